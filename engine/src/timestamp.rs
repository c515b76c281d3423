//! The timestamping rule: the one stamp every record of a batch gets.
//!
//! decisions.md, "Timestamping rules":
//! - `client-prefer`: the largest stamp any record offers, or the arrival time when none
//!   offers one;
//! - `client-require`: as above, but a batch with any record lacking a stamp is refused
//!   whole, naming the first such record;
//! - `arrival`: the arrival time; a batch with any record offering a stamp is refused
//!   whole, naming the first such record;
//! - then capped at the arrival time unless the stream is uncapped, then raised to at
//!   least the stream's previous stamp, so stamps never decrease along a stream.
//!
//! Offered stamps are wire `i64`s and may be negative; stored stamps are `u64`, so a
//! negative offer is simply raised by the final clamp. This module never reads a clock
//! (the caller passes the arrival time) and never touches a stream's state.

use crate::error::{Error, Result};
use crate::options::TimestampingMode;

/// What a batch's records offered, summarised in one pass with [`Offered::push`] (or
/// collected from an iterator of each record's optional stamp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offered {
    records: u32,
    with_timestamp: u32,
    max: Option<i64>,
    first_without: Option<u32>,
    first_with: Option<u32>,
}

impl Offered {
    /// A summary of no records.
    pub const fn new() -> Self {
        Self { records: 0, with_timestamp: 0, max: None, first_without: None, first_with: None }
    }

    /// Adds the next record of the batch, with the stamp it offers, if any.
    pub fn push(&mut self, timestamp: Option<i64>) {
        let index = self.records;
        match timestamp {
            Some(stamp) => {
                self.with_timestamp = self.with_timestamp.saturating_add(1);
                self.max = Some(self.max.map_or(stamp, |max| max.max(stamp)));
                self.first_with.get_or_insert(index);
            }
            None => {
                self.first_without.get_or_insert(index);
            }
        }
        // A batch is far below u32::MAX records (limits.md); saturate rather than panic
        // if a caller summarises before checking the count.
        self.records = self.records.saturating_add(1);
    }

    /// Records summarised.
    pub const fn records(&self) -> u32 {
        self.records
    }

    /// Records that offered a stamp.
    pub const fn with_timestamp(&self) -> u32 {
        self.with_timestamp
    }

    /// The largest stamp offered, if any record offered one.
    pub const fn max(&self) -> Option<i64> {
        self.max
    }

    /// Index of the first record without a stamp.
    pub const fn first_without(&self) -> Option<u32> {
        self.first_without
    }

    /// Index of the first record with a stamp.
    pub const fn first_with(&self) -> Option<u32> {
        self.first_with
    }
}

impl Extend<Option<i64>> for Offered {
    fn extend<I: IntoIterator<Item = Option<i64>>>(&mut self, stamps: I) {
        stamps.into_iter().for_each(|stamp| self.push(stamp));
    }
}

impl FromIterator<Option<i64>> for Offered {
    fn from_iter<I: IntoIterator<Item = Option<i64>>>(stamps: I) -> Self {
        let mut offered = Offered::new();
        offered.extend(stamps);
        offered
    }
}

/// The stamp for a batch: every record of it gets this one timestamp.
///
/// `arrival_ms` is when the batch arrived; `previous_ms` is the stream's last stamp (0 for
/// an empty stream). The result is never below `previous_ms`, and, unless `uncapped`,
/// never above `max(arrival_ms, previous_ms)`.
pub fn stamp(
    mode: TimestampingMode,
    uncapped: bool,
    offered: &Offered,
    arrival_ms: u64,
    previous_ms: u64,
) -> Result<u64> {
    if offered.records == 0 {
        return Err(Error::EmptyBatch);
    }
    let chosen = match mode {
        TimestampingMode::ClientPrefer => offered.max.map_or(arrival_ms, clamp_to_stored),
        TimestampingMode::ClientRequire => match (offered.first_without, offered.max) {
            (Some(index), _) => return Err(Error::TimestampRequired { index }),
            (None, Some(max)) => clamp_to_stored(max),
            // Every record offered one, yet no maximum: impossible for a non-empty
            // summary built by `push`; the arrival time is the only sound answer.
            (None, None) => arrival_ms,
        },
        TimestampingMode::Arrival => match offered.first_with {
            Some(index) => return Err(Error::TimestampNotAllowed { index }),
            None => arrival_ms,
        },
    };
    // A client cannot stamp the future unless the stream's scale is its own.
    let capped = if uncapped { chosen } else { chosen.min(arrival_ms) };
    // Stamps never decrease along a stream: that is what makes time addressable.
    Ok(capped.max(previous_ms))
}

/// A wire timestamp (`i64`) as stored stamps are (`u64`): a negative one becomes 0. An
/// offered stamp is then raised to the previous one by the final clamp; a read or trim
/// bound below 0 means what 0 does, since no stored stamp is below it.
pub fn clamp_to_stored(offered: i64) -> u64 {
    u64::try_from(offered).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use proptest::prelude::*;

    use TimestampingMode::{Arrival, ClientPrefer, ClientRequire};

    fn offered(stamps: &[Option<i64>]) -> Offered {
        stamps.iter().copied().collect()
    }

    #[test]
    fn summary_in_one_pass() {
        let summary = offered(&[None, Some(5), Some(-3), None, Some(9), Some(1)]);
        assert_eq!(summary.records(), 6);
        assert_eq!(summary.with_timestamp(), 4);
        assert_eq!(summary.max(), Some(9));
        assert_eq!(summary.first_without(), Some(0));
        assert_eq!(summary.first_with(), Some(1));
        assert_eq!(Offered::new(), Offered::default());
        let none = offered(&[None, None]);
        assert_eq!((none.max(), none.first_with(), none.first_without()), (None, None, Some(0)));
        let all = offered(&[Some(i64::MIN), Some(i64::MIN)]);
        assert_eq!(
            (all.max(), all.first_with(), all.first_without()),
            (Some(i64::MIN), Some(0), None)
        );
    }

    #[test]
    fn empty_batch_is_refused() {
        for mode in TimestampingMode::ALL {
            assert_eq!(stamp(*mode, false, &Offered::new(), 100, 0), Err(Error::EmptyBatch));
        }
    }

    #[test]
    fn client_prefer_takes_the_largest_offer() {
        let summary = offered(&[Some(40), None, Some(70), Some(50)]);
        assert_eq!(stamp(ClientPrefer, false, &summary, 100, 0), Ok(70));
    }

    #[test]
    fn client_prefer_without_offers_takes_arrival() {
        assert_eq!(stamp(ClientPrefer, false, &offered(&[None, None]), 100, 0), Ok(100));
        assert_eq!(stamp(ClientPrefer, true, &offered(&[None]), 100, 0), Ok(100));
    }

    #[test]
    fn client_require_takes_the_largest_offer() {
        let summary = offered(&[Some(10), Some(30), Some(20)]);
        assert_eq!(stamp(ClientRequire, false, &summary, 100, 0), Ok(30));
    }

    #[test]
    fn client_require_refuses_naming_the_first_record_without_a_stamp() {
        let summary = offered(&[Some(10), Some(11), None, Some(12), None]);
        let error = stamp(ClientRequire, false, &summary, 100, 0).expect_err("refused");
        assert_eq!(error, Error::TimestampRequired { index: 2 });
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(error.to_string().contains("record 2"));
        assert_eq!(
            stamp(ClientRequire, true, &offered(&[None]), 100, 0),
            Err(Error::TimestampRequired { index: 0 })
        );
    }

    #[test]
    fn arrival_stamps_arrival() {
        assert_eq!(stamp(Arrival, false, &offered(&[None, None]), 100, 0), Ok(100));
        // Uncapped changes nothing for arrival: nothing is offered to cap.
        assert_eq!(stamp(Arrival, true, &offered(&[None]), 100, 0), Ok(100));
    }

    #[test]
    fn arrival_refuses_naming_the_first_record_with_a_stamp() {
        let summary = offered(&[None, None, None, Some(5), Some(6)]);
        let error = stamp(Arrival, false, &summary, 100, 0).expect_err("refused");
        assert_eq!(error, Error::TimestampNotAllowed { index: 3 });
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(error.to_string().contains("record 3"));
    }

    #[test]
    fn offers_in_the_future_are_capped_at_arrival() {
        let future = offered(&[Some(500), Some(20)]);
        assert_eq!(stamp(ClientPrefer, false, &future, 100, 0), Ok(100));
        assert_eq!(stamp(ClientRequire, false, &future, 100, 0), Ok(100));
        // Exactly arrival is not the future.
        assert_eq!(stamp(ClientPrefer, false, &offered(&[Some(100)]), 100, 0), Ok(100));
    }

    #[test]
    fn uncapped_streams_keep_future_offers() {
        let future = offered(&[Some(500), Some(20)]);
        assert_eq!(stamp(ClientPrefer, true, &future, 100, 0), Ok(500));
        assert_eq!(stamp(ClientRequire, true, &future, 100, 0), Ok(500));
        let huge = offered(&[Some(i64::MAX)]);
        assert_eq!(stamp(ClientRequire, true, &huge, 100, 0), Ok(i64::MAX as u64));
    }

    #[test]
    fn stamps_never_fall_below_the_previous_one() {
        let past = offered(&[Some(40)]);
        assert_eq!(stamp(ClientPrefer, false, &past, 100, 60), Ok(60));
        assert_eq!(stamp(ClientRequire, true, &past, 100, 60), Ok(60));
        // Arrival behind the previous stamp (a clock step back, or an uncapped history).
        assert_eq!(stamp(Arrival, false, &offered(&[None]), 100, 250), Ok(250));
        assert_eq!(stamp(ClientPrefer, false, &offered(&[None]), 100, 250), Ok(250));
        // The cap applies before the raise: a future offer on a stream ahead of the clock
        // lands on the previous stamp, not the offer.
        assert_eq!(stamp(ClientPrefer, false, &offered(&[Some(900)]), 100, 250), Ok(250));
    }

    #[test]
    fn negative_offers_are_raised_by_the_clamp() {
        let negative = offered(&[Some(-5), Some(i64::MIN)]);
        assert_eq!(stamp(ClientPrefer, false, &negative, 100, 0), Ok(0));
        assert_eq!(stamp(ClientRequire, false, &negative, 100, 42), Ok(42));
        assert_eq!(stamp(ClientRequire, true, &negative, 100, 42), Ok(42));
        // The largest offer wins even when others are negative.
        assert_eq!(stamp(ClientPrefer, false, &offered(&[Some(-5), Some(7)]), 100, 0), Ok(7));
    }

    #[test]
    fn extreme_clock_values() {
        let summary = offered(&[None]);
        assert_eq!(stamp(ClientPrefer, false, &summary, u64::MAX, 0), Ok(u64::MAX));
        assert_eq!(stamp(Arrival, false, &summary, 0, u64::MAX), Ok(u64::MAX));
        assert_eq!(stamp(Arrival, false, &summary, 0, 0), Ok(0));
    }

    fn any_stamps() -> impl Strategy<Value = Vec<Option<i64>>> {
        prop::collection::vec(
            prop_oneof![
                Just(None),
                any::<i64>().prop_map(Some),
                (-1000i64..1000).prop_map(Some),
                (0i64..2_000_000).prop_map(Some),
            ],
            1..20,
        )
    }

    proptest! {
        #[test]
        fn the_stamp_respects_the_floor_and_the_cap(
            mode in prop::sample::select(TimestampingMode::ALL),
            uncapped in any::<bool>(),
            stamps in any_stamps(),
            arrival in prop_oneof![0u64..2_000_000, any::<u64>()],
            previous in prop_oneof![0u64..2_000_000, any::<u64>()],
        ) {
            let summary: Offered = stamps.iter().copied().collect();
            match stamp(mode, uncapped, &summary, arrival, previous) {
                Ok(stamped) => {
                    prop_assert!(stamped >= previous);
                    if !uncapped {
                        prop_assert!(stamped <= arrival.max(previous));
                    }
                    if mode == Arrival && arrival >= previous {
                        prop_assert_eq!(stamped, arrival);
                    }
                    if mode != Arrival {
                        // The stamp is an offer, the arrival time or the previous stamp.
                        let offered_max = summary.max().map(clamp_to_stored);
                        prop_assert!(
                            Some(stamped) == offered_max
                                || stamped == arrival
                                || stamped == previous
                        );
                    }
                }
                Err(Error::TimestampRequired { index }) => {
                    prop_assert_eq!(mode, ClientRequire);
                    let first = stamps.iter().position(Option::is_none);
                    prop_assert_eq!(first, usize::try_from(index).ok());
                }
                Err(Error::TimestampNotAllowed { index }) => {
                    prop_assert_eq!(mode, Arrival);
                    let first = stamps.iter().position(Option::is_some);
                    prop_assert_eq!(first, usize::try_from(index).ok());
                }
                Err(other) => prop_assert!(false, "unexpected error {other:?}"),
            }
        }

        #[test]
        fn refusals_happen_exactly_when_the_mode_says(
            mode in prop::sample::select(TimestampingMode::ALL),
            stamps in any_stamps(),
        ) {
            let summary: Offered = stamps.iter().copied().collect();
            let refused = stamp(mode, false, &summary, 1000, 0).is_err();
            let expected = match mode {
                ClientPrefer => false,
                ClientRequire => stamps.iter().any(Option::is_none),
                Arrival => stamps.iter().any(Option::is_some),
            };
            prop_assert_eq!(refused, expected);
        }
    }
}
