//! Lanes: how per-key ordering keeps each key with one worker at a time, across workers and
//! pods, with PostgreSQL as the only coordinator.
//!
//! Every partition key hashes into one of [`LANES`] lanes (`table::sql`). A worker claims only
//! rows of the lanes it holds, and it holds a lane by a session advisory lock on its own claim
//! connection. So no two workers ever claim rows of one key, and a worker that dies (kill -9,
//! a lost pod) frees its lanes the moment PostgreSQL ends its session, together with the
//! transaction that held its claimed rows: whoever takes the lane next sees them pending, in
//! order. A worker gives a lane up only between batches, with no transaction open.
//!
//! Balance: each worker also holds a membership lock, so `pg_locks` tells every worker how
//! many workers of the relay are alive and which lanes are taken. Every [`BALANCE_EVERY`] a
//! worker aims at its fair share, ceil(lanes / workers): it releases lanes above it and takes
//! free ones below it. When a worker joins, the others shed lanes within one interval and it
//! takes them; when one leaves, its lanes are free at once and taken within one interval.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use sqlx::PgConnection;

pub use crate::table::sql::LANES;

/// How often a worker looks at the lanes again.
pub const BALANCE_EVERY: Duration = Duration::from_secs(1);

/// Membership locks use keys above the lanes', so the two never meet.
const MEMBER_KEYS: std::ops::RangeInclusive<i32> = LANES..=i32::MAX;

/// The lanes one worker holds on its claim connection.
#[derive(Debug)]
pub struct Lanes {
    relay: String,
    /// The first key of every advisory lock of this relay's lanes (a hash of its name).
    class: Option<i32>,
    member: Option<i32>,
    held: BTreeSet<i32>,
    balanced_at: Option<Instant>,
}

/// What one balance saw and did, for the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Balance {
    pub workers: usize,
    pub share: usize,
    pub taken: usize,
    /// The lanes given up, for whoever tracks per-lane state.
    pub released: Vec<i32>,
}

impl Lanes {
    pub fn new(relay: &str) -> Self {
        Self {
            relay: relay.to_string(),
            class: None,
            member: None,
            held: BTreeSet::new(),
            balanced_at: None,
        }
    }

    /// The lanes held, for the claim.
    pub fn held(&self) -> Vec<i32> {
        self.held.iter().copied().collect()
    }

    /// The connection the locks lived on is gone: so are they. Returns the lanes lost.
    pub fn forget(&mut self) -> Vec<i32> {
        self.member = None;
        self.balanced_at = None;
        std::mem::take(&mut self.held).into_iter().collect()
    }

    /// Balances when [`BALANCE_EVERY`] has passed since the last time (or never ran on this
    /// connection). Call it between batches only: it may give lanes up.
    pub async fn balance_if_due(
        &mut self,
        conn: &mut PgConnection,
    ) -> Result<Option<Balance>, sqlx::Error> {
        if self
            .balanced_at
            .is_some_and(|at| at.elapsed() < BALANCE_EVERY)
        {
            return Ok(None);
        }
        let balance = self.balance(conn).await?;
        self.balanced_at = Some(Instant::now());
        Ok(Some(balance))
    }

    /// Joins (once per connection), then moves the lanes held towards the fair share.
    pub async fn balance(&mut self, conn: &mut PgConnection) -> Result<Balance, sqlx::Error> {
        let class = match self.class {
            Some(class) => class,
            None => {
                let class: i32 =
                    sqlx::query_scalar("SELECT hashtext('outbox-relay lanes ' || $1) & 2147483647")
                        .bind(&self.relay)
                        .fetch_one(&mut *conn)
                        .await?;
                *self.class.insert(class)
            }
        };
        if self.member.is_none() {
            self.member = Some(join(conn, class).await?);
        }
        // Who holds what, in this database: (second key, pid) of every lock of the class.
        let locks: Vec<(i64, i32)> = sqlx::query_as(
            "SELECT objid::int8, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND objsubid = 2 AND granted \
             AND classid = $1::int8::oid \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind(i64::from(class))
        .fetch_all(&mut *conn)
        .await?;
        let mine: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        let workers = locks
            .iter()
            .filter(|(key, _)| *key >= i64::from(LANES))
            .map(|(_, pid)| *pid)
            .collect::<BTreeSet<i32>>()
            .len()
            .max(1);
        let taken_by_others: BTreeSet<i32> = locks
            .iter()
            .filter(|(key, pid)| *key < i64::from(LANES) && *pid != mine)
            .map(|(key, _)| *key as i32)
            .collect();
        let share = fair_share(workers);
        let mut balance = Balance {
            workers,
            share,
            ..Balance::default()
        };
        while self.held.len() > share {
            let Some(&lane) = self.held.last() else {
                break;
            };
            sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                .bind(class)
                .bind(lane)
                .execute(&mut *conn)
                .await?;
            // Held until unlocked: if the unlock fails, forget() still names it as lost.
            self.held.remove(&lane);
            balance.released.push(lane);
        }
        if self.held.len() < share {
            let mut free: Vec<i32> = (0..LANES)
                .filter(|lane| !self.held.contains(lane) && !taken_by_others.contains(lane))
                .collect();
            // Workers starting together would otherwise all race for lane 0, 1, 2, …
            free.shuffle(&mut rand::rng());
            for lane in free {
                if self.held.len() >= share {
                    break;
                }
                if try_lock(conn, class, lane).await? {
                    self.held.insert(lane);
                    balance.taken += 1;
                }
            }
        }
        Ok(balance)
    }
}

/// ceil(lanes / workers): with every worker at its share all lanes are held.
fn fair_share(workers: usize) -> usize {
    (LANES as usize).div_ceil(workers.max(1))
}

/// Takes a membership lock with a key no other worker holds.
async fn join(conn: &mut PgConnection, class: i32) -> Result<i32, sqlx::Error> {
    loop {
        let key = rand::random_range(MEMBER_KEYS);
        if try_lock(conn, class, key).await? {
            return Ok(key);
        }
    }
}

/// The session advisory lock (`class`, `key`), never waiting: true when it is ours now.
async fn try_lock(conn: &mut PgConnection, class: i32, key: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
        .bind(class)
        .bind(key)
        .fetch_one(&mut *conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_of_all_workers_cover_every_lane() {
        for workers in 1..=300 {
            assert!(fair_share(workers) * workers >= LANES as usize, "{workers}");
            assert!(fair_share(workers) >= 1);
        }
        assert_eq!(fair_share(1), LANES as usize);
        assert_eq!(fair_share(6), 43);
    }
}
