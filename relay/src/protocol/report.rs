//! What one batch did: the rows it claimed and how each was settled, the broker's state after
//! it, and where its claim found rows (for the claim cursor).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::broker::BrokerFailure;

#[derive(Debug, Default, Clone)]
pub struct BatchReport {
    pub claimed: usize,
    pub published: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    pub untouched: usize,
    /// Of the untouched rows, those the broker nacked: its state, not the messages' fault, so
    /// they spend no attempt and the worker pauses before trying again.
    pub nacked: usize,
    /// Set when the broker connection must be replaced before the next batch.
    pub broker_broken: Option<BrokerFailure>,
    /// What the claim found, for the claim cursor.
    pub found: ClaimFound,
}

/// What one claim found, as the claim cursor needs it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClaimFound {
    pub claimed: usize,
    /// The claim position (occurred-at) of its first row, where nothing before it was pending
    /// for this worker; None when that row has no occurred-at.
    pub first: Option<DateTime<Utc>>,
    /// The claim position of its last row, for the next claim to seek from; None when that row
    /// has no occurred-at.
    pub last: Option<DateTime<Utc>>,
    /// How long the claim statement took.
    pub time: Duration,
}
