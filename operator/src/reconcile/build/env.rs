//! The two shapes of a relay container's environment variables: a value, and a Secret's key by
//! reference (the value then never stands in the pod spec). Shared by the connection files,
//! the OpenTelemetry settings and the Deployment.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

/// `name` set to `value`.
pub(super) fn value_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// `name` read from key `key` of Secret `secret`, which must exist.
pub(super) fn secret_key_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
