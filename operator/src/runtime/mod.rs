//! The operator process: the controller and its watches, leader election, the health and
//! metrics server, and logging. Everything here drives [`crate::reconcile`]; nothing there
//! knows about this.

pub mod api_requests;
pub mod controller;
pub mod crd_apply;
pub mod leader;
pub mod run;
pub mod server;
pub mod storage_migration;
pub mod telemetry;
