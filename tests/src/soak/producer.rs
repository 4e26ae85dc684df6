//! The soak's offered load: rows inserted at a steady rate, as an application writes its outbox,
//! through the faults too. An insert that fails (PostgreSQL restarting) is not made up for: the
//! producer reconnects and goes on at the same rate, and the rows it did insert are counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox_relay::table::OutboxTable;
use outbox_relay::tools::seed::insert_at_rate;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

/// Payload size of the offered rows: the reference article's order.
const PAYLOAD_BYTES: usize = 100;

pub struct Producer {
    inserted: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Producer {
    /// Inserts `rate` rows a second into `table` on the server `url` names, until stopped.
    pub fn start(url: String, table: OutboxTable, rate: f64) -> Self {
        let inserted = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (inserted, failures, stop) = (inserted.clone(), failures.clone(), stop.clone());
            async move {
                // One second's rows per call: the rate holds across calls and reconnects.
                let per_call = rate.ceil().max(1.0) as u64;
                let mut conn: Option<PgConnection> = None;
                while !stop.load(Ordering::SeqCst) {
                    if conn.is_none() {
                        match PgConnection::connect(&url).await {
                            Ok(session) => conn = Some(session),
                            Err(_) => {
                                failures.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(500)).await;
                                continue;
                            }
                        }
                    }
                    let session = conn.as_mut().expect("connected above");
                    let mut counted = 0;
                    let result =
                        insert_at_rate(session, &table, rate, per_call, PAYLOAD_BYTES, |done| {
                            inserted.fetch_add(done - counted, Ordering::SeqCst);
                            counted = done;
                        })
                        .await;
                    if result.is_err() {
                        failures.fetch_add(1, Ordering::SeqCst);
                        conn = None;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Self {
            inserted,
            failures,
            stop,
            task,
        }
    }

    /// Rows inserted so far.
    pub fn inserted(&self) -> u64 {
        self.inserted.load(Ordering::SeqCst)
    }

    /// The count of rows inserted, for a reader on another task.
    pub fn inserted_counter(&self) -> Arc<AtomicU64> {
        self.inserted.clone()
    }

    /// Inserts or connects that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// Stops after the second in progress; returns the rows inserted.
    pub async fn stop(self) -> u64 {
        let Self {
            inserted,
            stop,
            task,
            ..
        } = self;
        stop.store(true, Ordering::SeqCst);
        let _ = task.await;
        inserted.load(Ordering::SeqCst)
    }
}
