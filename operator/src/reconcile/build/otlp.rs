//! The OpenTelemetry variables of a relay pod (`spec.relay.tracing`): the standard
//! `OTEL_*` names, which the relay's exporter reads as every OpenTelemetry SDK does, so the
//! same settings work for `outbox-relay run` outside Kubernetes. Without `tracing` there are
//! none, and the pod template (its hash with it) is what it was before the field existed.

use k8s_openapi::api::core::v1::EnvVar;

use super::env::{secret_key_env, value_env};

use crate::crd::TracingSpec;

/// The only OTLP transport the relay speaks; it refuses grpc at start.
pub const OTLP_PROTOCOL: &str = "http/protobuf";

/// The variables for `tracing`, after the container's `POD_NAME`, which
/// `OTEL_RESOURCE_ATTRIBUTES` refers to as `$(POD_NAME)` (the kubelet expands a reference to a
/// variable defined before it).
pub fn otlp_env(tracing: &TracingSpec, namespace: &str, deployment: &str) -> Vec<EnvVar> {
    let mut env = vec![
        value_env("OTEL_EXPORTER_OTLP_ENDPOINT", tracing.otlp_endpoint.trim()),
        value_env("OTEL_EXPORTER_OTLP_PROTOCOL", OTLP_PROTOCOL),
    ];
    if let Some(ratio) = tracing.sample_ratio {
        // The relay's batch spans are roots (they link to the messages' traces), so a ratio
        // of trace ids is the fraction of batches.
        env.push(value_env("OTEL_TRACES_SAMPLER", "traceidratio"));
        env.push(value_env("OTEL_TRACES_SAMPLER_ARG", &ratio.to_string()));
    }
    if let Some(reference) = &tracing.headers_secret_ref {
        // Often an API key: by reference only, never as a value in the pod spec.
        env.push(secret_key_env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            &reference.name,
            &reference.key,
        ));
    }
    // Namespaces and object names are DNS labels and subdomains: nothing in them needs the
    // percent-encoding the variable's format would ask for.
    env.push(value_env(
        "OTEL_RESOURCE_ATTRIBUTES",
        &format!(
            "k8s.namespace.name={namespace},k8s.pod.name=$(POD_NAME),k8s.deployment.name={deployment}"
        ),
    ));
    env
}
