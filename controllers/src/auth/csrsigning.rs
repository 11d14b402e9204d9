//! The CSR signers (kube-controller-manager v1.34's `certificatesigningrequest-signing-controller`,
//! alias `csrsigning`, `pkg/controller/certificates/signer`): approved requests for the four
//! `kubernetes.io` signers get a certificate from the cluster's signing CA
//! (`--cluster-signing-cert-file` / `--cluster-signing-key-file`, or the per-signer
//! `--cluster-signing-{kubelet-serving,kubelet-client,kube-apiserver-client,legacy-unknown}-*-file`
//! pairs), valid for `--cluster-signing-duration` or the request's shorter
//! `spec.expirationSeconds` (never under 10 minutes), as upstream's `PermissiveSigningPolicy`:
//! backdated 5 minutes (the end too, unless the certificate lives under 8 hours), capped at the
//! CA's own NotAfter, the request's subject and DNS, IP, email and URI names, the key usages of
//! `spec.usages`, `CA:FALSE`, a random 128-bit serial.
//!
//! Owns: `status.certificate` of the requests it signs, and the `Failed` condition (reason
//! `SignerValidationFailure`) of an approved request its signer refuses (a kubelet request that
//! is not one, an API server client without `client auth`). One controller per signer with a
//! CA, each with its own work queue named as upstream's (`csrsigning-kubelet-serving`, ...),
//! five workers each. The CA is read once at start (upstream reloads it when the files change).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::{Api, Client};
use rcgen::{
    Certificate, CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose,
    IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::error::{Error, Result};
use crate::helpers::clock::{Clock, SystemClock};
use crate::helpers::csr;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs.
pub const NAME: &str = "csrsigning";

/// Workers per signer: kube-controller-manager starts five.
pub const WORKERS: usize = 5;

/// `--cluster-signing-duration`'s default (a year).
pub const DEFAULT_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// How far back a certificate's NotBefore goes (`Backdate`).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Under this, a certificate's NotAfter is not backdated (`Short`).
const SHORT: Duration = Duration::from_secs(8 * 3600);
/// The shortest certificate a request's expirationSeconds gets.
const MIN_DURATION: Duration = Duration::from_secs(10 * 60);

/// The signers, with upstream's controller (and work queue) names and the per-signer flags'
/// middle part.
pub const SIGNERS: [(&str, &str, &str); 4] = [
    (
        csr::KUBELET_SERVING,
        "csrsigning-kubelet-serving",
        "kubelet-serving",
    ),
    (
        csr::KUBE_APISERVER_CLIENT_KUBELET,
        "csrsigning-kubelet-client",
        "kubelet-client",
    ),
    (
        csr::KUBE_APISERVER_CLIENT,
        "csrsigning-kube-apiserver-client",
        "kube-apiserver-client",
    ),
    (
        csr::LEGACY_UNKNOWN,
        "csrsigning-legacy-unknown",
        "legacy-unknown",
    ),
];

/// A CA's certificate and key files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The signing settings of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningConfig {
    /// `--cluster-signing-cert-file` / `--cluster-signing-key-file`.
    pub default: Option<CaFiles>,
    /// The per-signer pairs, by signer name.
    pub per_signer: BTreeMap<&'static str, CaFiles>,
    /// `--cluster-signing-duration`.
    pub duration: Duration,
}

impl Default for SigningConfig {
    fn default() -> Self {
        Self {
            default: None,
            per_signer: BTreeMap::new(),
            duration: DEFAULT_DURATION,
        }
    }
}

impl SigningConfig {
    /// Whether any CA is given (without one, no signer runs).
    pub fn any(&self) -> bool {
        self.default.is_some() || !self.per_signer.is_empty()
    }

    /// The CA of each signer that has one: its per-signer pair, else the default pair (as
    /// upstream, giving both the default and a per-signer pair is an error).
    pub fn signers(&self) -> Result<Vec<(&'static str, &'static str, CaFiles)>> {
        if self.default.is_some() && !self.per_signer.is_empty() {
            return Err(Error::Invalid {
                object: "--cluster-signing-cert-file".into(),
                reason: "cannot specify default and per controller certs at the same time".into(),
            });
        }
        Ok(SIGNERS
            .iter()
            .filter_map(|(signer, controller, _)| {
                let files = self.per_signer.get(signer).or(self.default.as_ref())?;
                Some((*signer, *controller, files.clone()))
            })
            .collect())
    }
}

/// A loaded CA: what rcgen signs with, and its NotAfter (Unix seconds).
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    pub not_after: i64,
}

impl Ca {
    /// Reads the PEM certificate and the PEM (PKCS#8) key; an error names the file.
    pub fn load(files: &CaFiles) -> Result<Ca> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| Error::Invalid {
                object: format!("signing file {}", p.display()),
                reason: format!("reading: {e}"),
            })
        };
        let cert_pem = read(&files.cert)?;
        let key_pem = read(&files.key)?;
        Ca::from_pem(&cert_pem, &key_pem).map_err(|reason| Error::Invalid {
            object: format!(
                "signing CA {} / {}",
                files.cert.display(),
                files.key.display()
            ),
            reason,
        })
    }

    /// The CA of a PEM certificate and key (PKCS#8, or PKCS#1 RSA).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> std::result::Result<Ca, String> {
        let key = if key_pem.contains("-----BEGIN RSA PRIVATE KEY-----") {
            Pkcs1Rsa::from_pem(key_pem)?
        } else {
            KeyPair::from_pem(key_pem).map_err(|e| {
                format!("the key (PKCS#8 ECDSA, Ed25519 or RSA, or PKCS#1 RSA expected): {e}")
            })?
        };
        let (_, block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| format!("the certificate is not PEM: {e}"))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&block.contents)
            .map_err(|e| format!("the certificate: {e}"))?;
        let not_after = parsed.validity().not_after.timestamp();
        let params = CertificateParams::from_ca_cert_der(&block.contents.clone().into())
            .map_err(|e| format!("the certificate: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("the key does not sign as the certificate says: {e}"))?;
        Ok(Ca {
            cert,
            key,
            not_after,
        })
    }
}

/// A PKCS#1 RSA key (kubeadm's CA key), signing with RSA PKCS#1 v1.5 and SHA-256 as Go signs
/// with an RSA CA key.
struct Pkcs1Rsa(ring::signature::RsaKeyPair);

impl Pkcs1Rsa {
    fn from_pem(pem: &str) -> std::result::Result<KeyPair, String> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| format!("the key is not PEM: {e}"))?;
        let key = ring::signature::RsaKeyPair::from_der(&block.contents)
            .map_err(|e| format!("the PKCS#1 RSA key: {e}"))?;
        KeyPair::from_remote(Box::new(Pkcs1Rsa(key))).map_err(|e| e.to_string())
    }
}

impl rcgen::RemoteKeyPair for Pkcs1Rsa {
    fn public_key(&self) -> &[u8] {
        use ring::signature::KeyPair as _;
        self.0.public_key().as_ref()
    }

    fn sign(&self, msg: &[u8]) -> std::result::Result<Vec<u8>, rcgen::Error> {
        let mut sig = vec![0; self.0.public().modulus_len()];
        self.0
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                msg,
                &mut sig,
            )
            .map_err(|_| rcgen::Error::RingUnspecified)?;
        Ok(sig)
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_RSA_SHA256
    }
}

/// `duration`: the certificate's life for a request's `expirationSeconds`.
pub fn duration(cert_ttl: Duration, expiration_seconds: Option<i32>) -> Duration {
    let Some(s) = expiration_seconds else {
        return cert_ttl;
    };
    let requested = Duration::from_secs(u64::try_from(s).unwrap_or(0));
    if requested > cert_ttl {
        cert_ttl
    } else if requested < MIN_DURATION {
        MIN_DURATION
    } else {
        requested
    }
}

/// What a signer does with a request.
#[derive(Debug, PartialEq)]
pub enum Plan {
    Nothing,
    /// Mark it Failed with this message.
    Fail(String),
    /// Sign its request (the DER).
    Sign(Vec<u8>),
}

/// `handle`'s decision for `signer` over the request alone; an error when it does not parse.
pub fn plan(c: &CertificateSigningRequest, signer: &str) -> std::result::Result<Plan, String> {
    if !csr::certificate(c).is_empty()
        || !csr::is_approved(c)
        || csr::has_true_condition(c, "Failed")
        || c.spec.signer_name != signer
    {
        return Ok(Plan::Nothing);
    }
    let req = csr::parse(&c.spec.request.0).map_err(|e| {
        format!(
            "unable to parse csr {:?}: {e}",
            c.metadata.name.as_deref().unwrap_or_default()
        )
    })?;
    let usages = csr::usages(c);
    let valid = match signer {
        csr::KUBELET_SERVING => csr::validate_kubelet_serving(&req, &usages),
        csr::KUBE_APISERVER_CLIENT_KUBELET => csr::validate_kubelet_client(&req, &usages),
        csr::KUBE_APISERVER_CLIENT => {
            csr::validate_api_server_client_usages(c.spec.usages.as_deref().unwrap_or_default())
        }
        csr::LEGACY_UNKNOWN => Ok(()),
        _ => return Ok(Plan::Nothing),
    };
    Ok(match valid {
        Ok(()) => Plan::Sign(req.der),
        Err(m) => Plan::Fail(m),
    })
}

/// `keyUsagesFromStrings`: the key usages and the extended key usages (in Go's order) of
/// `spec.usages`; an error lists the unrecognized ones.
pub fn key_usages(
    usages: &[String],
) -> std::result::Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), String> {
    use ExtendedKeyUsagePurpose as E;
    use KeyUsagePurpose as K;
    let mut ku = Vec::new();
    // Keyed by Go's x509.ExtKeyUsage value, which orders them.
    let mut eku: BTreeMap<u8, E> = BTreeMap::new();
    let mut unrecognized = Vec::new();
    for u in usages {
        let k = match u.as_str() {
            "signing" | "digital signature" => Some(K::DigitalSignature),
            "content commitment" => Some(K::ContentCommitment),
            "key encipherment" => Some(K::KeyEncipherment),
            "key agreement" => Some(K::KeyAgreement),
            "data encipherment" => Some(K::DataEncipherment),
            "cert sign" => Some(K::KeyCertSign),
            "crl sign" => Some(K::CrlSign),
            "encipher only" => Some(K::EncipherOnly),
            "decipher only" => Some(K::DecipherOnly),
            _ => None,
        };
        if let Some(k) = k {
            if !ku.contains(&k) {
                ku.push(k);
            }
            continue;
        }
        let e = match u.as_str() {
            "any" => Some((0, E::Any)),
            "server auth" => Some((1, E::ServerAuth)),
            "client auth" => Some((2, E::ClientAuth)),
            "code signing" => Some((3, E::CodeSigning)),
            "email protection" | "s/mime" => Some((4, E::EmailProtection)),
            "ipsec end system" => Some((5, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5]))),
            "ipsec tunnel" => Some((6, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6]))),
            "ipsec user" => Some((7, E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7]))),
            "timestamping" => Some((8, E::TimeStamping)),
            "ocsp signing" => Some((9, E::OcspSigning)),
            "microsoft sgc" => Some((10, E::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3]))),
            "netscape sgc" => Some((11, E::Other(vec![2, 16, 840, 1, 113730, 4, 1]))),
            _ => None,
        };
        match e {
            Some((order, e)) => {
                eku.insert(order, e);
            }
            None => unrecognized.push(u.clone()),
        }
    }
    if !unrecognized.is_empty() {
        return Err(format!("unrecognized usage values: {unrecognized:?}"));
    }
    Ok((ku, eku.into_values().collect()))
}

/// `PermissiveSigningPolicy.apply`'s validity: (NotBefore, NotAfter) in Unix seconds for a
/// certificate of `ttl` issued at `now` by a CA valid until `ca_not_after`.
pub fn validity(
    now: i64,
    ttl: Duration,
    ca_not_after: i64,
) -> std::result::Result<(i64, i64), String> {
    let ttl_s = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
    let not_before = now - BACKDATE.as_secs() as i64;
    let mut not_after = if ttl < SHORT {
        now + ttl_s
    } else {
        not_before + ttl_s
    };
    if not_after >= ca_not_after {
        not_after = ca_not_after;
    }
    if not_before >= ca_not_after {
        return Err(format!("the signer has expired: NotAfter={ca_not_after}"));
    }
    if now >= ca_not_after {
        return Err(format!(
            "refusing to sign a certificate that expired in the past: NotAfter={ca_not_after}"
        ));
    }
    Ok((not_before, not_after))
}

/// `CertificateAuthority.Sign`: checks the request's signature and issues its certificate (PEM)
/// with `usages`, valid for `ttl` from `now` (Unix seconds), with `serial`.
pub fn issue(
    ca: &Ca,
    request_der: &[u8],
    usages: &[String],
    ttl: Duration,
    now: i64,
    serial: [u8; 16],
) -> std::result::Result<String, String> {
    let (_, req) = X509CertificationRequest::from_der(request_der)
        .map_err(|e| format!("unable to parse certificate request: {e}"))?;
    req.verify_signature()
        .map_err(|e| format!("unable to verify certificate request signature: {e}"))?;
    let info = &req.certification_request_info;
    let public_key = rcgen::SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
        .map_err(|e| format!("the request's public key: {e}"))?;
    let (key_usages, extended_key_usages) = key_usages(usages)?;
    let (not_before, not_after) = validity(now, ttl, ca.not_after)?;
    let time = |t: i64| {
        time::OffsetDateTime::from_unix_timestamp(t).map_err(|e| format!("a time of {t}: {e}"))
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(&info.subject)?;
    let parsed = csr::parse_der(request_der)?;
    let ia5 =
        |s: &str| rcgen::Ia5String::try_from(s).map_err(|e| format!("subjectAltName {s:?}: {e}"));
    for d in &parsed.dns_names {
        params.subject_alt_names.push(SanType::DnsName(ia5(d)?));
    }
    for ip in &parsed.ip_addresses {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    for e in &parsed.email_addresses {
        params.subject_alt_names.push(SanType::Rfc822Name(ia5(e)?));
    }
    for u in &parsed.uris {
        params.subject_alt_names.push(SanType::URI(ia5(u)?));
    }
    params.not_before = time(not_before)?;
    params.not_after = time(not_after)?;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = key_usages;
    params.extended_key_usages = extended_key_usages;
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&public_key, &ca.cert, &ca.key)
        .map_err(|e| format!("failed to sign certificate: {e}"))?;
    Ok(cert.pem())
}

/// The request's subject as Go's `pkix.Name` re-encodes it in the certificate: the attributes it
/// knows, in its order (C, ST, L, street, postal code, O, OU, CN, serial number), each a
/// PrintableString when its characters allow, else a UTF8String; attributes of other types are
/// dropped, as Go keeps them out of `ExtraNames`. rcgen keeps one value per type (Go keeps every
/// C, O, OU... value): the last one wins.
fn subject(name: &x509_parser::x509::X509Name) -> std::result::Result<DistinguishedName, String> {
    const GO_ORDER: [&[u64]; 9] = [
        &[2, 5, 4, 6],
        &[2, 5, 4, 8],
        &[2, 5, 4, 7],
        &[2, 5, 4, 9],
        &[2, 5, 4, 17],
        &[2, 5, 4, 10],
        &[2, 5, 4, 11],
        &[2, 5, 4, 3],
        &[2, 5, 4, 5],
    ];
    let mut found: BTreeMap<usize, String> = BTreeMap::new();
    for rdn in name.iter() {
        for attr in rdn.iter() {
            let Some(oid) = attr.attr_type().iter().map(|i| i.collect::<Vec<u64>>()) else {
                continue;
            };
            let Some(at) = GO_ORDER.iter().position(|o| *o == oid.as_slice()) else {
                continue;
            };
            let text = attr
                .as_str()
                .map_err(|e| format!("a subject attribute that is not a string: {e}"))?;
            found.insert(at, text.to_string());
        }
    }
    let mut dn = DistinguishedName::new();
    for (at, text) in found {
        let value = match rcgen::PrintableString::try_from(text.as_str()) {
            Ok(p) => DnValue::PrintableString(p),
            Err(_) => DnValue::Utf8String(text),
        };
        dn.push(DnType::from_oid(GO_ORDER[at]), value);
    }
    Ok(dn)
}

/// The running signer of one signer name.
pub struct Controller {
    client: Client,
    signer: &'static str,
    name: &'static str,
    ca: Ca,
    cert_ttl: Duration,
    clock: Arc<dyn Clock>,
    csrs: Arc<Indexed<CertificateSigningRequest>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Loads the signer's CA and registers its handler on the CSR informer.
    pub fn new(
        client: Client,
        informers: &Informers,
        signer: &'static str,
        name: &'static str,
        files: &CaFiles,
        cert_ttl: Duration,
    ) -> Result<Arc<Controller>> {
        let ca = Ca::load(files)?;
        let informer = informers.get::<CertificateSigningRequest>();
        let this = Arc::new(Controller {
            client,
            signer,
            name,
            ca,
            cert_ttl,
            clock: Arc::new(SystemClock),
            csrs: informer.cache(),
            queue: WorkQueue::new(name),
        });
        informer.on_change_of(&this, |c, old, new| {
            if let Some(name) = new.or(old).and_then(|r| r.metadata.name.clone()) {
                c.queue.add(name);
            }
        });
        Ok(this)
    }

    /// Every signer `config` gives a CA, built.
    pub fn all(
        client: &Client,
        informers: &Informers,
        config: &SigningConfig,
    ) -> Result<Vec<Arc<Controller>>> {
        config
            .signers()?
            .into_iter()
            .map(|(signer, name, files)| {
                Controller::new(
                    client.clone(),
                    informers,
                    signer,
                    name,
                    &files,
                    config.duration,
                )
            })
            .collect()
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, self.name, &[&*self.csrs], &self.queue, WORKERS).await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(c) = self.csrs.get("", name) else {
            return Ok(());
        };
        let object = || format!("CertificateSigningRequest {name}");
        let invalid = |reason: String| Error::Invalid {
            object: object(),
            reason,
        };
        let mut out = (*c).clone();
        match plan(&c, self.signer).map_err(invalid)? {
            Plan::Nothing => return Ok(()),
            Plan::Fail(message) => {
                out.status
                    .get_or_insert_with(Default::default)
                    .conditions
                    .get_or_insert_with(Vec::new)
                    .push(CertificateSigningRequestCondition {
                        type_: "Failed".into(),
                        status: "True".into(),
                        reason: Some("SignerValidationFailure".into()),
                        message: Some(message),
                        last_update_time: Some(Time(self.clock.now())),
                        ..Default::default()
                    });
            }
            Plan::Sign(der) => {
                let ttl = duration(self.cert_ttl, c.spec.expiration_seconds);
                let now = self.clock.now().as_second();
                let serial: [u8; 16] = rand::random();
                let usages = c.spec.usages.clone().unwrap_or_default();
                let pem = issue(&self.ca, &der, &usages, ttl, now, serial)
                    .map_err(|e| invalid(format!("error auto signing csr: {e}")))?;
                out.status.get_or_insert_with(Default::default).certificate =
                    Some(k8s_openapi::ByteString(pem.into_bytes()));
            }
        }
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        api.replace_status(name, &PostParams::default(), &out)
            .await
            .map(|_| ())
            .map_err(|e| Error::kube("updating the status of", object(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helpers::csr::tests::request;
    use rcgen::BasicConstraints;
    use serde_json::json;
    use x509_parser::extensions::ParsedExtension;

    fn ca() -> (Ca, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test-ca");
        params.not_after = time::OffsetDateTime::from_unix_timestamp(4_000_000_000).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        (Ca::from_pem(&pem, &key.serialize_pem()).unwrap(), pem)
    }

    fn csr(
        pem: &str,
        signer: &str,
        usages: &[&str],
        conditions: serde_json::Value,
    ) -> CertificateSigningRequest {
        let mut c: CertificateSigningRequest = serde_json::from_value(json!({
            "metadata": {"name": "r"},
            "spec": {"request": "", "signerName": signer, "usages": usages},
            "status": {"conditions": conditions}}))
        .unwrap();
        c.spec.request = k8s_openapi::ByteString(pem.as_bytes().to_vec());
        c
    }

    fn approved() -> serde_json::Value {
        json!([{"type": "Approved", "status": "True"}])
    }

    /// Upstream's `TestDuration` table.
    #[test]
    fn upstream_duration_table() {
        let h = |n: u64| Duration::from_secs(n * 3600);
        let m = |n: u64| Duration::from_secs(n * 60);
        let cases: [(Duration, Option<i32>, Duration); 7] = [
            (h(1), None, h(1)),
            (h(10), Some(3600), h(1)),
            (h(10), Some(3600 * 11), h(10)),
            (h(10), Some(60), m(10)),
            (h(10), Some(-1), m(10)),
            (h(10), Some(600), m(10)),
            (h(10), Some(601), Duration::from_secs(601)),
        ];
        for (ttl, exp, want) in cases {
            assert_eq!(duration(ttl, exp), want, "{ttl:?} {exp:?}");
        }
    }

    /// Upstream's `TestCertificateAuthority` validity cases: backdated, short certificates not
    /// backdated at the end, capped at the CA's NotAfter, refused past it.
    #[test]
    fn upstream_validity_cases() {
        let now = 1_000_000;
        assert_eq!(
            validity(now, Duration::from_secs(24 * 3600), i64::MAX).unwrap(),
            (now - 300, now - 300 + 24 * 3600)
        );
        assert_eq!(
            validity(now, Duration::from_secs(3600), i64::MAX).unwrap(),
            (now - 300, now + 3600)
        );
        assert_eq!(
            validity(now, Duration::from_secs(24 * 3600), now + 100).unwrap(),
            (now - 300, now + 100)
        );
        assert!(validity(now, Duration::from_secs(3600), now - 1000)
            .unwrap_err()
            .contains("the signer has expired"));
        assert!(validity(now, Duration::from_secs(3600), now - 100)
            .unwrap_err()
            .contains("refusing to sign"));
    }

    #[test]
    fn usages_map_as_upstreams_dictionaries() {
        let u = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (ku, eku) = key_usages(&u(&[
            "client auth",
            "server auth",
            "digital signature",
            "signing",
        ]))
        .unwrap();
        assert_eq!(ku, [KeyUsagePurpose::DigitalSignature]);
        assert_eq!(
            eku,
            [
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth
            ],
            "Go's order"
        );
        assert_eq!(
            key_usages(&u(&["client auth", "bogus"])).unwrap_err(),
            "unrecognized usage values: [\"bogus\"]"
        );
    }

    /// Upstream's `TestSignerHandle` / `TestHandle` decisions.
    #[test]
    fn which_requests_are_signed_or_failed() {
        let node_client = request(&["system:nodes"], "system:node:n1", vec![]);
        let client_usages = ["digital signature", "key encipherment", "client auth"];
        let kubelet = csr::KUBE_APISERVER_CLIENT_KUBELET;
        assert!(matches!(
            plan(
                &csr(&node_client, kubelet, &client_usages, approved()),
                kubelet
            )
            .unwrap(),
            Plan::Sign(_)
        ));
        for (what, c, signer) in [
            (
                "not approved",
                csr(&node_client, kubelet, &client_usages, json!([])),
                kubelet,
            ),
            (
                "denied too",
                csr(
                    &node_client,
                    kubelet,
                    &client_usages,
                    json!([{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]),
                ),
                kubelet,
            ),
            (
                "failed already",
                csr(
                    &node_client,
                    kubelet,
                    &client_usages,
                    json!([{"type": "Approved", "status": "True"}, {"type": "Failed", "status": "True"}]),
                ),
                kubelet,
            ),
            (
                "another signer's",
                csr(&node_client, kubelet, &client_usages, approved()),
                csr::KUBELET_SERVING,
            ),
            (
                "not a kubernetes.io signer",
                csr(&node_client, "example.com/x", &client_usages, approved()),
                "example.com/x",
            ),
        ] {
            assert_eq!(plan(&c, signer).unwrap(), Plan::Nothing, "{what}");
        }
        // A kubelet client request with serving usages: Failed.
        assert_eq!(
            plan(
                &csr(
                    &node_client,
                    kubelet,
                    &["digital signature", "server auth"],
                    approved()
                ),
                kubelet
            )
            .unwrap(),
            Plan::Fail(
                "usages did not match [client auth digital signature key encipherment]".into()
            )
        );
        // An API server client without client auth: Failed.
        let any = request(&["o"], "someone", vec![]);
        assert_eq!(
            plan(
                &csr(
                    &any,
                    csr::KUBE_APISERVER_CLIENT,
                    &["server auth"],
                    approved()
                ),
                csr::KUBE_APISERVER_CLIENT
            )
            .unwrap(),
            Plan::Fail("invalid usage for client certificate: server auth".into())
        );
        // legacy-unknown: anything.
        assert!(matches!(
            plan(
                &csr(&any, csr::LEGACY_UNKNOWN, &["server auth"], approved()),
                csr::LEGACY_UNKNOWN
            )
            .unwrap(),
            Plan::Sign(_)
        ));
    }

    #[test]
    fn the_issued_certificate_chains_to_the_ca_and_carries_the_request() {
        let (ca, ca_pem) = ca();
        let pem = request(
            &["system:nodes"],
            "system:node:n1",
            vec![
                SanType::DnsName("n1.example".try_into().unwrap()),
                SanType::IpAddress("10.0.0.9".parse().unwrap()),
            ],
        );
        let der = csr::parse(pem.as_bytes()).unwrap().der;
        let usages: Vec<String> = ["digital signature", "server auth"]
            .map(String::from)
            .to_vec();
        let now = 1_800_000_000;
        let out = issue(
            &ca,
            &der,
            &usages,
            Duration::from_secs(3600),
            now,
            [0x80; 16],
        )
        .unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(out.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).unwrap();
        let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_block.contents).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(
            cert.issuer().as_raw(),
            ca_cert.subject().as_raw(),
            "issuer bytes = CA subject bytes"
        );
        assert_eq!(
            cert.subject().to_string(),
            "O=system:nodes, CN=system:node:n1"
        );
        assert_eq!(cert.validity().not_before.timestamp(), now - 300);
        assert_eq!(cert.validity().not_after.timestamp(), now + 3600);
        let mut sans = Vec::new();
        let mut eku = None;
        let mut ca_false = false;
        for ext in cert.extensions() {
            match ext.parsed_extension() {
                ParsedExtension::SubjectAlternativeName(s) => {
                    sans = s.general_names.iter().map(|g| g.to_string()).collect()
                }
                ParsedExtension::ExtendedKeyUsage(e) => eku = Some((e.server_auth, e.client_auth)),
                ParsedExtension::BasicConstraints(b) => ca_false = !b.ca,
                _ => {}
            }
        }
        assert_eq!(sans, ["DNSName(n1.example)", "IPAddress(0a:00:00:09)"]);
        assert_eq!(eku, Some((true, false)));
        assert!(ca_false, "CA:FALSE");
        assert!(cert.key_usage().unwrap().unwrap().value.digital_signature());
        assert_eq!(csr::not_after(out.as_bytes()).unwrap(), now + 3600);

        // A request whose signature does not match: refused.
        let mut tampered = der.clone();
        let n = tampered.len();
        tampered[n - 3] ^= 0xff;
        assert!(issue(
            &ca,
            &tampered,
            &usages,
            Duration::from_secs(3600),
            now,
            [1; 16]
        )
        .is_err());
    }

    /// A kubeadm-style CA (RSA, its key PKCS#1, made by openssl: `testdata/`) signs too.
    #[test]
    fn a_pkcs1_rsa_ca_signs() {
        let ca_pem = include_str!("testdata/rsa-pkcs1-ca.crt");
        let ca = Ca::from_pem(ca_pem, include_str!("testdata/rsa-pkcs1-ca.key")).unwrap();
        let pem = request(&["team"], "alice", vec![]);
        let der = csr::parse(pem.as_bytes()).unwrap().der;
        let out = issue(
            &ca,
            &der,
            &["client auth".to_string()],
            Duration::from_secs(3600),
            1_800_000_000,
            [7; 16],
        )
        .unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(out.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).unwrap();
        let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_block.contents).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(cert.issuer().as_raw(), ca_cert.subject().as_raw());
    }

    #[test]
    fn default_and_per_signer_files() {
        let f = |n: &str| CaFiles {
            cert: n.into(),
            key: n.into(),
        };
        let mut c = SigningConfig::default();
        assert!(!c.any());
        c.default = Some(f("all"));
        assert_eq!(c.signers().unwrap().len(), 4);
        c.per_signer.insert(csr::KUBELET_SERVING, f("serving"));
        assert!(c.signers().is_err(), "both");
        c.default = None;
        let only = c.signers().unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(
            (only[0].0, only[0].1),
            (csr::KUBELET_SERVING, "csrsigning-kubelet-serving")
        );
    }
}
