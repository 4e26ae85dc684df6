//! The connection-security fields of the `OutboxRelay` spec: TLS for the database and the
//! broker, and passwords kept out of the URLs. Each refers to a Secret or ConfigMap key in the
//! relay's namespace; the operator mounts them read-only into the relay pods as files (so a
//! rotated password reaches running pods without a restart) and reads them for its own
//! connections.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Secret key holding a password (or a token a sidecar or a secrets driver rewrites). It is
/// mounted as a file that the relay reads again at every new connection, and it wins over a
/// password in the URL.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecretRef {
    /// Name of the Secret, in the namespace of the OutboxRelay.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret whose value is the password (its first line counts).
    #[serde(default = "password_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A key of a Secret or ConfigMap holding CA certificates (PEM, one or more).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CaKeyRef {
    /// Name of the Secret or ConfigMap, in the namespace of the OutboxRelay.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the PEM certificates (cert-manager writes `ca.crt`).
    #[serde(default = "ca_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Where the CA that signed the server's certificate is read: one of a Secret's key or a
/// ConfigMap's key (e.g. a trust bundle that trust-manager distributes).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("give the CA in exactly one of secretKeyRef and configMapKeyRef")
)]
pub struct CaSource {
    /// A Secret key holding the CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<CaKeyRef>,
    /// A ConfigMap key holding the CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<CaKeyRef>,
}

/// A Secret of type `kubernetes.io/tls` (keys `tls.crt` and `tls.key`), as cert-manager writes.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecretRef {
    /// Name of the Secret, in the namespace of the OutboxRelay.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The key of a `kubernetes.io/tls` Secret holding the certificate chain.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// The key of a `kubernetes.io/tls` Secret holding the private key.
pub const TLS_KEY_KEY: &str = "tls.key";

/// PostgreSQL's `sslmode`, with libpq's names and meanings.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PostgresTlsMode {
    /// Never TLS.
    #[serde(rename = "disable")]
    Disable,
    /// Plaintext, TLS only when the server refuses plaintext.
    #[serde(rename = "allow")]
    Allow,
    /// TLS when the server offers it, without verifying it.
    #[serde(rename = "prefer")]
    Prefer,
    /// TLS, without verifying the server (verify-ca when a ca is given, as libpq does).
    #[serde(rename = "require")]
    Require,
    /// TLS, and the server's certificate must chain to `ca`.
    #[serde(rename = "verify-ca")]
    VerifyCa,
    /// TLS, the certificate must chain to `ca` (or the system's store without one) and name
    /// the host of the URL.
    #[default]
    #[serde(rename = "verify-full")]
    VerifyFull,
}

impl PostgresTlsMode {
    /// libpq's spelling, for `PGSSLMODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// TLS to PostgreSQL. The URL in the Secret must then leave sslmode, sslrootcert, sslcert and
/// sslkey out: these fields say it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.mode != 'verify-ca' || has(self.ca)").message("mode verify-ca checks the server's certificate against a CA you give: set ca, or use verify-full, which without ca trusts the system's CA store").field_path(".ca"),
    validation = Rule::new("!has(self.ca) || self.mode in ['require', 'verify-ca', 'verify-full']").message("ca is only used to verify the server with mode require, verify-ca or verify-full; with disable, allow or prefer the server is not verified: use verify-full").field_path(".ca"),
    validation = Rule::new("self.mode != 'disable' || !has(self.clientCertificateSecretRef)").message("mode disable never uses TLS, so a client certificate cannot be presented: remove clientCertificateSecretRef or choose a mode that uses TLS").field_path(".clientCertificateSecretRef")
)]
pub struct DatabaseTlsSpec {
    /// libpq's sslmode: disable, allow, prefer, require, verify-ca or verify-full.
    #[serde(default)]
    pub mode: PostgresTlsMode,
    /// The CA that signed the server's certificate. Absent: the system's CA store (public CAs,
    /// as Azure's and Google's servers use), with verify-full only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSource>,
    /// A `kubernetes.io/tls` Secret whose certificate logs in (pg_hba `cert`) or is offered to
    /// a server that asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret_ref: Option<TlsSecretRef>,
}

/// TLS to the broker, used with an `amqps://` URL (the URL's scheme turns TLS on; these fields
/// say whom to trust and who the relay is).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BrokerTlsSpec {
    /// The CA that signed the broker's certificate, added to the system's CA store. Absent: the
    /// system's store alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSource>,
    /// A `kubernetes.io/tls` Secret with the relay's client certificate. With
    /// `?auth_mechanism=external` in the URL RabbitMQ logs the relay in by it
    /// (rabbitmq_auth_mechanism_ssl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret_ref: Option<TlsSecretRef>,
}

fn password_key() -> String {
    "password".into()
}

fn ca_key() -> String {
    "ca.crt".into()
}
