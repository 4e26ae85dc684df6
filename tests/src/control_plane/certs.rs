//! The control plane's key material, made fresh for every start: one CA that signs the API
//! server's serving certificate and the admin client certificate, and a separate key pair that
//! signs ServiceAccount tokens.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Paths of the PEM files written into the control plane's directory.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
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
        service_account_key: dir.join("sa.key"),
        service_account_public: dir.join("sa.pub"),
    };

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name("outbox-relay test control plane CA", None);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    std::fs::write(&files.ca_cert, ca_cert.pem())?;
    std::fs::write(&files.ca_key, ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca, ca_key);

    // The names a client may use: loopback, and the in-cluster Service names that pods get
    // through KUBERNETES_SERVICE_HOST or the kubernetes.default Service.
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])?;
    for ip in ["127.0.0.1", "10.0.0.1"] {
        serving
            .subject_alt_names
            .push(SanType::IpAddress(ip.parse()?));
    }
    serving.distinguished_name = name("kube-apiserver", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    write_leaf(&serving, &issuer, &files.serving_cert, &files.serving_key)?;

    // system:masters is the group the API server lets past RBAC: the test's own admin.
    let mut admin = CertificateParams::default();
    admin.distinguished_name = name("outbox-test-admin", Some("system:masters"));
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    write_leaf(&admin, &issuer, &files.admin_cert, &files.admin_key)?;

    let sa_key = KeyPair::generate()?;
    std::fs::write(&files.service_account_key, sa_key.serialize_pem())?;
    std::fs::write(&files.service_account_public, sa_key.public_key_pem())?;
    Ok(files)
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
