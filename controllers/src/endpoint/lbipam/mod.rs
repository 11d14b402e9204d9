//! LoadBalancer IP allocation: Services of type LoadBalancer get `status.loadBalancer.ingress[].ip`
//! from a configured pool; the address is released when the Service is deleted (through the
//! `service.kubernetes.io/load-balancer-cleanup` finalizer, as cloud controllers do) or stops being a
//! LoadBalancer. At start the allocator is rebuilt from the addresses Services already carry, so a
//! restart gives out no duplicates.
//!
//! Shape: `Controller::new(services).run(reconcile, error_policy, ctx)`; `step` is the pure decision,
//! `apply_step` the thin layer. Services with a `loadBalancerClass` other than ours are left alone.

pub mod pool;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use pool::{Allocator, Pool};

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

/// Shared by every reconcile.
pub struct Context {
    client: Client,
    alloc: Mutex<Allocator>,
}

/// Rebuilds the allocator from the Services that exist now.
pub async fn rebuild(client: &Client, pool: Pool) -> Result<Allocator> {
    let list = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            Error::kube(
                "listing Services to rebuild LoadBalancer allocations",
                "*",
                e,
            )
        })?;
    let mut alloc = Allocator::new(pool);
    for svc in list
        .items
        .iter()
        .filter(|s| is_ours(s) && s.metadata.deletion_timestamp.is_none())
    {
        for ip in ingress_ips(svc) {
            if alloc.claim(&key(svc), ip) {
                break;
            }
        }
    }
    tracing::info!(
        "lb-ipam: rebuilt {} assignments from existing Services",
        alloc.assigned()
    );
    Ok(alloc)
}

/// Runs the allocator controller (after `rebuild`) until its stream ends.
pub async fn run(client: Client, pool: Pool) -> Result<()> {
    let alloc = rebuild(&client, pool).await?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        alloc: Mutex::new(alloc),
    });
    Controller::new(Api::<Service>::all(client), watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("lb-ipam controller: {e}");
            }
            futures::future::ready(())
        })
        .await;
    Ok(())
}

/// Decides and writes one Service's address.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    let s = {
        let mut alloc = ctx.alloc.lock().expect("allocator lock");
        step(&svc, &mut alloc)?
    };
    if s != Step::default() {
        apply_step(&ctx.client, &svc, &s).await?;
    }
    Ok(Action::await_change())
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

/// Requeues a failed reconcile after a second.
pub fn error_policy(svc: Arc<Service>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::info!("lb-ipam: Service {}: {err}", key(&svc));
    Action::requeue(Duration::from_secs(1))
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
