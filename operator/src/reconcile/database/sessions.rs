//! At most a few of the operator's sessions on one database at any moment, however many
//! OutboxRelays use it and however many reconciles run at once.
//!
//! Why: a reconcile opens a short session per database step, and reconciles run concurrently
//! (`--reconcile-concurrency`). A thousand OutboxRelays on ten databases, all woken at once (a
//! restart, a rotated Secret), would otherwise open as many sessions as reconciles run, on
//! databases whose connection budget belongs to the applications (KEDA met this: one connection
//! per trigger, kedacore/keda #6955). Steps beyond the limit wait for a session to end.
//!
//! "One database" is a server address and a database name: the same database reached under
//! another user or with other parameters counts as the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use outbox_relay::connect::secret_url::SecretUrl;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The operator's sessions one database sees at most, by default.
pub const SESSIONS_PER_DATABASE: usize = 2;

/// The permits, one semaphore per database, made on first use.
#[derive(Debug)]
pub struct SessionLimit {
    per_database: usize,
    databases: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for SessionLimit {
    fn default() -> Self {
        Self::new(SESSIONS_PER_DATABASE)
    }
}

impl SessionLimit {
    pub fn new(per_database: usize) -> Self {
        Self {
            per_database: per_database.max(1),
            databases: Mutex::new(HashMap::new()),
        }
    }

    /// Waits until the database `url` names has a session to spare; the session is the
    /// permit's for as long as it is held.
    pub async fn acquire(&self, url: &SecretUrl) -> OwnedSemaphorePermit {
        let semaphore = {
            let mut databases = self
                .databases
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            databases
                .entry(database_key(url.redacted()))
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_database)))
                .clone()
        };
        semaphore
            .acquire_owned()
            .await
            .expect("the semaphores are never closed")
    }
}

/// The servers and the database of a URL (already without its password), without the user and
/// the parameters: `host:port[,host:port…]/database`.
fn database_key(redacted: &str) -> String {
    let rest = redacted
        .split_once("://")
        .map_or(redacted, |(_, rest)| rest);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, database) = rest.split_once('/').unwrap_or((rest, ""));
    let servers = authority
        .rsplit_once('@')
        .map_or(authority, |(_, servers)| servers);
    format!("{servers}/{database}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use outbox_relay::connect::secret_url::UrlKind;

    use super::*;

    fn url(text: &str) -> SecretUrl {
        SecretUrl::parse(text, UrlKind::Postgres).unwrap()
    }

    #[test]
    fn one_database_is_its_servers_and_its_name() {
        let key = |text: &str| database_key(url(text).redacted());
        assert_eq!(
            key("postgres://app:secret@db.shop:5432/orders?sslmode=require"),
            "db.shop:5432/orders"
        );
        assert_eq!(
            key("postgres://other@db.shop:5432/orders"),
            key("postgres://app:pw@db.shop:5432/orders?application_name=x"),
            "another user, other parameters: the same database"
        );
        assert_ne!(
            key("postgres://app@db.shop:5432/orders"),
            key("postgres://app@db.shop:5432/billing")
        );
        assert_eq!(
            key("postgresql://app@a:5432,b:5432/orders?target_session_attrs=read-write"),
            "a:5432,b:5432/orders"
        );
    }

    #[tokio::test]
    async fn a_database_has_at_most_its_sessions_and_the_others_are_not_held_up() {
        let limit = SessionLimit::new(2);
        let orders = url("postgres://app@db:5432/orders");
        let first = limit.acquire(&orders).await;
        let _second = limit.acquire(&url("postgres://other@db:5432/orders")).await;
        let third = tokio::time::timeout(Duration::from_millis(50), limit.acquire(&orders)).await;
        assert!(third.is_err(), "a third session on orders waits");
        let billing = tokio::time::timeout(
            Duration::from_millis(50),
            limit.acquire(&url("postgres://app@db:5432/billing")),
        )
        .await;
        assert!(billing.is_ok(), "another database does not wait");
        drop(first);
        let third = tokio::time::timeout(Duration::from_millis(50), limit.acquire(&orders)).await;
        assert!(third.is_ok(), "a session ended: the next one goes");
    }
}
