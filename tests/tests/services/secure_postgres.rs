//! PostgreSQL as production connects to it: TLS with libpq's `sslmode` meanings, SCRAM and md5
//! passwords, certificate login, a password file read at every new connection, and failures
//! that name the setting to change without showing a secret. Against the servers
//! `scripts/services.sh` sets up: the main one with TLS and TLS-only roles, one without TLS.

use std::path::Path;
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::{DatabaseTarget, FailureKind, connect};
use outbox_tests::tls::{self, EXPIRED_PORT, MD5_PASSWORD, PLAIN_PORT, SCRAM_PASSWORD, TlsRole};
use outbox_tests::{broker, db, process, unique, wait};
use sqlx::PgConnection;

/// A URL of one server for an `sslmode`.
type UrlFor<'a> = &'a dyn Fn(&'static str) -> String;

fn target(url: &str) -> DatabaseTarget {
    DatabaseTarget::from_url(SecretUrl::parse(url, UrlKind::Postgres).expect("a valid URL"))
}

/// Whether this session is encrypted, as the server sees it.
async fn encrypted(conn: &mut PgConnection) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Ok(encrypted) or Err(kind, message), asserting no message carries `secret`.
async fn attempt(url: &str, secret: &str) -> Result<bool, (FailureKind, String)> {
    match connect(&target(url)).await {
        Ok(mut conn) => Ok(encrypted(&mut conn).await),
        Err(e) => {
            assert!(!e.message.contains(secret), "a secret in: {e}");
            Err((e.kind, e.message))
        }
    }
}

/// The message of an attempt that must fail with `want`, asserting (through [`attempt`]) that it
/// holds no `secret`.
async fn refused(url: &str, secret: &str, want: FailureKind) -> String {
    match attempt(url, secret).await {
        Err((kind, message)) => {
            assert_eq!(kind, want, "{message}");
            message
        }
        Ok(encrypted) => panic!("expected a {want:?} failure, it connected (TLS: {encrypted})"),
    }
}

#[tokio::test]
async fn every_sslmode_behaves_as_libpq_on_a_tls_only_a_plaintext_only_and_a_mixed_server() {
    let ca = tls::file("ca.pem");
    let with_ca = |mode: &'static str| vec![("sslmode", mode), ("sslrootcert", ca.as_str())];
    // (server, sslmode, outcome: Some(encrypted) or None for refused)
    let tls_only =
        |mode: &'static str| tls::url("outbox_scram", Some(SCRAM_PASSWORD), &with_ca(mode));
    let mixed = |mode: &'static str| tls::url("postgres", None, &with_ca(mode));
    let plain = |mode: &'static str| {
        tls::url_on(
            "127.0.0.1",
            PLAIN_PORT,
            "postgres",
            "postgres",
            None,
            &with_ca(mode),
        )
    };
    let expected: [(&str, UrlFor<'_>, [Option<bool>; 6]); 3] = [
        // disable, allow, prefer, require, verify-ca, verify-full
        (
            "tls-only",
            &tls_only,
            [
                None,
                Some(true),
                Some(true),
                Some(true),
                Some(true),
                Some(true),
            ],
        ),
        (
            "mixed",
            &mixed,
            [
                Some(false),
                Some(false),
                Some(true),
                Some(true),
                Some(true),
                Some(true),
            ],
        ),
        (
            "plaintext-only",
            &plain,
            [Some(false), Some(false), Some(false), None, None, None],
        ),
    ];
    let modes = [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ];
    for (server, url_for, outcomes) in expected {
        for (mode, want) in modes.iter().zip(outcomes) {
            let got = attempt(&url_for(mode), SCRAM_PASSWORD).await;
            match (want, &got) {
                (Some(tls), Ok(was)) => assert_eq!(*was, tls, "{server} sslmode={mode}"),
                (None, Err((kind, message))) => {
                    let (want_kind, names) = if server == "tls-only" {
                        (FailureKind::Auth, "only over TLS")
                    } else {
                        (FailureKind::Tls, "does not offer TLS")
                    };
                    assert_eq!(*kind, want_kind, "{server} sslmode={mode}: {message}");
                    assert!(
                        message.contains(names),
                        "{server} sslmode={mode}: {message}"
                    );
                    assert!(message.contains("sslmode"), "{message}");
                }
                _ => panic!("{server} sslmode={mode}: expected {want:?}, got {got:?}"),
            }
        }
    }
}

#[tokio::test]
async fn certificate_trust_host_name_and_files_are_named_when_they_fail() {
    let ca = tls::file("ca.pem");
    let other_ca = tls::file("other-ca.pem");
    let scram = |params: &[(&str, &str)]| tls::url("outbox_scram", Some(SCRAM_PASSWORD), params);

    // A CA that did not sign the server's certificate.
    let message = refused(
        &scram(&[("sslmode", "verify-full"), ("sslrootcert", &other_ca)]),
        SCRAM_PASSWORD,
        FailureKind::Tls,
    )
    .await;
    assert!(
        message.contains("not trusted") && message.contains("sslrootcert"),
        "{message}"
    );

    // No CA given: the system's store does not know the test CA.
    let message = refused(
        &scram(&[("sslmode", "verify-full")]),
        SCRAM_PASSWORD,
        FailureKind::Tls,
    )
    .await;
    assert!(message.contains("sslrootcert=FILE"), "{message}");

    // The certificate names 127.0.0.1 only: `localhost` is the wrong host for verify-full, and
    // fine for verify-ca, which checks the chain alone.
    let on_localhost = |mode: &'static str| {
        tls::url_on(
            "localhost",
            outbox_tests::ports::PG_PORT,
            "test",
            "outbox_scram",
            Some(SCRAM_PASSWORD),
            &[("sslmode", mode), ("sslrootcert", &ca)],
        )
    };
    let message = refused(
        &on_localhost("verify-full"),
        SCRAM_PASSWORD,
        FailureKind::Tls,
    )
    .await;
    assert!(
        message.contains("not valid for the host name localhost"),
        "{message}"
    );
    assert!(message.contains("verify-ca"), "{message}");
    assert_eq!(
        attempt(&on_localhost("verify-ca"), SCRAM_PASSWORD).await,
        Ok(true)
    );

    // A CA file that is not there.
    let message = refused(
        &scram(&[
            ("sslmode", "verify-full"),
            ("sslrootcert", "/nonexistent/ca.pem"),
        ]),
        SCRAM_PASSWORD,
        FailureKind::Settings,
    )
    .await;
    assert!(
        message.contains("sslrootcert") && message.contains("/nonexistent/ca.pem"),
        "{message}"
    );

    // sslrootcert=system with a weaker mode is refused before connecting, as libpq does.
    let message = refused(
        &scram(&[("sslmode", "require"), ("sslrootcert", "system")]),
        SCRAM_PASSWORD,
        FailureKind::Settings,
    )
    .await;
    assert!(message.contains("verify-full"), "{message}");
}

/// A real server (the cluster on EXPIRED_PORT) whose certificate the test CA signed for
/// 127.0.0.1 and which expired on 2021-01-01: both verifying modes refuse it, saying so with the
/// host, the date, the clock and the fix; `require` without a CA, which checks no certificate,
/// gets through, so the date is the only thing wrong.
#[tokio::test]
async fn an_expired_server_certificate_is_named_with_its_host_date_and_fix() {
    let ca = tls::file("ca.pem");
    // Trust authentication ignores the password, so the URL works and still carries a secret.
    let secret = "Exp1red-S3cret";
    let url = |mode: &'static str| {
        tls::url_on(
            "127.0.0.1",
            EXPIRED_PORT,
            "postgres",
            "postgres",
            Some(secret),
            &[("sslmode", mode), ("sslrootcert", &ca)],
        )
    };
    for mode in ["verify-ca", "verify-full"] {
        let message = refused(&url(mode), secret, FailureKind::Tls).await;
        for part in [
            "certificate for 127.0.0.1 expired on 2021-01-01",
            &format!("sslmode={mode}"),
            "renew the server's certificate",
            "check this host's clock",
        ] {
            assert!(message.contains(part), "{part:?} missing: {message}");
        }
    }
    // Without sslrootcert: with one, `require` checks the chain as verify-ca does (libpq's rule).
    let require = tls::url_on(
        "127.0.0.1",
        EXPIRED_PORT,
        "postgres",
        "postgres",
        Some(secret),
        &[("sslmode", "require")],
    );
    assert_eq!(attempt(&require, secret).await, Ok(true));
}

#[tokio::test]
async fn scram_md5_and_certificate_logins_and_their_refusals() {
    let ca = tls::file("ca.pem");
    let full = [("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];

    // SCRAM with a password full of URL-special characters, percent-encoded in the URL.
    let url = tls::url("outbox_scram", Some(SCRAM_PASSWORD), &full);
    assert!(url.contains("%40") && url.contains("%2F"), "{url}");
    let mut conn = connect(&target(&url)).await.unwrap();
    assert!(encrypted(&mut conn).await);

    // md5.
    assert_eq!(
        attempt(
            &tls::url("outbox_md5", Some(MD5_PASSWORD), &full),
            MD5_PASSWORD
        )
        .await,
        Ok(true)
    );

    // A wrong password: said, and neither password shown.
    let wrong = "Wr0ng-pw-3e1";
    let message = refused(
        &tls::url("outbox_scram", Some(wrong), &full),
        wrong,
        FailureKind::Auth,
    )
    .await;
    assert!(
        message.contains("password authentication failed for user outbox_scram"),
        "{message}"
    );
    assert!(!message.contains(SCRAM_PASSWORD), "{message}");

    // Certificate login: the client certificate's CN is the role.
    let client = tls::file("client.pem");
    let key = tls::file("client.key");
    let with_cert = |key: &str| {
        let mut params = full.to_vec();
        params.extend([("sslcert", client.as_str()), ("sslkey", key)]);
        tls::url("outbox_cert", None, &params)
    };
    let mut conn = connect(&target(&with_cert(&key))).await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(user, "outbox_cert");

    // A key that is not the certificate's.
    let stray = tls::file("stray.key");
    let (kind, message) = attempt(&with_cert(&stray), "PRIVATE KEY")
        .await
        .unwrap_err();
    assert!(
        matches!(kind, FailureKind::Tls | FailureKind::Settings),
        "{kind:?}: {message}"
    );
    assert!(message.contains("sslkey"), "{message}");

    // The certificate role without a certificate.
    refused(
        &tls::url("outbox_cert", None, &full),
        SCRAM_PASSWORD,
        FailureKind::Auth,
    )
    .await;
}

#[tokio::test]
async fn a_password_file_is_read_at_each_connection_and_its_faults_are_named() {
    let dir = std::env::temp_dir().join(unique("pwfile"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    let url = tls::url("outbox_scram", None, &[("sslmode", "require")]);
    let with_file = DatabaseTarget::new(
        SecretUrl::parse(&url, UrlKind::Postgres).unwrap(),
        Some(file.clone()),
    );

    // Missing, then empty.
    let err = connect(&with_file).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Settings, "{err}");
    assert!(err.message.contains("--database-password-file"), "{err}");
    std::fs::write(&file, "\n").unwrap();
    let err = connect(&with_file).await.unwrap_err();
    assert!(err.message.contains("is empty"), "{err}");

    // A wrong password in it names the file; the right one (with its newline) logs in.
    std::fs::write(&file, "not-the-password\n").unwrap();
    let err = connect(&with_file).await.unwrap_err();
    assert_eq!(err.kind, FailureKind::Auth, "{err}");
    assert!(err.message.contains(&file.display().to_string()), "{err}");
    assert!(!err.message.contains("not-the-password"), "{err}");
    std::fs::write(&file, format!("{SCRAM_PASSWORD}\n")).unwrap();
    connect(&with_file)
        .await
        .expect("the file's password logs in");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_cli_exits_2_naming_sslmode_when_a_tls_only_server_is_reached_without_tls() {
    let url = tls::url(
        "outbox_scram",
        Some(SCRAM_PASSWORD),
        &[("sslmode", "disable")],
    );
    process::run_relay_refusing_settings(
        &["lag", "--table", &unique("absent")],
        &[("DATABASE_URL", &url)],
        &["only over TLS", "sslmode"],
        "w/rd",
    )
    .await;
}

/// Rows relayed over verify-full as a SCRAM role whose password has URL-special characters:
/// each id once, and every session of the relay encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_rows_over_verify_full_and_scram_each_id_once() {
    let password = "r3lay p@ss/%:?";
    let role = TlsRole::create("tlsrelay", password).await;
    let name = format!("{}.outbox", role.name);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 20_000).await;
    role.own(&mut admin, &name).await;
    let params: Vec<(&str, String)> = tls::verify_full();
    let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let url = tls::url(&role.name, Some(password), &params);

    let (code, _, stderr) = process::run_relay_command_with_env(
        &["migrate", "--table", &name],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let exchange = unique("tlsx");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let mut relay = process::spawn_relay_with_env(
        &role.name,
        &process::run_args(&name, &exchange, &["--workers", "2"]),
        &[("DATABASE_URL", &url)],
    );
    let user = role.name.clone();
    let all_encrypted = wait::until(
        "the relay's sessions are up, all encrypted",
        Duration::from_secs(60),
        || {
            let user = user.clone();
            async move {
                let mut admin = db::connect().await;
                let (sessions, encrypted): (i64, i64) = sqlx::query_as(
                    "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
                 JOIN pg_stat_ssl s USING (pid) WHERE a.usename = $1",
                )
                .bind(&user)
                .fetch_one(&mut admin)
                .await
                .unwrap();
                sessions >= 2 && sessions == encrypted
            }
        },
    )
    .await;
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    let log = relay.log_text();
    assert!(all_encrypted.is_ok() && drained, "relay log:\n{log}");
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut admin, &table, 20_000)
        .await;
    assert!(!relay.log_text().contains("w/rd") && !relay.log_text().contains(password));
    consumer.close().await;
    role.drop_now().await;
}

/// The role's password changes and the file is rewritten while the relay runs; its sessions are
/// then ended: the rows written after that can only be relayed by new sessions, which must have
/// logged in with the new password; nothing is lost or retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_password_file_is_used_on_reconnect_without_a_restart() {
    let role = TlsRole::create("tlsrot", "first-pw").await;
    let name = format!("{}.outbox", role.name);
    let table = db::table(&name);
    let mut admin = db::seeded_table(&table, 5_000).await;
    role.own(&mut admin, &name).await;
    let dir = std::env::temp_dir().join(unique("rotate"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "first-pw\n").unwrap();
    let url = tls::url(&role.name, None, &[("sslmode", "require")]);
    let exchange = unique("rotx");
    let consumer = broker::consume(&exchange, ExchangeKind::Fanout, "").await;
    let file_text = file.display().to_string();
    let mut relay = process::spawn_relay_with_env(
        &role.name,
        &process::run_args(&name, &exchange, &["--workers", "2"]),
        &[
            ("DATABASE_URL", &url),
            ("DATABASE_PASSWORD_FILE", &file_text),
        ],
    );
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );

    // Rotate: the server first, then the file (as an agent would), then cut the sessions.
    db::exec(
        &mut admin,
        &format!("ALTER ROLE {} PASSWORD 'second-pw'", role.name),
    )
    .await;
    rewrite(&file, "second-pw\n");
    db::exec(
        &mut admin,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{}'",
            role.name
        ),
    )
    .await;
    outbox_relay::tools::seed::copy_rows(&mut admin, &table, 5_000, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(60)).await,
        "rows pending after the rotation; relay log:\n{}",
        relay.log_text()
    );
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut admin, &table, 10_000)
        .await;
    let errors = db::scalar_i64(
        &mut admin,
        &format!("SELECT count(*) FROM {name} WHERE error IS NOT NULL"),
    )
    .await;
    assert_eq!(errors, 0, "a row spent an attempt");
    let log = relay.log_text();
    assert!(
        !log.contains("second-pw") && !log.contains("first-pw"),
        "{log}"
    );
    consumer.close().await;
    role.drop_now().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Replaces the file's content in one step, as a secrets agent does (write aside, rename).
fn rewrite(file: &Path, content: &str) {
    let aside = file.with_extension("new");
    std::fs::write(&aside, content).unwrap();
    std::fs::rename(&aside, file).unwrap();
}
