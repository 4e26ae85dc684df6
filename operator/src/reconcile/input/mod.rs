//! The first two steps: what one reconcile starts from, read and checked before anything is
//! touched. Every later step works from their two results.
//!
//! - [`dereference`]: the Secrets and ConfigMaps the relay refers to, read from the API server
//!   (its tests beside it);
//! - [`validate`]: the spec checked and turned into a typed plan ([`validate::RelayPlan`]), pure.

pub mod dereference;
pub mod validate;
