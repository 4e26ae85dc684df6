//! The outbox relay operator: the `OutboxRelay` custom resource, its reconciler and the
//! process around it (metrics, health, leader election).
//!
//! One module per concern: the resource ([`crd`], [`crdgen`]), the reconcile steps
//! ([`secrets`], [`validation`], [`migration`], [`deployment`], [`status`]), their
//! composition ([`controller`]), and the process ([`metrics`], [`telemetry`], [`leader`],
//! [`server`]).

pub mod autoscaler;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod crdgen;
pub mod deployment;
pub mod error;
pub mod events;
pub mod lag;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod run;
pub mod scaling;
pub mod secrets;
pub mod server;
pub mod status;
pub mod telemetry;
pub mod validation;

pub use controller::{Context, Settings, error_policy, reconcile};
pub use crd::{OutboxRelay, OutboxRelaySpec, OutboxRelayStatus};
pub use error::Error;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod reconcile_tests;
#[cfg(test)]
mod test_support;
