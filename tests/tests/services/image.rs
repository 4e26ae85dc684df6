//! The release image, built here without a daemon from this build's static binaries, and run by
//! runc as pods run it: non-root 65532, read-only root filesystem, no capabilities, no privilege
//! escalation, the host's network.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::oci::{Container, ContainerSpec, Image, NON_ROOT};
use outbox_tests::{broker, db, process, unique};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn spec(args: &[&str]) -> ContainerSpec {
    ContainerSpec {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_image_holds_both_binaries_and_runs_them_as_non_root_with_nothing_else() {
    let image = Image::shared();
    let (code, out) = Container::run(
        image,
        "relay-version",
        &spec(&["/usr/local/bin/outbox-relay", "--version"]),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(VERSION), "{out}");
    let (code, out) = Container::run(
        image,
        "operator-help",
        &spec(&["/usr/local/bin/outbox-operator", "--help"]),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("run"), "{out}");

    // Nothing but the two binaries, the CA bundle and the user: no shell, no libc.
    let rootfs = image.rootfs();
    for present in [
        "usr/local/bin/outbox-relay",
        "usr/local/bin/outbox-operator",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "etc/group",
    ] {
        assert!(rootfs.join(present).is_file(), "{present} is missing");
    }
    for absent in ["bin/sh", "lib", "lib64", "usr/lib"] {
        assert!(
            !rootfs.join(absent).exists(),
            "{absent} should not be in the image"
        );
    }
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd.contains(&format!(":{NON_ROOT}:{NON_ROOT}:")),
        "{passwd}"
    );

    let config = image.image_config();
    assert_eq!(config["config"]["User"], format!("{NON_ROOT}:{NON_ROOT}"));
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    let chart =
        std::fs::read_to_string(outbox_tests::helm::chart_dir().join("Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("appVersion: \"{VERSION}\""))
            || chart.contains(&format!("appVersion: {VERSION}")),
        "the chart's appVersion is the image version:\n{chart}"
    );
    assert_eq!(
        config["config"]["Entrypoint"][0],
        "/usr/local/bin/outbox-relay"
    );

    let mib = image.layout_bytes() as f64 / 1_048_576.0;
    println!("image size as an OCI layout (compressed layers): {mib:.1} MiB (target <= 30 MB)");
}

#[tokio::test]
async fn a_relay_container_drains_ten_thousand_rows_to_rabbitmq() {
    let name = unique("img");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 10_000).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let expected = db::all_ids(&mut conn, &table).await;

    let image = Image::shared();
    let mut args = vec!["/usr/local/bin/outbox-relay"];
    args.extend(process::run_args(&name, &name, &["--log-format", "json"]));
    let container_spec = ContainerSpec {
        env: vec![
            ("DATABASE_URL".into(), outbox_tests::database_url()),
            ("AMQP_URL".into(), outbox_tests::amqp_url()),
            ("POD_NAME".into(), "relay-in-a-container".into()),
        ],
        ..spec(&args)
    };
    let mut container = Container::start(image, "relay-drain", &container_spec);
    // The kernel's view of the relay process: the pod security context, really applied.
    let confinement =
        outbox_tests::wait::for_value("the container's process", Duration::from_secs(20), || {
            let found = container.confinement();
            async move { found }
        })
        .await
        .expect("the relay container runs");
    assert_eq!((confinement.uid, confinement.gid), (NON_ROOT, NON_ROOT));
    assert_eq!(confinement.effective_capabilities, "0000000000000000");
    assert!(
        confinement.no_new_privileges && confinement.read_only_root,
        "{confinement:?}"
    );
    let drained = db::wait_until_drained(&table, Duration::from_secs(120)).await;
    assert!(
        drained,
        "the container did not drain the table:\n{}",
        container.output()
    );
    assert_eq!(
        consumer.wait_for(10_000, Duration::from_secs(30)).await,
        10_000
    );
    {
        let received = consumer.received.lock().unwrap();
        for id in &expected {
            assert!(received.counts.contains_key(id), "{id} never arrived");
        }
    }
    // It stops on SIGTERM like a pod, cleanly.
    let code = container.stop(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{}", container.output());
    assert!(
        !container.output().contains("Permission denied"),
        "{}",
        container.output()
    );
}
