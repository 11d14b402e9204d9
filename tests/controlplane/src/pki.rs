//! The certificates and keys of one control plane: a CA, the API server's serving certificate,
//! client certificates for the admin and the upstream components, and the service-account signing
//! key. Everything is generated fresh per control plane (ECDSA P-256) and written as PEM files.
//!
//! Owns: the files it writes under the control plane's directory; nothing else.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// An identity: its certificate and key files (a client's, or a test server's).
#[derive(Debug, Clone)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The files of a control plane's PKI.
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// Signs service-account tokens.
    pub sa_key: PathBuf,
    /// Verifies them.
    pub sa_pub: PathBuf,
    dir: PathBuf,
    ca: Certificate,
    ca_key_pair: KeyPair,
}

impl Pki {
    /// Generates the CA, the serving certificate (valid for `ips` and the in-cluster names), and
    /// the service-account key, under `dir`.
    pub fn generate(dir: &Path, ips: &[IpAddr]) -> anyhow::Result<Pki> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key_pair = KeyPair::generate().context("generating the CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "kpr-reference-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key_pair).context("signing the CA")?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            dir: dir.to_path_buf(),
            ca,
            ca_key_pair,
        };
        write(&pki.ca_cert, &pki.ca.pem())?;
        write(&pki.ca_key, &pki.ca_key_pair.serialize_pem())?;

        let names = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        let mut params = CertificateParams::new(names.map(String::from).to_vec())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &pki.ca, &pki.ca_key_pair)?;
        write(&pki.serving_cert, &cert.pem())?;
        write(&pki.serving_key, &key.serialize_pem())?;

        let sa = KeyPair::generate().context("generating the service-account key")?;
        write(&pki.sa_key, &sa.serialize_pem())?;
        write(&pki.sa_pub, &sa.public_key_pem())?;
        Ok(pki)
    }

    /// A client certificate for user `name` (the CN), in `group` (the O; e.g. `system:masters`
    /// for the admin).
    pub fn client(
        &self,
        file_stem: &str,
        name: &str,
        group: Option<&str>,
    ) -> anyhow::Result<ClientCert> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(file_stem, params)
    }

    /// A new key and the certificate of `params` signed by the CA, written as
    /// `<file_stem>.crt` / `.key` in the PKI's directory.
    fn issue(&self, file_stem: &str, params: CertificateParams) -> anyhow::Result<ClientCert> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key_pair)?;
        let out = ClientCert {
            cert: self.dir.join(format!("{file_stem}.crt")),
            key: self.dir.join(format!("{file_stem}.key")),
        };
        write(&out.cert, &cert.pem())?;
        write(&out.key, &key.serialize_pem())?;
        Ok(out)
    }
}

impl Pki {
    /// A serving certificate for `names` (DNS names or IP addresses) signed by the CA, for a
    /// server a test runs behind the API server (an aggregated API's backend) or a node's kubelet.
    pub fn server(&self, file_stem: &str, names: &[&str]) -> anyhow::Result<ClientCert> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params
            .distinguished_name
            .push(DnType::CommonName, file_stem);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(file_stem, params)
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
