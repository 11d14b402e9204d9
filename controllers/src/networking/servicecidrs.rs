//! The service-CIDR controller (kube-controller-manager v1.34's `service-cidr-controller`,
//! `pkg/controller/servicecidrs`): the `networking.k8s.io/service-cidr-finalizer` finalizer and
//! the `Ready` condition of every ServiceCIDR.
//!
//! Owns: that finalizer and the `Ready` condition (written by server-side apply of the status with
//! the field manager `service-cidr-controller`, forced, as upstream). A live ServiceCIDR gets the
//! finalizer and `Ready=True` ("Kubernetes Service CIDR is ready"). A ServiceCIDR being deleted
//! keeps its finalizer while an IPAddress allocated by the API server (`ipaddress.kubernetes.io/
//! managed-by: ipallocator.k8s.io`) lies in it and in no other ServiceCIDR, with `Ready=False`,
//! reason `Terminating`; unless every one of its prefixes lies within another ServiceCIDR, in
//! which case nothing is orphaned. Once nothing holds it, the finalizer goes ten seconds after the
//! deletion started (upstream's grace period, for allocations in flight in the API server).
//!
//! Queueing, as upstream: a ServiceCIDR's add queues it and every ServiceCIDR overlapping it;
//! its update and delete queue it; an allocated IPAddress's add and delete queue the ServiceCIDRs
//! containing it. Five workers (upstream's fixed count), the work queue `ipaddresses` (upstream's
//! queue name) with the default controller rate limiter.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{EventHandlers, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name: its field manager, as upstream.
pub const NAME: &str = "service-cidr-controller";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "ipaddresses";

/// The finalizer (`ServiceCIDRProtectionFinalizer`).
pub const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

/// The label naming who allocated an IPAddress (`networking.LabelManagedBy`).
pub const LABEL_MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";

/// The API server's allocator (`ipallocator.ControllerName`): only its IPAddresses hold a
/// ServiceCIDR.
pub const IPALLOCATOR: &str = "ipallocator.k8s.io";

/// How long after its deletion started a ServiceCIDR nothing holds keeps its finalizer.
pub const DELETION_GRACE: Duration = Duration::from_secs(10);

/// Workers: kube-controller-manager starts five (no flag sets it).
pub const WORKERS: usize = 5;

/// The `Ready` condition's message on a live ServiceCIDR.
pub const READY_MESSAGE: &str = "Kubernetes Service CIDR is ready";

/// The `Ready=False` message while IPAddresses hold a ServiceCIDR being deleted.
pub const TERMINATING_MESSAGE: &str = "There are still IPAddresses referencing the ServiceCIDR, \
please remove them or create a new ServiceCIDR";

/// The prefixes of a ServiceCIDR (unparsable entries skipped: validation rejects them).
fn prefixes(cidr: &ServiceCIDR) -> Vec<IpNet> {
    cidr.spec
        .as_ref()
        .and_then(|s| s.cidrs.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.parse().ok())
        .collect()
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Upstream's `PrefixContainsIP`: inside the prefix, but neither its network address nor (IPv4)
/// its broadcast address, which are never allocated.
pub fn prefix_contains_ip(prefix: &IpNet, ip: IpAddr) -> bool {
    if prefix.network() == ip {
        return false;
    }
    if ip.is_ipv4() && prefix.broadcast() == ip {
        return false;
    }
    prefix.contains(&ip)
}

/// The names of the ServiceCIDRs of `all` overlapping `cidr` (`OverlapsPrefix`).
pub fn overlapping<'a>(cidr: &ServiceCIDR, all: &'a [Arc<ServiceCIDR>]) -> Vec<&'a str> {
    let mine = prefixes(cidr);
    all.iter()
        .filter(|o| {
            prefixes(o)
                .iter()
                .any(|p| mine.iter().any(|m| overlaps(p, m)))
        })
        .filter_map(|o| o.metadata.name.as_deref())
        .collect()
}

/// The names of the ServiceCIDRs of `all` containing `ip` (`ContainsAddress`).
pub fn containing(ip: IpAddr, all: &[Arc<ServiceCIDR>]) -> Vec<&str> {
    all.iter()
        .filter(|c| prefixes(c).iter().any(|p| prefix_contains_ip(p, ip)))
        .filter_map(|c| c.metadata.name.as_deref())
        .collect()
}

/// The address of an IPAddress the API server allocated (its name), else `None`.
pub fn allocated_address(ip: &IPAddress) -> Option<IpAddr> {
    (ip.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(IPALLOCATOR))
        .then(|| ip.name_any().parse().ok())
        .flatten()
}

/// Upstream's `canDeleteCIDR`: whether nothing is orphaned by deleting `cidr`. True when each of
/// its prefixes lies within another ServiceCIDR; else false while an allocated address in one of
/// its prefixes lies in no ServiceCIDR but this one.
pub fn can_delete(cidr: &ServiceCIDR, all: &[Arc<ServiceCIDR>], ips: &[Arc<IPAddress>]) -> bool {
    let name = cidr.name_any();
    let mine = prefixes(cidr);
    let has_parent = mine.iter().all(|p| {
        // `ContainsPrefix`: overlapping with a prefix at most as long.
        all.iter().any(|o| {
            o.name_any() != name
                && prefixes(o)
                    .iter()
                    .any(|q| overlaps(p, q) && q.prefix_len() <= p.prefix_len())
        })
    });
    if has_parent {
        return true;
    }
    // An address contained by this ServiceCIDR alone lies in one of its prefixes.
    !ips.iter()
        .filter_map(|ip| allocated_address(ip))
        .any(|a| containing(a, all) == [name.as_str()])
}

/// What a sync does to one ServiceCIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing.
    Nothing,
    /// Add the finalizer (if missing), then make the Ready condition `ready` (if different).
    Live {
        add_finalizer: bool,
        set_ready: bool,
    },
    /// Being deleted and held by IPAddresses: Ready=False, Terminating (if different).
    Held { set_condition: bool },
    /// Being deleted, nothing holds it, the grace period not over: look again after this long.
    Wait(Duration),
    /// Being deleted, nothing holds it: remove the finalizer.
    Release,
}

fn ready_condition(
    cidr: &ServiceCIDR,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    cidr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
}

/// Whether the Ready condition already reads `(status, reason, message)` (upstream's
/// `updateConditionIfNeeded` compares these three).
fn condition_is(cidr: &ServiceCIDR, status: &str, reason: &str, message: &str) -> bool {
    ready_condition(cidr)
        .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
}

/// The plan for `cidr`, `since_deletion` the time since its deletion started (if it is being
/// deleted).
pub fn plan(
    cidr: &ServiceCIDR,
    all: &[Arc<ServiceCIDR>],
    ips: &[Arc<IPAddress>],
    since_deletion: Option<Duration>,
) -> Plan {
    let has_finalizer = cidr.finalizers().iter().any(|f| f == FINALIZER);
    match since_deletion {
        None => {
            let add_finalizer = !has_finalizer;
            let set_ready = !condition_is(cidr, "True", "", READY_MESSAGE);
            if add_finalizer || set_ready {
                Plan::Live {
                    add_finalizer,
                    set_ready,
                }
            } else {
                Plan::Nothing
            }
        }
        Some(since) => {
            if !can_delete(cidr, all, ips) {
                let set = !condition_is(cidr, "False", "Terminating", TERMINATING_MESSAGE);
                return if set {
                    Plan::Held {
                        set_condition: true,
                    }
                } else {
                    Plan::Nothing
                };
            }
            if since < DELETION_GRACE {
                Plan::Wait(DELETION_GRACE - since)
            } else if has_finalizer {
                Plan::Release
            } else {
                Plan::Nothing
            }
        }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    cidrs: Arc<Indexed<ServiceCIDR>>,
    ips: Arc<Indexed<IPAddress>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the ServiceCIDR and IPAddress informers.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let cidr_informer = informers.get::<ServiceCIDR>();
        let ip_informer = informers.get::<IPAddress>();
        let this = Arc::new(Controller {
            client,
            cidrs: cidr_informer.cache(),
            ips: ip_informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        cidr_informer.on_events_of(
            &this,
            EventHandlers {
                added: |c, cidr| {
                    c.queue.add(cidr.name_any());
                    let all = c.cidrs.all();
                    for name in overlapping(cidr, &all) {
                        c.queue.add(name.to_string());
                    }
                },
                updated: |c, _, cidr| c.queue.add(cidr.name_any()),
                deleted: |c, cidr| c.queue.add(cidr.name_any()),
            },
        );
        ip_informer.on_events_of(
            &this,
            EventHandlers {
                added: |c, ip| c.queue_containing(ip),
                updated: |_, _, _| {},
                deleted: |c, ip| c.queue_containing(ip),
            },
        );
        this
    }

    fn queue_containing(&self, ip: &IPAddress) {
        let Some(addr) = allocated_address(ip) else {
            return;
        };
        let all = self.cidrs.all();
        for name in containing(addr, &all) {
            self.queue.add(name.to_string());
        }
    }

    /// Waits for the caches, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(
            &self,
            NAME,
            &[&*self.cidrs, &*self.ips],
            &self.queue,
            WORKERS,
        )
        .await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    async fn apply_condition(
        &self,
        name: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let api: Api<ServiceCIDR> = Api::all(self.client.clone());
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let body = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                                       "message": message, "lastTransitionTime": now}]}});
        api.patch_status(name, &PatchParams::apply(NAME).force(), &Patch::Apply(body))
            .await
            .map(|_| ())
            .map_err(|e| {
                Error::kube(
                    "updating the Ready condition of",
                    format!("ServiceCIDR {name}"),
                    e,
                )
            })
    }

    async fn patch_finalizers(
        &self,
        name: &str,
        patch: serde_json::Value,
        what: &'static str,
    ) -> Result<()> {
        let api: Api<ServiceCIDR> = Api::all(self.client.clone());
        match api
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if apierrors::is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(what, format!("ServiceCIDR {name}"), e)),
        }
    }
}

impl SyncKey for Controller {
    /// Upstream's `sync`.
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(cidr) = self.cidrs.get("", name) else {
            return Ok(());
        };
        let since_deletion = cidr.metadata.deletion_timestamp.as_ref().map(|t| {
            let elapsed = jiff::Timestamp::now().duration_since(t.0);
            Duration::try_from(elapsed).unwrap_or(Duration::ZERO)
        });
        let all = self.cidrs.all();
        let ips = self.ips.all();
        match plan(&cidr, &all, &ips, since_deletion) {
            Plan::Nothing => Ok(()),
            Plan::Live {
                add_finalizer,
                set_ready,
            } => {
                if add_finalizer {
                    let patch = json!({"metadata": {"finalizers": [FINALIZER]}});
                    self.patch_finalizers(name, patch, "adding the finalizer to")
                        .await?;
                }
                if set_ready {
                    self.apply_condition(name, "True", "", READY_MESSAGE)
                        .await?;
                }
                Ok(())
            }
            Plan::Held { .. } => {
                self.apply_condition(name, "False", "Terminating", TERMINATING_MESSAGE)
                    .await
            }
            Plan::Wait(after) => {
                self.queue.add_after(name.to_string(), after);
                Ok(())
            }
            Plan::Release => {
                let patch =
                    json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}});
                self.patch_finalizers(name, patch, "removing the finalizer from")
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(name: &str, cidrs: &[&str]) -> Arc<ServiceCIDR> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name, "finalizers": [FINALIZER]},
                "spec": {"cidrs": cidrs}}),
            )
            .unwrap(),
        )
    }

    fn ip(addr: &str, managed_by: &str) -> Arc<IPAddress> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": addr,
                "labels": {LABEL_MANAGED_BY: managed_by}},
                "spec": {"parentRef": {"resource": "services", "name": "s", "namespace": "ns"}}}))
            .unwrap(),
        )
    }

    /// Upstream's `Test_PrefixContainIP` cases.
    #[test]
    fn network_and_broadcast_addresses_are_not_contained() {
        let p: IpNet = "192.168.0.0/24".parse().unwrap();
        assert!(!prefix_contains_ip(&p, "192.168.0.0".parse().unwrap()));
        assert!(prefix_contains_ip(&p, "192.168.0.1".parse().unwrap()));
        assert!(!prefix_contains_ip(&p, "192.168.0.255".parse().unwrap()));
        assert!(!prefix_contains_ip(&p, "192.168.1.1".parse().unwrap()));
        let p6: IpNet = "2001:db8::/112".parse().unwrap();
        assert!(!prefix_contains_ip(&p6, "2001:db8::".parse().unwrap()));
        assert!(
            prefix_contains_ip(&p6, "2001:db8::ffff".parse().unwrap()),
            "no broadcast in v6"
        );
        let host: IpNet = "10.0.0.1/32".parse().unwrap();
        assert!(!prefix_contains_ip(&host, "10.0.0.1".parse().unwrap()));
    }

    /// Upstream's `TestControllerSync` cases, as plans.
    #[test]
    fn deletion_is_held_by_an_allocated_address_in_no_other_cidr() {
        let kubernetes = cidr("kubernetes", &["10.0.0.0/24", "2001:db2::/64"]);
        let wide = cidr("wide", &["10.0.0.0/16"]);
        let narrow = cidr("narrow", &["10.0.0.0/26"]);
        let other = cidr("other", &["192.168.0.0/24"]);
        let grace_over = Some(DELETION_GRACE);
        // No IPAddresses: released after the grace period, waited for before.
        assert_eq!(
            plan(
                &kubernetes,
                std::slice::from_ref(&kubernetes),
                &[],
                grace_over
            ),
            Plan::Release
        );
        assert_eq!(
            plan(
                &kubernetes,
                std::slice::from_ref(&kubernetes),
                &[],
                Some(Duration::from_secs(4))
            ),
            Plan::Wait(Duration::from_secs(6))
        );
        // An allocated address only it contains holds it.
        let all = [kubernetes.clone(), other.clone()];
        let held = [ip("10.0.0.1", IPALLOCATOR)];
        assert_eq!(
            plan(&kubernetes, &all, &held, grace_over),
            Plan::Held {
                set_condition: true
            }
        );
        // Not allocated by the API server: does not hold.
        let foreign = [ip("10.0.0.1", "someone-else")];
        assert_eq!(plan(&kubernetes, &all, &foreign, grace_over), Plan::Release);
        // The address in another ServiceCIDR as well: does not hold.
        let with_narrow = [kubernetes.clone(), narrow.clone()];
        assert_eq!(
            plan(&kubernetes, &with_narrow, &held, grace_over),
            Plan::Release
        );
        // An address the other (narrower) one does not contain holds it.
        let outside_narrow = [ip("10.0.0.100", IPALLOCATOR)];
        assert_eq!(
            plan(&kubernetes, &with_narrow, &outside_narrow, grace_over),
            Plan::Held {
                set_condition: true
            }
        );
        // Its IPv4 prefix within a wider one (its IPv6 one within none): the wider one contains
        // the address too, so it holds nothing.
        let with_wide = [kubernetes.clone(), wide.clone()];
        assert_eq!(
            plan(&kubernetes, &with_wide, &held, grace_over),
            Plan::Release
        );
        // Every prefix within another: released whatever the addresses.
        let v4only = cidr("v4", &["10.0.0.0/24"]);
        assert_eq!(
            plan(&v4only, &[v4only.clone(), wide.clone()], &held, grace_over),
            Plan::Release
        );
        // Network and broadcast addresses are never allocated: they hold nothing.
        let edge = [ip("10.0.0.255", IPALLOCATOR)];
        assert_eq!(plan(&kubernetes, &all, &edge, grace_over), Plan::Release);
    }

    #[test]
    fn a_live_cidr_gets_the_finalizer_and_ready_once() {
        let bare: Arc<ServiceCIDR> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "c"},
                "spec": {"cidrs": ["10.0.0.0/24"]}}))
            .unwrap(),
        );
        assert_eq!(
            plan(&bare, std::slice::from_ref(&bare), &[], None),
            Plan::Live {
                add_finalizer: true,
                set_ready: true
            }
        );
        let ready: Arc<ServiceCIDR> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "c", "finalizers": [FINALIZER]},
                "spec": {"cidrs": ["10.0.0.0/24"]},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
                    "message": READY_MESSAGE, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
            .unwrap(),
        );
        assert_eq!(
            plan(&ready, std::slice::from_ref(&ready), &[], None),
            Plan::Nothing
        );
        // Held, and already saying so: nothing more to write.
        let mut terminating = (*ready).clone();
        terminating.status = serde_json::from_value(json!({"conditions": [{"type": "Ready",
            "status": "False", "reason": "Terminating", "message": TERMINATING_MESSAGE,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
        .unwrap();
        let held = [ip("10.0.0.7", IPALLOCATOR)];
        let t = Arc::new(terminating);
        assert_eq!(
            plan(&t, std::slice::from_ref(&t), &held, Some(DELETION_GRACE)),
            Plan::Nothing
        );
    }

    #[test]
    fn queueing_finds_overlapping_and_containing_cidrs() {
        let a = cidr("a", &["10.0.0.0/24"]);
        let b = cidr("b", &["10.0.0.0/16"]);
        let c = cidr("c", &["192.168.0.0/24"]);
        let all = [a.clone(), b.clone(), c.clone()];
        assert_eq!(overlapping(&a, &all), ["a", "b"]);
        assert_eq!(containing("10.0.1.1".parse().unwrap(), &all), ["b"]);
        assert_eq!(
            allocated_address(&ip("10.0.0.1", IPALLOCATOR)),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(allocated_address(&ip("10.0.0.1", "x")), None);
    }
}
