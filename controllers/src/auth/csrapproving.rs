//! The CSR approver (kube-controller-manager v1.34's `certificatesigningrequest-approving-controller`,
//! alias `csrapproving`, `pkg/controller/certificates/approver`): approves a kubelet's client
//! certificate request (signer `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `O=system:nodes`, `CN=system:node:<name>`, no subjectAltNames, the client usages) when a
//! SubjectAccessReview says its requester may: `create certificatesigningrequests/selfnodeclient`
//! when the requester is the node the certificate names (a renewal), else
//! `create certificatesigningrequests/nodeclient` (a bootstrap token's first request).
//!
//! Owns: the `Approved` condition (reason `AutoApproved`, upstream's messages) written through
//! the `approval` subresource. Requests already signed, approved or denied are left alone; one
//! recognized but refused by the reviews is retried with backoff, as upstream's ignorable error.
//! Kubelet serving requests are not approved, as upstream does not. Five workers, the work queue
//! `csrapproving`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::helpers::csr;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs and its work queue's name, as upstream.
pub const NAME: &str = "csrapproving";

/// Workers: kube-controller-manager starts five.
pub const WORKERS: usize = 5;

/// One kind of request the approver recognizes: the subresource its requester must be allowed to
/// create, and the approval's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recognizer {
    pub subresource: &'static str,
    pub message: &'static str,
}

/// `isSelfNodeClientCert`: the kubelet renewing its own client certificate.
pub const SELF_NODE_CLIENT: Recognizer = Recognizer {
    subresource: "selfnodeclient",
    message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
};

/// `isNodeClientCert`: a kubelet client certificate requested by someone else (bootstrap).
pub const NODE_CLIENT: Recognizer = Recognizer {
    subresource: "nodeclient",
    message: "Auto approving kubelet client certificate after SubjectAccessReview.",
};

/// What the approver does with a request: nothing, or ask the reviews of `recognizers`, in
/// order (the first allowed approves it).
#[derive(Debug, PartialEq)]
pub enum Plan {
    Nothing,
    Review(Vec<Recognizer>),
}

/// `handle`'s decision over the request alone; an error when its request does not parse.
pub fn plan(c: &CertificateSigningRequest) -> std::result::Result<Plan, String> {
    if !csr::certificate(c).is_empty() {
        return Ok(Plan::Nothing);
    }
    let (approved, denied) = csr::approval(c);
    if approved || denied {
        return Ok(Plan::Nothing);
    }
    let req = csr::parse(&c.spec.request.0).map_err(|e| {
        format!(
            "unable to parse csr {:?}: {e}",
            c.metadata.name.as_deref().unwrap_or_default()
        )
    })?;
    let node_client = c.spec.signer_name == csr::KUBE_APISERVER_CLIENT_KUBELET
        && csr::validate_kubelet_client(&req, &csr::usages(c)).is_ok();
    if !node_client {
        return Ok(Plan::Nothing);
    }
    let mut tried = Vec::new();
    if c.spec.username.as_deref() == Some(req.common_name.as_str()) {
        tried.push(SELF_NODE_CLIENT);
    }
    tried.push(NODE_CLIENT);
    Ok(Plan::Review(tried))
}

/// The review asking whether the request's requester may create the subresource.
pub fn review(c: &CertificateSigningRequest, r: Recognizer) -> SubjectAccessReview {
    let extra: BTreeMap<String, Vec<String>> = c.spec.extra.clone().unwrap_or_default();
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: c.spec.username.clone(),
            uid: c.spec.uid.clone(),
            groups: c.spec.groups.clone(),
            extra: (!extra.is_empty()).then_some(extra),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                verb: Some("create".into()),
                subresource: Some(r.subresource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The request with the approval condition appended (`appendApprovalCondition`).
pub fn approved(c: &CertificateSigningRequest, r: Recognizer) -> CertificateSigningRequest {
    let mut out = c.clone();
    out.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("AutoApproved".into()),
            message: Some(r.message.into()),
            ..Default::default()
        });
    out
}

/// The running controller.
pub struct Controller {
    client: Client,
    csrs: Arc<Indexed<CertificateSigningRequest>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the CSR informer (every add, update and delete
    /// queues the request, as upstream's certificate controller).
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let informer = informers.get::<CertificateSigningRequest>();
        let this = Arc::new(Controller {
            client,
            csrs: informer.cache(),
            queue: WorkQueue::new(NAME),
        });
        informer.on_change_of(&this, |c, old, new| {
            if let Some(name) = new.or(old).and_then(|r| r.metadata.name.clone()) {
                c.queue.add(name);
            }
        });
        this
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.csrs], &self.queue, WORKERS).await;
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
        let recognizers = match plan(&c).map_err(|reason| Error::Invalid {
            object: object(),
            reason,
        })? {
            Plan::Nothing => return Ok(()),
            Plan::Review(r) => r,
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let mut tried = Vec::new();
        for r in recognizers {
            tried.push(r.subresource);
            let answer = reviews
                .create(&PostParams::default(), &review(&c, r))
                .await
                .map_err(|e| Error::kube("creating", "SubjectAccessReview", e))?;
            if answer.status.is_some_and(|s| s.allowed) {
                let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
                return api
                    .replace_subresource("approval", name, &PostParams::default(), &approved(&c, r))
                    .await
                    .map(|_| ())
                    .map_err(|e| Error::kube("updating the approval of", object(), e));
            }
        }
        Err(Error::Invalid {
            object: object(),
            reason: format!(
                "recognized csr {name:?} as {tried:?} but subject access review was not approved"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helpers::csr::tests::request;
    use rcgen::SanType;
    use serde_json::json;

    fn csr(pem: &str, signer: &str, user: &str, usages: &[&str]) -> CertificateSigningRequest {
        let mut c: CertificateSigningRequest = serde_json::from_value(json!({
            "metadata": {"name": "r"},
            "spec": {"request": "", "signerName": signer, "username": user, "usages": usages,
                     "groups": ["system:bootstrappers"], "extra": {"k": ["v"]}}}))
        .unwrap();
        c.spec.request = k8s_openapi::ByteString(pem.as_bytes().to_vec());
        c
    }

    const CLIENT: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

    /// Upstream's `TestHandle` and `TestRecognizers` cases, in plan terms.
    #[test]
    fn which_requests_are_reviewed() {
        let node = request(&["system:nodes"], "system:node:n1", vec![]);
        let kubelet = csr::KUBE_APISERVER_CLIENT_KUBELET;
        // A bootstrap request (the requester is not the node): nodeclient only.
        assert_eq!(
            plan(&csr(&node, kubelet, "system:bootstrap:abc", &CLIENT)).unwrap(),
            Plan::Review(vec![NODE_CLIENT])
        );
        // The node renewing its own: selfnodeclient first.
        assert_eq!(
            plan(&csr(&node, kubelet, "system:node:n1", &CLIENT)).unwrap(),
            Plan::Review(vec![SELF_NODE_CLIENT, NODE_CLIENT])
        );
        // Another signer, other usages, a serving request, another subject: not recognized.
        for (what, c) in [
            (
                "another signer",
                csr(&node, csr::KUBE_APISERVER_CLIENT, "u", &CLIENT),
            ),
            (
                "server usages",
                csr(
                    &node,
                    kubelet,
                    "u",
                    &["digital signature", "key encipherment", "server auth"],
                ),
            ),
            (
                "a DNS name",
                csr(
                    &request(
                        &["system:nodes"],
                        "system:node:n1",
                        vec![SanType::DnsName("n1".try_into().unwrap())],
                    ),
                    kubelet,
                    "u",
                    &CLIENT,
                ),
            ),
            (
                "another organization",
                csr(
                    &request(&["other"], "system:node:n1", vec![]),
                    kubelet,
                    "u",
                    &CLIENT,
                ),
            ),
        ] {
            assert_eq!(plan(&c).unwrap(), Plan::Nothing, "{what}");
        }
        // Approved, denied or signed already: nothing.
        let mut done = csr(&node, kubelet, "u", &CLIENT);
        done.status =
            serde_json::from_value(json!({"conditions": [{"type": "Denied", "status": "True"}]}))
                .unwrap();
        assert_eq!(plan(&done).unwrap(), Plan::Nothing);
        done.status = serde_json::from_value(json!({"certificate": "Zm9v"})).unwrap();
        assert_eq!(plan(&done).unwrap(), Plan::Nothing);
        // An unparsable request: an error naming it.
        let mut bad = csr(&node, kubelet, "u", &CLIENT);
        bad.spec.request.0 = b"junk".to_vec();
        assert!(plan(&bad)
            .unwrap_err()
            .contains("unable to parse csr \"r\""));
    }

    #[test]
    fn the_review_and_the_condition_are_upstreams() {
        let node = request(&["system:nodes"], "system:node:n1", vec![]);
        let c = csr(
            &node,
            csr::KUBE_APISERVER_CLIENT_KUBELET,
            "system:node:n1",
            &CLIENT,
        );
        let sar = serde_json::to_value(review(&c, SELF_NODE_CLIENT)).unwrap();
        assert_eq!(
            sar["spec"],
            json!({"user": "system:node:n1", "groups": ["system:bootstrappers"],
                   "extra": {"k": ["v"]},
                   "resourceAttributes": {"group": "certificates.k8s.io",
                     "resource": "certificatesigningrequests", "verb": "create",
                     "subresource": "selfnodeclient"}})
        );
        let a = approved(&c, NODE_CLIENT);
        let cond = &a.status.unwrap().conditions.unwrap()[0];
        assert_eq!(
            (
                cond.type_.as_str(),
                cond.status.as_str(),
                cond.reason.as_deref()
            ),
            ("Approved", "True", Some("AutoApproved"))
        );
        assert_eq!(
            cond.message.as_deref(),
            Some("Auto approving kubelet client certificate after SubjectAccessReview.")
        );
    }
}
