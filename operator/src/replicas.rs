//! How many relay pods to run. In manual mode that is `spec.replicas`. With `spec.scaling`, the
//! autoscaler decides; until it does (the recommend step is a separate piece of work), the
//! operator keeps what runs, within [minReplicas, maxReplicas], and starts new relays at the
//! fallback replicas: never a silent zero.
//!
//! The autoscaler slots in here: `decide_replicas` becomes "observe reports, then
//! `recommend(history, now, observation, spec)`", and its result flows into the Deployment
//! build and the status exactly as this value does.

use k8s_openapi::api::apps::v1::Deployment;

use crate::crd::OutboxRelaySpec;

/// The replicas decision and why it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaDecision {
    pub replicas: i32,
    pub source: ReplicaSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaSource {
    /// `spec.replicas` (no scaling block).
    Manual,
    /// The live Deployment's replicas, clamped to the scaling bounds.
    KeptWithinBounds,
    /// No Deployment yet: the fallback replicas, clamped to the bounds.
    Initial,
}

pub fn decide_replicas(spec: &OutboxRelaySpec, live: Option<&Deployment>) -> ReplicaDecision {
    let Some(scaling) = &spec.scaling else {
        return ReplicaDecision {
            replicas: spec.replicas.max(0),
            source: ReplicaSource::Manual,
        };
    };
    let (min, max) = (
        scaling.min_replicas.max(0),
        scaling.max_replicas.max(scaling.min_replicas.max(0)),
    );
    let running = live.and_then(|d| d.spec.replicas);
    match running {
        Some(running) => ReplicaDecision {
            replicas: running.clamp(min, max),
            source: ReplicaSource::KeptWithinBounds,
        },
        None => ReplicaDecision {
            replicas: scaling.fallback.replicas.clamp(min.max(1), max.max(1)),
            source: ReplicaSource::Initial,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ScalingSpec;
    use crate::test_support::sample_spec;
    use k8s_openapi::api::apps::v1::DeploymentSpec;

    fn running(replicas: i32) -> Deployment {
        Deployment {
            spec: DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn manual_mode_uses_spec_replicas() {
        let mut spec = sample_spec();
        spec.replicas = 4;
        assert_eq!(decide_replicas(&spec, Some(&running(9))).replicas, 4);
    }

    #[test]
    fn scaling_keeps_what_runs_within_bounds() {
        let mut spec = sample_spec();
        spec.scaling = Some(ScalingSpec {
            min_replicas: 2,
            max_replicas: 5,
            ..Default::default()
        });
        assert_eq!(decide_replicas(&spec, Some(&running(3))).replicas, 3);
        assert_eq!(decide_replicas(&spec, Some(&running(9))).replicas, 5);
        assert_eq!(decide_replicas(&spec, Some(&running(0))).replicas, 2);
        let initial = decide_replicas(&spec, None);
        assert_eq!(initial.replicas, 2);
        assert_eq!(initial.source, ReplicaSource::Initial);
    }

    #[test]
    fn a_new_relay_never_starts_at_zero() {
        let mut spec = sample_spec();
        spec.scaling = Some(ScalingSpec {
            min_replicas: 0,
            max_replicas: 3,
            ..Default::default()
        });
        assert_eq!(decide_replicas(&spec, None).replicas, 1);
    }
}
