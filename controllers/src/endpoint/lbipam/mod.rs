//! LoadBalancer IP allocation: Services of type LoadBalancer get `status.loadBalancer.ingress[].ip`
//! from a configured pool; the address is released when the Service is deleted (through the
//! `service.kubernetes.io/load-balancer-cleanup` finalizer, as cloud controllers do) or stops being a
//! LoadBalancer. At start the allocator is rebuilt from the addresses the Services in the cache
//! already carry, so a restart gives out no duplicates.
//!
//! Runs on the shared runtime: a handler on the Service informer queues the Services this may
//! concern (ours, or carrying our finalizer or an address) on one work queue named `lb_ipam`;
//! workers sync one Service at a time. [`step`] is the pure decision, [`apply_step`] the thin
//! layer. Services with a `loadBalancerClass` other than ours are left alone. An address that
//! cannot be given (pool exhausted, requested address taken) fails the sync, which is retried
//! with backoff and logged by the workers.

pub mod pool;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{self, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{start_key_workers, wait_for_caches, SyncKey};
use pool::{Allocator, Pool};

/// The work queue's (and metrics') name.
pub const QUEUE_NAME: &str = "lb_ipam";

/// Finalizer holding a Service until its address is released.
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The `spec.loadBalancerClass` we answer to (besides none).
pub const LB_CLASS: &str = "kpr.io/lb-ipam";

/// What one reconcile must write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// `Some(Some(ip))`: publish ip; `Some(None)`: clear the ingress list; `None`: leave it.
    pub ingress: Option<Option<IpAddr>>,
    /// `Some(true)`: add our finalizer; `Some(false)`: remove it; `None`: leave it.
    pub finalizer: Option<bool>,
}

/// `namespace/name`.
pub fn key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

fn is_ours(svc: &Service) -> bool {
    let spec = svc.spec.as_ref();
    spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec
            .and_then(|s| s.load_balancer_class.as_deref())
            .is_none_or(|c| c == LB_CLASS)
}

/// The ingress IPs a Service currently publishes.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

fn has_finalizer(svc: &Service) -> bool {
    svc.finalizers().iter().any(|f| f == FINALIZER)
}

/// Decides what to write for one Service, updating the allocator.
pub fn step(svc: &Service, alloc: &mut Allocator) -> Result<Step> {
    let k = key(svc);
    let current = ingress_ips(svc);
    if svc.metadata.deletion_timestamp.is_some() || !is_ours(svc) {
        alloc.release(&k);
        let ours_published = current.iter().any(|ip| alloc.in_pool(*ip));
        return Ok(Step {
            ingress: ours_published.then_some(None),
            finalizer: has_finalizer(svc).then_some(false),
        });
    }
    let requested = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
        .and_then(|ip| ip.parse().ok());
    let preferred = requested.or_else(|| current.iter().copied().find(|ip| alloc.in_pool(*ip)));
    let ip = alloc.ensure(&k, preferred)?;
    Ok(Step {
        ingress: (current != [ip]).then_some(Some(ip)),
        finalizer: (!has_finalizer(svc)).then_some(true),
    })
}

/// Whether a change of `svc` may need a write or release an address: it is (or was) ours, or it
/// carries our finalizer or an address.
fn concerns(svc: &Service) -> bool {
    is_ours(svc) || has_finalizer(svc) || !ingress_ips(svc).is_empty()
}

/// An allocator holding the addresses `services` already publish (the Services that are ours and
/// not being deleted, in `namespace/name` order, as a listing returns them: of two Services
/// claiming one address, the first keeps it).
pub fn rebuild<'a>(pool: Pool, services: impl IntoIterator<Item = &'a Service>) -> Allocator {
    let mut ours: Vec<&Service> = services
        .into_iter()
        .filter(|s| is_ours(s) && s.metadata.deletion_timestamp.is_none())
        .collect();
    ours.sort_by_key(|s| key(s));
    let mut alloc = Allocator::new(pool);
    for svc in ours {
        for ip in ingress_ips(svc) {
            if alloc.claim(&key(svc), ip) {
                break;
            }
        }
    }
    alloc
}

/// The lb-ipam controller's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The address pool (the controller-manager's `--lb-pool`).
    pub pool: Pool,
    /// Concurrent syncs (the allocation itself is serialized).
    pub workers: usize,
}

impl Config {
    /// Allocation out of `pool` with the default number of workers (5).
    pub fn new(pool: Pool) -> Self {
        Self { pool, workers: 5 }
    }
}

/// The running controller.
pub struct Controller {
    client: Client,
    workers: usize,
    pool: Pool,
    services: Arc<Indexed<Service>>,
    alloc: Mutex<Allocator>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the shared Service informer.
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        let svc_informer = informers.get::<Service>();
        let this = Arc::new(Controller {
            client,
            workers: config.workers,
            services: svc_informer.cache(),
            alloc: Mutex::new(Allocator::new(config.pool.clone())),
            pool: config.pool,
            queue: crate::endpoint::endpointutil::work_queue(QUEUE_NAME),
        });
        svc_informer.on_change_of(&this, Controller::on_service);
        this
    }

    /// Waits for the Service cache, rebuilds the allocator from it, then runs the workers until
    /// the queue shuts down.
    pub async fn run(self: Arc<Self>) {
        wait_for_caches("lb-ipam", &[&*self.services]).await;
        {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            *alloc = rebuild(
                self.pool.clone(),
                self.services.all().iter().map(|s| s.as_ref()),
            );
            tracing::info!(
                "lb-ipam: rebuilt {} assignments from existing Services",
                alloc.assigned()
            );
        }
        start_key_workers(&self, "lb-ipam", &self.queue, self.workers).await;
    }

    /// Stops the workers (the queue stops handing out keys).
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    fn on_service(&self, old: Option<&Arc<Service>>, new: Option<&Arc<Service>>) {
        if old.into_iter().chain(new).any(|s| concerns(s)) {
            if let Some(svc) = new.or(old) {
                self.queue.add(informer::key_of(svc.as_ref()));
            }
        }
    }
}

impl SyncKey for Controller {
    /// Decides and writes the address of the Service `key`; a Service gone from the cache (its
    /// finalizer removed by someone else) releases its address.
    async fn sync(&self, key: &str) -> Result<()> {
        let (ns, name) = informer::split_key(key);
        let Some(svc) = self.services.get(ns, name) else {
            self.alloc.lock().expect("allocator lock").release(key);
            return Ok(());
        };
        let s = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            step(&svc, &mut alloc)?
        };
        if s != Step::default() {
            apply_step(&self.client, &svc, &s).await?;
        }
        Ok(())
    }
}

async fn patch_finalizers(api: &Api<Service>, svc: &Service, add: bool) -> Result<()> {
    let mut list: Vec<String> = svc
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if add {
        list.push(FINALIZER.into());
    }
    let patch =
        json!({"metadata": {"finalizers": list, "resourceVersion": svc.resource_version()}});
    api.patch(
        &svc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .map_err(|e| Error::kube("patching Service metadata.finalizers", key(svc), e))?;
    Ok(())
}

/// Writes a step: finalizer before publishing an address, address cleared before the finalizer goes.
pub async fn apply_step(client: &Client, svc: &Service, s: &Step) -> Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), &svc.namespace().unwrap_or_default());
    if s.finalizer == Some(true) {
        patch_finalizers(&api, svc, true).await?;
    }
    if let Some(ingress) = s.ingress {
        let lb = match ingress {
            Some(ip) => json!({"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]}),
            None => json!({"ingress": null}),
        };
        api.patch_status(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": lb}})),
        )
        .await
        .map_err(|e| Error::kube("patching Service status.loadBalancer.ingress", key(svc), e))?;
    }
    if s.finalizer == Some(false) {
        let fresh = api
            .get(&svc.name_any())
            .await
            .map_err(|e| Error::kube("reading Service", key(svc), e))?;
        patch_finalizers(&api, &fresh, false).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(v: serde_json::Value) -> Service {
        let mut base =
            json!({"metadata": {"name": "s", "namespace": "ns"}, "spec": {"type": "LoadBalancer"}});
        json_patch::merge(&mut base, &v);
        serde_json::from_value(base).unwrap()
    }

    fn alloc() -> Allocator {
        Allocator::new("10.0.0.0/24".parse().unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn step_cases() {
        let fin = json!({"metadata": {"finalizers": [FINALIZER]}});
        let published = json!({"metadata": {"finalizers": [FINALIZER]}, "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
        let cases: Vec<(&str, serde_json::Value, Step)> = vec![
            (
                "new LoadBalancer: finalizer and address",
                json!({}),
                Step {
                    ingress: Some(Some(ip("10.0.0.1"))),
                    finalizer: Some(true),
                },
            ),
            (
                "finalizer present: address only",
                fin.clone(),
                Step {
                    ingress: Some(Some(ip("10.0.0.1"))),
                    finalizer: None,
                },
            ),
            (
                "already published: nothing",
                published.clone(),
                Step::default(),
            ),
            (
                "requested loadBalancerIP",
                json!({"spec": {"loadBalancerIP": "10.0.0.9"}, "metadata": {"finalizers": [FINALIZER]}}),
                Step {
                    ingress: Some(Some(ip("10.0.0.9"))),
                    finalizer: None,
                },
            ),
            (
                "changed to ClusterIP: clear and release",
                {
                    let mut v = published.clone();
                    v["spec"] = json!({"type": "ClusterIP"});
                    v
                },
                Step {
                    ingress: Some(None),
                    finalizer: Some(false),
                },
            ),
            (
                "being deleted: clear and release",
                {
                    let mut v = published.clone();
                    v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    v
                },
                Step {
                    ingress: Some(None),
                    finalizer: Some(false),
                },
            ),
            (
                "other loadBalancerClass: untouched",
                json!({"spec": {"loadBalancerClass": "example.com/other"}}),
                Step::default(),
            ),
            (
                "plain ClusterIP: untouched",
                json!({"spec": {"type": "ClusterIP"}}),
                Step::default(),
            ),
        ];
        for (name, v, want) in cases {
            assert_eq!(step(&svc(v), &mut alloc()).unwrap(), want, "{name}");
        }
    }

    #[test]
    fn rebuild_keeps_published_addresses_first_come_by_name() {
        let published = |name: &str, ip: &str| {
            svc(json!({"metadata": {"name": name},
                       "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}))
        };
        let mut gone = published("d", "10.0.0.9");
        gone.metadata.deletion_timestamp =
            serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
        let services = [
            published("b", "10.0.0.5"),
            published("a", "10.0.0.5"),
            published("c", "10.0.0.7"),
            gone,
        ];
        let mut a = rebuild("10.0.0.0/24".parse().unwrap(), &services);
        assert_eq!(
            a.assigned(),
            2,
            "a and c; b lost the tie, d is being deleted"
        );
        assert_eq!(a.ensure("ns/a", None).unwrap(), ip("10.0.0.5"));
        assert_eq!(a.ensure("ns/c", None).unwrap(), ip("10.0.0.7"));
        assert_ne!(a.ensure("ns/b", None).unwrap(), ip("10.0.0.5"));
    }

    #[test]
    fn only_services_that_may_need_a_write_are_queued() {
        assert!(concerns(&svc(json!({}))), "a LoadBalancer");
        let cluster_ip = json!({"spec": {"type": "ClusterIP"}});
        assert!(!concerns(&svc(cluster_ip.clone())));
        let mut was_ours = cluster_ip.clone();
        was_ours["metadata"] = json!({"finalizers": [FINALIZER]});
        assert!(concerns(&svc(was_ours)), "our finalizer to remove");
        let mut published = cluster_ip;
        published["status"] = json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}});
        assert!(concerns(&svc(published)), "an address to clear");
    }

    #[test]
    fn release_frees_the_address_for_the_next_service() {
        let mut a = alloc();
        let first = step(&svc(json!({})), &mut a).unwrap();
        assert_eq!(first.ingress, Some(Some(ip("10.0.0.1"))));
        let gone = svc(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        step(&gone, &mut a).unwrap();
        let other = svc(json!({"metadata": {"name": "t"}}));
        assert_eq!(
            step(&other, &mut a).unwrap().ingress,
            Some(Some(ip("10.0.0.2"))),
            "cursor moves on"
        );
        assert_eq!(a.assigned(), 1);
    }
}
