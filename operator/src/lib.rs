//! The outbox relay operator: the `OutboxRelay` custom resource, its reconciler and the
//! process around it.
//!
//! Three folders, importing one way (runtime → reconcile → crd):
//! - [`crd`]: the resource, its defaults and the generated CustomResourceDefinition;
//! - [`reconcile`]: the pipeline that turns one OutboxRelay into a migrated table, a Deployment
//!   and a status, one module per step (its helpers beneath it), run by its driver;
//! - [`runtime`]: the process — the controller's watches, leader election, the health and
//!   metrics server, logging.
//!
//! [`metrics`] sits beside them: the reconciler counts into it and the server exposes it.

pub mod crd;
pub mod metrics;
pub mod reconcile;
pub mod runtime;

pub use crd::{OutboxRelay, OutboxRelaySpec, OutboxRelayStatus};
pub use reconcile::{Context, Error, Settings, error_policy, reconcile};

#[cfg(test)]
mod test_support;
