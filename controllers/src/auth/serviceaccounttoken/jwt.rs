//! The legacy service-account tokens serviceaccount-token writes (`pkg/serviceaccount/jwt.go`'s
//! `JWTTokenGenerator` with `legacy.go`'s `LegacyClaims`): a JWS compact JWT signed with the key
//! of `--service-account-private-key-file`, RS256 for an RSA key and ES256 / ES384 for a P-256 /
//! P-384 ECDSA key, its header's `kid` the base64url SHA-256 of the public key's PKIX DER (what
//! kube-apiserver computes from `--service-account-key-file`), its claims the issuer
//! `kubernetes/serviceaccount`, the subject `system:serviceaccount:<ns>:<name>` and the four
//! `kubernetes.io/serviceaccount/...` claims. No expiry: legacy tokens live as long as their
//! Secret.
//!
//! Keys are read as upstream's `keyutil.ParsePrivateKeyPEM` reads them: the first `PRIVATE KEY`
//! (PKCS#8), `RSA PRIVATE KEY` (PKCS#1) or `EC PRIVATE KEY` (SEC1) block. A P-521 key (ES512),
//! which ring does not sign with, is refused with an error naming the file.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair};

use crate::error::{Error, Result};

/// The issuer of legacy tokens (`LegacyIssuer`).
pub const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

/// The private claims of a legacy token (`legacyPrivateClaims`).
pub const CLAIM_NAMESPACE: &str = "kubernetes.io/serviceaccount/namespace";
pub const CLAIM_SECRET_NAME: &str = "kubernetes.io/serviceaccount/secret.name";
pub const CLAIM_SA_NAME: &str = "kubernetes.io/serviceaccount/service-account.name";
pub const CLAIM_SA_UID: &str = "kubernetes.io/serviceaccount/service-account.uid";

enum Key {
    Rsa(RsaKeyPair),
    Ecdsa(EcdsaKeyPair, &'static str),
}

/// A signing key and its key ID.
pub struct Signer {
    key: Key,
    kid: String,
    rng: SystemRandom,
}

// DER: the few encodings the public key's PKIX form and a SEC1 key's PKCS#8 wrapping need.
fn der(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = body.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(body);
    out
}

const OID_RSA: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const OID_EC: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

/// `x509.MarshalPKIXPublicKey`'s SubjectPublicKeyInfo of an algorithm and a public key.
fn spki(algorithm: &[u8], public_key: &[u8]) -> Vec<u8> {
    let mut bits = vec![0];
    bits.extend_from_slice(public_key);
    let mut body = der(0x30, algorithm);
    body.extend(der(0x03, &bits));
    der(0x30, &body)
}

/// A SEC1 EC key wrapped as PKCS#8 for `curve`.
fn sec1_as_pkcs8(sec1: &[u8], curve: &[u8]) -> Vec<u8> {
    let mut alg = OID_EC.to_vec();
    alg.extend_from_slice(curve);
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend(der(0x30, &alg));
    body.extend(der(0x04, sec1));
    der(0x30, &body)
}

impl Signer {
    /// Reads `--service-account-private-key-file`; an error names the file and why.
    pub fn from_file(path: &Path) -> Result<Signer> {
        let invalid = |reason: String| Error::Invalid {
            object: format!("--service-account-private-key-file {}", path.display()),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| invalid(format!("reading: {e}")))?;
        Signer::from_pem(&pem).map_err(invalid)
    }

    /// The first private key block of `pem`.
    pub fn from_pem(pem: &[u8]) -> std::result::Result<Signer, String> {
        for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
            let block = block.map_err(|e| format!("not PEM: {e}"))?;
            let key = match block.label.as_str() {
                "PRIVATE KEY" => Self::pkcs8(&block.contents)?,
                "RSA PRIVATE KEY" => Key::Rsa(
                    RsaKeyPair::from_der(&block.contents)
                        .map_err(|e| format!("the PKCS#1 RSA key: {e}"))?,
                ),
                "EC PRIVATE KEY" => Self::sec1(&block.contents)?,
                _ => continue,
            };
            let public = match &key {
                Key::Rsa(k) => spki(&[OID_RSA, &[0x05, 0x00]].concat(), k.public_key().as_ref()),
                Key::Ecdsa(k, alg) => {
                    let curve = if *alg == "ES256" { OID_P256 } else { OID_P384 };
                    spki(&[OID_EC, curve].concat(), k.public_key().as_ref())
                }
            };
            let hash = ring::digest::digest(&ring::digest::SHA256, &public);
            return Ok(Signer {
                key,
                kid: URL_SAFE_NO_PAD.encode(hash.as_ref()),
                rng: SystemRandom::new(),
            });
        }
        Err("no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block".into())
    }

    fn pkcs8(der: &[u8]) -> std::result::Result<Key, String> {
        let rng = SystemRandom::new();
        if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
        {
            return Ok(Key::Ecdsa(k, "ES256"));
        }
        if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P384_SHA384_FIXED_SIGNING, der, &rng)
        {
            return Ok(Key::Ecdsa(k, "ES384"));
        }
        RsaKeyPair::from_pkcs8(der).map(Key::Rsa).map_err(|e| {
            format!(
                "the PKCS#8 key is neither RSA (2048 bits or more) nor ECDSA P-256 / P-384: {e}"
            )
        })
    }

    fn sec1(sec1: &[u8]) -> std::result::Result<Key, String> {
        let rng = SystemRandom::new();
        for (curve, alg, name) in [
            (
                OID_P256,
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                "ES256",
            ),
            (
                OID_P384,
                &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                "ES384",
            ),
        ] {
            if let Ok(k) = EcdsaKeyPair::from_pkcs8(alg, &sec1_as_pkcs8(sec1, curve), &rng) {
                return Ok(Key::Ecdsa(k, name));
            }
        }
        Err("the EC key is not on P-256 or P-384 (or lacks its public key)".into())
    }

    /// The key ID (`kid`).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JWS algorithm.
    pub fn alg(&self) -> &'static str {
        match &self.key {
            Key::Rsa(_) => "RS256",
            Key::Ecdsa(_, alg) => alg,
        }
    }

    /// `GenerateToken` of `LegacyClaims`: the signed token of the ServiceAccount `ns/name` (its
    /// `uid`) for the Secret `secret`.
    pub fn legacy_token(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        secret: &str,
    ) -> std::result::Result<String, String> {
        // serde_json's maps are ordered by key, as Go's encoding of go-jose's maps.
        let header = serde_json::json!({"alg": self.alg(), "kid": self.kid}).to_string();
        let claims = serde_json::json!({
            "iss": LEGACY_ISSUER,
            "sub": format!("system:serviceaccount:{ns}:{name}"),
            CLAIM_NAMESPACE: ns,
            CLAIM_SECRET_NAME: secret,
            CLAIM_SA_NAME: name,
            CLAIM_SA_UID: uid,
        })
        .to_string();
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        );
        let sig = match &self.key {
            Key::Rsa(k) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &self.rng,
                    input.as_bytes(),
                    &mut sig,
                )
                .map_err(|_| "RSA signing failed".to_string())?;
                sig
            }
            Key::Ecdsa(k, _) => k
                .sign(&self.rng, input.as_bytes())
                .map_err(|_| "ECDSA signing failed".to_string())?
                .as_ref()
                .to_vec(),
        };
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    /// An ECDSA P-256 PKCS#8 key (what the reference control plane's PKI writes): the token's
    /// claims and header, its signature verifying with the public key, and the `kid` the SHA-256
    /// of the PKIX public key rcgen writes.
    #[test]
    fn es256_token_verifies_and_carries_the_legacy_claims() {
        let key = rcgen::KeyPair::generate().unwrap();
        let s = Signer::from_pem(key.serialize_pem().as_bytes()).unwrap();
        assert_eq!(s.alg(), "ES256");
        let want_kid = URL_SAFE_NO_PAD
            .encode(ring::digest::digest(&ring::digest::SHA256, &key.public_key_der()).as_ref());
        assert_eq!(s.kid(), want_kid);
        let t = s.legacy_token("ns", "sa", "uid-1", "sa-token").unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(
            decode(parts[0]),
            serde_json::json!({"alg": "ES256", "kid": want_kid})
        );
        assert_eq!(
            decode(parts[1]),
            serde_json::json!({
                "iss": "kubernetes/serviceaccount",
                "sub": "system:serviceaccount:ns:sa",
                "kubernetes.io/serviceaccount/namespace": "ns",
                "kubernetes.io/serviceaccount/secret.name": "sa-token",
                "kubernetes.io/serviceaccount/service-account.name": "sa",
                "kubernetes.io/serviceaccount/service-account.uid": "uid-1",
            })
        );
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            key.public_key_raw(),
        );
        public
            .verify(
                format!("{}.{}", parts[0], parts[1]).as_bytes(),
                &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            )
            .expect("the signature verifies");
    }

    /// A P-384 key signs ES384; a SEC1 key is read as the same key as its PKCS#8 form.
    #[test]
    fn es384_and_sec1() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let s = Signer::from_pem(key.serialize_pem().as_bytes()).unwrap();
        assert_eq!(s.alg(), "ES384");
        // The SEC1 form: PKCS#8's inner OCTET STRING (rcgen writes PKCS#8 only).
        let p8 = key.serialize_der();
        let inner = x509_parser::der_parser::parse_der(&p8).unwrap().1;
        let seq = inner.as_sequence().unwrap();
        let sec1 = seq[2].as_slice().unwrap();
        let pem = format!(
            "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(sec1)
        );
        let s1 = Signer::from_pem(pem.as_bytes()).unwrap();
        assert_eq!(s1.kid(), s.kid());
        assert_eq!(s1.alg(), "ES384");
    }

    /// A PKCS#1 RSA key (kubeadm's `sa.key`): RS256, verifying with the public key.
    #[test]
    fn rs256_from_pkcs1() {
        let pem = include_str!("../testdata/rsa-pkcs1-ca.key");
        let s = Signer::from_pem(pem.as_bytes()).unwrap();
        assert_eq!(s.alg(), "RS256");
        let t = s.legacy_token("a", "b", "c", "d").unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        let Key::Rsa(k) = &s.key else { panic!() };
        signature::UnparsedPublicKey::new(
            &signature::RSA_PKCS1_2048_8192_SHA256,
            k.public_key().as_ref(),
        )
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
        )
        .expect("the signature verifies");
    }

    #[test]
    fn no_key_is_an_error() {
        assert!(Signer::from_pem(b"nothing").is_err());
    }
}
