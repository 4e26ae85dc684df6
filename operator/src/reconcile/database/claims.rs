//! Which OutboxRelay relays a table. Two OutboxRelays naming the same table of one database
//! would both run relays, with possibly different settings; the first to claim the table in
//! the database itself keeps it, so the check holds across namespaces, operators and clusters,
//! and no Secret's text is compared. The claim lives in `outbox_relay_claims` next to the
//! outbox table (one row per table), renewed by every reconcile of its holder; a claim nobody
//! renewed for [`CLAIM_EXPIRES_AFTER`] (its OutboxRelay deleted, its operator gone) is taken
//! by the next relay that asks. Deleting an OutboxRelay releases its claim at once
//! ([`release_claim`]).
//!
//! Only a table that exists is claimed: an OutboxRelay naming a missing table (a typo, a table
//! not created yet) would otherwise leave a claim, and the claims table itself, in the schema
//! its name points at, for a table nobody has.

use std::time::Duration;

use outbox_relay::table::ident::{Ident, TableName};
use sqlx::{AssertSqlSafe, PgConnection};

pub const CLAIMS_TABLE: &str = "outbox_relay_claims";
/// Three resync intervals of the operator's default (5 minutes): a holder that still exists is
/// reconciled well within it.
pub const CLAIM_EXPIRES_AFTER: Duration = Duration::from_secs(15 * 60);

/// Who holds the claim on a table, after asking for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The asking relay: it was free, expired, or already its own (now renewed).
    Held,
    /// The table does not exist: nothing was claimed, nor the claims table created.
    TableMissing,
    /// Another relay, `namespace/name`, renewed `renewed_seconds_ago`.
    HeldBy {
        relay: String,
        renewed_seconds_ago: f64,
    },
    /// The database role may not create the claims table (a table migrated by someone else
    /// with `outbox-relay migrate`, a role without CREATE on the schema): the check is skipped,
    /// as it is a guard, not something relaying needs.
    NotChecked(String),
}

fn claims_table(outbox: &TableName) -> TableName {
    TableName {
        schema: outbox.schema.clone(),
        table: Ident::new(CLAIMS_TABLE).expect("constant is valid"),
    }
}

/// Claims `outbox` for `relay` (`namespace/name`), or says who has it, or that it does not
/// exist.
pub async fn claim_table(
    conn: &mut PgConnection,
    outbox: &TableName,
    relay: &str,
) -> Result<Claim, sqlx::Error> {
    match try_claim(conn, outbox, relay).await {
        Err(e) if has_sql_state(&e, &[INSUFFICIENT_PRIVILEGE]) => {
            Ok(Claim::NotChecked(e.to_string()))
        }
        other => other,
    }
}

async fn try_claim(
    conn: &mut PgConnection,
    outbox: &TableName,
    relay: &str,
) -> Result<Claim, sqlx::Error> {
    // Looked up as the relay's own inspection does (through the search path when unqualified).
    // A table created or dropped right after the look-up is met by the next reconcile.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(outbox.quoted())
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(Claim::TableMissing);
    }
    let claims = claims_table(outbox).quoted();
    // The table exists after the first claim in a schema: no DDL on the rounds after that.
    let won = match upsert_claim(conn, &claims, outbox, relay).await {
        Err(e) if has_sql_state(&e, &[UNDEFINED_TABLE]) => {
            create_claims_table(conn, &claims).await?;
            upsert_claim(conn, &claims, outbox, relay).await?
        }
        other => other?,
    };
    if won.is_some() {
        return Ok(Claim::Held);
    }
    let (holder, ago): (String, f64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT relay, extract(epoch FROM now() - renewed_at)::float8 FROM {claims} \
         WHERE outbox_table = $1"
    )))
    .bind(outbox.to_string())
    .fetch_one(&mut *conn)
    .await?;
    Ok(Claim::HeldBy {
        relay: holder,
        renewed_seconds_ago: ago,
    })
}

/// What releasing a relay's claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The relay held the table; its row is gone, so another relay may claim it at once.
    Released,
    /// The relay held no claim (never checked, expired and taken, or released before).
    NotHeld,
    /// Another relay, `namespace/name`, holds the table: what the migration created serves it,
    /// so a cleanup must leave it in place.
    HeldBy(String),
}

/// Releases `relay`'s claim on `outbox`, and says who holds the table when it is not `relay`.
pub async fn release_claim(
    conn: &mut PgConnection,
    outbox: &TableName,
    relay: &str,
) -> Result<Release, sqlx::Error> {
    let claims = claims_table(outbox).quoted();
    let holder: Result<Option<(String,)>, sqlx::Error> = sqlx::query_as(AssertSqlSafe(format!(
        "WITH released AS (DELETE FROM {claims} WHERE outbox_table = $1 AND relay = $2 \
           RETURNING relay) \
         SELECT relay FROM released UNION ALL \
         SELECT relay FROM {claims} WHERE outbox_table = $1 AND relay <> $2"
    )))
    .bind(outbox.to_string())
    .bind(relay)
    .fetch_optional(&mut *conn)
    .await;
    match holder {
        // No claims table: nobody ever claimed a table of this schema (or may not).
        Err(e) if has_sql_state(&e, &[UNDEFINED_TABLE, INSUFFICIENT_PRIVILEGE]) => {
            Ok(Release::NotHeld)
        }
        Err(e) => Err(e),
        Ok(None) => Ok(Release::NotHeld),
        Ok(Some((holder,))) if holder == relay => Ok(Release::Released),
        Ok(Some((holder,))) => Ok(Release::HeldBy(holder)),
    }
}

/// The relay other than `relay` that holds `outbox`, if any; nothing is changed.
pub async fn other_holder(
    conn: &mut PgConnection,
    outbox: &TableName,
    relay: &str,
) -> Result<Option<String>, sqlx::Error> {
    let claims = claims_table(outbox).quoted();
    let holder = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT relay FROM {claims} WHERE outbox_table = $1 AND relay <> $2"
    )))
    .bind(outbox.to_string())
    .bind(relay)
    .fetch_optional(&mut *conn)
    .await;
    match holder {
        Err(e) if has_sql_state(&e, &[UNDEFINED_TABLE, INSUFFICIENT_PRIVILEGE]) => Ok(None),
        other => other,
    }
}

/// Takes or renews the claim; the row comes back when `relay` holds it now.
async fn upsert_claim(
    conn: &mut PgConnection,
    claims: &str,
    outbox: &TableName,
    relay: &str,
) -> Result<Option<(String,)>, sqlx::Error> {
    sqlx::query_as(AssertSqlSafe(format!(
        "INSERT INTO {claims} AS c (outbox_table, relay) VALUES ($1, $2) \
         ON CONFLICT (outbox_table) DO UPDATE SET relay = EXCLUDED.relay, renewed_at = now(), \
           claimed_at = CASE WHEN c.relay = EXCLUDED.relay THEN c.claimed_at ELSE now() END \
         WHERE c.relay = EXCLUDED.relay OR c.renewed_at < now() - make_interval(secs => $3) \
         RETURNING relay"
    )))
    .bind(outbox.to_string())
    .bind(relay)
    .bind(CLAIM_EXPIRES_AFTER.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await
}

/// Creates the claims table when missing. Two first claims at once may both try: the loser's
/// duplicate-type or duplicate-table error means the table exists, which is all it needs.
async fn create_claims_table(conn: &mut PgConnection, claims: &str) -> Result<(), sqlx::Error> {
    let created = sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {claims} (\
           outbox_table text PRIMARY KEY, \
           relay text NOT NULL, \
           claimed_at timestamptz NOT NULL DEFAULT now(), \
           renewed_at timestamptz NOT NULL DEFAULT now())"
    )))
    .execute(&mut *conn)
    .await;
    match created {
        Err(e) if has_sql_state(&e, &[UNIQUE_VIOLATION, DUPLICATE_TABLE]) => Ok(()),
        other => other.map(drop),
    }
}

const UNDEFINED_TABLE: &str = "42P01";
const DUPLICATE_TABLE: &str = "42P07";
const UNIQUE_VIOLATION: &str = "23505";
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Whether PostgreSQL answered with one of the SQLSTATE `codes`.
fn has_sql_state(error: &sqlx::Error, codes: &[&str]) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| codes.contains(&code.as_ref()))
}
