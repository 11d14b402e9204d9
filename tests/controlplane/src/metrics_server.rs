//! A scripted resource metrics API (`metrics.k8s.io/v1beta1`, what metrics-server serves): the
//! test says which CPU usage each Pod reports ([`Script`]), and the server answers the API
//! server's proxied requests from that script: discovery of the group version, PodMetrics of a
//! namespace by label selector (list) and of one Pod (get). It serves TLS (a certificate from the
//! control plane's CA) on loopback; the API server reaches it through the aggregation layer, an
//! APIService whose Service is an ExternalName `localhost` (the aggregator dials
//! `https://<externalName>:<port>` for those, so nothing leaves loopback): [`register`] creates
//! both. The HPA differential suite and the HPA benchmark serve their Pods' usage from it.
//!
//! Owns: its listening sockets, the script, and the Service and APIService it registers.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The APIService's name.
pub const API_SERVICE: &str = "v1beta1.metrics.k8s.io";

/// Creates the Service (ExternalName `localhost`, in kube-system) and the APIService through
/// which the API server serves `metrics.k8s.io` from the server on `port`, and waits (up to
/// `wait`) until the aggregator finds it available.
pub async fn register(client: &kube::Client, port: u16, wait: Duration) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "scripted-metrics"},
                "spec": {"type": "ExternalName", "externalName": "localhost"}}))?,
        )
        .await
        .context("creating Service kube-system/scripted-metrics")?;
    let apiservices: Api<APIService> = Api::all(client.clone());
    apiservices
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": API_SERVICE},
                "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                    "service": {"namespace": "kube-system", "name": "scripted-metrics", "port": port},
                    "insecureSkipTLSVerify": true,
                    "groupPriorityMinimum": 100, "versionPriority": 100}}))?,
        )
        .await
        .with_context(|| format!("creating APIService {API_SERVICE}"))?;
    let start = Instant::now();
    loop {
        let s = apiservices.get(API_SERVICE).await?;
        let available = s
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Available"))
            .map(|c| (c.status.clone(), c.message.clone()));
        if available.as_ref().is_some_and(|a| a.0 == "True") {
            return Ok(());
        }
        if start.elapsed() > wait {
            bail!("the scripted metrics APIService is not available: {available:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one Pod reports: its labels (the list's selector matches them) and its CPU usage in
/// millicores, `None` for a Pod the metrics API has no sample of.
#[derive(Debug, Clone)]
struct Sample {
    labels: BTreeMap<String, String>,
    cpu_milli: Option<u32>,
}

/// The Pods' samples by namespace and name, changed by the test between steps.
#[derive(Clone, Default)]
pub struct Script {
    pods: Arc<Mutex<BTreeMap<(String, String), Sample>>>,
}

impl Script {
    /// Pod `ns/name` with `labels` reports `cpu_milli` (`None`: no sample).
    pub fn set(&self, ns: &str, name: &str, labels: &[(&str, &str)], cpu_milli: Option<u32>) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.pods
            .lock()
            .unwrap()
            .insert((ns.into(), name.into()), Sample { labels, cpu_milli });
    }

    /// The PodMetrics of the Pods of `ns` matching `selector` that have a sample.
    fn list(&self, ns: &str, selector: &[(String, String)]) -> Vec<Value> {
        self.pods
            .lock()
            .unwrap()
            .iter()
            .filter(|((n, _), s)| {
                n == ns
                    && selector
                        .iter()
                        .all(|(k, v)| s.labels.get(k).is_some_and(|l| l == v))
            })
            .filter_map(|((n, name), s)| pod_metrics(n, name, s))
            .collect()
    }

    fn get(&self, ns: &str, name: &str) -> Option<Value> {
        let pods = self.pods.lock().unwrap();
        let s = pods.get(&(ns.to_string(), name.to_string()))?;
        pod_metrics(ns, name, s)
    }
}

fn pod_metrics(ns: &str, name: &str, s: &Sample) -> Option<Value> {
    let cpu = s.cpu_milli?;
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap()
        .to_string();
    Some(json!({
        "metadata": {"name": name, "namespace": ns, "labels": s.labels, "creationTimestamp": now},
        "timestamp": now,
        "window": "30s",
        "containers": [{"name": "c", "usage": {"cpu": format!("{cpu}m"), "memory": "10Mi"}}],
    }))
}

/// A label selector as the autoscaler sends it (`k=v,k2=v2`); anything else is refused, so a
/// selector the script cannot honour fails loudly instead of matching everything.
fn parse_selector(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (k, v) = t
                .split_once("==")
                .or_else(|| t.split_once('='))
                .ok_or_else(|| format!("unsupported selector term {t:?}"))?;
            if k.ends_with('!') || v.contains(['(', ')']) {
                return Err(format!("unsupported selector term {t:?}"));
            }
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

const GV: &str = "metrics.k8s.io/v1beta1";

async fn discovery() -> Json<Value> {
    let resource = |name: &str, kind: &str, namespaced: bool| {
        json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
               "verbs": ["get", "list"]})
    };
    Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV,
        "resources": [resource("nodes", "NodeMetrics", false),
                      resource("pods", "PodMetrics", true)],
    }))
}

async fn list_pods(
    State(script): State<Script>,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, (StatusCode, String)> {
    let selector = parse_selector(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    Ok(Json(json!({
        "kind": "PodMetricsList", "apiVersion": GV, "metadata": {},
        "items": script.list(&ns, &selector),
    })))
}

async fn get_pod(
    State(script): State<Script>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    match script.get(&ns, &name) {
        Some(mut m) => {
            m["kind"] = json!("PodMetrics");
            m["apiVersion"] = json!(GV);
            Ok(Json(m))
        }
        None => Err((
            StatusCode::NOT_FOUND,
            Json(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404,
                "message": format!("podmetrics.metrics.k8s.io \"{ns}/{name}\" not found")}),
            ),
        )),
    }
}

/// TLS connections whose handshake is done, fed by the accept loops (a handshake never holds
/// up the next accept).
struct TlsListener {
    conns: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.conns.recv().await {
            Some(c) => c,
            // Every accept loop ended: nothing will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

fn accept_loop(
    listener: TcpListener,
    tls: TlsAcceptor,
    out: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                continue;
            };
            let (tls, out) = (tls.clone(), out.clone());
            tokio::spawn(async move {
                if let Ok(stream) = tls.accept(tcp).await {
                    let _ = out.send((stream, peer)).await;
                }
            });
        }
    });
}

/// Starts the server on a free port of 127.0.0.1 (and the same port of ::1 when this machine
/// has it: `localhost` may resolve to either) with the certificate and key in PEM files;
/// returns the port and the script it answers from.
pub async fn start(cert: &Path, key: &Path) -> anyhow::Result<(u16, Script)> {
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = TlsAcceptor::from(Arc::new(config));

    let v4 = TcpListener::bind("127.0.0.1:0").await?;
    let addr = v4.local_addr()?;
    let (tx, rx) = mpsc::channel(64);
    if let Ok(v6) = TcpListener::bind(("::1", addr.port())).await {
        accept_loop(v6, tls.clone(), tx.clone());
    }
    accept_loop(v4, tls, tx);

    let script = Script::default();
    let app = Router::new()
        .route("/apis/metrics.k8s.io/v1beta1", get(discovery))
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods",
            get(list_pods),
        )
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{name}",
            get(get_pod),
        )
        .with_state(script.clone());
    let listener = TlsListener { conns: rx, addr };
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr.port(), script))
}
