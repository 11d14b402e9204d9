//! The agent's HTTP endpoints: `/metrics`, `/state` and `/trace` on the metrics address, `/healthz`
//! and `/livez` on the healthz address.

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

/// Binds both listeners (so a port conflict fails the start) and serves them in the background.
pub async fn start(
    metrics_addr: SocketAddr,
    healthz_addr: SocketAddr,
    metrics_reg: Arc<Metrics>,
    health: Arc<Health>,
    health_timeout: Duration,
    queries: mpsc::Sender<StateQuery>,
) -> std::io::Result<()> {
    let shared = Shared {
        metrics: metrics_reg,
        health,
        health_timeout,
        queries,
    };
    let m = tokio::net::TcpListener::bind(metrics_addr).await?;
    let h = tokio::net::TcpListener::bind(healthz_addr).await?;
    let metrics_app = Router::new()
        .route("/metrics", get(metrics))
        .route("/state", get(state))
        .route("/trace", get(trace))
        .with_state(shared.clone());
    let health_app = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .with_state(shared);
    tokio::spawn(async move { axum::serve(m, metrics_app).await });
    tokio::spawn(async move { axum::serve(h, health_app).await });
    Ok(())
}
