//! The agent's HTTP endpoints: `/metrics`, `/state` and `/trace` on the metrics address, `/healthz`
//! and `/livez` on the healthz address (kube-proxy's two ports), `/healthz` and `/readyz` on the
//! readiness address (kpr's own, for the DaemonSet's probes: while kube-proxy still holds its
//! ports on the node, a probe of those would be answered by kube-proxy).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::{mpsc, oneshot};

use crate::dataplane::{TraceQuery, TraceView};
use crate::metrics::Metrics;
use crate::status::{Health, StateView};
use crate::sync::StateQuery;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    health_timeout: Duration,
    queries: mpsc::Sender<StateQuery>,
}

async fn metrics(State(s): State<Shared>) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn state(State(s): State<Shared>) -> Result<Json<StateView>, (StatusCode, String)> {
    let (tx, rx) = oneshot::channel();
    let unavailable = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the sync runner is not running".to_string(),
        )
    };
    s.queries
        .send(StateQuery::State(tx))
        .await
        .map_err(|_| unavailable())?;
    rx.await.map(Json).map_err(|_| unavailable())
}

/// `GET /trace?src=&dst=&port=&proto=[&src_port=]`: the dataplane's own decision for that new
/// connection (`proxy trace --backend userspace`); 501 from a backend that decides in the kernel.
async fn trace(
    State(s): State<Shared>,
    Query(q): Query<TraceQuery>,
) -> Result<Json<TraceView>, (StatusCode, String)> {
    let (tx, rx) = oneshot::channel();
    let unavailable = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the sync runner is not running".to_string(),
        )
    };
    s.queries
        .send(StateQuery::Trace(q, tx))
        .await
        .map_err(|_| unavailable())?;
    match rx.await.map_err(|_| unavailable())? {
        Ok(view) => Ok(Json(view)),
        Err(why) => Err((StatusCode::NOT_IMPLEMENTED, why)),
    }
}

async fn healthz(State(s): State<Shared>) -> (StatusCode, String) {
    match s.health.healthy(s.health_timeout) {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// The agent's listeners: where they bind and what a bind failure does.
pub struct Listeners {
    pub metrics: SocketAddr,
    pub healthz: SocketAddr,
    /// kpr's own readiness address (`/healthz`, `/readyz`), which no other proxy shares.
    pub readiness: Option<SocketAddr>,
    /// Exit when the metrics or healthz address cannot be bound (kube-proxy's
    /// `--bind-address-hard-fail`); otherwise log it and try again every 5 s, as kube-proxy does.
    pub hard_fail: bool,
}

/// How often a listener that could not bind tries again (kube-proxy's `serveHealthz` and
/// `serveMetrics` period).
const REBIND_PERIOD: Duration = Duration::from_secs(5);

/// Binds the listeners and serves them in the background. The readiness address always fails
/// the start when taken (it is kpr's own); the metrics and healthz addresses do only with
/// `hard_fail`. Otherwise a taken one (kube-proxy still running on the node, as while kpr
/// replaces it, make before break) is retried every 5 s: the dataplane does not wait for it.
pub async fn start(
    listeners: Listeners,
    metrics_reg: Arc<Metrics>,
    health: Arc<Health>,
    health_timeout: Duration,
    queries: mpsc::Sender<StateQuery>,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let shared = Shared {
        metrics: metrics_reg,
        health,
        health_timeout,
        queries,
    };
    let metrics_app = Router::new()
        .route("/metrics", get(metrics))
        .route("/state", get(state))
        .route("/trace", get(trace))
        .with_state(shared.clone());
    let health_app = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .with_state(shared.clone());
    if let Some(addr) = listeners.readiness {
        let readiness_app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(healthz))
            .with_state(shared);
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the readiness address {addr}"))?;
        tokio::spawn(async move { axum::serve(l, readiness_app).await });
    }
    for (what, addr, app) in [
        ("metrics", listeners.metrics, metrics_app),
        ("healthz", listeners.healthz, health_app),
    ] {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tokio::spawn(async move { axum::serve(l, app).await });
            }
            Err(e) if listeners.hard_fail => {
                return Err(e).with_context(|| {
                    format!("binding the {what} address {addr} (--bind-address-hard-fail)")
                });
            }
            Err(e) => {
                tracing::error!(
                    address = %addr,
                    error = %e,
                    "cannot bind the {what} address (is kube-proxy still running on this \
                     node?); serving without it, trying again every {}s",
                    REBIND_PERIOD.as_secs()
                );
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(REBIND_PERIOD).await;
                        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
                            tracing::info!(address = %addr, "the {what} address is bound now");
                            let _ = axum::serve(l, app).await;
                            return;
                        }
                    }
                });
            }
        }
    }
    Ok(())
}
