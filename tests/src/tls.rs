//! The TLS and authentication set-up `scripts/services.sh` makes: a test CA and certificates,
//! TLS-only roles (SCRAM, md5, certificate login) on the main PostgreSQL, a second cluster
//! without TLS and a third whose certificate has expired. The values here are the ones that script writes.

use std::path::PathBuf;

use sqlx::PgConnection;

use crate::db::exec;

/// The password of `outbox_scram`: every character a URL must percent-encode.
pub const SCRAM_PASSWORD: &str = "p@ss:w/rd %?&#tls";
pub const MD5_PASSWORD: &str = "md5-Pw/with:colon";
/// The cluster that offers no TLS.
pub const PLAIN_PORT: u16 = crate::ports::PLAIN_PG_PORT;
/// The cluster whose certificate (the test CA's, for 127.0.0.1) expired on 2021-01-01.
pub const EXPIRED_PORT: u16 = crate::ports::EXPIRED_PG_PORT;

/// Where services.sh keeps the CA, the server's and the client's certificates.
pub fn dir() -> PathBuf {
    crate::cache_dir().join("tls")
}

/// A file of the set-up, e.g. `ca.pem`, as text for a URL parameter.
pub fn file(name: &str) -> String {
    let path = dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/services.sh",
        path.display()
    );
    path.display().to_string()
}

/// A URL of the server `DATABASE_URL` names (the main one, database `test` on 127.0.0.1,
/// unless the version matrix points it at another major set up the same way) for `user` with
/// `password` (percent-encoded here) and these query parameters.
pub fn url(user: &str, password: Option<&str>, params: &[(&str, &str)]) -> String {
    let main = url::Url::parse(&crate::database_url()).expect("DATABASE_URL is a URL");
    url_on(
        main.host_str().expect("DATABASE_URL names a host"),
        main.port().unwrap_or(5432),
        main.path().trim_start_matches('/'),
        user,
        password,
        params,
    )
}

pub fn url_on(
    host: &str,
    port: u16,
    database: &str,
    user: &str,
    password: Option<&str>,
    params: &[(&str, &str)],
) -> String {
    let mut url = url::Url::parse(&format!("postgres://{host}:{port}/{database}")).unwrap();
    url.set_username(user).unwrap();
    url.set_password(password).unwrap();
    if !params.is_empty() {
        url.query_pairs_mut().extend_pairs(params.iter().copied());
    }
    url.to_string()
}

/// `verify-full` against the test CA.
pub fn verify_full() -> Vec<(&'static str, String)> {
    vec![
        ("sslmode", "verify-full".into()),
        ("sslrootcert", file("ca.pem")),
    ]
}

/// A login role of the test's own that may connect only over TLS with SCRAM, owning a schema of
/// the same name; [`TlsRole::drop_now`] removes both.
pub struct TlsRole {
    pub name: String,
}

impl TlsRole {
    pub async fn create(prefix: &str, password: &str) -> Self {
        let name = crate::unique(prefix);
        let mut admin = crate::db::connect().await;
        exec(
            &mut admin,
            &format!(
                "SET password_encryption = 'scram-sha-256'; \
                 CREATE ROLE {name} LOGIN IN ROLE outbox_tls_only PASSWORD '{password}'; \
                 CREATE SCHEMA {name} AUTHORIZATION {name}"
            ),
        )
        .await;
        Self { name }
    }

    /// Gives the role a table an administrator made in its schema.
    pub async fn own(&self, admin: &mut PgConnection, table: &str) {
        exec(
            admin,
            &format!("ALTER TABLE {table} OWNER TO {}", self.name),
        )
        .await;
    }

    pub async fn drop_now(self) {
        let mut admin = crate::db::connect().await;
        exec(
            &mut admin,
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'; \
                 DROP SCHEMA IF EXISTS {0} CASCADE; DROP ROLE IF EXISTS {0}",
                self.name
            ),
        )
        .await;
    }
}
