//! The release as a cluster consumes it: `make dist` into a registry on the address the tests'
//! node reaches (plain HTTP, trusted in containerd's `hosts.toml` as a private mirror would
//! be), then the chart `helm install`ed from `oci://` into a restricted namespace with the
//! image pinned to the pushed digest. The node's containerd pulls the image from the registry
//! by digest (a name it has never seen: the image imported at the node's start is under
//! another), and the operator pod runs it: the digest cosign verifies with the signing key.
//!
//! The image's layers are in containerd's store already (the node imported the same build at
//! its start), so the pull resolves the digest at the registry and fetches its manifest but
//! no layer: milliseconds. A registry that did not answer, or a digest it did not hold, would
//! fail the pod with ErrImagePull.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use outbox_tests::cluster::OPERATOR_NAME;
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node::Node;
use outbox_tests::registry::{KeyPair, Registry, cosign, run_dist};
use outbox_tests::{helm, process, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_from_oci_runs_the_operator_image_pulled_by_digest() {
    let plane = ControlPlane::shared();
    let node = tokio::task::spawn_blocking(Node::shared)
        .await
        .expect("the node starts");
    let work = process::target_dir().join(unique("release_install"));
    std::fs::create_dir_all(&work).unwrap();
    let registry = Registry::start_for_node(&work.join("registry")).expect("a registry");
    node.trust_plain_http_registry(&registry.address)
        .expect("containerd told about the registry");
    let keys = KeyPair::generate(&work, "release").expect("a key pair");
    let dist = tokio::task::block_in_place(|| run_dist(&registry, &work.join("dist"), Some(&keys)))
        .expect("make dist");
    let version = dist.get("VERSION").to_owned();
    let image_ref = dist.get("IMAGE_REF").to_owned();
    let digest = dist.get("IMAGE_DIGEST").to_owned();

    let ns = unique("oci").replace('_', "-");
    plane.create_restricted_namespace(&ns).unwrap();
    let values = [
        format!("fullnameOverride={OPERATOR_NAME}"),
        format!("watchNamespaces={{{ns}}}"),
        "logFormat=text".to_owned(),
        format!("image.repository={}", dist.get("IMAGE_REPO")),
        format!("image.digest={digest}"),
    ];
    let mut args = vec![
        "install",
        OPERATOR_NAME,
        dist.get("CHART_OCI"),
        "--version",
        &version,
        "--plain-http",
        "-n",
        &ns,
    ];
    args.extend(helm::wait_flags(plane));
    for value in &values {
        args.extend(["--set", value]);
    }
    let installed = tokio::task::block_in_place(|| helm::helm(plane, &args));
    let client = plane.admin_client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    assert!(
        installed.is_ok(),
        "helm install from oci://: {installed:?}\npods: {:#?}\n{}",
        listed.iter().map(|p| &p.status).collect::<Vec<_>>(),
        node.logs(20)
    );

    // The pod runs the digest from the registry.
    assert_eq!(listed.len(), 1, "one operator pod");
    let pod = &listed[0];
    let spec_image = pod.spec.as_ref().unwrap().containers[0].image.clone();
    assert_eq!(spec_image.as_deref(), Some(image_ref.as_str()));
    let status = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert!(status.ready, "the operator pod is ready");
    assert!(
        status.image_id.ends_with(&digest),
        "the running image is {}, not the pushed {digest}",
        status.image_id
    );

    // Pulled, not found present: the kubelet's event says so.
    let pulled = plane
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "reason=Pulled",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap();
    assert!(
        pulled.contains("Successfully pulled image") && pulled.contains(&image_ref),
        "the kubelet did not pull {image_ref}: {pulled}"
    );

    // The relay pods get the same digest: the operator hands them its own image.
    let deployments: Api<Deployment> = Api::namespaced(client, &ns);
    let operator = deployments.get(OPERATOR_NAME).await.unwrap();
    let container = &operator.spec.template.spec.unwrap().containers[0];
    let relay_image = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "OUTBOX_OPERATOR_RELAY_IMAGE")
        .and_then(|e| e.value.clone());
    assert_eq!(relay_image.as_deref(), Some(image_ref.as_str()));

    // What runs is what was signed.
    let key = keys.public.to_str().unwrap();
    let verified = cosign(
        [
            "verify",
            "--key",
            key,
            "--insecure-ignore-tlog=true",
            "--allow-http-registry=true",
            "--allow-insecure-registry=true",
            &image_ref,
        ],
        &keys.password,
    )
    .unwrap();
    assert!(
        verified.status.success(),
        "cosign verify {image_ref}: {}",
        String::from_utf8_lossy(&verified.stderr)
    );
    println!(
        "release install: chart {} {version} from oci://, operator pod running {image_ref} pulled by the node, signature verified ({})",
        dist.get("CHART_OCI"),
        pulled.trim()
    );

    let _ = tokio::task::block_in_place(|| {
        helm::helm(plane, &["uninstall", OPERATOR_NAME, "-n", &ns, "--wait"])
    });
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
    drop(registry);
    let _ = std::fs::remove_dir_all(&work);
}
