//! The housekeeping controllers of issue 43 (clusterrole-aggregation, ttl, csrapproving,
//! csrsigning, csrcleaner) end to end against the reference control plane, once with
//! kube-controller-manager (`upstream_*`) and once with our `controller-manager` (`kpr_*`), both
//! with `--controllers` naming those five (kube-controller-manager's names, which ours takes too),
//! the control plane's CA as `--cluster-signing-cert-file` / `--cluster-signing-key-file` and
//! `--cluster-signing-duration=720h`. The same checks hold for both; no kubelet runs (the Node is
//! an API object).
//!
//! - aggregation: the API server's bootstrap `view` role gets the rules of the
//!   `system:aggregate-to-view` roles; a ClusterRole selecting two labelled roles gets their rules
//!   in name order, each once, written by the field manager `clusterrole-aggregation-controller`,
//!   and follows when one of them changes.
//! - ttl: a new Node gets `node.alpha.kubernetes.io/ttl: "0"`, and gets it back when it is edited.
//! - certificates: a kubelet client request made by the admin (a bootstrap, not the node itself)
//!   is approved with upstream's reason and message and signed: the certificate chains to the CA,
//!   carries the request's subject, `client auth`, and lives `expirationSeconds` (from 5 minutes
//!   before); a kube-apiserver-client request approved by the test is signed for 720 h (from 5
//!   minutes before); one asking for `server auth` is marked Failed (`SignerValidationFailure`); a
//!   kubelet-serving request is signed once approved but not approved by the approver.
//! - cleaner: a request denied two hours before the manager starts is deleted at its first look;
//!   one denied now stays.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::time::Duration;

use common::{Cluster, Flavour};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use serde_json::json;
use x509_parser::extensions::ParsedExtension;

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str = "clusterrole-aggregation-controller,ttl-controller,\
     certificatesigningrequest-approving-controller,certificatesigningrequest-signing-controller,\
     certificatesigningrequest-cleaner-controller";

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

fn request(org: &str, cn: &str, sans: Vec<SanType>) -> Vec<u8> {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.subject_alt_names = sans;
    let key = KeyPair::generate().unwrap();
    params
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap()
        .into_bytes()
}

fn csr(
    name: &str,
    pem: Vec<u8>,
    signer: &str,
    usages: &[&str],
    expiration: Option<i32>,
) -> CertificateSigningRequest {
    let mut c: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"request": "", "signerName": signer, "usages": usages,
                 "expirationSeconds": expiration}}))
    .unwrap();
    c.spec.request = k8s_openapi::ByteString(pem);
    c
}

async fn set_condition(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    condition: serde_json::Value,
) {
    let mut c = api.get(name).await.unwrap();
    let mut status = serde_json::to_value(c.status.take().unwrap_or_default()).unwrap();
    status["conditions"] = json!([condition]);
    c.status = Some(serde_json::from_value(status).unwrap());
    api.replace_subresource("approval", name, &PostParams::default(), &c)
        .await
        .unwrap();
}

fn start(flavour: Flavour) -> Cluster {
    let opts = controlplane::Options::minimal(controlplane::run_dir(&format!(
        "housekeeping-{}",
        flavour.tag()
    )));
    tokio::task::block_in_place(|| {
        Cluster::start_with_flags(
            flavour,
            CONTROLLERS,
            opts,
            vec!["--cluster-signing-duration=720h".into()],
            |cp| {
                // Before the manager starts: a request denied two hours ago (the cleaner deletes
                // it at its first look) and one denied now (it stays).
                let rt = tokio::runtime::Handle::current();
                rt.block_on(async {
                    let client = cp.client().await?;
                    let api: Api<CertificateSigningRequest> = Api::all(client);
                    let two_hours_ago =
                        jiff::Timestamp::now() - jiff::SignedDuration::from_hours(2);
                    for (name, when) in [
                        ("denied-long-ago", two_hours_ago.to_string()),
                        ("denied-now", jiff::Timestamp::now().to_string()),
                    ] {
                        let pem = request("o", name, vec![]);
                        api.create(
                            &PostParams::default(),
                            &csr(name, pem, "example.com/other", &["client auth"], None),
                        )
                        .await?;
                        set_condition(
                            &api,
                            name,
                            json!({"type": "Denied", "status": "True", "reason": "Test",
                                   "lastUpdateTime": when}),
                        )
                        .await;
                    }
                    anyhow::Ok(())
                })
            },
        )
    })
    .expect("starting the control plane")
}

async fn aggregation(cluster: &Cluster, client: &Client) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    cluster
        .eventually("the bootstrap view role aggregated", WAIT, POLL, || async {
            let view = roles.get("view").await.unwrap();
            view.rules
                .is_some_and(|r| {
                    r.iter()
                        .any(|r| r.resources.iter().flatten().any(|x| x == "pods"))
                })
                .then_some(())
        })
        .await;
    let pp = PostParams::default();
    let rule =
        |verb: &str, res: &str| json!({"apiGroups": [""], "resources": [res], "verbs": [verb]});
    for v in [
        json!({"metadata": {"name": "agg-target"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"kpr.test/agg": "yes"}}]}}),
        json!({"metadata": {"name": "agg-b", "labels": {"kpr.test/agg": "yes"}},
            "rules": [rule("get", "pods"), rule("list", "services")]}),
        json!({"metadata": {"name": "agg-a", "labels": {"kpr.test/agg": "yes"}},
            "rules": [rule("get", "pods"), rule("watch", "configmaps")]}),
        json!({"metadata": {"name": "agg-other", "labels": {"kpr.test/agg": "no"}},
            "rules": [rule("delete", "secrets")]}),
    ] {
        roles
            .create(&pp, &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }
    let rules_are = |want: serde_json::Value| {
        let roles = roles.clone();
        move || {
            let (roles, want) = (roles.clone(), want.clone());
            async move {
                let r = roles.get("agg-target").await.unwrap();
                let got = serde_json::to_value(r.rules.clone().unwrap_or_default()).unwrap();
                if got == want {
                    Ok(r)
                } else {
                    Err(format!("{got}"))
                }
            }
        }
    };
    let target = cluster
        .eventually_showing(
            "agg-target with the rules of agg-a then agg-b",
            WAIT,
            POLL,
            rules_are(json!([
                rule("get", "pods"),
                rule("watch", "configmaps"),
                rule("list", "services")
            ])),
        )
        .await;
    let managers: Vec<String> = target
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers
            .iter()
            .any(|m| m == "clusterrole-aggregation-controller"),
        "{:?}: managers {managers:?}",
        cluster.flavour
    );
    roles
        .patch(
            "agg-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": [rule("create", "events")]})),
        )
        .await
        .unwrap();
    cluster
        .eventually_showing(
            "agg-target following agg-b",
            WAIT,
            POLL,
            rules_are(json!([
                rule("get", "pods"),
                rule("watch", "configmaps"),
                rule("create", "events")
            ])),
        )
        .await;
}

async fn ttl(cluster: &Cluster, client: &Client) {
    const TTL: &str = "node.alpha.kubernetes.io/ttl";
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ttl-node"}})).unwrap(),
        )
        .await
        .unwrap();
    let annotated = || async {
        let n = nodes.get("ttl-node").await.unwrap();
        let v = n.metadata.annotations.unwrap_or_default().get(TTL).cloned();
        (v.as_deref() == Some("0")).then_some(())
    };
    cluster
        .eventually("the ttl annotation", WAIT, POLL, annotated)
        .await;
    nodes
        .patch(
            "ttl-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {TTL: "300"}}})),
        )
        .await
        .unwrap();
    cluster
        .eventually("the ttl annotation put back", WAIT, POLL, annotated)
        .await;
}

/// The parsed certificate of a request, once issued.
async fn issued(cluster: &Cluster, api: &Api<CertificateSigningRequest>, name: &str) -> Vec<u8> {
    cluster
        .eventually(&format!("{name} signed"), WAIT, POLL, || async {
            let c = api.get(name).await.unwrap();
            c.status
                .and_then(|s| s.certificate)
                .map(|b| b.0)
                .filter(|b| !b.is_empty())
        })
        .await
}

struct Cert {
    not_before: i64,
    not_after: i64,
    subject: String,
    client_auth: bool,
    server_auth: bool,
}

fn check_chain(pem: &[u8], ca_pem: &[u8]) -> Cert {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).unwrap();
    let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_block.contents).unwrap();
    cert.verify_signature(Some(ca.public_key()))
        .expect("signed by the CA");
    assert_eq!(cert.issuer().as_raw(), ca.subject().as_raw());
    let mut out = Cert {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        subject: cert.subject().to_string(),
        client_auth: false,
        server_auth: false,
    };
    for ext in cert.extensions() {
        if let ParsedExtension::ExtendedKeyUsage(e) = ext.parsed_extension() {
            out.client_auth = e.client_auth;
            out.server_auth = e.server_auth;
        }
    }
    out
}

async fn certificates(cluster: &Cluster, client: &Client) {
    let ca_pem = std::fs::read(&cluster.cp().pki.ca_cert).unwrap();
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pp = PostParams::default();
    let kubelet_usages = ["digital signature", "client auth"];
    api.create(
        &pp,
        &csr(
            "kubelet-client",
            request("system:nodes", "system:node:n1", vec![]),
            "kubernetes.io/kube-apiserver-client-kubelet",
            &kubelet_usages,
            Some(3600),
        ),
    )
    .await
    .unwrap();
    let approved = cluster
        .eventually("kubelet-client approved", WAIT, POLL, || async {
            let c = api.get("kubelet-client").await.unwrap();
            c.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Approved")
        })
        .await;
    assert_eq!(
        (approved.reason.as_deref(), approved.message.as_deref()),
        (
            Some("AutoApproved"),
            Some("Auto approving kubelet client certificate after SubjectAccessReview.")
        ),
        "{:?}",
        cluster.flavour
    );
    let cert = check_chain(&issued(cluster, &api, "kubelet-client").await, &ca_pem);
    assert_eq!(cert.subject, "O=system:nodes, CN=system:node:n1");
    assert!(cert.client_auth && !cert.server_auth);
    assert_eq!(
        cert.not_after - cert.not_before,
        3600 + 300,
        "{:?}",
        cluster.flavour
    );

    // Approved by the test: a client of the API server (signed for the flag's 720 h), one asking
    // for server auth (Failed), a kubelet serving request (signed; never approved by the
    // approver).
    let serving_usages = ["digital signature", "server auth"];
    let requests = [
        (
            "apiserver-client",
            request("team", "alice", vec![]),
            "kubernetes.io/kube-apiserver-client",
            &kubelet_usages,
        ),
        (
            "apiserver-server-auth",
            request("team", "bob", vec![]),
            "kubernetes.io/kube-apiserver-client",
            &serving_usages,
        ),
        (
            "kubelet-serving",
            request(
                "system:nodes",
                "system:node:n1",
                vec![SanType::DnsName("n1.example".try_into().unwrap())],
            ),
            "kubernetes.io/kubelet-serving",
            &serving_usages,
        ),
    ];
    for (name, pem, signer, usages) in requests {
        api.create(&pp, &csr(name, pem, signer, usages, None))
            .await
            .unwrap();
    }
    // The approver leaves the serving request alone (had it approved it, the approval below,
    // which leaves the Approved condition out, would be refused).
    let serving = api.get("kubelet-serving").await.unwrap();
    assert!(
        serving
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .is_empty(),
        "{:?}: the approver approved a kubelet serving request",
        cluster.flavour
    );
    for name in [
        "apiserver-client",
        "apiserver-server-auth",
        "kubelet-serving",
    ] {
        set_condition(
            &api,
            name,
            json!({"type": "Approved", "status": "True", "reason": "Test", "message": "by the test"}),
        )
        .await;
    }
    let cert = check_chain(&issued(cluster, &api, "apiserver-client").await, &ca_pem);
    assert_eq!(cert.subject, "O=team, CN=alice");
    assert_eq!(
        cert.not_after - cert.not_before,
        720 * 3600,
        "{:?}",
        cluster.flavour
    );
    let cert = check_chain(&issued(cluster, &api, "kubelet-serving").await, &ca_pem);
    assert!(cert.server_auth && !cert.client_auth);
    let failed = cluster
        .eventually("apiserver-server-auth Failed", WAIT, POLL, || async {
            let c = api.get("apiserver-server-auth").await.unwrap();
            c.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Failed")
        })
        .await;
    assert_eq!(
        (failed.reason.as_deref(), failed.message.as_deref()),
        (
            Some("SignerValidationFailure"),
            Some("invalid usage for client certificate: server auth")
        ),
        "{:?}",
        cluster.flavour
    );
    assert!(failed.last_update_time.is_some());
}

async fn cleaner(cluster: &Cluster, client: &Client) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    // kube-controller-manager v1.34's cleaner makes its first pass at start without waiting for
    // its informer (cleaner.go's Run starts `wait.UntilWithContext` with no cache sync), so
    // whether it sees the seeded requests is a race, and the next pass is an hour later: in
    // the first run of this suite it deleted nothing in 30 s. kpr's cleaner passes once its
    // cache is synced (docs/WORKLOADS.md, Housekeeping): only kpr's deletion is awaited; that
    // a request denied now stays holds for both.
    if cluster.flavour == Flavour::Kpr {
        cluster
            .eventually(
                "the request denied long ago deleted",
                WAIT,
                POLL,
                || async {
                    api.get_opt("denied-long-ago")
                        .await
                        .unwrap()
                        .is_none()
                        .then_some(())
                },
            )
            .await;
    }
    assert!(
        api.get_opt("denied-now").await.unwrap().is_some(),
        "{:?}: the request denied now was deleted",
        cluster.flavour
    );
}

async fn scenario(flavour: Flavour) {
    let cluster = start(flavour);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    cleaner(&cluster, &client).await;
    aggregation(&cluster, &client).await;
    ttl(&cluster, &client).await;
    certificates(&cluster, &client).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_housekeeping() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_housekeeping() {
    scenario(Flavour::Kpr).await;
}
