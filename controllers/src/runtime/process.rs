//! What the process binaries (`controller-manager`, `scheduler`) share around their work: the
//! Kubernetes client from a kubeconfig, the leader election identity, and the `/metrics` and
//! `/healthz` endpoint. Owns no controller and no scheduling.

use anyhow::Context as _;

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
