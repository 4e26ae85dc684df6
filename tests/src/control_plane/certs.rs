//! The control plane's key material, made fresh for every start: one CA that signs the API
//! server's serving certificate, the admin client certificate, the API server's client
//! certificate for kubelets, and later the node's certificates ([`issue`]); and a separate key
//! pair that signs ServiceAccount tokens.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::services::SERVICES_ADDRESS;

/// Paths of the PEM files written into the control plane's directory.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// The API server's identity towards kubelets (`kubectl logs`, `exec`, `port-forward`).
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
    /// Signs ServiceAccount tokens (kube-apiserver and the token controller).
    pub service_account_key: PathBuf,
    pub service_account_public: PathBuf,
}

/// Writes a new CA, the serving and admin certificates and the ServiceAccount keys into `dir`.
pub fn write(dir: &Path) -> anyhow::Result<CertFiles> {
    let files = CertFiles {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        kubelet_client_cert: dir.join("apiserver-kubelet-client.crt"),
        kubelet_client_key: dir.join("apiserver-kubelet-client.key"),
        service_account_key: dir.join("sa.key"),
        service_account_public: dir.join("sa.pub"),
    };

    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params().self_signed(&ca_key)?;
    std::fs::write(&files.ca_cert, ca_cert.pem())?;
    std::fs::write(&files.ca_key, ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca_params(), ca_key);

    // The names a client may use: loopback, and the in-cluster Service names that pods get
    // through KUBERNETES_SERVICE_HOST or the kubernetes.default Service.
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])?;
    // Loopback for the tests, the services address for the node and pods (the `kubernetes`
    // Service's endpoint), the Service's ClusterIP for in-cluster clients.
    for ip in [
        "127.0.0.1".parse()?,
        std::net::IpAddr::V4(SERVICES_ADDRESS),
        "10.0.0.1".parse()?,
    ] {
        serving.subject_alt_names.push(SanType::IpAddress(ip));
    }
    serving.distinguished_name = name("kube-apiserver", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    write_leaf(&serving, &issuer, &files.serving_cert, &files.serving_key)?;

    // system:masters is the group the API server lets past RBAC: the test's own admin.
    let admin = client_params("outbox-test-admin", Some("system:masters"));
    write_leaf(&admin, &issuer, &files.admin_cert, &files.admin_key)?;

    // What kubeadm gives the API server: a client in system:masters, so every kubelet's
    // webhook authorization lets it read logs and open port-forwards.
    let kubelet_client = client_params("kube-apiserver-kubelet-client", Some("system:masters"));
    write_leaf(
        &kubelet_client,
        &issuer,
        &files.kubelet_client_cert,
        &files.kubelet_client_key,
    )?;

    let sa_key = KeyPair::generate()?;
    std::fs::write(&files.service_account_key, sa_key.serialize_pem())?;
    std::fs::write(&files.service_account_public, sa_key.public_key_pem())?;
    Ok(files)
}

/// The CA's parameters: the same on every call, so a certificate issued later by [`issue`] with
/// the CA key from disk names the CA exactly as the CA certificate does.
fn ca_params() -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name("outbox-relay test control plane CA", None);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca
}

fn client_params(common_name: &str, organization: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name, organization);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// What a certificate [`issue`]s is for.
pub enum Usage<'a> {
    /// A client: Kubernetes reads the user from the common name, the groups from the
    /// organizations.
    Client {
        user: &'a str,
        group: Option<&'a str>,
    },
    /// A server at these addresses and names.
    Server {
        ips: &'a [std::net::IpAddr],
        names: &'a [String],
    },
}

/// A certificate of the control plane's CA (whose files are in `files`) for `usage`, written to
/// `dir/<stem>.crt` and `.key`; returns their paths.
pub fn issue(
    files: &CertFiles,
    dir: &Path,
    stem: &str,
    usage: Usage<'_>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(&files.ca_key)?)?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let params = match usage {
        Usage::Client { user, group } => client_params(user, group),
        Usage::Server { ips, names } => {
            let mut params = CertificateParams::new(names.to_vec())?;
            for ip in ips {
                params.subject_alt_names.push(SanType::IpAddress(*ip));
            }
            params.distinguished_name = name(names.first().map_or("server", String::as_str), None);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params
        }
    };
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    write_leaf(&params, &issuer, &cert, &key)?;
    Ok((cert, key))
}

fn write_leaf(
    params: &CertificateParams,
    issuer: &Issuer<'_, KeyPair>,
    cert_path: &Path,
    key_path: &Path,
) -> anyhow::Result<()> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    std::fs::write(cert_path, cert.pem())?;
    std::fs::write(key_path, key.serialize_pem())?;
    Ok(())
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}
