//! `make dist` into a real registry (Debian's docker-registry on a loopback port of this
//! test's own), with a key pair the test generates, checked with the tools users run:
//!
//! - without a key, everything is built and pushed, one line says what was not signed, and
//!   nothing verifies;
//! - with the key, `cosign verify` passes on the pushed image and chart digests, and fails on
//!   another digest of the same image and with another key; the CycloneDX attestation
//!   verifies and describes this image (its digest, both binaries' crates);
//! - the chart comes back from `oci://` with this version, byte for byte;
//! - neither run prints the key's password or the private key.
//!
//! Needs the release binaries (static, as `make` builds them), buildah, skopeo, Go (cosign's
//! first build) and docker-registry: a fresh machine installs them (image-tools, services.sh).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use base64::Engine as _;
use outbox_tests::registry::{Dist, KeyPair, Registry, cosign, run_dist};
use outbox_tests::{helm, process, unique};

/// cosign's flags for a plain-HTTP registry and a signature without a transparency log.
const OFFLINE: [&str; 3] = [
    "--allow-http-registry=true",
    "--allow-insecure-registry=true",
    "--insecure-ignore-tlog=true",
];

#[test]
fn dist_pushes_signed_image_chart_and_sbom() {
    let work = process::target_dir().join(unique("dist_test"));
    std::fs::create_dir_all(&work).unwrap();
    let registry = Registry::start(&work.join("registry")).expect("start the registry");
    let keys = KeyPair::generate(&work, "release").expect("a key pair");
    let other = KeyPair::generate(&work, "other").expect("another key pair");
    let version = env!("CARGO_PKG_VERSION");

    // Without the key: built and pushed, said in one line, nothing verifies.
    let unsigned =
        run_dist(&registry, &work.join("unsigned"), None).expect("make dist without a key");
    assert_eq!(unsigned.get("SIGNED"), "no");
    let not_signed: Vec<&str> = unsigned
        .log
        .lines()
        .filter(|l| l.contains("not signed"))
        .collect();
    assert_eq!(
        not_signed.len(),
        1,
        "one line says what was not signed:\n{}",
        unsigned.log
    );
    assert!(
        not_signed[0].contains(unsigned.get("IMAGE_REF"))
            && not_signed[0].contains("COSIGN_KEY")
            && not_signed[0].contains("COSIGN_PASSWORD"),
        "the line names the image and how to give the key: {}",
        not_signed[0]
    );
    let verified = verify(&keys, unsigned.get("IMAGE_REF"));
    assert!(!verified.status.success(), "an unsigned image verified");

    // With the key.
    let signed =
        run_dist(&registry, &work.join("signed"), Some(&keys)).expect("make dist with a key");
    assert_eq!(signed.get("SIGNED"), "yes");
    assert_eq!(signed.get("VERSION"), version);
    for secret in [keys.password.as_str(), "PRIVATE KEY"] {
        assert!(
            !signed.log.contains(secret) && !unsigned.log.contains(secret),
            "make dist printed a secret ({secret}):\n{}",
            signed.log
        );
    }
    let image = signed.get("IMAGE_REF");
    let chart = signed.get("CHART_REF");
    assert!(image.starts_with(&format!(
        "{}/outbox-relay/outbox-relay@sha256:",
        registry.address
    )));

    for reference in [image, chart] {
        let ok = verify(&keys, reference);
        assert!(
            ok.status.success(),
            "cosign verify {reference}: {}",
            stderr(&ok)
        );
        let wrong_key = verify(&other, reference);
        assert!(
            !wrong_key.status.success(),
            "{reference} verified with another key"
        );
    }

    // Another digest of the same image (its manifest converted to Docker's format by skopeo,
    // layers unchanged) carries no signature: signatures bind the digest.
    let changed = changed_digest(signed.get("IMAGE_REPO"), image, &work);
    assert_ne!(changed, image);
    let on_changed = verify(&keys, &changed);
    assert!(
        !on_changed.status.success(),
        "the signature verified on another digest {changed}"
    );
    println!(
        "dist: cosign verify refuses another digest: {}",
        stderr(&on_changed).lines().last().unwrap_or_default()
    );

    // The SBOM attestation: verifies with the key only, and describes this image.
    let attestation = verify_attestation(&keys, image);
    assert!(
        attestation.status.success(),
        "cosign verify-attestation: {}",
        stderr(&attestation)
    );
    assert!(!verify_attestation(&other, image).status.success());
    assert!(!verify_attestation(&keys, &changed).status.success());
    check_sbom_statement(&attestation.stdout, signed.get("IMAGE_DIGEST"), version);

    // The chart from oci://, with this version, the bytes that were pushed.
    let chart_oci = signed.get("CHART_OCI");
    let shown = helm_run(
        &work,
        &[
            "show",
            "chart",
            chart_oci,
            "--version",
            version,
            "--plain-http",
        ],
    );
    assert!(
        shown.contains(&format!("\nversion: {version}\n"))
            && shown.contains(&format!("appVersion: {version}")),
        "helm show chart:\n{shown}"
    );
    let pulled = work.join("pulled");
    std::fs::create_dir_all(&pulled).unwrap();
    helm_run(
        &work,
        &[
            "pull",
            chart_oci,
            "--version",
            version,
            "--plain-http",
            "-d",
            pulled.to_str().unwrap(),
        ],
    );
    let pulled_tgz = pulled.join(format!("outbox-relay-operator-{version}.tgz"));
    assert_eq!(
        std::fs::read(&pulled_tgz).expect("helm pull wrote the package"),
        std::fs::read(signed.get("CHART_PACKAGE")).unwrap(),
        "the chart pulled from the registry is the package make dist pushed"
    );

    print_summary(&signed);
    drop(registry);
    let _ = std::fs::remove_dir_all(&work);
}

fn verify(keys: &KeyPair, reference: &str) -> Output {
    let key = keys.public.to_str().unwrap();
    let mut args = vec!["verify", "--key", key];
    args.extend(OFFLINE);
    args.push(reference);
    cosign(args, &keys.password).expect("run cosign verify")
}

fn verify_attestation(keys: &KeyPair, reference: &str) -> Output {
    let key = keys.public.to_str().unwrap();
    let mut args = vec!["verify-attestation", "--type", "cyclonedx", "--key", key];
    args.extend(OFFLINE);
    args.push(reference);
    cosign(args, &keys.password).expect("run cosign verify-attestation")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The image copied by skopeo to a new tag as a Docker v2 schema 2 manifest: its digest.
fn changed_digest(repository: &str, image: &str, work: &Path) -> String {
    let digest_file = work.join("changed.digest");
    let status = Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
        ])
        .args(["--format", "v2s2", "--digestfile"])
        .arg(&digest_file)
        .arg(format!("docker://{image}"))
        .arg(format!("docker://{repository}:changed"))
        .stdin(Stdio::null())
        .status()
        .expect("run skopeo");
    assert!(status.success(), "skopeo copy --format v2s2");
    let digest = std::fs::read_to_string(&digest_file).unwrap();
    format!("{repository}@{}", digest.trim())
}

/// cosign verify-attestation prints one JSON envelope per attestation; its payload is the
/// in-toto statement, whose subject is the image and whose predicate is the SBOM.
fn check_sbom_statement(stdout: &[u8], digest: &str, version: &str) {
    let text = String::from_utf8_lossy(stdout);
    let envelope: serde_json::Value = serde_json::from_str(
        text.lines()
            .find(|l| !l.trim().is_empty())
            .expect("an attestation"),
    )
    .expect("the envelope is JSON");
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().expect("a payload"))
        .expect("base64 payload");
    let statement: serde_json::Value =
        serde_json::from_slice(&payload).expect("an in-toto statement");
    assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        digest.trim_start_matches("sha256:")
    );
    let sbom = &statement["predicate"];
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["type"], "container");
    assert_eq!(sbom["metadata"]["component"]["version"], version);
    let components = sbom["components"].as_array().expect("components");
    for name in ["outbox-relay", "outbox-operator", "tokio", "sqlx", "kube"] {
        assert!(
            components.iter().any(|c| c["name"] == name),
            "the SBOM names no {name}"
        );
    }
    println!(
        "dist: the SBOM attestation verifies: {} components, subject {digest}",
        components.len()
    );
}

/// Runs the real helm with homes of this test's own; its stdout.
fn helm_run(work: &Path, args: &[&str]) -> String {
    let output = Command::new(helm::helm_path().expect("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", work.join("helm-cache"))
        .env("HELM_CONFIG_HOME", work.join("helm-config"))
        .env("HELM_DATA_HOME", work.join("helm-data"))
        .stdin(Stdio::null())
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "helm {}: {}",
        args.join(" "),
        stderr(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn print_summary(dist: &Dist) {
    println!(
        "dist: image {}, chart {} {}, signed and verified with the test's key",
        dist.get("IMAGE_REF"),
        dist.get("CHART_OCI"),
        dist.get("VERSION"),
    );
}
