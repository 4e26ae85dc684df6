//! The dereference step: read the Secrets and ConfigMaps a relay refers to. The operator needs
//! the database's URL, password and TLS material itself (to migrate the table and count the
//! backlog over the same kind of connection its pods make); the broker's and the OTLP
//! headers are only checked, so that a typo or a missing key shows up as a condition instead
//! of as crash-looping pods or spans refused by the backend. The
//! values are held as [`SecretUrl`] and [`DatabaseTarget`], whose formatting never shows a
//! password or a key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use outbox_relay::broker::urls::BrokerUrls;
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::{DatabaseTarget, Pem, TlsMaterial};
use sqlx::postgres::PgSslMode;

use crate::crd::tls::{TLS_CERT_KEY, TLS_KEY_KEY};
use crate::crd::{
    BrokerTlsSpec, CaSource, DatabaseTlsSpec, OutboxRelaySpec, PostgresTlsMode, SecretKeyRef,
};
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::dereference::read_cache::ObjectReader;

pub mod read_cache;

/// URL parameters that `spec.database.tls` sets; a URL may not set them too.
const URL_TLS_PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The Secrets and ConfigMaps of one relay, dereferenced.
#[derive(Debug, Clone)]
pub struct RelaySecrets {
    /// The URL, with the password and TLS material of the spec in memory.
    pub database: DatabaseTarget,
    /// One broker URL, or the comma-separated full URLs of a broker's nodes (issue 44).
    pub broker_urls: BrokerUrls,
    /// resourceVersion of every referenced object whose change the pods cannot pick up by
    /// themselves (`name` for a Secret, `configmap/name` for a ConfigMap). It goes into the pod
    /// template so a change rolls the pods (env values are read at container start), and into
    /// the migration memory so a new database URL is migrated again. Password Secrets are left
    /// out: the pods read the mounted file at every new connection, so a rotation must not
    /// restart them.
    pub versions: BTreeMap<String, String>,
}

impl RelaySecrets {
    /// One short fingerprint of the referenced objects' versions (never of their values).
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
pub fn referenced_secret_names(spec: &OutboxRelaySpec) -> Vec<&str> {
    let mut names = vec![
        spec.database.url_secret_ref.name.as_str(),
        spec.broker.url_secret_ref.name.as_str(),
    ];
    names.extend(
        spec.database
            .session_url_secret_ref
            .as_ref()
            .map(|r| r.name.as_str()),
    );
    for password in [
        &spec.database.password_secret_ref,
        &spec.broker.password_secret_ref,
    ] {
        names.extend(password.as_ref().map(|p| p.name.as_str()));
    }
    let tls = [
        spec.database
            .tls
            .as_ref()
            .map(|t| (&t.ca, &t.client_certificate_secret_ref)),
        spec.broker
            .tls
            .as_ref()
            .map(|t| (&t.ca, &t.client_certificate_secret_ref)),
    ];
    for (ca, client) in tls.into_iter().flatten() {
        names.extend(
            ca.as_ref()
                .and_then(|ca| ca.secret_key_ref.as_ref())
                .map(|r| r.name.as_str()),
        );
        names.extend(client.as_ref().map(|c| c.name.as_str()));
    }
    names.extend(
        spec.relay
            .tracing
            .as_ref()
            .and_then(|t| t.headers_secret_ref.as_ref())
            .map(|r| r.name.as_str()),
    );
    names
}

/// Names of the ConfigMaps a relay spec refers to (CA bundles), for the ConfigMap watch.
pub fn referenced_config_map_names(spec: &OutboxRelaySpec) -> Vec<&str> {
    let database = spec.database.tls.as_ref().and_then(|t| t.ca.as_ref());
    let broker = spec.broker.tls.as_ref().and_then(|t| t.ca.as_ref());
    [database, broker]
        .into_iter()
        .flatten()
        .filter_map(|ca| ca.config_map_key_ref.as_ref().map(|r| r.name.as_str()))
        .collect()
}

/// The objects read so far, by name, with their versions.
struct Fetched {
    secrets: BTreeMap<String, Secret>,
    config_maps: BTreeMap<String, ConfigMap>,
}

/// Reads and checks every Secret and ConfigMap `spec` refers to.
pub async fn dereference_secrets(
    secrets: &ObjectReader<'_, Secret>,
    config_maps: &ObjectReader<'_, ConfigMap>,
    spec: &OutboxRelaySpec,
) -> Result<RelaySecrets, Error> {
    let mut fetched = Fetched {
        secrets: BTreeMap::new(),
        config_maps: BTreeMap::new(),
    };
    for name in referenced_secret_names(spec) {
        if fetched.secrets.contains_key(name) {
            continue;
        }
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(Error::ReadSecret)?
            .ok_or_else(|| Error::SecretNotFound { name: name.into() })?;
        fetched.secrets.insert(name.into(), secret);
    }
    for name in referenced_config_map_names(spec) {
        if fetched.config_maps.contains_key(name) {
            continue;
        }
        let config_map = config_maps
            .get_opt(name)
            .await
            .map_err(Error::ReadConfigMap)?
            .ok_or_else(|| Error::ConfigMapNotFound { name: name.into() })?;
        fetched.config_maps.insert(name.into(), config_map);
    }

    let database_url = url_from(&fetched, &spec.database.url_secret_ref, UrlKind::Postgres)?;
    let broker_urls = broker_urls_from(&fetched, &spec.broker.url_secret_ref)?;
    // The operator's migration and measurements take session advisory locks: behind a
    // transaction pool they go to the session URL (validation requires it there).
    let session_url = match &spec.database.session_url_secret_ref {
        Some(reference) => {
            let url = url_from(&fetched, reference, UrlKind::Postgres)?;
            if spec.database.tls.is_some() {
                refuse_url_tls_parameters(&url, reference)?;
            }
            Some(url)
        }
        None => None,
    };
    let mut database =
        DatabaseTarget::from_url(session_url.unwrap_or_else(|| database_url.clone()));
    if let Some(reference) = &spec.database.password_secret_ref {
        let password = text_of(&fetched, &reference.name, &reference.key)?;
        let first_line = password
            .lines()
            .next()
            .unwrap_or_default()
            .trim_end()
            .to_string();
        if first_line.is_empty() {
            return Err(invalid(
                &reference.name,
                &reference.key,
                "is empty: put the password there",
            ));
        }
        let origin = format!("Secret {}, key {}", reference.name, reference.key);
        database = database.with_password(first_line, origin);
    }
    if let Some(tls) = &spec.database.tls {
        refuse_url_tls_parameters(&database_url, &spec.database.url_secret_ref)?;
        database = database.with_tls(database_tls(&fetched, tls)?);
    }
    if let Some(tls) = &spec.broker.tls {
        check_broker_tls(&fetched, tls, &broker_urls, &spec.broker.url_secret_ref)?;
    }
    if let Some(reference) = &spec.broker.password_secret_ref {
        text_of(&fetched, &reference.name, &reference.key)?;
    }
    if let Some(reference) = spec
        .relay
        .tracing
        .as_ref()
        .and_then(|t| t.headers_secret_ref.as_ref())
    {
        let text = text_of(&fetched, &reference.name, &reference.key)?;
        check_otlp_headers(&text).map_err(|e| invalid(&reference.name, &reference.key, e))?;
    }
    Ok(RelaySecrets {
        database,
        broker_urls,
        versions: versions_that_roll(&fetched, spec),
    })
}

/// The versions of everything but the password Secrets (see [`RelaySecrets::versions`]). A
/// Secret that holds a URL (or the OTLP headers) as well as a password still counts: those
/// are env values.
fn versions_that_roll(fetched: &Fetched, spec: &OutboxRelaySpec) -> BTreeMap<String, String> {
    let otlp_headers = (spec.relay.tracing.as_ref())
        .and_then(|t| t.headers_secret_ref.as_ref())
        .map(|r| r.name.as_str());
    let passwords_only: Vec<&str> = [
        &spec.database.password_secret_ref,
        &spec.broker.password_secret_ref,
    ]
    .into_iter()
    .flatten()
    .map(|p| p.name.as_str())
    .filter(|name| {
        *name != spec.database.url_secret_ref.name
            && *name != spec.broker.url_secret_ref.name
            && Some(*name) != otlp_headers
    })
    .collect();
    let mut versions = BTreeMap::new();
    for (name, secret) in &fetched.secrets {
        if passwords_only.contains(&name.as_str()) {
            continue;
        }
        if let Some(version) = &secret.metadata.resource_version {
            versions.insert(name.clone(), version.clone());
        }
    }
    for (name, config_map) in &fetched.config_maps {
        if let Some(version) = &config_map.metadata.resource_version {
            versions.insert(format!("configmap/{name}"), version.clone());
        }
    }
    versions
}

fn database_tls(fetched: &Fetched, tls: &DatabaseTlsSpec) -> Result<TlsMaterial, Error> {
    let ca = match &tls.ca {
        Some(ca) => ca_pem(fetched, ca)?,
        None => None,
    };
    let client = tls
        .client_certificate_secret_ref
        .as_ref()
        .map(|reference| client_pems(fetched, &reference.name))
        .transpose()?;
    Ok(TlsMaterial {
        mode: pg_mode(tls.mode),
        ca,
        client,
    })
}

fn pg_mode(mode: PostgresTlsMode) -> PgSslMode {
    match mode {
        PostgresTlsMode::Disable => PgSslMode::Disable,
        PostgresTlsMode::Allow => PgSslMode::Allow,
        PostgresTlsMode::Prefer => PgSslMode::Prefer,
        PostgresTlsMode::Require => PgSslMode::Require,
        PostgresTlsMode::VerifyCa => PgSslMode::VerifyCa,
        PostgresTlsMode::VerifyFull => PgSslMode::VerifyFull,
    }
}

/// The pods get these settings as libpq's variables, which the URL's parameters would
/// silently override: both at once is refused, naming the parameter.
fn refuse_url_tls_parameters(url: &SecretUrl, reference: &SecretKeyRef) -> Result<(), Error> {
    let Some(parsed) = url.parsed() else {
        return Ok(());
    };
    let set: Vec<String> = parsed
        .query_pairs()
        .map(|(key, _)| key.into_owned())
        .filter(|key| URL_TLS_PARAMETERS.contains(&key.as_str()))
        .collect();
    match set.first() {
        None => Ok(()),
        Some(parameter) => Err(invalid(
            &reference.name,
            &reference.key,
            &format!(
                "sets {parameter}, which spec.database.tls sets too: remove the TLS parameters \
                 from the URL, or remove spec.database.tls"
            ),
        )),
    }
}

fn check_broker_tls(
    fetched: &Fetched,
    tls: &BrokerTlsSpec,
    urls: &BrokerUrls,
    reference: &SecretKeyRef,
) -> Result<(), Error> {
    let count = urls.len();
    for (index, url) in urls.iter().enumerate() {
        if url.scheme() != "amqps" {
            let which = if count > 1 {
                format!("element {} of {count} ", index + 1)
            } else {
                String::new()
            };
            return Err(invalid(
                &reference.name,
                &reference.key,
                &format!(
                    "{which}is not an amqps:// URL, so spec.broker.tls would not be used: connect \
                     with amqps:// (RabbitMQ's TLS port is 5671), or remove spec.broker.tls"
                ),
            ));
        }
    }
    if let Some(ca) = &tls.ca {
        ca_pem(fetched, ca)?;
    }
    if let Some(client) = &tls.client_certificate_secret_ref {
        client_pems(fetched, &client.name)?;
    }
    Ok(())
}

/// The CA certificates `ca` names, checked to be PEM certificates. `None` for a source that
/// names neither kind, which validation refuses (the schema refuses it first).
fn ca_pem(fetched: &Fetched, ca: &CaSource) -> Result<Option<Pem>, Error> {
    let (kind, reference, text) = match (&ca.secret_key_ref, &ca.config_map_key_ref) {
        (Some(reference), _) => (
            "Secret",
            reference,
            text_of(fetched, &reference.name, &reference.key)?,
        ),
        (None, Some(reference)) => {
            let text = config_map_text(fetched, &reference.name, &reference.key)?;
            ("ConfigMap", reference, text)
        }
        (None, None) => return Ok(None),
    };
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        let reason = "holds no PEM certificate (-----BEGIN CERTIFICATE-----): put the CA's certificate there";
        return Err(match kind {
            "Secret" => invalid(&reference.name, &reference.key, reason),
            _ => Error::ConfigMapValueInvalid {
                name: reference.name.clone(),
                key: reference.key.clone(),
                reason: reason.into(),
            },
        });
    }
    Ok(Some(Pem {
        bytes: text.into_bytes(),
        origin: format!("{kind} {}, key {}", reference.name, reference.key),
    }))
}

/// The certificate and key of a `kubernetes.io/tls` Secret.
fn client_pems(fetched: &Fetched, name: &str) -> Result<(Pem, Pem), Error> {
    let cert = text_of(fetched, name, TLS_CERT_KEY)?;
    if !cert.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(
            name,
            TLS_CERT_KEY,
            "holds no PEM certificate: give the client certificate",
        ));
    }
    let key = text_of(fetched, name, TLS_KEY_KEY)?;
    if !key.contains("PRIVATE KEY-----") {
        return Err(invalid(
            name,
            TLS_KEY_KEY,
            "holds no PEM private key: give the client certificate's key",
        ));
    }
    let pem = |key: &str, text: String| Pem {
        bytes: text.into_bytes(),
        origin: format!("Secret {name}, key {key}"),
    };
    Ok((pem(TLS_CERT_KEY, cert), pem(TLS_KEY_KEY, key)))
}

/// OTEL_EXPORTER_OTLP_HEADERS text: `key=value` pairs separated by commas. The SDKs skip a
/// pair they cannot read, so a typo would only show up as a backend refusing every export;
/// here it is a condition. The reason never repeats the text (an API key).
fn check_otlp_headers(text: &str) -> Result<(), &'static str> {
    let pairs: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .collect();
    if pairs.is_empty() {
        return Err(
            "is empty: put the OTLP export headers there, as key=value pairs \
                    separated by commas (e.g. x-api-key=KEY)",
        );
    }
    if pairs.iter().any(|pair| {
        pair.split_once('=')
            .is_none_or(|(key, _)| key.trim().is_empty())
    }) {
        return Err(
            "is not OTEL_EXPORTER_OTLP_HEADERS text: write key=value pairs separated \
                    by commas, values percent-encoded (e.g. Authorization=Basic%20dXNlcjpwYXNz)",
        );
    }
    Ok(())
}

fn invalid(name: &str, key: &str, reason: &str) -> Error {
    Error::SecretValueInvalid {
        name: name.into(),
        key: key.into(),
        reason: reason.into(),
    }
}

/// The UTF-8 text of `key` in the fetched Secret `name`.
fn text_of(fetched: &Fetched, name: &str, key: &str) -> Result<String, Error> {
    let secret = &fetched.secrets[name];
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.clone())
        .or_else(|| {
            // stringData is write-only on a real API server, but test fixtures and some tools
            // return it; accept it rather than report a key that is visibly there.
            secret
                .string_data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|value| value.clone().into_bytes())
        })
        .ok_or_else(|| Error::SecretKeyMissing {
            name: name.into(),
            key: key.into(),
        })?;
    String::from_utf8(bytes).map_err(|_| invalid(name, key, "is not UTF-8 text"))
}

fn config_map_text(fetched: &Fetched, name: &str, key: &str) -> Result<String, Error> {
    fetched.config_maps[name]
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .cloned()
        .ok_or_else(|| Error::ConfigMapKeyMissing {
            name: name.into(),
            key: key.into(),
        })
}

fn url_from(
    fetched: &Fetched,
    reference: &SecretKeyRef,
    kind: UrlKind,
) -> Result<SecretUrl, Error> {
    let text = text_of(fetched, &reference.name, &reference.key)?;
    // UrlError messages never repeat the input, so they are safe to show.
    let url = SecretUrl::parse(&text, kind)
        .map_err(|e| invalid(&reference.name, &reference.key, &e.to_string()))?;
    if kind == UrlKind::Postgres {
        // The relay pods and the operator both write: a URL choosing read-only sessions (or
        // naming a choice libpq does not know) is refused here, as the relay refuses it.
        let target = DatabaseTarget::from_url(url.clone());
        outbox_relay::database::require_writes(&target)
            .map_err(|e| invalid(&reference.name, &reference.key, &e))?;
    }
    Ok(url)
}

/// The broker's URL or list of node URLs in the Secret key `reference`; an error names the
/// element by its position, never its text.
fn broker_urls_from(fetched: &Fetched, reference: &SecretKeyRef) -> Result<BrokerUrls, Error> {
    let text = text_of(fetched, &reference.name, &reference.key)?;
    BrokerUrls::parse(&text).map_err(|e| invalid(&reference.name, &reference.key, &e.to_string()))
}

#[cfg(test)]
mod tests;
