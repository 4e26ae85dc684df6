//! Opening PostgreSQL connections the same way everywhere: named `outbox-relay` in
//! `pg_stat_activity` (unless the URL names them), so an operator can tell relay sessions apart.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection};

use crate::secret_url::SecretUrl;

pub const APPLICATION_NAME: &str = "outbox-relay";

pub async fn connect(url: &SecretUrl) -> Result<PgConnection, sqlx::Error> {
    let mut options = PgConnectOptions::from_str(url.expose())?;
    if !url.expose().contains("application_name=") {
        options = options.application_name(APPLICATION_NAME);
    }
    options.connect().await
}
