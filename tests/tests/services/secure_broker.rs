//! The broker as production connects to it: AMQPS against a private CA given as a file, login by
//! client certificate (RabbitMQ's EXTERNAL), a password file read at each connect, and refusals
//! that name the option to change without showing a secret. RabbitMQ's TLS listener (3.10's, or
//! 4.0's under the broker matrix: `outbox_tests::test_broker`) and Artemis' are the ones
//! `scripts/services.sh` sets up.

use std::path::PathBuf;
use std::time::Duration;

use const_format::formatcp;
use lapin::ExchangeKind;
use outbox_relay::broker::amqp::{AmqpPublisher, AmqpSettings};
use outbox_relay::broker::amqp10::{Amqp10Publisher, Amqp10Settings};
use outbox_relay::broker::tls::{BrokerTls, ClientCert};
use outbox_relay::broker::{ConnectError, Publisher, Refusal};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_tests::amqp10::{ARTEMIS_TLS_URL, artemis_ca};
use outbox_tests::ports::PG_PORT;
use outbox_tests::test_broker::TestBroker;
use outbox_tests::{broker, db, process, tls, unique};

/// The tests' RabbitMQ inside TLS, logged in as `user` (`guest:PASSWORD`, or `outbox_cert`).
fn amqps(user: &str) -> String {
    let port = TestBroker::current().tls_port();
    format!("amqps://{user}@127.0.0.1:{port}/%2f")
}

/// Logged in by the test client certificate (EXTERNAL, user `outbox_cert`).
fn external() -> String {
    format!("{}?auth_mechanism=external", amqps("outbox_cert"))
}

fn trusting(ca: &str) -> BrokerTls {
    BrokerTls {
        ca_file: Some(PathBuf::from(tls::file(ca))),
        ..Default::default()
    }
}

fn with_client_cert(ca: &str) -> BrokerTls {
    BrokerTls {
        client: Some(ClientCert {
            cert: PathBuf::from(tls::file("client.pem")),
            key: PathBuf::from(tls::file("client.key")),
        }),
        ..trusting(ca)
    }
}

async fn rabbit(
    url: &str,
    tls: BrokerTls,
    password_file: Option<PathBuf>,
) -> Result<AmqpPublisher, ConnectError> {
    let settings = AmqpSettings {
        exchange: unique("tlsq"),
        dead_letter_exchange: None,
        confirms: true,
        mandatory: false,
        timeout: Duration::from_secs(10),
        heartbeat: outbox_relay::defaults::BROKER_HEARTBEAT,
        content_type: "application/json".into(),
        connection_name: "secure broker test".into(),
        declare_exchange: Some(outbox_relay::broker::routing::ExchangeType::Fanout),
        tls,
        password_file,
        cloudevents: None,
    };
    let url = SecretUrl::parse(url, UrlKind::Amqp).unwrap();
    AmqpPublisher::connect(&url, settings).await
}

/// The refusal's kind and text; fails when it connected or was only "unavailable".
fn refusal(outcome: Result<AmqpPublisher, ConnectError>) -> (Refusal, String) {
    match outcome {
        Err(ConnectError::Refused { kind, message }) => (kind, message),
        Err(other) => panic!("expected a refusal naming its cause, got {other:?}"),
        Ok(_) => panic!("expected a refusal, it connected"),
    }
}

#[tokio::test]
async fn amqps_trusts_the_ca_file_and_names_it_when_it_is_the_wrong_one() {
    let url = amqps("guest:guest");
    let publisher = rabbit(&url, trusting("ca.pem"), None)
        .await
        .expect("AMQPS with the CA file");
    assert!(publisher.is_connected());
    publisher.close().await;

    let (kind, message) = refusal(rabbit(&url, trusting("other-ca.pem"), None).await);
    assert_eq!(kind, Refusal::Tls, "{message}");
    assert!(
        message.contains("--broker-ca-file") && message.contains("other-ca.pem"),
        "{message}"
    );

    // No CA file: the system's store does not know the test CA.
    let (kind, message) = refusal(rabbit(&url, BrokerTls::default(), None).await);
    assert_eq!(kind, Refusal::Tls, "{message}");
    assert!(message.contains("--broker-ca-file"), "{message}");

    // A CA file that is not there.
    let missing = BrokerTls {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..Default::default()
    };
    let (kind, message) = refusal(rabbit(&url, missing, None).await);
    assert_eq!(kind, Refusal::Settings, "{message}");
    assert!(message.contains("/nonexistent/ca.pem"), "{message}");
}

/// The broker's certificate names 127.0.0.1 only: reached as `localhost` it is the wrong host,
/// refused naming that host and what to do, without the URL's password. (No broker test for an
/// expired certificate: RabbitMQ serves one certificate on its TLS listener, and a second
/// listener or broker for it would cost more than the unit test of its message in
/// relay/src/broker/tls.rs.)
#[tokio::test]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let secret = "H0st-S3cret";
    let port = TestBroker::current().tls_port();
    let url = format!("amqps://guest:{secret}@localhost:{port}/%2f");
    let (kind, message) = refusal(rabbit(&url, trusting("ca.pem"), None).await);
    assert_eq!(kind, Refusal::Tls, "{message}");
    assert!(
        message.contains("not valid for the host name localhost"),
        "{message}"
    );
    assert!(!message.contains(secret), "{message}");
}

/// A client certificate set in the environment without its key: `run` exits 2 before
/// connecting, naming both settings (the flag and YAML sources are unit tests of
/// relay/src/config/mod.rs).
#[tokio::test]
async fn a_client_certificate_without_its_key_exits_2_naming_both() {
    let cert = tls::file("client.pem");
    process::run_relay_refusing_settings(
        &["run", "--table", &unique("absent")],
        &[
            (
                "DATABASE_URL",
                formatcp!("postgres://postgres:Pa1r-S3cret@127.0.0.1:{PG_PORT}/test"),
            ),
            ("AMQP_URL", &amqps("guest:guest")),
            ("BROKER_CLIENT_CERT", &cert),
        ],
        &["--broker-client-cert", "--broker-client-key"],
        "Pa1r-S3cret",
    )
    .await;
}

#[tokio::test]
async fn certificate_login_with_external_and_password_refusals() {
    let publisher = rabbit(&external(), with_client_cert("ca.pem"), None)
        .await
        .expect("EXTERNAL login with the client certificate");
    publisher.close().await;

    // EXTERNAL without a certificate: the broker refuses the login.
    let (kind, message) = refusal(rabbit(&external(), trusting("ca.pem"), None).await);
    assert_eq!(kind, Refusal::Auth, "{message}");

    // A wrong password: refused as a login, the password not shown.
    let wrong = &amqps("guest:Wr0ng-S3cret");
    let (kind, message) = refusal(rabbit(wrong, trusting("ca.pem"), None).await);
    assert_eq!(kind, Refusal::Auth, "{message}");
    assert!(!message.contains("Wr0ng-S3cret"), "{message}");

    // The password from a file wins over the URL's; an empty file is named.
    let dir = std::env::temp_dir().join(unique("brokerpw"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "guest\n").unwrap();
    let publisher = rabbit(wrong, trusting("ca.pem"), Some(file.clone()))
        .await
        .expect("the file's password logs in");
    publisher.close().await;
    std::fs::write(&file, "").unwrap();
    let (kind, message) = refusal(rabbit(wrong, trusting("ca.pem"), Some(file.clone())).await);
    assert_eq!(kind, Refusal::Settings, "{message}");
    assert!(
        message.contains("--broker-password-file") && message.contains("empty"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn amqp10_over_tls_takes_the_ca_file_too() {
    let settings = |ca: PathBuf| Amqp10Settings {
        address: unique("amqp10_tls"),
        timeout: Duration::from_secs(10),
        content_type: "application/json".into(),
        container_id: unique("amqp10_tls"),
        tls: BrokerTls {
            ca_file: Some(ca),
            ..Default::default()
        },
        password_file: None,
        cloudevents: None,
    };
    let url = SecretUrl::parse(ARTEMIS_TLS_URL, UrlKind::Amqp).unwrap();
    let publisher = Amqp10Publisher::connect(&url, settings(artemis_ca()))
        .await
        .expect("AMQP 1.0 over TLS with Artemis' CA as --broker-ca-file");
    publisher.close().await;
    match Amqp10Publisher::connect(&url, settings(PathBuf::from(tls::file("other-ca.pem")))).await {
        Err(ConnectError::Refused { kind, message }) => {
            assert_eq!(kind, Refusal::Tls, "{message}");
            assert!(message.contains("--broker-ca-file"), "{message}");
        }
        Err(other) => panic!("expected a TLS refusal, got {other:?}"),
        Ok(_) => panic!("a CA that did not sign Artemis' certificate was accepted"),
    }
}

/// Rows relayed over AMQPS, logged in by client certificate: each id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_rows_over_amqps_with_certificate_login_each_id_once() {
    let name = unique("amqps");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 20_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let (ca, cert, key) = (
        tls::file("ca.pem"),
        tls::file("client.pem"),
        tls::file("client.key"),
    );
    let mut relay = process::spawn_relay_with_env(
        &name,
        &process::run_args(&name, &name, &["--workers", "2"]),
        &[
            ("AMQP_URL", &external()),
            ("BROKER_CA_FILE", &ca),
            ("BROKER_CLIENT_CERT", &cert),
            ("BROKER_CLIENT_KEY", &key),
        ],
    );
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(drained, "rows pending; relay log:\n{}", relay.log_text());
    assert_eq!(relay.terminate(Duration::from_secs(30)).await, Some(0));
    consumer
        .assert_each_id_once(&mut conn, &table, 20_000)
        .await;
    consumer.close().await;
}
