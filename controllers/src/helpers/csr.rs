//! CertificateSigningRequests as the certificates controllers read them (upstream's
//! `pkg/apis/certificates` helpers and `pkg/controller/certificates`' condition helpers): the
//! PEM request parsed into what the approver and the signers look at, the kubelet client and
//! serving request checks, the conditions, and an issued certificate's expiry.
//!
//! Pure: X.509 parsing is x509-parser's; nothing here signs or talks to the API server.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

/// The signer names of the API (`capi.*SignerName`).
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// A parsed request: the fields of Go's `x509.CertificateRequest` the controllers use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// The DER of the whole request.
    pub der: Vec<u8>,
    /// The subject's O values, in order.
    pub organization: Vec<String>,
    /// The subject's CN (the last, as Go keeps it), empty when none.
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub email_addresses: Vec<String>,
    pub uris: Vec<String>,
}

/// `ParseCSR`: the one `CERTIFICATE REQUEST` PEM block of `spec.request`, parsed. The signature
/// is not checked here (the signer checks it, as upstream's `CheckSignature` in `Sign`).
pub fn parse(pem: &[u8]) -> Result<Request, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_string())?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    parse_der(&block.contents)
}

/// [`parse`] of the request's DER.
pub fn parse_der(der: &[u8]) -> Result<Request, String> {
    let (_, csr) = X509CertificationRequest::from_der(der)
        .map_err(|e| format!("parsing the certificate request: {e}"))?;
    let subject = &csr.certification_request_info.subject;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| {
        a.as_str().map(str::to_string).map_err(|e| e.to_string())
    };
    let organization = subject
        .iter_organization()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    let common_name = match subject.iter_common_name().last() {
        Some(cn) => text(cn)?,
        None => String::new(),
    };
    let mut out = Request {
        der: der.to_vec(),
        organization,
        common_name,
        ..Default::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => out.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => out.email_addresses.push(e.to_string()),
                    GeneralName::URI(u) => out.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => out.ip_addresses.push(ip_of(b)?),
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

fn ip_of(b: &[u8]) -> Result<IpAddr, String> {
    match b.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes"))),
        16 => Ok(IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes"))),
        n => Err(format!("an IP subjectAltName of {n} bytes")),
    }
}

/// `spec.usages` as a set.
pub fn usages(csr: &CertificateSigningRequest) -> BTreeSet<&str> {
    csr.spec
        .usages
        .iter()
        .flatten()
        .map(String::as_str)
        .collect()
}

fn set<'a>(v: &[&'a str]) -> BTreeSet<&'a str> {
    v.iter().copied().collect()
}

/// `ValidateKubeletClientCSR`: a kubelet's client certificate request.
pub fn validate_kubelet_client(req: &Request, usages: &BTreeSet<&str>) -> Result<(), String> {
    if req.organization != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if !req.dns_names.is_empty() {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if !req.email_addresses.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !req.ip_addresses.is_empty() {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if !req.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !req.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    let rsa = set(&["client auth", "digital signature", "key encipherment"]);
    if *usages != rsa && *usages != set(&["client auth", "digital signature"]) {
        return Err(format!("usages did not match {}", go_list(&rsa)));
    }
    Ok(())
}

/// `ValidateKubeletServingCSR`: a kubelet's serving certificate request.
pub fn validate_kubelet_serving(req: &Request, usages: &BTreeSet<&str>) -> Result<(), String> {
    if req.organization != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if !req.email_addresses.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !req.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    let rsa = set(&["digital signature", "key encipherment", "server auth"]);
    if *usages != rsa && *usages != set(&["digital signature", "server auth"]) {
        return Err(format!("usages did not match {}", go_list(&rsa)));
    }
    if !req.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    Ok(())
}

/// `validAPIServerClientUsages`: `client auth`, with `digital signature` and `key
/// encipherment` allowed besides.
pub fn validate_api_server_client_usages(usages: &[String]) -> Result<(), String> {
    let mut client_auth = false;
    for u in usages {
        match u.as_str() {
            "digital signature" | "key encipherment" => {}
            "client auth" => client_auth = true,
            other => return Err(format!("invalid usage for client certificate: {other}")),
        }
    }
    if !client_auth {
        return Err("missing required usage for client certificate: client auth".into());
    }
    Ok(())
}

/// A set as Go's `%v` prints a sorted string list: `[a b c]`.
fn go_list(s: &BTreeSet<&str>) -> String {
    format!("[{}]", Vec::from_iter(s.iter().copied()).join(" "))
}

/// Whether the request has a condition of `type_` with status True.
pub fn has_true_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    conditions(csr).any(|c| c.type_ == type_ && c.status == "True")
}

fn conditions(
    csr: &CertificateSigningRequest,
) -> impl Iterator<Item = &k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
}

/// `GetCertApprovalCondition`: (approved, denied), by the presence of the condition types (a
/// status other than True does not count).
pub fn approval(csr: &CertificateSigningRequest) -> (bool, bool) {
    (
        has_true_condition(csr, "Approved"),
        has_true_condition(csr, "Denied"),
    )
}

/// `IsCertificateRequestApproved`: approved and not denied.
pub fn is_approved(csr: &CertificateSigningRequest) -> bool {
    let (approved, denied) = approval(csr);
    approved && !denied
}

/// The issued certificate (`status.certificate`), empty when none.
pub fn certificate(csr: &CertificateSigningRequest) -> &[u8] {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .map(|c| c.0.as_slice())
        .unwrap_or_default()
}

/// The NotAfter (Unix seconds) of the first certificate of a PEM bundle.
pub fn not_after(pem: &[u8]) -> Result<i64, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|_| "expected the certificate associated with the CSR to be PEM encoded")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
        .map_err(|e| format!("unable to parse certificate data: {e}"))?;
    Ok(cert.validity().not_after.timestamp())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    /// A request made as a kubelet makes it (rcgen in the place of Go's x509); the CSR
    /// controllers' tests make theirs with it too.
    pub(crate) fn request(org: &[&str], cn: &str, sans: Vec<SanType>) -> String {
        let mut params = CertificateParams::default();
        for o in org {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn dns(n: &str) -> SanType {
        SanType::DnsName(n.try_into().unwrap())
    }

    #[test]
    fn a_request_parses_into_its_subject_and_names() {
        let pem = request(
            &["system:nodes"],
            "system:node:a",
            vec![
                dns("a.example"),
                SanType::IpAddress("10.0.0.1".parse().unwrap()),
                SanType::Rfc822Name("x@example.com".try_into().unwrap()),
            ],
        );
        let r = parse(pem.as_bytes()).unwrap();
        assert_eq!(r.organization, ["system:nodes"]);
        assert_eq!(r.common_name, "system:node:a");
        assert_eq!(r.dns_names, ["a.example"]);
        assert_eq!(r.ip_addresses, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(r.email_addresses, ["x@example.com"]);
        assert!(parse(b"garbage").is_err());
        let cert_block = pem.replace("CERTIFICATE REQUEST", "CERTIFICATE");
        assert_eq!(
            parse(cert_block.as_bytes()).unwrap_err(),
            "PEM block type must be CERTIFICATE REQUEST"
        );
    }

    /// Upstream's `TestIsKubeletClientCSR` / `TestIsKubeletServingCSR` cases.
    #[test]
    fn kubelet_client_and_serving_requests() {
        let client = ["client auth", "digital signature", "key encipherment"];
        let client_ec = ["client auth", "digital signature"];
        let serving = ["digital signature", "key encipherment", "server auth"];
        let good = Request {
            organization: vec!["system:nodes".into()],
            common_name: "system:node:n1".into(),
            ..Default::default()
        };
        assert_eq!(validate_kubelet_client(&good, &set(&client)), Ok(()));
        assert_eq!(validate_kubelet_client(&good, &set(&client_ec)), Ok(()));
        let cases: Vec<(&str, Request, &[&str], &str)> = vec![
            (
                "wrong organization",
                Request {
                    organization: vec!["system:nodes".into(), "other".into()],
                    ..good.clone()
                },
                &client,
                "subject organization is not system:nodes",
            ),
            (
                "a DNS name",
                Request {
                    dns_names: vec!["n".into()],
                    ..good.clone()
                },
                &client,
                "DNS subjectAltNames are not allowed",
            ),
            (
                "an IP",
                Request {
                    ip_addresses: vec!["10.0.0.1".parse().unwrap()],
                    ..good.clone()
                },
                &client,
                "IP subjectAltNames are not allowed",
            ),
            (
                "wrong CN",
                Request {
                    common_name: "node:n1".into(),
                    ..good.clone()
                },
                &client,
                "subject common name does not begin with system:node:",
            ),
            (
                "server usages",
                good.clone(),
                &serving,
                "usages did not match [client auth digital signature key encipherment]",
            ),
        ];
        for (what, req, u, want) in cases {
            assert_eq!(
                validate_kubelet_client(&req, &set(u)),
                Err(want.to_string()),
                "{what}"
            );
        }

        let serving_good = Request {
            dns_names: vec!["n1.example".into()],
            ..good.clone()
        };
        assert_eq!(
            validate_kubelet_serving(&serving_good, &set(&serving)),
            Ok(())
        );
        assert_eq!(
            validate_kubelet_serving(&good, &set(&serving)),
            Err("DNS or IP subjectAltName is required".into())
        );
        assert_eq!(
            validate_kubelet_serving(&serving_good, &set(&client)),
            Err("usages did not match [digital signature key encipherment server auth]".into())
        );
        let uri = Request {
            uris: vec!["spiffe://x".into()],
            ..serving_good.clone()
        };
        assert_eq!(
            validate_kubelet_serving(&uri, &set(&serving)),
            Err("URI subjectAltNames are not allowed".into())
        );
    }

    #[test]
    fn api_server_client_usages() {
        let u = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            validate_api_server_client_usages(&u(&["client auth"])),
            Ok(())
        );
        assert_eq!(
            validate_api_server_client_usages(&u(&[
                "client auth",
                "digital signature",
                "key encipherment"
            ])),
            Ok(())
        );
        assert_eq!(
            validate_api_server_client_usages(&u(&["digital signature"])),
            Err("missing required usage for client certificate: client auth".into())
        );
        assert_eq!(
            validate_api_server_client_usages(&u(&["client auth", "server auth"])),
            Err("invalid usage for client certificate: server auth".into())
        );
    }
}
