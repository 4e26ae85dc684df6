//! `?watch=true`: newline-delimited JSON watch events, replayed from the history after the
//! requested resourceVersion and then live, until `timeoutSeconds` passes. With
//! `allowWatchBookmarks=true`, a quiet watch gets a BOOKMARK every second, so a client resumes
//! from a recent resourceVersion rather than replaying everything since its last event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::json;
use tokio::time::Instant;

use super::kinds::Kind;
use super::selector::Selector;
use super::store::Store;

/// What one watch request asks for.
pub struct WatchRequest {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: Selector,
    /// `None` or 0: start with ADDED for every current object, as the API server does.
    pub since: Option<u64>,
    pub timeout: Duration,
    pub bookmarks: bool,
}

/// Quiet time after which a watch that allows bookmarks gets one.
const BOOKMARK_AFTER: Duration = Duration::from_secs(1);

struct WatchState {
    store: Arc<Mutex<Store>>,
    request: WatchRequest,
    wake: tokio::sync::watch::Receiver<u64>,
    last_seen: u64,
    ready: VecDeque<Bytes>,
    deadline: Instant,
    finished: bool,
}

pub fn watch_stream(
    store: Arc<Mutex<Store>>,
    request: WatchRequest,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let (wake, last_seen, ready, finished) = {
        let guard = store.lock().unwrap();
        // Subscribe under the lock, so no change between the snapshot and the wait is missed.
        let wake = guard.subscribe();
        match request.since.filter(|rv| *rv > 0) {
            Some(since) => match guard.changes_since(request.kind, since) {
                Ok(_) => (wake, since, VecDeque::new(), false),
                Err(gone) => {
                    let line = event_line("ERROR", &gone.status());
                    (wake, since, VecDeque::from([line]), true)
                }
            },
            None => {
                let (objects, version) = guard.list(
                    request.kind,
                    request.namespace.as_deref(),
                    &request.labels,
                    &request.fields,
                );
                let lines = objects.iter().map(|o| event_line("ADDED", o)).collect();
                (wake, version, lines, false)
            }
        }
    };
    let state = WatchState {
        store,
        deadline: Instant::now() + request.timeout,
        request,
        wake,
        last_seen,
        ready,
        finished,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(line) = state.ready.pop_front() {
                return Some((Ok(line), state));
            }
            if state.finished {
                return None;
            }
            state.wake.borrow_and_update();
            state.collect_changes();
            if !state.ready.is_empty() {
                continue;
            }
            let bookmark_at = if state.request.bookmarks {
                (Instant::now() + BOOKMARK_AFTER).min(state.deadline)
            } else {
                state.deadline
            };
            tokio::select! {
                changed = state.wake.changed() => if changed.is_err() { return None },
                _ = tokio::time::sleep_until(bookmark_at) => {
                    if Instant::now() >= state.deadline {
                        return None;
                    }
                    let bookmark = state.bookmark();
                    state.ready.push_back(bookmark);
                }
            }
        }
    })
}

impl WatchState {
    fn collect_changes(&mut self) {
        let store = self.store.lock().unwrap();
        let changes = store.changes_since(self.request.kind, self.last_seen);
        // Everything up to the current version has now been looked at, whatever its kind.
        let newest = store.resource_version();
        drop(store);
        let changes = match changes {
            Ok(changes) => changes,
            Err(gone) => {
                self.ready.push_back(event_line("ERROR", &gone.status()));
                self.finished = true;
                return;
            }
        };
        for change in changes {
            self.last_seen = change.resource_version;
            let object = &change.object;
            let in_namespace = self
                .request
                .namespace
                .as_deref()
                .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns));
            if in_namespace
                && self.request.labels.matches_labels(object)
                && self.request.fields.matches_fields(object)
            {
                self.ready
                    .push_back(event_line(change.change.as_str(), object));
            }
        }
        self.last_seen = self.last_seen.max(newest);
    }

    /// A BOOKMARK: only the kind and the resourceVersion the client may resume from.
    fn bookmark(&self) -> Bytes {
        event_line(
            "BOOKMARK",
            &json!({
                "apiVersion": self.request.kind.api_version(),
                "kind": self.request.kind.kind,
                "metadata": {"resourceVersion": self.last_seen.to_string()},
            }),
        )
    }
}

fn event_line(kind: &str, object: &serde_json::Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object}))
        .expect("JSON values serialize");
    line.push(b'\n');
    Bytes::from(line)
}
