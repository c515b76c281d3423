//! Stream options and bucket configuration: their values, their ranges, and how a create
//! request, a reconfigure patch and a bucket update turn into a concrete configuration.
//!
//! The rules (buckets.md, decisions.md "Creating and reconfiguring"):
//! - a [`StreamOptions`] is always complete and concrete; "unbounded" is written as 0 for
//!   `batch_max_records`, retention and throughput;
//! - a create request copies every field it leaves out from the bucket's defaults, once
//!   (copy-at-create), and a scalar sent as 0 or `false` counts as left out;
//! - a reconfigure patch carries presence: a present 0 sets the bound to unbounded;
//! - `timestamping_mode` and `timestamping_uncapped` are fixed at creation;
//! - uncapped timestamping and age retention are refused together, for streams and for
//!   bucket defaults alike;
//! - ranges the spec leaves open are recorded in `docs/decisions/0002-stream-option-ranges.md`.
//!
//! This module never stores, looks up or applies options to a running stream; it only
//! computes and checks values.

use std::fmt;
use std::ops::RangeInclusive;

use crate::error::{Error, Result};
use crate::limits::BATCH_BYTES_MAX;

/// Domain default for `batch_max_bytes`: 8 MiB (producers.md).
pub const BATCH_MAX_BYTES_DEFAULT: u32 = 8 << 20;
/// Domain default for `batch_max_delay_ms`: 250 ms (producers.md).
pub const BATCH_MAX_DELAY_MS_DEFAULT: u32 = 250;
/// Accepted `batch_max_bytes`: a chunk's data length is a `u32`, and a chunk may run past
/// its trigger by one append batch, so the trigger stays far below 4 GiB. There is no
/// unbounded form: something must cut chunks.
pub const BATCH_MAX_BYTES_RANGE: RangeInclusive<u32> = 1..=256 << 20;
/// Accepted `batch_max_delay_ms`: a standard-class ack waits for the chunk to be cut, so
/// the delay is bounded like a read's `wait`; 0 would mean "unbounded" on a patch, which
/// would leave a quiet stream's appends unacknowledged forever.
pub const BATCH_MAX_DELAY_MS_RANGE: RangeInclusive<u32> = 1..=60_000;
/// Accepted `batch_max_records` (0 = unbounded): a chunk's record count is a `u32`.
pub const BATCH_MAX_RECORDS_RANGE: RangeInclusive<u32> = 0..=u32::MAX;
/// Longest bucket `location`, in bytes. The field is opaque and reserved; the bound only
/// keeps it from bloating every bucket record.
pub const LOCATION_BYTES_MAX: usize = 256;

// The largest trigger plus one whole append batch still fits a chunk's `u32` data length.
const _: () = assert!(
    *BATCH_MAX_BYTES_RANGE.end() as u64 + BATCH_BYTES_MAX <= u32::MAX as u64,
    "a chunk cut at the largest trigger must fit a u32 length"
);
const _: () = assert!(
    BATCH_MAX_BYTES_DEFAULT >= *BATCH_MAX_BYTES_RANGE.start()
        && BATCH_MAX_BYTES_DEFAULT <= *BATCH_MAX_BYTES_RANGE.end()
);
const _: () = assert!(
    BATCH_MAX_DELAY_MS_DEFAULT >= *BATCH_MAX_DELAY_MS_RANGE.start()
        && BATCH_MAX_DELAY_MS_DEFAULT <= *BATCH_MAX_DELAY_MS_RANGE.end()
);

/// How much of an unrecognised option word an error quotes.
const OPTION_VALUE_EXCERPT_CHARS: usize = 64;

/// Where a set of options lives, which decides the wire names errors use: a stream's
/// `class` is a bucket's `default_class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionScope {
    Stream,
    BucketDefaults,
}

/// The option fields, for naming them in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Class,
    ProducerPolicy,
    TimestampingMode,
    TimestampingUncapped,
    RetentionMaxAgeMs,
    BatchMaxBytes,
    BatchMaxRecords,
    BatchMaxDelayMs,
}

impl Field {
    /// The field's wire name in `scope` (http-api.md).
    const fn name(self, scope: OptionScope) -> &'static str {
        let stream = matches!(scope, OptionScope::Stream);
        match self {
            Field::Class if stream => "class",
            Field::Class => "default_class",
            Field::ProducerPolicy if stream => "producer_policy",
            Field::ProducerPolicy => "default_producer_policy",
            Field::TimestampingMode if stream => "timestamping_mode",
            Field::TimestampingMode => "default_timestamping_mode",
            Field::TimestampingUncapped if stream => "timestamping_uncapped",
            Field::TimestampingUncapped => "default_timestamping_uncapped",
            Field::RetentionMaxAgeMs if stream => "retention_max_age_ms",
            Field::RetentionMaxAgeMs => "default_retention_max_age_ms",
            Field::BatchMaxBytes if stream => "batch_max_bytes",
            Field::BatchMaxBytes => "default_batch_max_bytes",
            Field::BatchMaxRecords if stream => "batch_max_records",
            Field::BatchMaxRecords => "default_batch_max_records",
            Field::BatchMaxDelayMs if stream => "batch_max_delay_ms",
            Field::BatchMaxDelayMs => "default_batch_max_delay_ms",
        }
    }
}

/// Generates an option enum persisted as `u8`, with its wire names.
macro_rules! option_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $field:expr, $accepted:literal,
        { $($(#[$vmeta:meta])* $variant:ident = $value:literal => $wire:literal,)+ }
    ) => {
        $(#[$meta])*
        ///
        /// `#[repr(u8)]` with explicit values: persisted in stream and bucket records;
        /// never renumber.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// Every value, in discriminant order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }

            /// The persisted discriminant.
            pub const fn as_u8(self) -> u8 {
                self as u8
            }

            /// The value persisted as `value`, if it is one.
            pub const fn from_u8(value: u8) -> Option<Self> {
                match value {
                    $($value => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Parses a wire name (exact, lowercase) of a stream's field.
            pub fn parse(value: &str) -> Result<Self> {
                Self::parse_in(value, OptionScope::Stream)
            }

            /// Parses a wire name; an error names the field as `scope` spells it.
            pub fn parse_in(value: &str, scope: OptionScope) -> Result<Self> {
                match value {
                    $($wire => Ok($name::$variant),)+
                    _ => Err(Error::InvalidOptionValue {
                        field: $field.name(scope),
                        value: value.chars().take(OPTION_VALUE_EXCERPT_CHARS).collect(),
                        reason: concat!("accepted values are ", $accepted).to_owned(),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

// Persisted discriminants: never renumber, never reuse a retired value.
option_enum! {
    /// Where a batch is durable when it is acknowledged (architecture.md).
    StorageClass, Field::Class, "standard, express",
    {
        /// Acknowledged once durable in object storage.
        Standard = 1 => "standard",
        /// Acknowledged once durable in the node's local journal.
        Express = 2 => "express",
    }
}

// Persisted discriminants: never renumber, never reuse a retired value.
option_enum! {
    /// Which appends without a fencing token a stream accepts (producers.md).
    ProducerPolicy, Field::ProducerPolicy, "any, fenced",
    {
        /// Appends without a token are accepted.
        Any = 1 => "any",
        /// Appends must carry the current token.
        Fenced = 2 => "fenced",
    }
}

// Persisted discriminants: never renumber, never reuse a retired value.
option_enum! {
    /// Whose clock stamps a batch (records.md, decisions.md "Timestamping rules").
    TimestampingMode, Field::TimestampingMode, "client-prefer, client-require, arrival",
    {
        /// Records may offer a stamp; none offered means arrival time.
        ClientPrefer = 1 => "client-prefer",
        /// Every record must offer a stamp.
        ClientRequire = 2 => "client-require",
        /// Arrival time; offering a stamp is refused.
        Arrival = 3 => "arrival",
    }
}

/// A stream's complete configuration. Also a bucket's default configuration, which every
/// stream created in the bucket starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamOptions {
    pub class: StorageClass,
    pub producer_policy: ProducerPolicy,
    /// Fixed at creation.
    pub timestamping_mode: TimestampingMode,
    /// Fixed at creation. When set, offered stamps are not capped at arrival time.
    pub timestamping_uncapped: bool,
    /// 0 = unbounded.
    pub retention_max_age_ms: u64,
    /// 0 = unbounded.
    pub retention_max_bytes: u64,
    /// Cut a chunk at this many content bytes; see [`BATCH_MAX_BYTES_RANGE`].
    pub batch_max_bytes: u32,
    /// Cut a chunk at this many records; 0 = unbounded.
    pub batch_max_records: u32,
    /// Cut a chunk this long after its first record; see [`BATCH_MAX_DELAY_MS_RANGE`].
    pub batch_max_delay_ms: u32,
    /// Content bytes per second an append may add; 0 = unlimited.
    pub throughput_max_bytes_per_second: u64,
}

impl Default for StreamOptions {
    /// The domain defaults. They only ever fill a bucket's configuration; a stream always
    /// starts from its bucket's defaults.
    fn default() -> Self {
        Self {
            class: StorageClass::Standard,
            producer_policy: ProducerPolicy::Any,
            timestamping_mode: TimestampingMode::ClientPrefer,
            timestamping_uncapped: false,
            retention_max_age_ms: 0,
            retention_max_bytes: 0,
            batch_max_bytes: BATCH_MAX_BYTES_DEFAULT,
            batch_max_records: 0,
            batch_max_delay_ms: BATCH_MAX_DELAY_MS_DEFAULT,
            throughput_max_bytes_per_second: 0,
        }
    }
}

/// The options a create names (CreateStream, or the `default_*` fields of CreateBucket
/// and UpdateBucket). Enums are `None` when omitted; scalars are 0 / `false` both when
/// omitted and when sent so, which is why a create cannot set a bound back to unbounded
/// nor turn `timestamping_uncapped` off (buckets.md, "Zero means unset on the wire").
///
/// Scalars are `u64` whatever their stored width, so a value too wide for its field is
/// refused with the value named rather than failing in the wire decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamOptionsRequest {
    pub class: Option<StorageClass>,
    pub producer_policy: Option<ProducerPolicy>,
    pub timestamping_mode: Option<TimestampingMode>,
    pub timestamping_uncapped: bool,
    pub retention_max_age_ms: u64,
    pub retention_max_bytes: u64,
    pub batch_max_bytes: u64,
    pub batch_max_records: u64,
    pub batch_max_delay_ms: u64,
    pub throughput_max_bytes_per_second: u64,
}

/// A ReconfigureStream: every field carries presence. A present 0 sets a bound to
/// unbounded where the field has an unbounded form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamOptionsPatch {
    pub class: Option<StorageClass>,
    pub producer_policy: Option<ProducerPolicy>,
    /// Accepted only when equal to the stream's (fixed at creation).
    pub timestamping_mode: Option<TimestampingMode>,
    /// Accepted only when equal to the stream's (fixed at creation).
    pub timestamping_uncapped: Option<bool>,
    pub retention_max_age_ms: Option<u64>,
    pub retention_max_bytes: Option<u64>,
    pub batch_max_bytes: Option<u64>,
    pub batch_max_records: Option<u64>,
    pub batch_max_delay_ms: Option<u64>,
    pub throughput_max_bytes_per_second: Option<u64>,
}

impl StreamOptions {
    /// Copy-at-create: `self` is the bucket's defaults; every field the request leaves
    /// out (or sends as 0 / `false`) is copied from them. The result is validated.
    pub fn with_request(&self, request: &StreamOptionsRequest) -> Result<StreamOptions> {
        self.with_request_in(request, OptionScope::Stream)
    }

    fn with_request_in(
        &self,
        request: &StreamOptionsRequest,
        scope: OptionScope,
    ) -> Result<StreamOptions> {
        let nonzero = |value: u64| (value != 0).then_some(value);
        let mut options = *self;
        options.class = request.class.unwrap_or(self.class);
        options.producer_policy = request.producer_policy.unwrap_or(self.producer_policy);
        options.timestamping_mode = request.timestamping_mode.unwrap_or(self.timestamping_mode);
        options.timestamping_uncapped = request.timestamping_uncapped || self.timestamping_uncapped;
        if let Some(age) = nonzero(request.retention_max_age_ms) {
            options.retention_max_age_ms = age;
        }
        if let Some(bytes) = nonzero(request.retention_max_bytes) {
            options.retention_max_bytes = bytes;
        }
        if let Some(bytes) = nonzero(request.batch_max_bytes) {
            options.batch_max_bytes =
                narrow(Field::BatchMaxBytes, scope, bytes, &BATCH_MAX_BYTES_RANGE)?;
        }
        if let Some(records) = nonzero(request.batch_max_records) {
            options.batch_max_records =
                narrow(Field::BatchMaxRecords, scope, records, &BATCH_MAX_RECORDS_RANGE)?;
        }
        if let Some(delay) = nonzero(request.batch_max_delay_ms) {
            options.batch_max_delay_ms =
                narrow(Field::BatchMaxDelayMs, scope, delay, &BATCH_MAX_DELAY_MS_RANGE)?;
        }
        if let Some(rate) = nonzero(request.throughput_max_bytes_per_second) {
            options.throughput_max_bytes_per_second = rate;
        }
        options.validate_in(scope).map_err(|error| match error {
            // A stream's create that took one of the two from its bucket says which: the
            // request alone does not show it (a create's 0 takes the bucket's value).
            Error::UncappedWithAgeRetention {
                uncapped_field,
                age_field,
                retention_max_age_ms,
                from_bucket: None,
            } if scope == OptionScope::Stream => {
                let from_bucket = if request.retention_max_age_ms == 0 {
                    Some(Field::RetentionMaxAgeMs.name(OptionScope::BucketDefaults))
                } else if !request.timestamping_uncapped {
                    Some(Field::TimestampingUncapped.name(OptionScope::BucketDefaults))
                } else {
                    None
                };
                Error::UncappedWithAgeRetention {
                    uncapped_field,
                    age_field,
                    retention_max_age_ms,
                    from_bucket,
                }
            }
            other => other,
        })?;
        Ok(options)
    }

    /// ReconfigureStream: every present field is set, including 0. Changing
    /// `timestamping_mode` or `timestamping_uncapped` is refused (sending the current
    /// value is not a change). The result is validated.
    pub fn with_patch(&self, patch: &StreamOptionsPatch) -> Result<StreamOptions> {
        let scope = OptionScope::Stream;
        if patch.timestamping_mode.is_some_and(|mode| mode != self.timestamping_mode) {
            return Err(Error::OptionImmutable { field: Field::TimestampingMode.name(scope) });
        }
        if patch
            .timestamping_uncapped
            .is_some_and(|uncapped| uncapped != self.timestamping_uncapped)
        {
            return Err(Error::OptionImmutable { field: Field::TimestampingUncapped.name(scope) });
        }
        let mut options = *self;
        if let Some(class) = patch.class {
            options.class = class;
        }
        if let Some(policy) = patch.producer_policy {
            options.producer_policy = policy;
        }
        if let Some(age) = patch.retention_max_age_ms {
            options.retention_max_age_ms = age;
        }
        if let Some(bytes) = patch.retention_max_bytes {
            options.retention_max_bytes = bytes;
        }
        if let Some(bytes) = patch.batch_max_bytes {
            options.batch_max_bytes =
                narrow(Field::BatchMaxBytes, scope, bytes, &BATCH_MAX_BYTES_RANGE)?;
        }
        if let Some(records) = patch.batch_max_records {
            options.batch_max_records =
                narrow(Field::BatchMaxRecords, scope, records, &BATCH_MAX_RECORDS_RANGE)?;
        }
        if let Some(delay) = patch.batch_max_delay_ms {
            options.batch_max_delay_ms =
                narrow(Field::BatchMaxDelayMs, scope, delay, &BATCH_MAX_DELAY_MS_RANGE)?;
        }
        if let Some(rate) = patch.throughput_max_bytes_per_second {
            options.throughput_max_bytes_per_second = rate;
        }
        options.validate_in(scope)?;
        Ok(options)
    }

    /// Checks the ranges and the uncapped/age exclusion, naming a stream's fields.
    pub fn validate(&self) -> Result<()> {
        self.validate_in(OptionScope::Stream)
    }

    /// Like [`StreamOptions::validate`], naming the fields as `scope` spells them.
    pub fn validate_in(&self, scope: OptionScope) -> Result<()> {
        check_range(Field::BatchMaxBytes, scope, self.batch_max_bytes, &BATCH_MAX_BYTES_RANGE)?;
        check_range(
            Field::BatchMaxRecords,
            scope,
            self.batch_max_records,
            &BATCH_MAX_RECORDS_RANGE,
        )?;
        check_range(
            Field::BatchMaxDelayMs,
            scope,
            self.batch_max_delay_ms,
            &BATCH_MAX_DELAY_MS_RANGE,
        )?;
        // Age retention reads record time as wall clock; an uncapped stream's record time
        // may be any monotone scale, and retention would silently mis-trim it.
        if self.timestamping_uncapped && self.retention_max_age_ms > 0 {
            return Err(Error::UncappedWithAgeRetention {
                uncapped_field: Field::TimestampingUncapped.name(scope),
                age_field: Field::RetentionMaxAgeMs.name(scope),
                retention_max_age_ms: self.retention_max_age_ms,
                from_bucket: None,
            });
        }
        Ok(())
    }
}

/// The refusal of `value` for a `u32` field, naming the field's range.
fn out_of_range(
    field: Field,
    scope: OptionScope,
    value: u64,
    range: &RangeInclusive<u32>,
) -> Error {
    Error::OptionOutOfRange {
        field: field.name(scope),
        value,
        min: u64::from(*range.start()),
        max: u64::from(*range.end()),
    }
}

/// A wire `u64` into a `u32` field, within the field's range.
fn narrow(
    field: Field,
    scope: OptionScope,
    value: u64,
    range: &RangeInclusive<u32>,
) -> Result<u32> {
    u32::try_from(value)
        .ok()
        .filter(|narrow| range.contains(narrow))
        .ok_or_else(|| out_of_range(field, scope, value, range))
}

fn check_range(
    field: Field,
    scope: OptionScope,
    value: u32,
    range: &RangeInclusive<u32>,
) -> Result<()> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(out_of_range(field, scope, u64::from(value), range))
    }
}

/// A bucket's caller-writable configuration, complete and validated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BucketConfig {
    /// Opaque and reserved: no routing meaning today (buckets.md).
    pub location: String,
    pub create_stream_on_append: bool,
    pub create_stream_on_read: bool,
    /// Every stream created in the bucket starts from these (copy-at-create).
    pub defaults: StreamOptions,
}

/// CreateBucket's or UpdateBucket's body. Both build the whole configuration afresh:
/// every default the request leaves out (or sends as 0 / `false`) takes the domain
/// default, not the bucket's previous value (http-api.md, UpdateBucket).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BucketConfigRequest {
    /// Empty when omitted.
    pub location: String,
    pub create_stream_on_append: bool,
    pub create_stream_on_read: bool,
    pub defaults: StreamOptionsRequest,
}

impl BucketConfig {
    /// Builds the configuration a CreateBucket or UpdateBucket asks for, with the domain
    /// defaults filling every default left out. Errors name the `default_*` wire fields.
    pub fn from_request(request: &BucketConfigRequest) -> Result<BucketConfig> {
        check_location(&request.location)?;
        let defaults = StreamOptions::default()
            .with_request_in(&request.defaults, OptionScope::BucketDefaults)?;
        Ok(BucketConfig {
            location: request.location.clone(),
            create_stream_on_append: request.create_stream_on_append,
            create_stream_on_read: request.create_stream_on_read,
            defaults,
        })
    }

    /// Checks a configuration (for instance one read back from storage).
    pub fn validate(&self) -> Result<()> {
        check_location(&self.location)?;
        self.defaults.validate_in(OptionScope::BucketDefaults)
    }
}

fn check_location(location: &str) -> Result<()> {
    if location.len() > LOCATION_BYTES_MAX {
        return Err(Error::LocationTooLong { len: location.len(), limit: LOCATION_BYTES_MAX });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use proptest::prelude::*;

    /// A bucket's defaults that differ from the domain defaults in every field but the
    /// fixed-at-creation pair's combination rule.
    fn bucket_defaults() -> StreamOptions {
        StreamOptions {
            class: StorageClass::Express,
            producer_policy: ProducerPolicy::Fenced,
            timestamping_mode: TimestampingMode::ClientRequire,
            timestamping_uncapped: false,
            retention_max_age_ms: 86_400_000,
            retention_max_bytes: 1 << 30,
            batch_max_bytes: 1 << 20,
            batch_max_records: 500,
            batch_max_delay_ms: 10,
            throughput_max_bytes_per_second: 5 << 20,
        }
    }

    fn out_of_range_field(result: Result<StreamOptions>) -> (&'static str, u64, u64, u64) {
        match result {
            Err(Error::OptionOutOfRange { field, value, min, max }) => (field, value, min, max),
            other => panic!("expected OptionOutOfRange, got {other:?}"),
        }
    }

    #[test]
    fn domain_defaults() {
        let options = StreamOptions::default();
        assert_eq!(options.class, StorageClass::Standard);
        assert_eq!(options.producer_policy, ProducerPolicy::Any);
        assert_eq!(options.timestamping_mode, TimestampingMode::ClientPrefer);
        assert!(!options.timestamping_uncapped);
        assert_eq!(options.retention_max_age_ms, 0);
        assert_eq!(options.retention_max_bytes, 0);
        assert_eq!(options.batch_max_bytes, 8 * 1024 * 1024);
        assert_eq!(options.batch_max_records, 0);
        assert_eq!(options.batch_max_delay_ms, 250);
        assert_eq!(options.throughput_max_bytes_per_second, 0);
        options.validate().expect("the domain defaults are valid");
        bucket_defaults().validate().expect("the test defaults are valid");
    }

    #[test]
    fn enum_values_and_wire_names_are_stable() {
        let classes =
            [(StorageClass::Standard, 1, "standard"), (StorageClass::Express, 2, "express")];
        for (class, value, wire) in classes {
            assert_eq!(class.as_u8(), value);
            assert_eq!(class.as_str(), wire);
            assert_eq!(class.to_string(), wire);
            assert_eq!(StorageClass::from_u8(value), Some(class));
            assert_eq!(StorageClass::parse(wire), Ok(class));
        }
        let policies = [(ProducerPolicy::Any, 1, "any"), (ProducerPolicy::Fenced, 2, "fenced")];
        for (policy, value, wire) in policies {
            assert_eq!(policy.as_u8(), value);
            assert_eq!(policy.as_str(), wire);
            assert_eq!(ProducerPolicy::from_u8(value), Some(policy));
            assert_eq!(ProducerPolicy::parse(wire), Ok(policy));
        }
        let modes = [
            (TimestampingMode::ClientPrefer, 1, "client-prefer"),
            (TimestampingMode::ClientRequire, 2, "client-require"),
            (TimestampingMode::Arrival, 3, "arrival"),
        ];
        for (mode, value, wire) in modes {
            assert_eq!(mode.as_u8(), value);
            assert_eq!(mode.as_str(), wire);
            assert_eq!(TimestampingMode::from_u8(value), Some(mode));
            assert_eq!(TimestampingMode::parse(wire), Ok(mode));
        }
        assert_eq!(StorageClass::ALL.len(), 2);
        assert_eq!(ProducerPolicy::ALL.len(), 2);
        assert_eq!(TimestampingMode::ALL.len(), 3);
        for value in [0, 3, 255] {
            assert_eq!(StorageClass::from_u8(value), None);
            assert_eq!(ProducerPolicy::from_u8(value), None);
        }
        assert_eq!(TimestampingMode::from_u8(0), None);
        assert_eq!(TimestampingMode::from_u8(4), None);
    }

    #[test]
    fn enum_parse_refusals_name_the_field_and_the_accepted_values() {
        let cases: [(Result<()>, &str, &str); 4] = [
            (StorageClass::parse("Standard").map(drop), "class", "standard, express"),
            (ProducerPolicy::parse("").map(drop), "producer_policy", "any, fenced"),
            (
                TimestampingMode::parse("client_prefer").map(drop),
                "timestamping_mode",
                "client-prefer, client-require, arrival",
            ),
            (
                StorageClass::parse_in("gold", OptionScope::BucketDefaults).map(drop),
                "default_class",
                "standard, express",
            ),
        ];
        for (result, expected_field, accepted) in cases {
            let error = result.expect_err("refused");
            assert_eq!(error.code(), Code::InvalidArgument);
            match &error {
                Error::InvalidOptionValue { field, reason, .. } => {
                    assert_eq!(*field, expected_field);
                    assert!(reason.contains(accepted), "{reason}");
                }
                other => panic!("expected InvalidOptionValue, got {other:?}"),
            }
            assert!(error.to_string().contains(accepted), "{error}");
        }
        let message = StorageClass::parse("gold").expect_err("refused").to_string();
        assert_eq!(message, "invalid class \"gold\": accepted values are standard, express");
    }

    #[test]
    fn create_copies_every_omitted_field_from_the_bucket() {
        let defaults = bucket_defaults();
        assert_eq!(defaults.with_request(&StreamOptionsRequest::default()), Ok(defaults));
    }

    #[test]
    fn create_sets_every_field_it_names() {
        let request = StreamOptionsRequest {
            class: Some(StorageClass::Standard),
            producer_policy: Some(ProducerPolicy::Any),
            timestamping_mode: Some(TimestampingMode::Arrival),
            timestamping_uncapped: false,
            retention_max_age_ms: 1000,
            retention_max_bytes: 2000,
            batch_max_bytes: 3000,
            batch_max_records: 4000,
            batch_max_delay_ms: 5000,
            throughput_max_bytes_per_second: 6000,
        };
        let options = bucket_defaults().with_request(&request).expect("valid create");
        assert_eq!(
            options,
            StreamOptions {
                class: StorageClass::Standard,
                producer_policy: ProducerPolicy::Any,
                timestamping_mode: TimestampingMode::Arrival,
                timestamping_uncapped: false,
                retention_max_age_ms: 1000,
                retention_max_bytes: 2000,
                batch_max_bytes: 3000,
                batch_max_records: 4000,
                batch_max_delay_ms: 5000,
                throughput_max_bytes_per_second: 6000,
            }
        );
    }

    #[test]
    fn create_zero_means_unset() {
        // Zero cannot set a bound back to unbounded, nor false turn uncapped off.
        let mut defaults = bucket_defaults();
        let zeros = StreamOptionsRequest::default();
        assert_eq!(zeros.retention_max_age_ms, 0);
        let options = defaults.with_request(&zeros).expect("valid");
        assert_eq!(options.retention_max_age_ms, 86_400_000);
        assert_eq!(options.retention_max_bytes, 1 << 30);
        assert_eq!(options.batch_max_bytes, 1 << 20);
        assert_eq!(options.batch_max_records, 500);
        assert_eq!(options.batch_max_delay_ms, 10);
        assert_eq!(options.throughput_max_bytes_per_second, 5 << 20);

        defaults.retention_max_age_ms = 0;
        defaults.timestamping_uncapped = true;
        let options = defaults.with_request(&zeros).expect("valid");
        assert!(options.timestamping_uncapped, "false on create keeps the bucket's uncapped");

        let uncapped = StreamOptionsRequest { timestamping_uncapped: true, ..zeros };
        let options = StreamOptions::default().with_request(&uncapped).expect("valid");
        assert!(options.timestamping_uncapped);
    }

    #[test]
    fn create_refuses_out_of_range_values() {
        let defaults = StreamOptions::default();
        let request = |f: fn(&mut StreamOptionsRequest)| {
            let mut request = StreamOptionsRequest::default();
            f(&mut request);
            defaults.with_request(&request)
        };
        assert_eq!(
            out_of_range_field(request(|r| r.batch_max_bytes = (256 << 20) + 1)),
            ("batch_max_bytes", (256 << 20) + 1, 1, 256 << 20)
        );
        assert_eq!(
            request(|r| r.batch_max_bytes = 256 << 20).map(|o| o.batch_max_bytes),
            Ok(256 << 20)
        );
        assert_eq!(request(|r| r.batch_max_bytes = 1).map(|o| o.batch_max_bytes), Ok(1));
        assert_eq!(
            out_of_range_field(request(|r| r.batch_max_bytes = u64::MAX)),
            ("batch_max_bytes", u64::MAX, 1, 256 << 20)
        );
        assert_eq!(
            out_of_range_field(request(|r| r.batch_max_delay_ms = 60_001)),
            ("batch_max_delay_ms", 60_001, 1, 60_000)
        );
        assert_eq!(
            request(|r| r.batch_max_delay_ms = 60_000).map(|o| o.batch_max_delay_ms),
            Ok(60_000)
        );
        assert_eq!(
            out_of_range_field(request(|r| r.batch_max_records = 1 << 32)),
            ("batch_max_records", 1 << 32, 0, u64::from(u32::MAX))
        );
        assert_eq!(
            request(|r| r.batch_max_records = u64::from(u32::MAX)).map(|o| o.batch_max_records),
            Ok(u32::MAX)
        );
        // Retention and throughput take any u64.
        let wide = request(|r| {
            r.retention_max_bytes = u64::MAX;
            r.throughput_max_bytes_per_second = u64::MAX;
            r.retention_max_age_ms = u64::MAX;
        })
        .expect("no upper bound");
        assert_eq!(wide.retention_max_age_ms, u64::MAX);
        let message = request(|r| r.batch_max_delay_ms = 60_001).expect_err("refused").to_string();
        assert_eq!(
            message,
            "batch_max_delay_ms 60001 is out of range: it must be between 1 and 60000"
        );
    }

    #[test]
    fn create_refuses_uncapped_with_age_retention() {
        let uncapped_bucket = StreamOptions { timestamping_uncapped: true, ..Default::default() };
        let aged_bucket = StreamOptions { retention_max_age_ms: 60_000, ..Default::default() };
        let expected = |age, from_bucket| Error::UncappedWithAgeRetention {
            uncapped_field: "timestamping_uncapped",
            age_field: "retention_max_age_ms",
            retention_max_age_ms: age,
            from_bucket,
        };
        // Both in the request.
        let both = StreamOptionsRequest {
            timestamping_uncapped: true,
            retention_max_age_ms: 1000,
            ..Default::default()
        };
        assert_eq!(StreamOptions::default().with_request(&both), Err(expected(1000, None)));
        // Age in the request, uncapped from the bucket.
        let aged = StreamOptionsRequest { retention_max_age_ms: 5, ..Default::default() };
        let from_bucket = Some("default_timestamping_uncapped");
        assert_eq!(uncapped_bucket.with_request(&aged), Err(expected(5, from_bucket)));
        // Uncapped in the request, age from the bucket.
        let uncapped = StreamOptionsRequest { timestamping_uncapped: true, ..Default::default() };
        let from_bucket = Some("default_retention_max_age_ms");
        assert_eq!(aged_bucket.with_request(&uncapped), Err(expected(60_000, from_bucket)));
        // Byte retention is not age retention.
        let bytes = StreamOptionsRequest { retention_max_bytes: 1 << 20, ..uncapped };
        assert!(StreamOptions::default().with_request(&bytes).is_ok());
        let error = StreamOptions::default().with_request(&both).expect_err("refused");
        assert_eq!(error.code(), Code::InvalidArgument);
    }

    #[test]
    fn patch_sets_present_fields_only() {
        let options = bucket_defaults();
        assert_eq!(options.with_patch(&StreamOptionsPatch::default()), Ok(options));
        let patch = StreamOptionsPatch {
            class: Some(StorageClass::Standard),
            producer_policy: Some(ProducerPolicy::Any),
            batch_max_bytes: Some(4096),
            ..Default::default()
        };
        let patched = options.with_patch(&patch).expect("valid patch");
        assert_eq!(
            patched,
            StreamOptions {
                class: StorageClass::Standard,
                producer_policy: ProducerPolicy::Any,
                batch_max_bytes: 4096,
                ..options
            }
        );
        let patch = StreamOptionsPatch {
            retention_max_age_ms: Some(1),
            retention_max_bytes: Some(2),
            batch_max_records: Some(3),
            batch_max_delay_ms: Some(4),
            throughput_max_bytes_per_second: Some(5),
            ..Default::default()
        };
        let patched = options.with_patch(&patch).expect("valid patch");
        assert_eq!(
            patched,
            StreamOptions {
                retention_max_age_ms: 1,
                retention_max_bytes: 2,
                batch_max_records: 3,
                batch_max_delay_ms: 4,
                throughput_max_bytes_per_second: 5,
                ..options
            }
        );
    }

    #[test]
    fn patch_present_zero_sets_unbounded() {
        let options = bucket_defaults();
        let patch = StreamOptionsPatch {
            retention_max_age_ms: Some(0),
            retention_max_bytes: Some(0),
            batch_max_records: Some(0),
            throughput_max_bytes_per_second: Some(0),
            ..Default::default()
        };
        let patched = options.with_patch(&patch).expect("valid patch");
        assert_eq!(patched.retention_max_age_ms, 0);
        assert_eq!(patched.retention_max_bytes, 0);
        assert_eq!(patched.batch_max_records, 0);
        assert_eq!(patched.throughput_max_bytes_per_second, 0);
        assert_eq!(patched.batch_max_bytes, options.batch_max_bytes);
    }

    #[test]
    fn patch_zero_is_refused_where_there_is_no_unbounded_form() {
        let options = bucket_defaults();
        let zero_bytes = StreamOptionsPatch { batch_max_bytes: Some(0), ..Default::default() };
        assert_eq!(
            out_of_range_field(options.with_patch(&zero_bytes)),
            ("batch_max_bytes", 0, 1, 256 << 20)
        );
        let zero_delay = StreamOptionsPatch { batch_max_delay_ms: Some(0), ..Default::default() };
        assert_eq!(
            out_of_range_field(options.with_patch(&zero_delay)),
            ("batch_max_delay_ms", 0, 1, 60_000)
        );
        let wide = StreamOptionsPatch { batch_max_records: Some(u64::MAX), ..Default::default() };
        assert_eq!(out_of_range_field(options.with_patch(&wide)).0, "batch_max_records");
    }

    #[test]
    fn patch_refuses_changing_what_is_fixed_at_creation() {
        let options = bucket_defaults();
        let mode = StreamOptionsPatch {
            timestamping_mode: Some(TimestampingMode::Arrival),
            ..Default::default()
        };
        assert_eq!(
            options.with_patch(&mode),
            Err(Error::OptionImmutable { field: "timestamping_mode" })
        );
        let uncapped =
            StreamOptionsPatch { timestamping_uncapped: Some(true), ..Default::default() };
        let error = options.with_patch(&uncapped).expect_err("immutable");
        assert_eq!(error, Error::OptionImmutable { field: "timestamping_uncapped" });
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(error.to_string().contains("timestamping_uncapped"));

        // Sending the current values is not a change.
        let same = StreamOptionsPatch {
            timestamping_mode: Some(options.timestamping_mode),
            timestamping_uncapped: Some(options.timestamping_uncapped),
            class: Some(StorageClass::Standard),
            ..Default::default()
        };
        let patched = options.with_patch(&same).expect("no change to the fixed pair");
        assert_eq!(patched.class, StorageClass::Standard);

        // An immutable change refuses the whole patch, including its valid fields.
        let mixed = StreamOptionsPatch { class: Some(StorageClass::Standard), ..mode };
        assert!(options.with_patch(&mixed).is_err());
    }

    #[test]
    fn patch_refuses_age_retention_on_an_uncapped_stream() {
        let uncapped = StreamOptions { timestamping_uncapped: true, ..Default::default() };
        let aged = StreamOptionsPatch { retention_max_age_ms: Some(60_000), ..Default::default() };
        assert_eq!(
            uncapped.with_patch(&aged),
            Err(Error::UncappedWithAgeRetention {
                uncapped_field: "timestamping_uncapped",
                age_field: "retention_max_age_ms",
                retention_max_age_ms: 60_000,
                from_bucket: None,
            })
        );
        // Setting age retention back to unbounded is fine, and so is byte retention.
        let unbounded = StreamOptionsPatch {
            retention_max_age_ms: Some(0),
            retention_max_bytes: Some(1 << 20),
            ..Default::default()
        };
        assert!(uncapped.with_patch(&unbounded).is_ok());
    }

    #[test]
    fn validate_refuses_out_of_range_and_the_uncapped_age_pair() {
        let cases = [
            (StreamOptions { batch_max_bytes: 0, ..Default::default() }, "batch_max_bytes"),
            (
                StreamOptions { batch_max_bytes: (256 << 20) + 1, ..Default::default() },
                "batch_max_bytes",
            ),
            (StreamOptions { batch_max_delay_ms: 0, ..Default::default() }, "batch_max_delay_ms"),
            (
                StreamOptions { batch_max_delay_ms: 60_001, ..Default::default() },
                "batch_max_delay_ms",
            ),
        ];
        for (options, field) in cases {
            match options.validate() {
                Err(Error::OptionOutOfRange { field: refused, .. }) => assert_eq!(refused, field),
                other => panic!("expected OptionOutOfRange on {field}, got {other:?}"),
            }
        }
        let both = StreamOptions {
            timestamping_uncapped: true,
            retention_max_age_ms: 1,
            ..Default::default()
        };
        assert!(matches!(both.validate(), Err(Error::UncappedWithAgeRetention { .. })));
        assert!(matches!(
            both.validate_in(OptionScope::BucketDefaults),
            Err(Error::UncappedWithAgeRetention {
                uncapped_field: "default_timestamping_uncapped",
                age_field: "default_retention_max_age_ms",
                ..
            })
        ));
    }

    #[test]
    fn bucket_config_fills_omitted_defaults_with_the_domain_defaults() {
        let config = BucketConfig::from_request(&BucketConfigRequest::default()).expect("valid");
        assert_eq!(config, BucketConfig::default());
        assert_eq!(config.defaults, StreamOptions::default());
        assert_eq!(config.location, "");
        assert!(!config.create_stream_on_append && !config.create_stream_on_read);

        let request = BucketConfigRequest {
            location: "eu-west".into(),
            create_stream_on_append: true,
            create_stream_on_read: true,
            defaults: StreamOptionsRequest {
                class: Some(StorageClass::Express),
                retention_max_age_ms: 3_600_000,
                batch_max_delay_ms: 5,
                ..Default::default()
            },
        };
        let config = BucketConfig::from_request(&request).expect("valid");
        assert_eq!(config.location, "eu-west");
        assert!(config.create_stream_on_append && config.create_stream_on_read);
        assert_eq!(
            config.defaults,
            StreamOptions {
                class: StorageClass::Express,
                retention_max_age_ms: 3_600_000,
                batch_max_delay_ms: 5,
                ..Default::default()
            }
        );
        config.validate().expect("a built config is valid");
    }

    #[test]
    fn bucket_update_does_not_inherit_the_previous_defaults() {
        // UpdateBucket replaces the config: what it omits takes the domain default.
        let created = BucketConfig::from_request(&BucketConfigRequest {
            defaults: StreamOptionsRequest { batch_max_delay_ms: 5, ..Default::default() },
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(created.defaults.batch_max_delay_ms, 5);
        let updated = BucketConfig::from_request(&BucketConfigRequest {
            create_stream_on_append: true,
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(updated.defaults.batch_max_delay_ms, BATCH_MAX_DELAY_MS_DEFAULT);
    }

    #[test]
    fn bucket_defaults_refuse_uncapped_with_age_retention() {
        let request = BucketConfigRequest {
            defaults: StreamOptionsRequest {
                timestamping_uncapped: true,
                retention_max_age_ms: 1000,
                ..Default::default()
            },
            ..Default::default()
        };
        let error = BucketConfig::from_request(&request).expect_err("refused");
        assert_eq!(
            error,
            Error::UncappedWithAgeRetention {
                uncapped_field: "default_timestamping_uncapped",
                age_field: "default_retention_max_age_ms",
                retention_max_age_ms: 1000,
                from_bucket: None,
            }
        );
        assert_eq!(error.code(), Code::InvalidArgument);
        let stored = BucketConfig {
            defaults: StreamOptions {
                timestamping_uncapped: true,
                retention_max_age_ms: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(stored.validate().is_err());
    }

    #[test]
    fn bucket_errors_name_the_default_fields() {
        let request = BucketConfigRequest {
            defaults: StreamOptionsRequest { batch_max_bytes: 1 << 40, ..Default::default() },
            ..Default::default()
        };
        match BucketConfig::from_request(&request) {
            Err(Error::OptionOutOfRange { field, .. }) => {
                assert_eq!(field, "default_batch_max_bytes")
            }
            other => panic!("expected OptionOutOfRange, got {other:?}"),
        }
        let request = BucketConfigRequest {
            defaults: StreamOptionsRequest { batch_max_delay_ms: 60_001, ..Default::default() },
            ..Default::default()
        };
        let message = BucketConfig::from_request(&request).expect_err("refused").to_string();
        assert!(message.contains("default_batch_max_delay_ms 60001"), "{message}");
    }

    #[test]
    fn bucket_location_is_bounded() {
        let at_limit = BucketConfigRequest { location: "l".repeat(256), ..Default::default() };
        assert!(BucketConfig::from_request(&at_limit).is_ok());
        let over = BucketConfigRequest { location: "l".repeat(257), ..Default::default() };
        assert_eq!(
            BucketConfig::from_request(&over),
            Err(Error::LocationTooLong { len: 257, limit: LOCATION_BYTES_MAX })
        );
    }

    #[test]
    fn field_names_match_the_wire() {
        let fields = [
            (Field::Class, "class"),
            (Field::ProducerPolicy, "producer_policy"),
            (Field::TimestampingMode, "timestamping_mode"),
            (Field::TimestampingUncapped, "timestamping_uncapped"),
            (Field::RetentionMaxAgeMs, "retention_max_age_ms"),
            (Field::BatchMaxBytes, "batch_max_bytes"),
            (Field::BatchMaxRecords, "batch_max_records"),
            (Field::BatchMaxDelayMs, "batch_max_delay_ms"),
        ];
        for (field, name) in fields {
            assert_eq!(field.name(OptionScope::Stream), name);
            assert_eq!(field.name(OptionScope::BucketDefaults), format!("default_{name}"));
        }
    }

    fn any_options() -> impl Strategy<Value = StreamOptions> {
        (
            prop::sample::select(StorageClass::ALL),
            prop::sample::select(ProducerPolicy::ALL),
            prop::sample::select(TimestampingMode::ALL),
            any::<bool>(),
            prop_oneof![Just(0u64), any::<u64>()],
            any::<u64>(),
            BATCH_MAX_BYTES_RANGE,
            any::<u32>(),
            BATCH_MAX_DELAY_MS_RANGE,
            any::<u64>(),
        )
            .prop_map(
                |(class, policy, mode, uncapped, age, bytes, bmb, bmr, delay, rate)| {
                    StreamOptions {
                        class,
                        producer_policy: policy,
                        timestamping_mode: mode,
                        timestamping_uncapped: uncapped,
                        // Keep the pair legal: uncapped streams have no age retention.
                        retention_max_age_ms: if uncapped { 0 } else { age },
                        retention_max_bytes: bytes,
                        batch_max_bytes: bmb,
                        batch_max_records: bmr,
                        batch_max_delay_ms: delay,
                        throughput_max_bytes_per_second: rate,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn empty_request_and_empty_patch_change_nothing(options in any_options()) {
            prop_assert_eq!(options.with_request(&StreamOptionsRequest::default())?, options);
            prop_assert_eq!(options.with_patch(&StreamOptionsPatch::default())?, options);
        }

        #[test]
        fn a_patch_of_every_current_value_changes_nothing(options in any_options()) {
            let patch = StreamOptionsPatch {
                class: Some(options.class),
                producer_policy: Some(options.producer_policy),
                timestamping_mode: Some(options.timestamping_mode),
                timestamping_uncapped: Some(options.timestamping_uncapped),
                retention_max_age_ms: Some(options.retention_max_age_ms),
                retention_max_bytes: Some(options.retention_max_bytes),
                batch_max_bytes: Some(u64::from(options.batch_max_bytes)),
                batch_max_records: Some(u64::from(options.batch_max_records)),
                batch_max_delay_ms: Some(u64::from(options.batch_max_delay_ms)),
                throughput_max_bytes_per_second: Some(options.throughput_max_bytes_per_second),
            };
            prop_assert_eq!(options.with_patch(&patch)?, options);
        }

        #[test]
        fn results_are_always_valid(
            options in any_options(),
            age in prop_oneof![Just(0u64), 1..u64::MAX],
            bmb in any::<u64>(),
            uncapped in any::<bool>(),
        ) {
            let request = StreamOptionsRequest {
                timestamping_uncapped: uncapped,
                retention_max_age_ms: age,
                batch_max_bytes: bmb,
                ..Default::default()
            };
            if let Ok(created) = options.with_request(&request) {
                prop_assert!(created.validate().is_ok());
            }
            let patch = StreamOptionsPatch {
                retention_max_age_ms: Some(age),
                batch_max_bytes: Some(bmb),
                ..Default::default()
            };
            if let Ok(patched) = options.with_patch(&patch) {
                prop_assert!(patched.validate().is_ok());
            }
        }
    }
}
