//! The reconcile pipeline: one module per step, each marked by what it touches.
//!
//! | step | module | touches |
//! |---|---|---|
//! | dereference the Secrets | [`dereference`] | API server |
//! | validate the spec into a plan | [`validate`] | pure |
//! | migrate the table, once per generation | [`migrate`] | database |
//! | observe the Deployment, its pods ([`pods`]) and the lag | [`observe`] | API server, database |
//! | recommend the replicas | [`recommend`] ([`autoscaler`]) | pure |
//! | divide `spec.relay.maxRate` among the pods | [`rate_share`] | database |
//! | build the Deployment | [`build`] | pure |
//! | apply it, when it changed | [`apply`] | API server |
//! | compute and write the status | [`status`] ([`conditions`], [`progress`], [`table_health`], [`suspension`]), [`apply`] | pure, API server |
//! | on deletion: stop the pods, clean up the database | [`cleanup`] | API server, database |
//!
//! [`driver`] runs the steps in that order, behind kube-runtime's finalizer helper: a relay
//! being deleted goes to [`cleanup`] instead. The replicas are recommended before the build, so
//! a scale and a template change are one write, not two. The database steps go through the
//! [`database::RelayDatabase`] trait in the [`Context`]: PostgreSQL in production, a scripted
//! stand-in in the request-level tests here (the PostgreSQL side is tested against a real
//! server in `operator/tests/`).

pub mod apply;
pub mod autoscaler;
pub mod build;
pub mod cleanup;
pub mod conditions;
pub mod context;
pub mod database;
pub mod dereference;
pub mod driver;
pub mod error;
pub mod events;
pub mod memory;
pub mod migrate;
pub mod observe;
pub mod pods;
pub mod progress;
pub mod rate_share;
pub mod recommend;
pub mod status;
pub mod suspension;
pub mod table_health;
pub mod validate;

pub use context::{Context, Settings};
pub use driver::{error_policy, reconcile};
pub use error::Error;

#[cfg(test)]
mod tests;
