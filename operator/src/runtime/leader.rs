//! Leader election on a coordination/v1 Lease, so that two operator replicas never reconcile
//! at once. The rules are client-go's: the holder renews every few seconds; anyone may take a
//! lease whose renewal is older than its duration; every write carries the resourceVersion it
//! read, so of two candidates racing for the same lease exactly one wins (the other gets 409).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub name: String,
    /// Who we are in `holderIdentity`; the pod name, so `kubectl get lease` tells which pod leads.
    pub identity: String,
    /// How long a lease lasts without renewal before others may take it.
    pub lease_duration: Duration,
    /// How often the holder renews, and how often a candidate retries.
    pub retry_period: Duration,
}

impl LeaseSettings {
    pub fn new(name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(4),
        }
    }
}

/// What to do with the lease as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Nobody holds it, or the holder let it expire: take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a live lease.
    Wait { holder: String },
}

/// Pure rule of the election, for one look at the lease.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> LeaseDecision {
    let Some(spec) = spec else {
        return LeaseDecision::Acquire;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder.is_empty() {
        return LeaseDecision::Acquire;
    }
    if holder == identity {
        return LeaseDecision::Renew;
    }
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(15).into());
    match &spec.renew_time {
        Some(MicroTime(renewed)) if *renewed + duration > now => LeaseDecision::Wait { holder },
        _ => LeaseDecision::Acquire,
    }
}

/// One election round: true when we hold the lease afterwards.
pub async fn try_acquire_or_renew(
    leases: &Api<Lease>,
    settings: &LeaseSettings,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let duration_seconds = i32::try_from(settings.lease_duration.as_secs()).unwrap_or(15);
    let Some(current) = leases.get_opt(&settings.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.identity.clone()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return conflict_means_lost(leases.create(&PostParams::default(), &lease).await);
    };
    let mut next = current.clone();
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    match decide(current.spec.as_ref(), &settings.identity, now) {
        LeaseDecision::Wait { .. } => return Ok(false),
        LeaseDecision::Renew => {}
        LeaseDecision::Acquire => {
            spec.holder_identity = Some(settings.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
    }
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(MicroTime(now));
    conflict_means_lost(
        leases
            .replace(&settings.name, &PostParams::default(), &next)
            .await,
    )
}

/// Gives the lease up on shutdown, so a standby takes over at once instead of after the
/// lease duration.
pub async fn release(leases: &Api<Lease>, settings: &LeaseSettings) -> Result<(), kube::Error> {
    let Some(mut lease) = leases.get_opt(&settings.name).await? else {
        return Ok(());
    };
    let ours = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(settings.identity.as_str());
    if !ours {
        return Ok(());
    }
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.renew_time = None;
    }
    leases
        .replace(&settings.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

fn conflict_means_lost(result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_or_empty_lease_is_taken() {
        assert_eq!(decide(None, "me", at(100)), LeaseDecision::Acquire);
        assert_eq!(
            decide(Some(&LeaseSpec::default()), "me", at(100)),
            LeaseDecision::Acquire
        );
    }

    #[test]
    fn the_holder_renews() {
        assert_eq!(
            decide(Some(&held_by("me", 0)), "me", at(100)),
            LeaseDecision::Renew
        );
    }

    #[test]
    fn a_live_lease_of_another_holder_is_respected() {
        assert_eq!(
            decide(Some(&held_by("other", 90)), "me", at(100)),
            LeaseDecision::Wait {
                holder: "other".into()
            }
        );
    }

    #[test]
    fn an_expired_lease_is_taken_over() {
        assert_eq!(
            decide(Some(&held_by("other", 80)), "me", at(100)),
            LeaseDecision::Acquire
        );
    }

    #[tokio::test]
    async fn a_race_lost_on_create_is_not_an_error() {
        use crate::test_support::api_server::{Reply, Step, finish, serve};
        let (service, handle) = crate::test_support::mock_service::pair();
        let client = kube::Client::new(service, "ops");
        let leases: Api<Lease> = Api::namespaced(client, "ops");
        let path = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";
        let server = serve(
            handle,
            vec![
                Step::get(format!("{path}/op"), Reply::not_found("leases", "op")),
                Step::new(http::Method::POST, path, |body| {
                    assert_eq!(body["spec"]["holderIdentity"], "pod-a");
                    Reply {
                        status: http::StatusCode::CONFLICT,
                        body: serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "AlreadyExists", "code": 409, "message": "exists"}),
                    }
                }),
            ],
        );
        let won = try_acquire_or_renew(&leases, &LeaseSettings::new("op", "pod-a"))
            .await
            .unwrap();
        assert!(!won);
        drop(leases);
        finish(server).await;
    }
}
