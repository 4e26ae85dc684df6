//! The files a relay pod reads its connection secrets from: passwords, CA certificates and
//! client certificates, each a Secret or ConfigMap key mounted read-only in a folder of its
//! own. Whole volumes are mounted, never `subPath`, because only then does the kubelet update
//! the files when the Secret changes: a rotated password reaches the running relay, which reads
//! it at every new connection.
//!
//! The database's TLS settings reach the relay as libpq's variables (`PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), which it reads as libpq does; the broker's and the
//! passwords as the relay's own flags.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EnvVar, KeyToPath, SecretVolumeSource, Volume, VolumeMount,
};

use super::env::value_env;
use crate::crd::tls::{TLS_CERT_KEY, TLS_KEY_KEY};
use crate::crd::{
    BrokerTlsSpec, CaSource, DatabaseTlsSpec, OutboxRelaySpec, PasswordSecretRef, PostgresTlsMode,
    TlsSecretRef,
};

/// Where the folders are mounted in the relay container.
pub const MOUNT_ROOT: &str = "/var/run/secrets/outbox-relay";
/// Owner-and-group read only: the pod's fsGroup makes the relay's user the group.
const FILE_MODE: i32 = 0o440;

/// The volumes, mounts, variables and flag values of one relay's connection files.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ConnectionFiles {
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
    pub env: Vec<EnvVar>,
    pub database_password_file: Option<PathBuf>,
    pub broker_password_file: Option<PathBuf>,
    pub broker_ca_file: Option<PathBuf>,
    pub broker_client_cert: Option<PathBuf>,
    pub broker_client_key: Option<PathBuf>,
}

impl ConnectionFiles {
    /// Everything `spec` asks to mount; empty for a spec without passwords or TLS, so such
    /// Deployments stay exactly as they were.
    pub fn of(spec: &OutboxRelaySpec) -> Self {
        let mut files = Self::default();
        if let Some(reference) = &spec.database.password_secret_ref {
            files.database_password_file = Some(files.password("database-password", reference));
        }
        if let Some(tls) = &spec.database.tls {
            files.database_tls(tls);
        }
        if let Some(reference) = &spec.broker.password_secret_ref {
            files.broker_password_file = Some(files.password("broker-password", reference));
        }
        if let Some(tls) = &spec.broker.tls {
            files.broker_tls(tls);
        }
        files
    }

    /// True when a file is mounted, so the pod needs an fsGroup to read it.
    pub fn any(&self) -> bool {
        !self.volumes.is_empty()
    }

    fn database_tls(&mut self, tls: &DatabaseTlsSpec) {
        self.env.push(value_env("PGSSLMODE", tls.mode.as_str()));
        match &tls.ca {
            Some(ca) => {
                if let Some(path) = self.ca("database-ca", ca) {
                    self.env
                        .push(value_env("PGSSLROOTCERT", &path.display().to_string()));
                }
            }
            // libpq 16's word for the operating system's CA store.
            None if tls.mode == PostgresTlsMode::VerifyFull => {
                self.env.push(value_env("PGSSLROOTCERT", "system"));
            }
            None => {}
        }
        if let Some(reference) = &tls.client_certificate_secret_ref {
            let (cert, key) = self.client("database-client", reference);
            self.env
                .push(value_env("PGSSLCERT", &cert.display().to_string()));
            self.env
                .push(value_env("PGSSLKEY", &key.display().to_string()));
        }
    }

    fn broker_tls(&mut self, tls: &BrokerTlsSpec) {
        if let Some(ca) = &tls.ca {
            self.broker_ca_file = self.ca("broker-ca", ca);
        }
        if let Some(reference) = &tls.client_certificate_secret_ref {
            let (cert, key) = self.client("broker-client", reference);
            self.broker_client_cert = Some(cert);
            self.broker_client_key = Some(key);
        }
    }

    fn password(&mut self, volume: &str, reference: &PasswordSecretRef) -> PathBuf {
        self.secret(volume, &reference.name, &[(&reference.key, "password")])
            .join("password")
    }

    /// `None` for a source naming neither kind, which validation refuses.
    fn ca(&mut self, volume: &str, ca: &CaSource) -> Option<PathBuf> {
        let folder = match (&ca.secret_key_ref, &ca.config_map_key_ref) {
            (Some(r), _) => self.secret(volume, &r.name, &[(&r.key, "ca.crt")]),
            (None, Some(r)) => {
                self.volumes.push(Volume {
                    name: volume.into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: r.name.clone(),
                        items: Some(vec![item(&r.key, "ca.crt")]),
                        default_mode: Some(FILE_MODE),
                        optional: Some(false),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                self.mount(volume)
            }
            (None, None) => return None,
        };
        Some(folder.join("ca.crt"))
    }

    fn client(&mut self, volume: &str, reference: &TlsSecretRef) -> (PathBuf, PathBuf) {
        let folder = self.secret(
            volume,
            &reference.name,
            &[(TLS_CERT_KEY, TLS_CERT_KEY), (TLS_KEY_KEY, TLS_KEY_KEY)],
        );
        (folder.join(TLS_CERT_KEY), folder.join(TLS_KEY_KEY))
    }

    /// Mounts the Secret `name`'s `keys` (key, file name) as `volume`; returns its folder.
    fn secret(&mut self, volume: &str, name: &str, keys: &[(&str, &str)]) -> PathBuf {
        self.volumes.push(Volume {
            name: volume.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.into()),
                items: Some(keys.iter().map(|(key, file)| item(key, file)).collect()),
                default_mode: Some(FILE_MODE),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.mount(volume)
    }

    fn mount(&mut self, volume: &str) -> PathBuf {
        let folder = PathBuf::from(MOUNT_ROOT).join(volume);
        self.mounts.push(VolumeMount {
            name: volume.into(),
            mount_path: folder.display().to_string(),
            read_only: Some(true),
            ..Default::default()
        });
        folder
    }
}

fn item(key: &str, file: &str) -> KeyToPath {
    KeyToPath {
        key: key.into(),
        path: file.into(),
        ..Default::default()
    }
}
