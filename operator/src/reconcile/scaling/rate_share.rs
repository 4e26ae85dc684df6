//! The rate-share step: `spec.relay.maxRate` divided among the pods, written into the limits
//! table the pods read at each report interval (a value in the pod template would roll every
//! pod at each scale).
//!
//! The share is maxRate over the larger of the replicas asked for this round and the pods
//! that still run: on a scale-up the lower share is written before the Deployment grows, so
//! the new pods start within it (they read it before their first claim); on a scale-down the
//! pods that are leaving still count until they are gone, so the remaining ones get the
//! higher share only after. The pods follow a new share within one report interval, so for at
//! most that long after a scale-up the old pods still hold the old, higher share: the sum may
//! then exceed maxRate by the new pods' shares, at most `maxRate × added / replicas`. Each pod
//! gets at least 1 msg/s (the relay's smallest limit): with more pods than maxRate the sum is
//! the pod count, which only minReplicas, the fallback or manual replicas can cause, since the
//! autoscaler runs no more pods than maxRate.

use crate::reconcile::database::RateShare;
use crate::reconcile::driver::memory::RelayMemory;

/// The smallest share a pod gets, as `--max-rate` allows.
pub const MIN_PER_POD: f64 = 1.0;

/// What was last written per relay, so a share is written only when it changes (`None`: the
/// row was removed).
pub type RateShareMemory = RelayMemory<Option<RateShare>>;

/// The share of `max_rate` each pod gets when `desired` are asked for and `running` still run.
pub fn rate_share(max_rate: f64, desired: i32, running: i32) -> RateShare {
    let pods = desired.max(running).max(1);
    RateShare {
        per_pod_rate: (max_rate / f64::from(pods)).max(MIN_PER_POD),
        max_rate,
        replicas: pods,
    }
}

/// The share to write this round, or None when the last one written still holds. `last` is
/// `None` when nothing is remembered (a fresh operator process): then the row is written, or
/// removed, once, so a limit removed from the spec while the operator was down is lifted.
pub fn share_to_write(
    wanted: Option<RateShare>,
    last: Option<Option<RateShare>>,
) -> Option<Option<RateShare>> {
    match last {
        Some(last) if last == wanted => None,
        _ => Some(wanted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_divided_among_the_larger_of_asked_and_running() {
        let share = rate_share(1_000.0, 4, 2);
        assert_eq!(share.per_pod_rate, 250.0);
        assert_eq!(share.replicas, 4);
        // Scaling down from 4 to 2: the leaving pods still count.
        assert_eq!(rate_share(1_000.0, 2, 4).per_pod_rate, 250.0);
        // Gone: the two left get half each.
        assert_eq!(rate_share(1_000.0, 2, 2).per_pod_rate, 500.0);
        // At zero pods the next pod gets it all.
        assert_eq!(rate_share(1_000.0, 0, 0).per_pod_rate, 1_000.0);
        // Fractions are kept: the sum is maxRate exactly.
        let third = rate_share(100.0, 3, 3);
        assert!((third.per_pod_rate * 3.0 - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_pod_gets_at_least_one_message_per_second() {
        let share = rate_share(3.0, 5, 5);
        assert_eq!(share.per_pod_rate, MIN_PER_POD);
        assert_eq!(share.replicas, 5);
    }

    #[test]
    fn the_sum_never_exceeds_the_limit_once_the_pods_follow() {
        for max_rate in [1.0, 7.5, 100.0, 12_345.0] {
            for desired in 0..40 {
                for running in 0..40 {
                    let share = rate_share(max_rate, desired, running);
                    let pods = f64::from(desired.max(running));
                    if max_rate >= pods {
                        assert!(share.per_pod_rate * pods <= max_rate * (1.0 + 1e-12));
                    }
                }
            }
        }
    }

    #[test]
    fn a_share_is_written_when_it_changes_and_once_after_a_restart() {
        let share = Some(rate_share(100.0, 2, 2));
        assert_eq!(share_to_write(share, None), Some(share));
        assert_eq!(share_to_write(share, Some(share)), None);
        assert_eq!(share_to_write(None, Some(share)), Some(None));
        assert_eq!(share_to_write(None, None), Some(None));
        assert_eq!(share_to_write(None, Some(None)), None);
    }
}
