//! What PostgreSQL itself counted for one table during a run: the claim statements' calls, rows
//! and buffers (pg_stat_statements), the table's and its indexes' buffers (pg_statio_*), the
//! pending index's entries read (pg_stat_user_indexes); and how many of the relay's sessions
//! wait on a lock, sampled. These are the figures two cores cannot distort: a buffer read is a
//! buffer read however busy the machine is.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use sqlx::{Connection, PgConnection};

/// Counters of one table at one moment; subtract two with [`TableCounters::since`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TableCounters {
    /// Claim statements (their text has `SKIP LOCKED` and the table's name): None when
    /// pg_stat_statements is not loaded.
    pub claims: Option<StatementCounters>,
    /// The capped backlog counts of the lag report (pg_stat_statements shows their constant as
    /// a placeholder); None without pg_stat_statements.
    pub backlog_counts: Option<StatementCounters>,
    pub heap_blocks: i64,
    pub index_blocks: i64,
    /// Entries the pending (partial) index returned to scans.
    pub pending_index_entries: i64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct StatementCounters {
    pub calls: i64,
    pub rows: i64,
    /// shared_blks_hit + shared_blks_read.
    pub blocks: i64,
    pub exec_ms: f64,
}

/// Makes pg_stat_statements usable in the bench's database: true when the server loads it
/// (`make services` does), false with a line saying what is missing.
pub async fn statements_available(conn: &mut PgConnection) -> bool {
    let created = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut *conn)
        .await;
    let readable = sqlx::raw_sql("SELECT 1 FROM pg_stat_statements LIMIT 1")
        .execute(&mut *conn)
        .await;
    match created.and(readable) {
        Ok(_) => true,
        Err(e) => {
            eprintln!(
                "  pg_stat_statements is not usable ({e}); the claim's own buffers are not \
                 measured: `make services` loads it (shared_preload_libraries)"
            );
            false
        }
    }
}

impl TableCounters {
    /// Reads the counters of `table` (its name as the claim's text has it, unquoted).
    pub async fn read(
        conn: &mut PgConnection,
        table: &str,
        with_statements: bool,
    ) -> anyhow::Result<Self> {
        let (claims, backlog_counts) = if with_statements {
            (
                Some(statement_counters(conn, table, "%SKIP LOCKED%").await?),
                Some(
                    statement_counters(conn, table, "SELECT count(*) FROM (SELECT % FROM%").await?,
                ),
            )
        } else {
            (None, None)
        };
        let (heap_blocks, index_blocks): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(heap_blks_hit + heap_blks_read, 0)::int8, \
             coalesce(idx_blks_hit + idx_blks_read, 0)::int8 \
             FROM pg_statio_user_tables WHERE relid = $1::regclass",
        )
        .bind(table)
        .fetch_one(&mut *conn)
        .await?;
        let pending_index_entries: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(s.idx_tup_read), 0)::int8 \
             FROM pg_stat_user_indexes s JOIN pg_index i ON i.indexrelid = s.indexrelid \
             WHERE i.indrelid = $1::regclass AND i.indpred IS NOT NULL",
        )
        .bind(table)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Self {
            claims,
            backlog_counts,
            heap_blocks,
            index_blocks,
            pending_index_entries,
        })
    }

    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        let since =
            |now: Option<StatementCounters>, then: Option<StatementCounters>| match (now, then) {
                (Some(now), Some(then)) => Some(StatementCounters {
                    calls: now.calls - then.calls,
                    rows: now.rows - then.rows,
                    blocks: now.blocks - then.blocks,
                    exec_ms: now.exec_ms - then.exec_ms,
                }),
                _ => None,
            };
        Self {
            claims: since(self.claims, earlier.claims),
            backlog_counts: since(self.backlog_counts, earlier.backlog_counts),
            heap_blocks: self.heap_blocks - earlier.heap_blocks,
            index_blocks: self.index_blocks - earlier.index_blocks,
            pending_index_entries: self.pending_index_entries - earlier.pending_index_entries,
        }
    }
}

/// The statements of `table` whose text is `LIKE pattern`, added up.
async fn statement_counters(
    conn: &mut PgConnection,
    table: &str,
    pattern: &str,
) -> anyhow::Result<StatementCounters> {
    let (calls, rows, blocks, exec_ms): (i64, i64, i64, f64) = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(rows), 0)::int8, \
         coalesce(sum(shared_blks_hit + shared_blks_read), 0)::int8, \
         coalesce(sum(total_exec_time), 0)::float8 \
         FROM pg_stat_statements WHERE query LIKE $2 AND strpos(query, $1) > 0",
    )
    .bind(table)
    .bind(pattern)
    .fetch_one(conn)
    .await?;
    Ok(StatementCounters {
        calls,
        rows,
        blocks,
        exec_ms,
    })
}

/// How many of the relay's sessions waited, on average over the samples: on a heavyweight lock
/// (a row or transaction lock another holds), on a lightweight lock (a buffer's content lock,
/// the lock manager's partitions), and how many were running a statement at all.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SessionWaits {
    pub samples: u64,
    pub lock: f64,
    pub lwlock: f64,
    pub active: f64,
}

/// Samples pg_stat_activity every `every` until `stop` is set.
pub async fn sample_waits(
    database_url: String,
    application_name: &'static str,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<SessionWaits> {
    let mut conn = PgConnection::connect(&database_url).await?;
    let (mut lock, mut lwlock, mut active, mut samples) = (0i64, 0i64, 0i64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let (l, lw, a): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), \
             count(*) FILTER (WHERE wait_event_type = 'LWLock'), \
             count(*) FILTER (WHERE state = 'active') \
             FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND application_name = $1",
        )
        .bind(application_name)
        .fetch_one(&mut conn)
        .await?;
        (lock, lwlock, active, samples) = (lock + l, lwlock + lw, active + a, samples + 1);
        tokio::time::sleep(every).await;
    }
    let mean = |total: i64| total as f64 / samples.max(1) as f64;
    Ok(SessionWaits {
        samples,
        lock: mean(lock),
        lwlock: mean(lwlock),
        active: mean(active),
    })
}
