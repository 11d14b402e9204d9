//! The CSR cleaner (kube-controller-manager v1.34's `certificatesigningrequest-cleaner-controller`,
//! alias `csrcleaner`, `pkg/controller/certificates/cleaner`): deletes a CertificateSigningRequest
//! once it is of no more use, looking at every request in the cache every hour (the first look at
//! start):
//!
//! - approved and issued, its Approved condition updated more than an hour ago;
//! - denied, or failed, its condition updated more than an hour ago;
//! - pending (no condition), created more than 24 hours ago;
//! - approved and issued, the certificate expired.
//!
//! Owns: the deletion of those requests. A failed delete is logged and tried again at the next
//! look, as upstream. No work queue (upstream has none either).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::{Api, Client};

use crate::helpers::clock::{Clock, SystemClock};
use crate::helpers::csr;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;

/// The controller's name in logs.
pub const NAME: &str = "csrcleaner";

/// How often every request is looked at (`pollingInterval`).
pub const POLLING_INTERVAL: Duration = Duration::from_secs(3600);

const APPROVED_EXPIRATION: i64 = 3600;
const DENIED_EXPIRATION: i64 = 3600;
const PENDING_EXPIRATION: i64 = 24 * 3600;

/// Why a request is deleted, as upstream's log lines say it; `None`: it stays.
pub fn plan(c: &CertificateSigningRequest, now: Timestamp) -> Option<&'static str> {
    let older =
        |t: Option<&Time>, secs: i64| t.is_some_and(|t| now.as_second() - t.0.as_second() > secs);
    let conditions: Vec<_> = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .collect();
    let issued = !csr::certificate(c).is_empty();
    let approved = conditions.iter().any(|x| x.type_ == "Approved");
    if issued
        && conditions.iter().any(|x| {
            x.type_ == "Approved" && older(x.last_update_time.as_ref(), APPROVED_EXPIRATION)
        })
    {
        return Some("it is more than approvedExpiration duration old and approved");
    }
    if conditions
        .iter()
        .any(|x| x.type_ == "Denied" && older(x.last_update_time.as_ref(), DENIED_EXPIRATION))
    {
        return Some("it is more than deniedExpiration duration old and denied");
    }
    if conditions
        .iter()
        .any(|x| x.type_ == "Failed" && older(x.last_update_time.as_ref(), DENIED_EXPIRATION))
    {
        return Some("it is more than deniedExpiration duration old and failed");
    }
    if conditions.is_empty() && older(c.metadata.creation_timestamp.as_ref(), PENDING_EXPIRATION) {
        return Some("it is more than pendingExpiration duration old and unhandled");
    }
    // An unreadable certificate counts as not expired, as upstream's isExpired.
    if approved && issued && csr::not_after(csr::certificate(c)).is_ok_and(|t| now.as_second() > t)
    {
        return Some("the associated certificate is expired");
    }
    None
}

/// The running controller.
pub struct Controller {
    client: Client,
    csrs: Arc<Indexed<CertificateSigningRequest>>,
    clock: Arc<dyn Clock>,
}

impl Controller {
    /// Uses the CSR informer's cache (no handler: the cleaner polls).
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        Arc::new(Controller {
            client,
            csrs: informers.get::<CertificateSigningRequest>().cache(),
            clock: Arc::new(SystemClock),
        })
    }

    /// Waits for the cache, then looks at every request every [`POLLING_INTERVAL`].
    pub async fn run(self: Arc<Self>) {
        self.csrs.wait_ready().await;
        tracing::info!(controller = NAME, "starting");
        let mut tick = tokio::time::interval(POLLING_INTERVAL);
        loop {
            tick.tick().await;
            self.clean().await;
        }
    }

    /// One look at every request.
    pub async fn clean(&self) {
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let now = self.clock.now();
        for c in self.csrs.all() {
            let Some(why) = plan(&c, now) else { continue };
            let name = c.metadata.name.clone().unwrap_or_default();
            tracing::info!(csr = name, "cleaning CSR as {why}");
            if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                tracing::error!(csr = name, "unable to delete CSR: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 2_000_000_000;

    fn at(secs_ago: i64) -> String {
        Timestamp::from_second(NOW - secs_ago).unwrap().to_string()
    }

    fn csr(created_ago: i64, status: serde_json::Value) -> CertificateSigningRequest {
        let mut c: CertificateSigningRequest = serde_json::from_value(json!({
            "metadata": {"name": "r", "creationTimestamp": at(created_ago)},
            "spec": {"request": "", "signerName": "example.com/s"},
            "status": status}))
        .unwrap();
        c.spec.request = k8s_openapi::ByteString(Vec::new());
        c
    }

    /// Upstream's `TestCleanerWithApprovedExpiredCSR` table (the certificate cases use a
    /// certificate issued here).
    #[test]
    fn upstream_cleaner_table() {
        let now = Timestamp::from_second(NOW).unwrap();
        let cond =
            |t: &str, ago: i64| json!({"type": t, "status": "True", "lastUpdateTime": at(ago)});
        let cert = |not_after: i64| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::default();
            p.not_after = time::OffsetDateTime::from_unix_timestamp(not_after).unwrap();
            let pem = p.self_signed(&key).unwrap().pem();
            use k8s_openapi::ByteString;
            serde_json::to_value(ByteString(pem.into_bytes())).unwrap()
        };
        let valid = cert(NOW + 3600);
        let expired = cert(NOW - 60);
        let cases = [
            ("no condition, recent", csr(3600, json!({})), false),
            ("no condition, 25 h old", csr(25 * 3600, json!({})), true),
            (
                "approved 5 min ago, issued",
                csr(
                    600,
                    json!({"conditions": [cond("Approved", 300)], "certificate": valid.clone()}),
                ),
                false,
            ),
            (
                "approved 90 min ago, issued",
                csr(
                    6000,
                    json!({"conditions": [cond("Approved", 5400)], "certificate": valid.clone()}),
                ),
                true,
            ),
            (
                "approved 90 min ago, not issued",
                csr(6000, json!({"conditions": [cond("Approved", 5400)]})),
                false,
            ),
            (
                "denied 5 min ago",
                csr(600, json!({"conditions": [cond("Denied", 300)]})),
                false,
            ),
            (
                "denied 90 min ago",
                csr(6000, json!({"conditions": [cond("Denied", 5400)]})),
                true,
            ),
            (
                "failed 90 min ago",
                csr(6000, json!({"conditions": [cond("Failed", 5400)]})),
                true,
            ),
            (
                "approved 5 min ago, certificate expired",
                csr(
                    600,
                    json!({"conditions": [cond("Approved", 300)], "certificate": expired}),
                ),
                true,
            ),
            (
                "approved without a time, old",
                csr(
                    30 * 3600,
                    json!({"conditions": [{"type": "Approved", "status": "True"}], "certificate": valid}),
                ),
                false,
            ),
        ];
        for (what, c, deleted) in cases {
            assert_eq!(
                plan(&c, now).is_some(),
                deleted,
                "{what}: {:?}",
                plan(&c, now)
            );
        }
    }
}
