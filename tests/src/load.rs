//! A producer inserting rows at a steady pace until stopped, as an application does while a
//! test suspends, scales or upgrades the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox_relay::table::OutboxTable;
use tokio::task::JoinHandle;

use crate::db;

pub struct SteadyLoad {
    inserted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl SteadyLoad {
    /// Inserts `rows` small rows into `table`, then sleeps `every`, until [`SteadyLoad::stop`].
    pub fn start(table: &OutboxTable, rows: u64, every: Duration) -> Self {
        let inserted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (table, inserted, stop) = (table.clone(), inserted.clone(), stop.clone());
            async move {
                let mut conn = db::connect().await;
                while !stop.load(Ordering::SeqCst) {
                    outbox_relay::tools::seed::copy_rows(&mut conn, &table, rows, 50, |_| {})
                        .await
                        .expect("the steady load inserts");
                    inserted.fetch_add(rows, Ordering::SeqCst);
                    tokio::time::sleep(every).await;
                }
            }
        });
        Self {
            inserted,
            stop,
            task,
        }
    }

    /// Rows inserted so far.
    pub fn inserted(&self) -> u64 {
        self.inserted.load(Ordering::SeqCst)
    }

    /// Stops after the insert in progress; returns every row inserted.
    pub async fn stop(self) -> u64 {
        let Self {
            inserted,
            stop,
            task,
        } = self;
        stop.store(true, Ordering::SeqCst);
        task.await.expect("the steady load ends");
        inserted.load(Ordering::SeqCst)
    }
}
