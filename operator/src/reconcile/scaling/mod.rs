//! How many pods, and how fast each may go: the steps between observe and build.
//!
//! - [`recommend`]: the replicas for this round (manual, suspended, or the autoscaler's), pure;
//! - [`autoscaler`]: the replica recommendation from the scaling history, with the HPA's and
//!   KEDA's semantics, pure;
//! - [`rate_share`]: `spec.relay.maxRate` divided among the pods, written into the database's
//!   limits table.

pub mod autoscaler;
pub mod rate_share;
pub mod recommend;
