//! `Ticker`: the pace of a shard's periodic duties (settling, age retention).
//!
//! A duty's ticks start an interval apart, whatever each tick's work took, and a tick
//! whose work overran the interval is followed at once. A fixed pause after the work
//! instead stretched the period by the work's length: a settler whose settles took
//! longer than its interval planned nothing for a whole interval more, and a small cache
//! turned over in that time (docs/benchmarks.md).

use std::time::{Duration, Instant};

pub(super) struct Ticker {
    interval: Duration,
    last: Instant,
}

impl Ticker {
    /// A ticker whose first tick is an interval from now.
    pub(super) fn new(interval: Duration) -> Self {
        Self { interval, last: Instant::now() }
    }

    /// Waits for the next tick: an interval after the last one began, or now if that
    /// has passed already.
    pub(super) async fn tick(&mut self) {
        glommio::timer::sleep(self.interval.saturating_sub(self.last.elapsed())).await;
        self.last = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use glommio::{LocalExecutorBuilder, Placement};

    use super::*;

    /// Ticks an interval apart while the work is short; after work that overran, the
    /// next tick at once, and the one after an interval later again. The margins (40% of
    /// the interval) leave room for a loaded machine; a fixed pause after the work would
    /// miss both by 60%.
    #[test]
    fn ticks_keep_their_rate_and_an_overrun_is_followed_at_once() {
        let executor = LocalExecutorBuilder::new(Placement::Unbound).make().expect("executor");
        executor.run(async {
            let interval = Duration::from_millis(100);
            let margin = interval * 2 / 5;
            let mut ticker = Ticker::new(interval);
            let start = Instant::now();
            ticker.tick().await;
            assert!(start.elapsed() >= interval, "the first tick is an interval away");

            // Work of 60% of the interval: the next tick is an interval after this one
            // began, not after the work ended.
            let began = Instant::now();
            glommio::timer::sleep(interval * 3 / 5).await;
            ticker.tick().await;
            let period = began.elapsed();
            assert!(period >= interval && period < interval + margin, "{period:?}");

            // Work that overran: the next tick comes at once.
            glommio::timer::sleep(interval * 3).await;
            let overran = Instant::now();
            ticker.tick().await;
            assert!(overran.elapsed() < margin, "{:?}", overran.elapsed());

            // And the rate holds after it.
            let began = Instant::now();
            ticker.tick().await;
            assert!(began.elapsed() >= interval - margin, "{:?}", began.elapsed());
        });
    }
}
