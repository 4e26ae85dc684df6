//! Where relay pods go and how many may be taken away at once: their topology spread
//! constraints and their PodDisruptionBudget. A relay's pods share its table, so losing all of
//! them at once (one node failing, one drain) stops the relay; spreading them and budgeting
//! disruptions keeps one running.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::{Resource, ResourceExt};

use crate::crd::OutboxRelay;

/// The node label every kubelet sets to its node's name.
const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// The spec's constraints, each counting the relay's own pods when it names no selector; over
/// nodes, as a preference, when the spec has none; none for `[]`.
pub fn spread_constraints(
    relay: &OutboxRelay,
    selector: &BTreeMap<String, String>,
) -> Option<Vec<TopologySpreadConstraint>> {
    let own_pods = || LabelSelector {
        match_labels: Some(selector.clone()),
        ..Default::default()
    };
    let constraints = match &relay.spec.relay.topology_spread_constraints {
        Some(given) => given
            .iter()
            .cloned()
            .map(|mut constraint| {
                constraint.label_selector.get_or_insert_with(own_pods);
                constraint
            })
            .collect(),
        None => vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: HOSTNAME_TOPOLOGY_KEY.into(),
            when_unsatisfiable: "ScheduleAnyway".into(),
            label_selector: Some(own_pods()),
            // Counts the pods of the current ReplicaSet only, so a rollout is not skewed by
            // the pods it is about to remove.
            match_label_keys: Some(vec!["pod-template-hash".into()]),
            ..Default::default()
        }],
    };
    (!constraints.is_empty()).then_some(constraints)
}

/// The relay pods' PodDisruptionBudget, named like the relay and owned by it; `None` when the
/// spec turns it off.
pub fn disruption_budget(
    relay: &OutboxRelay,
    labels: &BTreeMap<String, String>,
    selector: &BTreeMap<String, String>,
) -> Option<PodDisruptionBudget> {
    let budget = &relay.spec.relay.disruption_budget;
    if !budget.enabled {
        return None;
    }
    Some(PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(relay.name_any()),
            namespace: relay.namespace(),
            labels: Some(labels.clone()),
            owner_references: relay.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(budget.max_unavailable.clone()),
            selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            }),
            // A pod that is not ready relays nothing: evicting it costs no availability, and
            // a budget that counted it would block the drain of a crash-looping relay.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        status: None,
    })
}
