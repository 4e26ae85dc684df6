//! Delivery suspended and resumed while the process runs (SIGUSR1 and SIGUSR2 for `run`, see
//! `cli::signals`): the workers finish the batch in hand and claim nothing until resumed; the
//! reporter, the HTTP endpoints and the connections stay up, so the backlog is still measured
//! and `/readyz` still says whether the relay could deliver.
//!
//! A watch channel, not a flag polled on a timer: a suspended worker sleeps until the state
//! changes, and a running one pays one uncontended read per batch.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// The sending side: whoever decides (the signal thread) turns delivery off and on.
#[derive(Debug)]
pub struct SuspendSwitch(watch::Sender<bool>);

impl SuspendSwitch {
    /// Suspends (`true`) or resumes (`false`) delivery; the same state twice is no change.
    pub fn set(&self, suspended: bool) {
        self.0.send_if_modified(|state| {
            let changed = *state != suspended;
            *state = suspended;
            changed
        });
    }
}

/// The receiving side, one clone per worker and one for the announcer.
#[derive(Debug, Clone)]
pub struct Suspension(watch::Receiver<bool>);

/// A switch and its receivers, delivery running.
pub fn switch() -> (SuspendSwitch, Suspension) {
    let (sender, receiver) = watch::channel(false);
    (SuspendSwitch(sender), Suspension(receiver))
}

impl Default for Suspension {
    /// Never suspended: for a process nobody can suspend.
    fn default() -> Self {
        Suspension(watch::channel(false).1)
    }
}

impl Suspension {
    pub fn is_suspended(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns at once while delivery runs; while suspended, waits until it is resumed or
    /// `shutdown` comes. True when it waited, so the caller starts its round afresh.
    pub async fn wait_while_suspended(&mut self, shutdown: &CancellationToken) -> bool {
        if !self.is_suspended() {
            return false;
        }
        tokio::select! {
            // Err: the switch is gone (the process is ending); shutdown follows.
            _ = self.0.wait_for(|suspended| !suspended) => {}
            _ = shutdown.cancelled() => {}
        }
        true
    }

    /// Keeps `gauge` at 1 while suspended and says each change once, until `shutdown`.
    pub async fn announce(mut self, gauge: prometheus::IntGauge, shutdown: CancellationToken) {
        let mut announced = false;
        loop {
            let suspended = *self.0.borrow_and_update();
            gauge.set(i64::from(suspended));
            if suspended != announced {
                if suspended {
                    info!(
                        "delivery suspended (SIGUSR1): workers finish their batches in flight and claim nothing until SIGUSR2; the backlog is still measured"
                    );
                } else {
                    info!("delivery resumed (SIGUSR2)");
                }
                announced = suspended;
            }
            tokio::select! {
                changed = self.0.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_suspended_worker_waits_until_resumed() {
        let (switch, mut suspension) = switch();
        let shutdown = CancellationToken::new();
        assert!(!suspension.wait_while_suspended(&shutdown).await);
        switch.set(true);
        let mut waiting = suspension.clone();
        let stop = shutdown.clone();
        let waiter = tokio::spawn(async move { waiting.wait_while_suspended(&stop).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "claimed while suspended");
        switch.set(false);
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("resumed in time")
            .unwrap();
        assert!(waited);
        assert!(!suspension.wait_while_suspended(&shutdown).await);
    }

    #[tokio::test]
    async fn shutdown_ends_a_suspension_wait() {
        let (switch, mut suspension) = switch();
        switch.set(true);
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            suspension.wait_while_suspended(&shutdown),
        )
        .await
        .expect("shutdown ends the wait");
        assert!(waited);
    }

    #[tokio::test]
    async fn the_gauge_follows_the_switch() {
        let (switch, suspension) = switch();
        let gauge = prometheus::IntGauge::new("suspended", "test").unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(suspension.announce(gauge.clone(), shutdown.clone()));
        switch.set(true);
        switch.set(true);
        let reached = |want: i64| {
            let gauge = gauge.clone();
            async move {
                for _ in 0..100 {
                    if gauge.get() == want {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            }
        };
        assert!(reached(1).await);
        switch.set(false);
        assert!(reached(0).await);
        shutdown.cancel();
        task.await.unwrap();
    }
}
