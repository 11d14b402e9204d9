//! The endpointslice-mirroring, service-cidr and validatingadmissionpolicy-status controllers of
//! issue 43 end to end against the reference control plane, once with kube-controller-manager
//! (`upstream_*`) and once with our `controller-manager` (`kpr_*`), both with `--controllers`
//! naming those three (kube-controller-manager's names, which ours takes too). The same checks
//! hold for both, except the one difference written down in docs/WORKLOADS.md: kpr does not
//! type-check CEL.
//!
//! - mirroring: the custom Endpoints of a Service without a selector (an IPv4 and an IPv6 address,
//!   ready and not, a hostname, a label and an annotation) become one slice per family, labelled
//!   `endpointslice.kubernetes.io/managed-by: endpointslicemirroring-controller.k8s.io`, owned by
//!   the Endpoints, with the same endpoints; Endpoints labelled `skip-mirror` get none; an address
//!   removed is removed from the same slice; the Service gaining a selector deletes the slices.
//! - service-cidr: the default ServiceCIDR and a new one get the finalizer and `Ready=True`; the
//!   new one, deleted while a Service's ClusterIP is allocated in it, stays with `Ready=False`
//!   (`Terminating`) until the Service goes, then goes.
//! - validatingadmissionpolicy-status: a policy's `status.observedGeneration` follows its
//!   generation, with `typeChecking` and no warnings for a well-typed expression; for an
//!   expression comparing an integer with a string, kube-controller-manager writes a warning and
//!   kpr none.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;

use std::time::Duration;

use common::{Cluster, Flavour};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

/// kube-controller-manager's names of the controllers under test; ours takes the same.
const CONTROLLERS: &str = "endpointslice-mirroring-controller,service-cidr-controller,\
     validatingadmissionpolicy-status-controller";

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
const NS: &str = "mirror";
const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", K::kind(&())))
}

/// The mirrored slices of `name`, each as (addressType, ports, endpoints) with endpoints and
/// ports sorted (their order is the controllers' own).
async fn mirrored(api: &Api<EndpointSlice>, name: &str) -> Vec<(String, Value, Vec<Value>)> {
    let lp = ListParams::default().labels(&format!(
        "kubernetes.io/service-name={name},endpointslice.kubernetes.io/managed-by={MANAGED_BY}"
    ));
    let mut out: Vec<(String, Value, Vec<Value>)> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let mut eps: Vec<Value> = s
                .endpoints
                .iter()
                .map(|e| serde_json::to_value(e).unwrap())
                .collect();
            eps.sort_by_key(|e| e.to_string());
            (s.address_type, serde_json::to_value(&s.ports).unwrap(), eps)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

async fn mirroring(cluster: &Cluster, client: &Client) {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": NS}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    for name in ["skipped", "custom"] {
        create(
            &services,
            json!({"metadata": {"name": name}, "spec": {"ports": [{"name": "http", "port": 80}]}}),
        )
        .await;
    }
    create(
        &endpoints,
        json!({"metadata": {"name": "skipped",
                            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
               "subsets": [{"addresses": [{"ip": "10.1.0.9"}], "ports": [{"name": "http", "port": 8080}]}]}),
    )
    .await;
    let ep = create(
        &endpoints,
        json!({"metadata": {"name": "custom", "labels": {"team": "a"},
                            "annotations": {"note": "n"}},
               "subsets": [{"addresses": [{"ip": "10.1.0.1", "hostname": "h1"}, {"ip": "10.1.0.2"},
                                          {"ip": "2001:db8::1"}],
                            "notReadyAddresses": [{"ip": "10.1.0.3"}],
                            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}),
    )
    .await;
    let ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let ready = |ip: &str, host: Option<&str>| {
        let mut v = json!({"addresses": [ip], "conditions": {"ready": true}});
        if let Some(h) = host {
            v["hostname"] = json!(h);
        }
        v
    };
    let not_ready = |ip: &str| json!({"addresses": [ip], "conditions": {"ready": false}});
    let want = vec![
        (
            "IPv4".to_string(),
            ports.clone(),
            vec![
                ready("10.1.0.1", Some("h1")),
                ready("10.1.0.2", None),
                not_ready("10.1.0.3"),
            ],
        ),
        (
            "IPv6".to_string(),
            ports.clone(),
            vec![ready("2001:db8::1", None)],
        ),
    ];
    cluster
        .eventually_showing("custom's two mirrored slices", WAIT, POLL, || async {
            let got = mirrored(&slices, "custom").await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    let lp = ListParams::default().labels("kubernetes.io/service-name=custom");
    let listed = slices.list(&lp).await.unwrap().items;
    let v4_name = listed
        .iter()
        .find(|s| s.address_type == "IPv4")
        .unwrap()
        .name_any();
    for s in &listed {
        assert_eq!(
            s.labels()["team"],
            "a",
            "{:?}: the Endpoints' labels",
            cluster.flavour
        );
        assert_eq!(s.annotations().get("note").map(String::as_str), Some("n"));
        let owner = &s.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Endpoints", "custom", Some(true))
        );
        assert_eq!(Some(&owner.uid), ep.metadata.uid.as_ref());
        assert!(s.name_any().starts_with("custom-"), "{}", s.name_any());
    }
    assert!(
        mirrored(&slices, "skipped").await.is_empty(),
        "{:?}: skip-mirror Endpoints were mirrored",
        cluster.flavour
    );

    // An address removed: the same slice rewritten.
    let patch = json!({"subsets": [{"addresses": [{"ip": "10.1.0.1", "hostname": "h1"}, {"ip": "2001:db8::1"}],
                                    "notReadyAddresses": [{"ip": "10.1.0.3"}],
                                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]});
    endpoints
        .patch("custom", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    cluster
        .eventually(
            "10.1.0.2 removed from the IPv4 slice",
            WAIT,
            POLL,
            || async {
                let s = slices.get_opt(&v4_name).await.unwrap()?;
                let ips: Vec<&str> = s
                    .endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter().map(String::as_str))
                    .collect();
                (ips.len() == 2 && !ips.contains(&"10.1.0.2")).then_some(())
            },
        )
        .await;

    // A selector: the mirrored slices go.
    services
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"app": "x"}}})),
        )
        .await
        .unwrap();
    cluster
        .eventually("custom's mirrored slices deleted", WAIT, POLL, || async {
            mirrored(&slices, "custom").await.is_empty().then_some(())
        })
        .await;
}

fn ready_condition(c: &ServiceCIDR) -> Option<(String, String, String)> {
    c.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn service_cidr(cluster: &Cluster, client: &Client) {
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());
    cluster
        .eventually(
            "the default ServiceCIDR's finalizer",
            WAIT,
            POLL,
            || async {
                let c = cidrs.get_opt("kubernetes").await.unwrap()?;
                c.finalizers().iter().any(|f| f == FINALIZER).then_some(())
            },
        )
        .await;
    create(
        &cidrs,
        json!({"metadata": {"name": "extra"}, "spec": {"cidrs": ["10.100.0.0/24"]}}),
    )
    .await;
    cluster
        .eventually_showing("extra's finalizer and Ready", WAIT, POLL, || async {
            let c = cidrs.get("extra").await.unwrap();
            let ready = ready_condition(&c);
            let want = Some((
                "True".to_string(),
                String::new(),
                "Kubernetes Service CIDR is ready".to_string(),
            ));
            if c.finalizers().iter().any(|f| f == FINALIZER) && ready == want {
                Ok(())
            } else {
                Err(format!("{:?} {ready:?}", c.finalizers()))
            }
        })
        .await;
    // A ClusterIP allocated in it holds it when deleted.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    create(
        &services,
        json!({"metadata": {"name": "in-extra"},
               "spec": {"clusterIP": "10.100.0.10", "ports": [{"port": 80}]}}),
    )
    .await;
    cidrs
        .delete("extra", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually_showing(
            "extra held, Ready=False Terminating",
            WAIT,
            POLL,
            || async {
                let c = cidrs.get("extra").await.unwrap();
                let ready = ready_condition(&c);
                if c.metadata.deletion_timestamp.is_some()
                    && ready.as_ref().map(|r| (r.0.as_str(), r.1.as_str()))
                        == Some(("False", "Terminating"))
                {
                    Ok(())
                } else {
                    Err(format!("{ready:?}"))
                }
            },
        )
        .await;
    assert!(cidrs.get_opt("extra").await.unwrap().is_some());
    services
        .delete("in-extra", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("extra gone once its address is", WAIT, POLL, || async {
            cidrs
                .get_opt("extra")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
}

fn policy(name: &str, expression: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
                    "validations": [{"expression": expression}]}})
}

/// (observedGeneration, the warnings' fieldRefs) once the status has been written.
async fn policy_status(
    api: &Api<ValidatingAdmissionPolicy>,
    name: &str,
) -> Option<(i64, Vec<String>)> {
    let p = api.get(name).await.unwrap();
    let status = p.status?;
    let type_checking = status.type_checking?;
    let refs = type_checking
        .expression_warnings
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.field_ref)
        .collect();
    Some((status.observed_generation?, refs))
}

async fn policy_status_controller(cluster: &Cluster, client: &Client) {
    let api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    create(&api, policy("typed", "object.spec.replicas < 5")).await;
    cluster
        .eventually(
            "typed's status, generation 1, no warnings",
            WAIT,
            POLL,
            || async { (policy_status(&api, "typed").await? == (1, vec![])).then_some(()) },
        )
        .await;
    let change = json!({"spec": {"validations": [{"expression": "object.spec.replicas < 10"}]}});
    api.patch("typed", &PatchParams::default(), &Patch::Merge(change))
        .await
        .unwrap();
    cluster
        .eventually("typed's generation 2 observed", WAIT, POLL, || async {
            (policy_status(&api, "typed").await? == (2, vec![])).then_some(())
        })
        .await;
    create(&api, policy("mistyped", "object.spec.replicas == 'five'")).await;
    let (generation, warnings) = cluster
        .eventually("mistyped's status", WAIT, POLL, || async {
            policy_status(&api, "mistyped").await
        })
        .await;
    assert_eq!(generation, 1);
    // The difference: kube-controller-manager type-checks against the Deployment schema and
    // warns; kpr does not type-check (docs/WORKLOADS.md).
    match cluster.flavour {
        Flavour::Upstream => assert_eq!(warnings, ["spec.validations[0].expression"]),
        Flavour::Kpr => assert!(warnings.is_empty(), "{warnings:?}"),
    }
}

async fn scenario(flavour: Flavour) {
    let cluster = Cluster::start_minimal(flavour, "mirroring-servicecidr", CONTROLLERS);
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    mirroring(&cluster, &client).await;
    service_cidr(&cluster, &client).await;
    policy_status_controller(&cluster, &client).await;
    cluster.check_alive().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_mirroring_servicecidr_policy_status() {
    scenario(Flavour::Upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpr_mirroring_servicecidr_policy_status() {
    scenario(Flavour::Kpr).await;
}
