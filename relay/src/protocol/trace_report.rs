//! Counts the malformed trace context of a batch's messages and says so in the log at most once
//! a minute per process: a producer that writes a bad traceparent writes it on every row, and a
//! line per message (or per batch of every worker) would drown the log. The messages themselves
//! go out without the bad header; the metric counts every one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::broker::Message;
use crate::broker::trace_context::Dropped;
use crate::metrics::Metrics;

/// How often the log says that malformed trace context goes on arriving.
pub const SAY_EVERY: Duration = Duration::from_secs(60);

/// When the line was last said, and how many were dropped since: shared by the process's
/// workers (a process-wide state, like the metric it goes with).
static SAID: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

/// Counts what `messages` dropped; logs the first drop, then once per [`SAY_EVERY`].
pub fn count_dropped<'m, 'a: 'm>(
    messages: impl Iterator<Item = &'m Message<'a>>,
    metrics: &Metrics,
) {
    let mut first: Option<(uuid::Uuid, Dropped)> = None;
    let mut dropped = 0u64;
    for message in messages {
        if let Some(bad) = message.trace.dropped {
            metrics
                .trace_context_invalid
                .with_label_values(&[bad.field.label()])
                .inc();
            first.get_or_insert((message.id, bad));
            dropped += 1;
        }
    }
    let Some((id, bad)) = first else {
        return;
    };
    let now = Instant::now();
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    let (since, unsaid) = match *said {
        Some((at, unsaid)) if now.duration_since(at) < SAY_EVERY => {
            *said = Some((at, unsaid + dropped));
            return;
        }
        Some((at, unsaid)) => (Some(now.duration_since(at)), unsaid + dropped),
        None => (None, dropped),
    };
    *said = Some((now, 0));
    drop(said);
    warn!(
        row = %id,
        header = bad.field.label(),
        dropped = unsaid,
        since_secs = since.map(|d| d.as_secs()),
        "malformed W3C trace context in the outbox: the {} of row {id} {}; its message went \
         without it (outbox_relay_trace_context_invalid_total counts them; said at most once a \
         minute)",
        bad.field.label(),
        bad.reason,
    );
}
