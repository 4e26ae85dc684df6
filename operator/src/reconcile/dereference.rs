//! The dereference step: read the Secrets a relay refers to. The operator needs the
//! database URL itself (to migrate the table); the broker URL is only checked to be a usable
//! AMQP URL so that a typo shows up as a condition instead of as crash-looping pods. The values
//! are held as [`SecretUrl`], whose formatting never shows the password.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use outbox_relay::secret_url::{SecretUrl, UrlKind};

use crate::crd::{OutboxRelaySpec, SecretKeyRef};
use crate::reconcile::error::Error;

/// The Secrets of one relay, dereferenced.
#[derive(Debug, Clone)]
pub struct RelaySecrets {
    pub database_url: SecretUrl,
    pub amqp_url: SecretUrl,
    /// resourceVersion of every referenced Secret, by name. It goes into the pod template so a
    /// changed Secret rolls the pods (env values are only read at container start), and into
    /// the migration memory so a new database URL is migrated again.
    pub versions: BTreeMap<String, String>,
}

impl RelaySecrets {
    /// One short fingerprint of the referenced Secrets' versions (never of their values).
    pub fn fingerprint(&self) -> String {
        let joined: Vec<String> = self
            .versions
            .iter()
            .map(|(name, version)| format!("{name}={version}"))
            .collect();
        joined.join(",")
    }
}

/// Names of the Secrets a relay spec refers to, for the Secret watch.
pub fn referenced_secret_names(spec: &OutboxRelaySpec) -> [&str; 2] {
    [
        spec.database.url_secret_ref.name.as_str(),
        spec.broker.url_secret_ref.name.as_str(),
    ]
}

/// Reads and checks both Secrets of `spec` in `namespace`.
pub async fn dereference_secrets(
    secrets: &Api<Secret>,
    spec: &OutboxRelaySpec,
) -> Result<RelaySecrets, Error> {
    let mut versions = BTreeMap::new();
    let mut fetched: BTreeMap<String, Secret> = BTreeMap::new();
    for reference in [&spec.database.url_secret_ref, &spec.broker.url_secret_ref] {
        if fetched.contains_key(&reference.name) {
            continue;
        }
        let secret = secrets
            .get_opt(&reference.name)
            .await
            .map_err(Error::ReadSecret)?
            .ok_or_else(|| Error::SecretNotFound {
                name: reference.name.clone(),
            })?;
        if let Some(version) = &secret.metadata.resource_version {
            versions.insert(reference.name.clone(), version.clone());
        }
        fetched.insert(reference.name.clone(), secret);
    }
    let database_url = url_from(&fetched, &spec.database.url_secret_ref, UrlKind::Postgres)?;
    let amqp_url = url_from(&fetched, &spec.broker.url_secret_ref, UrlKind::Amqp)?;
    Ok(RelaySecrets {
        database_url,
        amqp_url,
        versions,
    })
}

fn url_from(
    fetched: &BTreeMap<String, Secret>,
    reference: &SecretKeyRef,
    kind: UrlKind,
) -> Result<SecretUrl, Error> {
    let secret = &fetched[&reference.name];
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(&reference.key))
        .map(|value| value.0.clone())
        .or_else(|| {
            // stringData is write-only on a real API server, but test fixtures and some tools
            // return it; accept it rather than report a key that is visibly there.
            secret
                .string_data
                .as_ref()
                .and_then(|data| data.get(&reference.key))
                .map(|value| value.clone().into_bytes())
        })
        .ok_or_else(|| Error::SecretKeyMissing {
            name: reference.name.clone(),
            key: reference.key.clone(),
        })?;
    let text = String::from_utf8(bytes).map_err(|_| Error::SecretValueInvalid {
        name: reference.name.clone(),
        key: reference.key.clone(),
        reason: "is not UTF-8 text".into(),
    })?;
    // UrlError messages never repeat the input, so they are safe to show.
    SecretUrl::parse(&text, kind).map_err(|e| Error::SecretValueInvalid {
        name: reference.name.clone(),
        key: reference.key.clone(),
        reason: e.to_string(),
    })
}
