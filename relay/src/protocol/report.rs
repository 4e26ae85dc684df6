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
    /// The claim position (occurred-at) of the batch's first row, where nothing before it was
    /// pending for this worker; None when that row has no occurred-at.
    pub first_claimed: Option<DateTime<Utc>>,
    /// The claim position (occurred-at) of the batch's last row, for the next claim to seek
    /// from; None when that row has no occurred-at.
    pub last_claimed: Option<DateTime<Utc>>,
    /// How long the claim statement took.
    pub claim_time: Duration,
}
