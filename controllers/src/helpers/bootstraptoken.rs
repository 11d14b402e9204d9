//! Bootstrap token Secrets (`k8s.io/cluster-bootstrap`'s `token/api` and `util/secrets`): the
//! Secrets of type `bootstrap.kubernetes.io/token` in `kube-system` named `bootstrap-token-<id>`
//! that kubeadm's `kubeadm token` writes, their keys, their `expiration`, and which of them may
//! sign the `cluster-info` ConfigMap (bootstrapsigner's `validateSecretForSigning`). What
//! bootstrapsigner and tokencleaner share.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret;

/// The Secret type (`SecretTypeBootstrapToken`).
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The namespace the tokens live in (`TokenSecretNamespace`, `kube-system`).
pub const NAMESPACE: &str = "kube-system";
/// A token Secret's name prefix (`BootstrapTokenSecretPrefix`).
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// The keys of a token Secret.
pub const ID_KEY: &str = "token-id";
pub const SECRET_KEY: &str = "token-secret";
pub const EXPIRATION_KEY: &str = "expiration";
pub const USAGE_SIGNING_KEY: &str = "usage-bootstrap-signing";

/// Whether `s` is a bootstrap token Secret of the tokens' namespace (the filter of both
/// controllers' Secret handlers).
pub fn is_token_secret(s: &Secret) -> bool {
    s.type_.as_deref() == Some(SECRET_TYPE) && s.metadata.namespace.as_deref() == Some(NAMESPACE)
}

/// The token ID in a Secret's name (`ParseName`: `bootstrap-token-` then six of `[a-z0-9]`).
pub fn parse_name(name: &str) -> Option<&str> {
    let id = name.strip_prefix(SECRET_PREFIX)?;
    (id.len() == 6
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
    .then_some(id)
}

/// The value of `key` in the Secret's data as a string (`GetData`; absent: empty).
pub fn data<'a>(s: &'a Secret, key: &str) -> &'a str {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| std::str::from_utf8(&v.0).unwrap_or_default())
        .unwrap_or_default()
}

/// A token's expiry (`GetExpiration`).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Expiry {
    /// No `expiration`.
    Never,
    /// Expires after this long.
    In(SignedDuration),
    /// Expired (or an `expiration` that is not RFC 3339, as upstream).
    Expired,
}

/// `GetExpiration`: the token's expiry at `now`.
pub fn time_left(s: &Secret, now: Timestamp) -> Expiry {
    let expiration = data(s, EXPIRATION_KEY);
    if expiration.is_empty() {
        return Expiry::Never;
    }
    let Ok(at) = expiration.parse::<Timestamp>() else {
        return Expiry::Expired;
    };
    let left = at.duration_since(now);
    if left <= SignedDuration::ZERO {
        Expiry::Expired
    } else {
        Expiry::In(left)
    }
}

/// `validateSecretForSigning`: the token's ID and secret when it may sign the `cluster-info`
/// ConfigMap: a well-formed name whose ID is the `token-id` key's, a non-empty `token-secret`,
/// not expired, and `usage-bootstrap-signing: "true"`.
pub fn for_signing(s: &Secret, now: Timestamp) -> Option<(&str, &str)> {
    let name_id = parse_name(s.metadata.name.as_deref()?)?;
    let id = data(s, ID_KEY);
    if id.is_empty() || id != name_id {
        return None;
    }
    let secret = data(s, SECRET_KEY);
    if secret.is_empty() || time_left(s, now) == Expiry::Expired {
        return None;
    }
    (data(s, USAGE_SIGNING_KEY) == "true").then_some((id, secret))
}

/// `getTokens`: every signing token of `secrets` by ID (the bootstrap token Secrets of the tokens'
/// namespace; of two Secrets with one ID, the first by name).
pub fn signing_tokens<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut candidates: Vec<&Secret> = secrets.into_iter().filter(|s| is_token_secret(s)).collect();
    candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = BTreeMap::new();
    for s in candidates {
        if let Some((id, secret)) = for_signing(s, now) {
            out.entry(id.to_string())
                .or_insert_with(|| secret.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A token Secret with string data (upstream's tests' `newTokenSecret`).
    pub fn token(name: &str, data: &[(&str, &str)]) -> Secret {
        let mut s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "type": SECRET_TYPE,
        }))
        .unwrap();
        s.data = Some(
            data.iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        k8s_openapi::ByteString(v.as_bytes().to_vec()),
                    )
                })
                .collect(),
        );
        s
    }

    #[test]
    fn names() {
        assert_eq!(parse_name("bootstrap-token-abc123"), Some("abc123"));
        for bad in [
            "bootstrap-token-abc12",
            "bootstrap-token-abc1234",
            "bootstrap-token-ABC123",
            "token-abc123",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    /// Upstream's `TestValidateSecretForSigning` cases.
    #[test]
    fn which_tokens_sign() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let ok = [
            (ID_KEY, "abc123"),
            (SECRET_KEY, "tokenSecret"),
            (USAGE_SIGNING_KEY, "true"),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut d: Vec<(&str, &str)> = ok.to_vec();
            for (k, v) in extra {
                d.retain(|(x, _)| x != k);
                d.push((k, v));
            }
            token("bootstrap-token-abc123", &d)
        };
        assert_eq!(
            for_signing(&with(&[]), now),
            Some(("abc123", "tokenSecret"))
        );
        assert!(for_signing(&with(&[(EXPIRATION_KEY, "2026-01-02T00:00:00Z")]), now).is_some());
        for (what, s) in [
            ("expired", with(&[(EXPIRATION_KEY, "2025-12-31T23:59:59Z")])),
            (
                "unparseable expiration",
                with(&[(EXPIRATION_KEY, "tomorrow")]),
            ),
            ("no signing usage", with(&[(USAGE_SIGNING_KEY, "false")])),
            ("empty secret", with(&[(SECRET_KEY, "")])),
            ("id not the name's", with(&[(ID_KEY, "xyz789")])),
            ("bad name", token("bootstrap-token-abc", &ok)),
        ] {
            assert_eq!(for_signing(&s, now), None, "{what}");
        }
    }

    #[test]
    fn expiration() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t = |e: &str| token("bootstrap-token-abc123", &[(EXPIRATION_KEY, e)]);
        assert_eq!(
            time_left(&token("bootstrap-token-abc123", &[]), now),
            Expiry::Never
        );
        assert_eq!(
            time_left(&t("2026-01-01T00:00:30Z"), now),
            Expiry::In(SignedDuration::from_secs(30))
        );
        assert_eq!(time_left(&t("2026-01-01T00:00:00Z"), now), Expiry::Expired);
        assert_eq!(time_left(&t("not a time"), now), Expiry::Expired);
    }

    #[test]
    fn duplicate_ids_first_by_name_wins_and_other_namespaces_do_not_count() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let d = |secret| {
            vec![
                (ID_KEY, "abc123"),
                (SECRET_KEY, secret),
                (USAGE_SIGNING_KEY, "true"),
            ]
        };
        let a = token("bootstrap-token-abc123", &d("first"));
        let mut elsewhere = token("bootstrap-token-xyz789", &d("x"));
        elsewhere.metadata.namespace = Some("default".into());
        let got = signing_tokens([&a, &elsewhere], now);
        assert_eq!(got.len(), 1);
        assert_eq!(got["abc123"], "first");
    }
}
