//! What the process binaries (`controller-manager`, `scheduler`) share around their work: the
//! process's start (the allocator, the runtime), the Kubernetes client from a kubeconfig, the
//! leader election identity, the `/metrics` and `/healthz` endpoint, and running until a signal.
//! Owns no controller and no scheduling.

use std::future::Future;

use anyhow::Context as _;

use super::leader::{self, LeaderConfig};

/// A binary's `main`: the allocator's arenas bounded first (before any thread exists: a thread
/// keeps the arena it is first given), then `work` on a multi-threaded tokio runtime.
pub fn main(work: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    super::allocator::bound_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(work)
}

/// Runs `work` until it ends or the process is interrupted (SIGINT) or terminated (SIGTERM), then
/// gives up the leader Lease when there is one (so a successor need not wait for it to expire).
/// `what` names the binary in the error of a `work` that failed (`<what> stopped`).
pub async fn run_until_signalled<E>(
    client: &kube::Client,
    leader: Option<&LeaderConfig>,
    what: &str,
    work: impl Future<Output = Result<(), E>>,
) -> anyhow::Result<()>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    tokio::select! {
        r = work => r.with_context(|| format!("{what} stopped"))?,
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
        _ = term.recv() => tracing::info!("terminated"),
    }
    if let Some(l) = leader {
        leader::release(client, l)
            .await
            .context("releasing the leader Lease")?;
    }
    Ok(())
}

/// Serves `/metrics` (the process's Prometheus registry) and `/healthz` on `addr` until the
/// process ends; a failure to bind names `--metrics-bind-address`.
pub async fn serve_metrics(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    crate::runtime::metrics::encode(),
                )
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-bind-address {addr}: binding"))?;
    axum::serve(listener, app)
        .await
        .with_context(|| format!("serving metrics on {addr}"))
}

/// The client of `kubeconfig`, or of the environment (in-cluster, `KUBECONFIG`, ~/.kube/config),
/// with every request held to `limit`.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    limit: crate::runtime::ratelimit::ClientLimit,
) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("inferring the Kubernetes client configuration")?,
    };
    let layer = limit.layer();
    let build = move |config: kube::Config| -> anyhow::Result<kube::Client> {
        let builder = kube::client::ClientBuilder::try_from(config)
            .context("building the Kubernetes client")?;
        Ok(match &layer {
            Some(layer) => builder.with_layer(layer).build(),
            None => builder.build(),
        })
    };
    let client = build(config.clone())?;
    // Each watch on a client of its own thread, under the same request limit (one bucket).
    crate::runtime::informer::set_watch_client(move || match build(config.clone()) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("the watch's own client: {e:#}; watching on the shared one");
            None
        }
    });
    Ok(client)
}

/// The leader election identity: the host name and the process id.
pub fn identity() -> String {
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "unknown".into());
    format!("{}_{}", host.trim(), std::process::id())
}
