//! The token controllers of issue 43 (serviceaccount-token, legacy-serviceaccount-token-cleaner,
//! bootstrapsigner, tokencleaner) end to end against the reference control plane, once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), both
//! with `--controllers` naming those four (kube-controller-manager's names, which ours takes too),
//! the control plane's service-account key as `--service-account-private-key-file`, its CA as
//! `--root-ca-file`, and `--legacy-service-account-token-clean-up-period=1s`. The same checks hold
//! for both:
//!
//! - serviceaccount-token: a `kubernetes.io/service-account-token` Secret naming a ServiceAccount
//!   gets `ca.crt` (the CA file's bytes), `namespace`, the account's UID annotation and a `token`
//!   whose header's `kid` is the SHA-256 of the API server's `--service-account-key-file` and
//!   whose claims are the legacy ones; the token authenticates with the API server as
//!   `system:serviceaccount:<ns>:<name>` (a SelfSubjectReview made with it); when the account is
//!   deleted, the Secret is deleted.
//! - legacy cleaner: with the API server's tracking date moved back to 2020 before the manager
//!   starts, an auto-generated token (its account lists it) made before the manager starts and
//!   older than the 1 s period is labelled `kubernetes.io/legacy-token-invalid-since: <today>` at
//!   the first look (and the API server refuses it from then on); one its account does not list
//!   is left alone.
//! - bootstrapsigner: `kube-public/cluster-info` gets `jws-kubeconfig-<id>` for a signing
//!   bootstrap token, equal to kpr's own computation of the detached JWS (so upstream's signature
//!   is checked against ours), none for a token without the signing usage, and loses the
//!   signature when the token is deleted.
//! - tokencleaner: a bootstrap token already expired is deleted; one expiring in 3 s is deleted
//!   once expired; one without an expiration stays.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{Cluster, Flavour};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str = "serviceaccount-token-controller,\
     legacy-serviceaccount-token-cleaner-controller,bootstrap-signer-controller,\
     token-cleaner-controller";

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
const NS: &str = "tokens";

fn secret(ns: &str, name: &str, type_: &str, annotations: serde_json::Value) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "type": type_}))
    .unwrap()
}

fn bootstrap_token(id: &str, extra: &[(&str, &str)]) -> Secret {
    let mut data: BTreeMap<String, String> = [
        ("token-id".to_string(), id.to_string()),
        ("token-secret".to_string(), "0123456789abcdef".to_string()),
    ]
    .into();
    for (k, v) in extra {
        data.insert(k.to_string(), v.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": data}))
    .unwrap()
}

fn start(flavour: Flavour) -> Cluster {
    let opts =
        controlplane::Options::minimal(controlplane::run_dir(&format!("tokens-{}", flavour.tag())));
    tokio::task::block_in_place(|| {
        Cluster::start_with_flags(
            flavour,
            CONTROLLERS,
            opts,
            vec!["--legacy-service-account-token-clean-up-period=1s".into()],
            |cp| {
                // Before the manager starts: tracking as if since 2020, and two legacy tokens
                // more than the period old at its first look, one listed by its account.
                let rt = tokio::runtime::Handle::current();
                rt.block_on(async {
                    let client = cp.client().await?;
                    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
                    let name = "kube-apiserver-legacy-service-account-token-tracking";
                    let deadline = std::time::Instant::now() + WAIT;
                    let mut cm = loop {
                        if let Some(cm) = cms.get_opt(name).await? {
                            break cm;
                        }
                        anyhow::ensure!(std::time::Instant::now() < deadline, "no {name}");
                        tokio::time::sleep(POLL).await;
                    };
                    cm.data = Some([("since".to_string(), "2020-01-01".to_string())].into());
                    cms.replace(name, &PostParams::default(), &cm).await?;
                    let nss: Api<Namespace> = Api::all(client.clone());
                    nss.create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
                    )
                    .await?;
                    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
                    sas.create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({
                            "metadata": {"name": "old"},
                            "secrets": [{"name": "old-listed"}]}))?,
                    )
                    .await?;
                    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
                    for s in ["old-listed", "old-unlisted"] {
                        secrets
                            .create(
                                &PostParams::default(),
                                &secret(
                                    NS,
                                    s,
                                    "kubernetes.io/service-account-token",
                                    json!({"kubernetes.io/service-account.name": "old"}),
                                ),
                            )
                            .await?;
                    }
                    // Older than the 1 s period when the manager looks (its start takes longer,
                    // but this does not rest on it).
                    let made = jiff::Timestamp::now();
                    while jiff::Timestamp::now().as_second() < made.as_second() + 2 {
                        tokio::time::sleep(POLL).await;
                    }
                    anyhow::Ok(())
                })
            },
        )
    })
    .expect("starting the control plane")
}

fn data<'a>(s: &'a Secret, key: &str) -> Option<&'a [u8]> {
    s.data.as_ref()?.get(key).map(|v| v.0.as_slice())
}

/// Whether a request made with `token` authenticates, and as whom.
async fn whoami(cluster: &Cluster, token: &str) -> Result<String, String> {
    let kubeconfig = {
        let cp = cluster.cp();
        cp.kubeconfig_for_token(
            &format!("token-{}.kubeconfig", token.len() % 1000),
            token,
            &cp.server_url(),
        )
        .unwrap()
    };
    let client = controlplane::client_from(&kubeconfig).await.unwrap();
    let api: Api<SelfSubjectReview> = Api::all(client);
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => Ok(r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default()),
        Err(e) => Err(e.to_string()),
    }
}

async fn service_account_token(cluster: &Cluster, client: &Client) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let sa = sas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap(),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                NS,
                "robot-token",
                "kubernetes.io/service-account-token",
                json!({"kubernetes.io/service-account.name": "robot"}),
            ),
        )
        .await
        .unwrap();
    let s = cluster
        .eventually("the token Secret filled", WAIT, POLL, || async {
            let s = secrets.get("robot-token").await.unwrap();
            data(&s, "token")
                .is_some_and(|t| !t.is_empty())
                .then_some(s)
        })
        .await;
    let (ca, sa_pub) = {
        let cp = cluster.cp();
        (
            std::fs::read(&cp.pki.ca_cert).unwrap(),
            std::fs::read(&cp.pki.sa_pub).unwrap(),
        )
    };
    assert_eq!(
        data(&s, "ca.crt"),
        Some(ca.as_slice()),
        "{:?}",
        cluster.flavour
    );
    assert_eq!(data(&s, "namespace"), Some(NS.as_bytes()));
    let annotations = s.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("kubernetes.io/service-account.uid"),
        sa.metadata.uid.as_ref()
    );
    let token = String::from_utf8(data(&s, "token").unwrap().to_vec()).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    let part = |i: usize| -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[i]).unwrap()).unwrap()
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&sa_pub).unwrap();
    let kid = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &pem.contents));
    assert_eq!(
        part(0),
        json!({"alg": "ES256", "kid": kid}),
        "{:?}",
        cluster.flavour
    );
    assert_eq!(
        part(1),
        json!({
            "iss": "kubernetes/serviceaccount",
            "sub": format!("system:serviceaccount:{NS}:robot"),
            "kubernetes.io/serviceaccount/namespace": NS,
            "kubernetes.io/serviceaccount/secret.name": "robot-token",
            "kubernetes.io/serviceaccount/service-account.name": "robot",
            "kubernetes.io/serviceaccount/service-account.uid": sa.metadata.uid.clone().unwrap(),
        }),
        "{:?}",
        cluster.flavour
    );
    assert_eq!(
        whoami(cluster, &token).await,
        Ok(format!("system:serviceaccount:{NS}:robot")),
        "{:?}: the token does not authenticate",
        cluster.flavour
    );
    // The account deleted: its token goes.
    sas.delete("robot", &DeleteParams::default()).await.unwrap();
    cluster
        .eventually("the token Secret deleted", WAIT, POLL, || async {
            secrets
                .get_opt("robot-token")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
}

async fn legacy_cleaner(cluster: &Cluster, client: &Client) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .to_string();
    let label = "kubernetes.io/legacy-token-invalid-since";
    let s = cluster
        .eventually(
            "the listed old token labelled invalid",
            WAIT,
            POLL,
            || async {
                let s = secrets.get("old-listed").await.unwrap();
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(label))
                    .is_some()
                    .then_some(s)
            },
        )
        .await;
    assert_eq!(
        s.metadata.labels.as_ref().unwrap()[label],
        today,
        "{:?}",
        cluster.flavour
    );
    let unlisted = secrets.get("old-unlisted").await.unwrap();
    assert!(
        unlisted
            .metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(label)),
        "{:?}: the unlisted token was labelled",
        cluster.flavour
    );
    // Invalid for the API server from now on (once serviceaccount-token has filled it).
    let s = cluster
        .eventually("the listed old token filled", WAIT, POLL, || async {
            let s = secrets.get("old-listed").await.unwrap();
            data(&s, "token")
                .is_some_and(|t| !t.is_empty())
                .then_some(s)
        })
        .await;
    let token = String::from_utf8(data(&s, "token").unwrap().to_vec()).unwrap();
    assert!(
        whoami(cluster, &token).await.is_err(),
        "{:?}: a token labelled invalid still authenticates",
        cluster.flavour
    );
}

async fn bootstrap(cluster: &Cluster, client: &Client) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let kubeconfig = "apiVersion: v1\nkind: Config\nclusters: []\n";
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "cluster-info"},
            "data": {"kubeconfig": kubeconfig}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let future = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string();
    for s in [
        bootstrap_token(
            "abc123",
            &[("usage-bootstrap-signing", "true"), ("expiration", &future)],
        ),
        bootstrap_token("def456", &[("usage-bootstrap-authentication", "true")]),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let want = controllers::auth::bootstrapsigner::detached_signature(
        kubeconfig,
        "abc123",
        "0123456789abcdef",
    );
    let data = cluster
        .eventually("cluster-info signed", WAIT, POLL, || async {
            let cm = cms.get("cluster-info").await.unwrap();
            let data = cm.data.unwrap_or_default();
            data.contains_key("jws-kubeconfig-abc123").then_some(data)
        })
        .await;
    assert_eq!(
        data["jws-kubeconfig-abc123"], want,
        "{:?}: the signature",
        cluster.flavour
    );
    assert!(!data.contains_key("jws-kubeconfig-def456"));
    secrets
        .delete("bootstrap-token-abc123", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("the signature removed", WAIT, POLL, || async {
            let cm = cms.get("cluster-info").await.unwrap();
            (!cm.data
                .unwrap_or_default()
                .contains_key("jws-kubeconfig-abc123"))
            .then_some(())
        })
        .await;
}

async fn cleaner(cluster: &Cluster, client: &Client) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let past = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1)).to_string();
    let soon = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3)).to_string();
    for s in [
        bootstrap_token("exp001", &[("expiration", &past)]),
        bootstrap_token("exp002", &[("expiration", &soon)]),
        bootstrap_token("exp003", &[]),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    for name in ["bootstrap-token-exp001", "bootstrap-token-exp002"] {
        cluster
            .eventually(&format!("{name} deleted"), WAIT, POLL, || async {
                secrets.get_opt(name).await.unwrap().is_none().then_some(())
            })
            .await;
    }
    assert!(
        secrets
            .get_opt("bootstrap-token-exp003")
            .await
            .unwrap()
            .is_some(),
        "{:?}: a token without expiration was deleted",
        cluster.flavour
    );
}

async fn scenario(flavour: Flavour) {
    let cluster = start(flavour);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    legacy_cleaner(&cluster, &client).await;
    service_account_token(&cluster, &client).await;
    bootstrap(&cluster, &client).await;
    cleaner(&cluster, &client).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tokens() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_tokens() {
    scenario(Flavour::Kpr).await;
}
