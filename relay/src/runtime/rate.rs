//! The process's rate limit: `--max-rate`, and the per-pod share of an OutboxRelay's
//! `spec.relay.maxRate` that the operator writes into the limits table. One GCRA limiter
//! (the `governor` crate) is shared by every worker of the process; the limit in force is the
//! smaller of the two, or none.
//!
//! The limit holds at batch granularity, and a worker waits for its permits before it claims,
//! never while it holds row locks: a wait with rows locked would stall their keys under per-key
//! ordering, and the other workers would skip them. Permits are paid in advance and kept as
//! the worker's credit: before a claim the worker tops its credit up to the claim size and
//! claims at most that many rows; the rows it claimed are spent, the rest stays for the next
//! claim. So a claim that comes back short (a nearly empty table) wastes nothing and costs
//! the next claim no wait, and over any window the rows claimed never exceed the permits
//! granted, which GCRA bounds by `rate × window + burst` (governor has no refund, and none is
//! needed). Rows are counted as claimed, not as confirmed: a row that goes again (a nack, a
//! broker outage) is paid again, which errs below the limit, never above.
//!
//! The claim size (and the burst) is the batch size, or one second of the limit when that is
//! smaller: at `--max-rate 10` a worker claims 10 rows at a time, since 500 at once would be
//! 50 seconds of the limit in one burst.
//!
//! With no limit in force a worker checks one atomic flag per batch and takes no permit.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio_util::sync::CancellationToken;

use crate::defaults::MAX_RATE_RANGE;

/// One limiter at one rate. Replaced, never reconfigured, when the rate changes.
struct Limiter {
    rate: f64,
    /// Rows per claim, and the limiter's burst: the batch size, or one second of the rate.
    claim: u32,
    gcra: DefaultDirectRateLimiter,
}

impl Limiter {
    fn new(rate: f64, batch_size: usize) -> Self {
        let claim = claim_size(rate, batch_size);
        let period = Duration::from_secs_f64(
            1.0 / rate.clamp(*MAX_RATE_RANGE.start(), *MAX_RATE_RANGE.end()),
        );
        let burst = NonZeroU32::new(claim).expect("claim_size is at least 1");
        let quota = Quota::with_period(period)
            .expect("a rate within MAX_RATE_RANGE has a period above zero")
            .allow_burst(burst);
        Self {
            rate,
            claim,
            gcra: RateLimiter::direct(quota),
        }
    }

    /// Spends the burst a new limiter starts with, so a change of rate never lets an extra
    /// burst through: the first permits come at the new rate.
    fn drained(self) -> Self {
        let burst = NonZeroU32::new(self.claim).expect("claim is at least 1");
        let _ = self.gcra.check_n(burst);
        self
    }
}

/// Rows one claim takes under `rate`: the batch size, or one second of the rate when that is
/// smaller; at least one.
pub fn claim_size(rate: f64, batch_size: usize) -> u32 {
    let second = rate.floor().clamp(1.0, f64::from(u32::MAX)) as u32;
    let batch = u32::try_from(batch_size.max(1)).unwrap_or(u32::MAX);
    second.min(batch)
}

/// The limit shared by every worker of a process, and what it cost them.
pub struct RateGate {
    /// `--max-rate`: never exceeded, whatever share the operator writes.
    ceiling: Option<f64>,
    batch_size: usize,
    /// The operator's per-pod share, as last read.
    share: RwLock<Option<f64>>,
    /// Set while a limit is in force: the one check a batch makes when there is none.
    limited: AtomicBool,
    limiter: RwLock<Option<Arc<Limiter>>>,
    /// Nanoseconds the workers waited for permits since the last report, summed over workers.
    waited_nanos: AtomicU64,
    wait_seconds_total: prometheus::Counter,
    limit_gauge: prometheus::Gauge,
}

/// What happened to the limit when the share was read again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitChange {
    Unchanged,
    /// A new limit in force (messages per second), or None: no limit any more.
    Now(Option<f64>),
}

impl RateGate {
    pub fn new(
        ceiling: Option<f64>,
        batch_size: usize,
        wait_seconds_total: prometheus::Counter,
        limit_gauge: prometheus::Gauge,
    ) -> Self {
        let gate = Self {
            ceiling,
            batch_size,
            share: RwLock::new(None),
            limited: AtomicBool::new(false),
            limiter: RwLock::new(None),
            waited_nanos: AtomicU64::new(0),
            wait_seconds_total,
            limit_gauge,
        };
        gate.install(ceiling, false);
        gate
    }

    /// The limit in force, in messages per second; None: none.
    pub fn in_force(&self) -> Option<f64> {
        self.current().map(|limiter| limiter.rate)
    }

    /// The rows a claim takes under the limit in force (the batch size without one).
    pub fn claim_size(&self) -> usize {
        self.current()
            .map_or(self.batch_size, |limiter| limiter.claim as usize)
    }

    /// Takes the per-pod share read from the limits table (None: no row, so no share) and
    /// installs the smaller of it and `--max-rate` when that changed.
    pub fn set_share(&self, share: Option<f64>) -> LimitChange {
        // A share outside what --max-rate accepts is clamped into it: the operator writes at
        // least 1 msg/s, and a hand-written row must not make the limiter panic.
        let share = share
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| s.clamp(*MAX_RATE_RANGE.start(), *MAX_RATE_RANGE.end()));
        *self.share.write().expect("share lock") = share;
        let wanted = match (self.ceiling, share) {
            (Some(c), Some(s)) => Some(c.min(s)),
            (c, s) => c.or(s),
        };
        if wanted == self.in_force() {
            return LimitChange::Unchanged;
        }
        self.install(wanted, true);
        LimitChange::Now(wanted)
    }

    fn install(&self, rate: Option<f64>, drain: bool) {
        let limiter = rate.map(|rate| {
            let limiter = Limiter::new(rate, self.batch_size);
            Arc::new(if drain { limiter.drained() } else { limiter })
        });
        *self.limiter.write().expect("limiter lock") = limiter;
        self.limited.store(rate.is_some(), Ordering::Release);
        self.limit_gauge.set(rate.unwrap_or(0.0));
    }

    fn current(&self) -> Option<Arc<Limiter>> {
        if !self.limited.load(Ordering::Acquire) {
            return None;
        }
        self.limiter.read().expect("limiter lock").clone()
    }

    /// Before a claim: tops the worker's `credit` up to the claim size, waiting for the
    /// permits it lacks, and returns how many rows the claim may take. None when shutdown
    /// came first (no claim then).
    pub async fn before_claim(
        &self,
        credit: &mut u32,
        shutdown: &CancellationToken,
    ) -> Option<usize> {
        let Some(limiter) = self.current() else {
            return Some(self.batch_size);
        };
        // Credit beyond the claim size (left from a higher limit) is dropped: kept, it would
        // let a claim through above the new limit's burst.
        *credit = (*credit).min(limiter.claim);
        let lacking = limiter.claim - *credit;
        if let Some(lacking) = NonZeroU32::new(lacking) {
            let started = Instant::now();
            // Only a wait that slept counts: the check itself takes nanoseconds.
            let mut slept = false;
            // lacking ≤ claim = burst, so capacity always suffices; Err(InsufficientCapacity)
            // cannot happen, and is treated as "go ahead" rather than a panic.
            while let Ok(Err(not_yet)) = limiter.gcra.check_n(lacking) {
                let wait = not_yet.wait_time_from(limiter.gcra.clock().now());
                slept = true;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => {
                        self.waited(started.elapsed());
                        return None;
                    }
                }
            }
            if slept {
                self.waited(started.elapsed());
            }
            *credit = limiter.claim;
        }
        Some(limiter.claim as usize)
    }

    /// After a claim of `claimed` rows: they are spent.
    pub fn after_claim(&self, credit: &mut u32, claimed: usize) {
        let claimed = u32::try_from(claimed).unwrap_or(u32::MAX);
        *credit = credit.saturating_sub(claimed);
    }

    fn waited(&self, waited: Duration) {
        if waited.is_zero() {
            return;
        }
        self.wait_seconds_total.inc_by(waited.as_secs_f64());
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Seconds the workers waited for permits since the last call, summed over workers: what
    /// the lag report says about the interval.
    pub fn take_waited_seconds(&self) -> f64 {
        self.waited_nanos.swap(0, Ordering::Relaxed) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(ceiling: Option<f64>, batch: usize) -> RateGate {
        RateGate::new(
            ceiling,
            batch,
            prometheus::Counter::new("w", "w").unwrap(),
            prometheus::Gauge::new("g", "g").unwrap(),
        )
    }

    #[test]
    fn claims_are_the_batch_or_one_second_of_the_limit() {
        assert_eq!(claim_size(10.0, 500), 10);
        assert_eq!(claim_size(2.5, 500), 2);
        assert_eq!(claim_size(1.0, 500), 1);
        assert_eq!(claim_size(5_000.0, 500), 500);
        assert_eq!(claim_size(0.5, 500), 1);
        assert_eq!(gate(None, 500).claim_size(), 500);
        assert_eq!(gate(Some(20.0), 500).claim_size(), 20);
    }

    #[test]
    fn the_limit_in_force_is_the_smaller_of_the_ceiling_and_the_share() {
        let g = gate(Some(100.0), 500);
        assert_eq!(g.in_force(), Some(100.0));
        assert_eq!(g.limit_gauge.get(), 100.0);
        assert_eq!(g.set_share(Some(40.0)), LimitChange::Now(Some(40.0)));
        assert_eq!(g.set_share(Some(40.0)), LimitChange::Unchanged);
        assert_eq!(g.set_share(Some(400.0)), LimitChange::Now(Some(100.0)));
        assert_eq!(g.set_share(None), LimitChange::Unchanged);
        let free = gate(None, 500);
        assert_eq!(free.in_force(), None);
        assert_eq!(free.limit_gauge.get(), 0.0);
        assert_eq!(free.set_share(Some(30.0)), LimitChange::Now(Some(30.0)));
        assert_eq!(free.set_share(None), LimitChange::Now(None));
        // Rows written by hand cannot break the limiter.
        for odd in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            assert_eq!(free.set_share(Some(odd)), LimitChange::Unchanged, "{odd}");
        }
        assert_eq!(free.set_share(Some(1e-9)), LimitChange::Now(Some(1.0)));
    }

    #[tokio::test]
    async fn credit_carries_over_and_the_wait_is_counted() {
        let g = gate(Some(100.0), 500);
        let stop = CancellationToken::new();
        let mut credit = 0;
        // The first claim uses the burst (one second's worth: 100 rows) at once.
        assert_eq!(g.before_claim(&mut credit, &stop).await, Some(100));
        assert_eq!(credit, 100);
        // Only 30 rows were there: 70 permits stay, so the next claim waits for 30 only.
        g.after_claim(&mut credit, 30);
        assert_eq!(credit, 70);
        let started = Instant::now();
        assert_eq!(g.before_claim(&mut credit, &stop).await, Some(100));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(waited < Duration::from_millis(900), "{waited:?}");
        assert!(g.take_waited_seconds() > 0.2);
        assert_eq!(g.take_waited_seconds(), 0.0);
        assert!(g.wait_seconds_total.get() > 0.2);
        // An empty claim costs nothing next time.
        g.after_claim(&mut credit, 0);
        assert_eq!(g.before_claim(&mut credit, &stop).await, Some(100));
        assert_eq!(g.take_waited_seconds(), 0.0);
    }

    #[tokio::test]
    async fn shutdown_ends_a_wait() {
        let g = gate(Some(1.0), 500);
        let stop = CancellationToken::new();
        let mut credit = 0;
        assert_eq!(g.before_claim(&mut credit, &stop).await, Some(1));
        g.after_claim(&mut credit, 1);
        stop.cancel();
        let started = Instant::now();
        assert_eq!(g.before_claim(&mut credit, &stop).await, None);
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    #[tokio::test]
    async fn without_a_limit_nothing_waits() {
        let g = gate(None, 500);
        let stop = CancellationToken::new();
        let mut credit = 0;
        for _ in 0..1000 {
            assert_eq!(g.before_claim(&mut credit, &stop).await, Some(500));
        }
        assert_eq!(g.take_waited_seconds(), 0.0);
    }

    #[tokio::test]
    async fn a_new_limit_brings_no_extra_burst() {
        let g = gate(Some(1_000.0), 500);
        let stop = CancellationToken::new();
        let mut credit = 0;
        assert_eq!(g.set_share(Some(10.0)), LimitChange::Now(Some(10.0)));
        let started = Instant::now();
        assert_eq!(g.before_claim(&mut credit, &stop).await, Some(10));
        // The drained limiter lets 10 rows through only after one second of the new rate.
        assert!(
            started.elapsed() >= Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
    }
}
