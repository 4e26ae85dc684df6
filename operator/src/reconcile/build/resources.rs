//! The relay container's resources when `spec.relay.resources` is absent. Without requests a
//! pod is BestEffort (the first evicted under pressure) and without a memory limit a leak or a
//! batch of huge payloads takes the node's memory instead of one pod.
//!
//! Sized from `make bench` (docs/benchmarks.md): the relay's peak RSS is about 37 MiB at the
//! defaults (2 workers, batches of 500 small rows) and grows by about 10 MiB per worker. A
//! worker holds its claimed batch twice at most (the rows, and the frames at the broker), so
//! the limit leaves 64 MiB per worker for payloads above the request: 2 workers relay batches
//! of 500 rows of up to about 60 kB each. `spec.relay.resources: {}` asks for none at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Memory every pod needs whatever its workers (runtime, metrics, the report loop), and what
/// each worker adds, requested and as limit, in MiB.
const BASE_REQUEST_MIB: i32 = 32;
const REQUEST_PER_WORKER_MIB: i32 = 16;
const BASE_LIMIT_MIB: i32 = 128;
const LIMIT_PER_WORKER_MIB: i32 = 64;
/// A twentieth of a core: the relay waits on the database and the broker most of the time. No
/// CPU limit, so a busy relay is never throttled while the node has CPU to spare.
const CPU_REQUEST: &str = "50m";

/// What the relay container asks for: the spec's resources, the defaults for `workers` when
/// absent, none when the spec says `{}`.
pub fn relay_resources(
    spec: Option<&ResourceRequirements>,
    workers: i32,
) -> Option<ResourceRequirements> {
    match spec {
        Some(given) if is_empty(given) => None,
        Some(given) => Some(given.clone()),
        None => Some(default_resources(workers)),
    }
}

fn is_empty(resources: &ResourceRequirements) -> bool {
    let none = |map: &Option<BTreeMap<String, Quantity>>| map.as_ref().is_none_or(|m| m.is_empty());
    none(&resources.requests)
        && none(&resources.limits)
        && resources.claims.as_ref().is_none_or(|c| c.is_empty())
}

/// Requests of 50m CPU and 32 MiB + 16 MiB per worker; a memory limit of 128 MiB + 64 MiB
/// per worker (64 Mi and 256 Mi at the default 2 workers).
pub fn default_resources(workers: i32) -> ResourceRequirements {
    let workers = workers.max(1);
    let mib = |n: i32| Quantity(format!("{n}Mi"));
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(CPU_REQUEST.into())),
            (
                "memory".to_string(),
                mib(BASE_REQUEST_MIB + REQUEST_PER_WORKER_MIB * workers),
            ),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            mib(BASE_LIMIT_MIB + LIMIT_PER_WORKER_MIB * workers),
        )])),
        claims: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(map: &Option<BTreeMap<String, Quantity>>) -> &str {
        &map.as_ref().unwrap()["memory"].0
    }

    #[test]
    fn absent_resources_get_defaults_that_grow_with_the_workers() {
        let two = relay_resources(None, 2).unwrap();
        assert_eq!(memory(&two.requests), "64Mi");
        assert_eq!(memory(&two.limits), "256Mi");
        assert_eq!(two.requests.as_ref().unwrap()["cpu"].0, "50m");
        assert!(
            !two.limits.as_ref().unwrap().contains_key("cpu"),
            "no CPU limit"
        );
        let eight = relay_resources(None, 8).unwrap();
        assert_eq!(memory(&eight.requests), "160Mi");
        assert_eq!(memory(&eight.limits), "640Mi");
    }

    #[test]
    fn given_resources_are_kept_and_an_empty_object_means_none() {
        let given = ResourceRequirements {
            limits: Some(BTreeMap::from([("memory".into(), Quantity("1Gi".into()))])),
            ..Default::default()
        };
        assert_eq!(relay_resources(Some(&given), 2), Some(given));
        assert_eq!(
            relay_resources(Some(&ResourceRequirements::default()), 2),
            None
        );
    }
}
