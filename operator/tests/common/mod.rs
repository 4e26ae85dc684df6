//! What the operator's PostgreSQL tests share: the server they run against, a connection to it,
//! and a schema of a test's own that is dropped with everything in it when the test ends, so
//! the database `DATABASE_URL` names is left as it was found, even when the test fails.

// Each test binary compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use sqlx::{Connection, PgConnection};

/// A password no configuration contains, so finding it in a message is a leak.
pub const CANARY: &str = "Canary-Pw-7f3a9";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub async fn connect() -> PgConnection {
    PgConnection::connect(&database_url())
        .await
        .expect("the local PostgreSQL must be running (see scripts/services.sh)")
}

pub async fn execute(sql: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut connect().await)
        .await
        .unwrap();
}

/// A schema named `s_<uuid>` (the name the run against database `postgres` counts leftovers
/// by), created empty and dropped on drop.
pub struct OwnSchema(String);

impl OwnSchema {
    pub async fn create() -> OwnSchema {
        let name = format!("s_{}", uuid::Uuid::new_v4().simple());
        execute(format!("CREATE SCHEMA {name}")).await;
        OwnSchema(name)
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for OwnSchema {
    fn drop(&mut self) {
        drop_now(
            format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
            "schema",
            &self.0,
        );
    }
}

/// A database named `horizon_<uuid>` (the name the run against database `postgres` looks for
/// among leftovers), created empty and dropped on drop, even when its sessions are still open.
pub struct OwnDatabase(String);

impl OwnDatabase {
    pub async fn create() -> OwnDatabase {
        let name = format!("horizon_{}", uuid::Uuid::new_v4().simple());
        execute(format!("CREATE DATABASE {name}")).await;
        OwnDatabase(name)
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0);
        drop_now(sql, "database", &self.0);
    }
}

/// Runs `sql` on a connection of its own, from a guard's `drop`.
fn drop_now(sql: String, what: &str, name: &str) {
    // Drop runs inside the test's runtime, which cannot block on itself: a thread of its own.
    let dropped = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(execute(sql));
    })
    .join();
    if dropped.is_err() && !std::thread::panicking() {
        panic!("could not drop the test's {what} {name}");
    }
}
