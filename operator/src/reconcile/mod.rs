//! The reconcile pipeline: one module per step, each marked by what it touches. The folder
//! shows the pipeline: each step at this level, in the order below, with its helpers beneath
//! it; [`driver`] runs the steps and holds what they share, [`database`] is the database they
//! go through.
//!
//! | step | module | touches |
//! |---|---|---|
//! | dereference the Secrets | [`input::dereference`] | API server |
//! | validate the spec into a plan | [`input::validate`] | pure |
//! | migrate the table, once per generation | [`migrate`] | database |
//! | observe the Deployment, its pods ([`observe::pods`]) and the lag | [`observe`] | API server, database |
//! | recommend the replicas | [`scaling::recommend`] ([`scaling::autoscaler`]) | pure |
//! | divide `spec.relay.maxRate` among the pods | [`scaling::rate_share`] | database |
//! | build the Deployment | [`build`] | pure |
//! | apply it, when it changed | [`apply`] | API server |
//! | compute and write the status | [`status`] ([`status::conditions`], [`status::progress`], [`status::table_health`], [`status::suspension`]), [`apply`] | pure, API server |
//! | on deletion: stop the pods, clean up the database | [`cleanup`] | API server, database |
//!
//! [`driver`] runs the steps in that order, behind kube-runtime's finalizer helper: a relay
//! being deleted goes to [`cleanup`] instead. The replicas are recommended before the build, so
//! a scale and a template change are one write, not two. What the steps share is beneath the
//! driver: the [`Context`] ([`driver::context`]), the [`Error`] ([`driver::error`]) and the
//! per-relay memories ([`driver::memory`]); the events are announced with the status
//! ([`status::events`]). The database steps go through the [`database::RelayDatabase`] trait
//! in the [`Context`]: PostgreSQL in production, a scripted stand-in in the request-level
//! tests (`driver/pipeline_tests/`; the PostgreSQL side is tested against a real server in
//! `operator/tests/`).

pub mod input;

pub mod migrate;

pub mod observe;

pub mod scaling;

pub mod build;

pub mod apply;

pub mod status;

pub mod cleanup;

pub mod database;

pub mod driver;

pub use driver::context::{Context, Settings};
pub use driver::error::Error;
pub use driver::{error_policy, reconcile};
