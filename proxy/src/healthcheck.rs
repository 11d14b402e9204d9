//! The healthCheckNodePort servers of eTP Local LoadBalancer Services.
//!
//! Answers 200 with the count of local ready endpoints (of the family the request came over, as
//! kube-proxy's per-family servers do) when there is at least one, 503 otherwise
//! (also when every local endpoint is terminating), as kube-proxy does. One listener per port, on
//! both address families, opened and closed as Services come and go; the count is updated in
//! place on every sync.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::state::ProxyState;

/// Local ready endpoints per family (IPv4, IPv6).
type Counts = Arc<[AtomicUsize; 2]>;

struct Listener {
    service: String,
    local: Counts,
    task: tokio::task::JoinHandle<()>,
}

/// Keeps one HTTP listener per healthCheckNodePort.
#[derive(Default)]
pub struct HealthCheckServers {
    listeners: HashMap<u16, Listener>,
}

impl Drop for HealthCheckServers {
    fn drop(&mut self) {
        for l in self.listeners.values() {
            l.task.abort();
        }
    }
}

impl HealthCheckServers {
    /// Brings listeners and counts in line with the state (cheap: O(service ports with a hcnp)).
    pub fn update(&mut self, state: &ProxyState) {
        let mut wanted: HashMap<u16, (String, [u32; 2])> = HashMap::new();
        for (name, port) in state
            .iter()
            .filter(|(_, p)| p.service.health_check_node_port != 0 && p.service.external_local)
        {
            let (sp, local) = (&port.service, port.selected.local_ready);
            let e = wanted
                .entry(sp.health_check_node_port)
                .or_insert((format!("{}/{}", name.namespace, name.name), [0; 2]));
            for (have, n) in e.1.iter_mut().zip(local) {
                *have = (*have).max(n);
            }
        }
        self.listeners.retain(|port, l| {
            let keep = wanted.get(port).is_some_and(|(svc, _)| *svc == l.service);
            if !keep {
                l.task.abort();
            }
            keep
        });
        for (port, (service, local)) in wanted {
            match self.listeners.get(&port) {
                Some(l) => {
                    for (count, n) in l.local.iter().zip(local) {
                        count.store(n as usize, Ordering::Relaxed);
                    }
                }
                None => self.open(port, service, local),
            }
        }
    }

    fn open(&mut self, port: u16, service: String, local: [u32; 2]) {
        let count: Counts = Arc::new(local.map(|n| AtomicUsize::new(n as usize)));
        let std_listener = match bind_any(port) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(%service, port, "cannot open healthCheckNodePort: {e}");
                return;
            }
        };
        let _ = std_listener.set_nonblocking(true);
        let (svc, c) = (service.clone(), count.clone());
        let task = tokio::spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                return;
            };
            // The answer is the count of the family the request came over (a v4-mapped peer is
            // IPv4).
            let app = axum::Router::new().fallback(
                move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>| {
                    let (svc, c) = (svc.clone(), c.clone());
                    let family = usize::from(peer.ip().to_canonical().is_ipv6());
                    async move { respond(&svc, c[family].load(Ordering::Relaxed)) }
                },
            );
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        self.listeners.insert(
            port,
            Listener {
                service,
                local: count,
                task,
            },
        );
    }
}

/// A listener on `port` of every address of both families (`[::]` taking IPv4 as mapped
/// addresses), or of every IPv4 address where the node has no IPv6.
fn bind_any(port: u16) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let dual = || -> std::io::Result<std::net::TcpListener> {
        let socket = Socket::new(Domain::IPV6, Type::STREAM, None)?;
        socket.set_only_v6(false)?;
        socket.set_reuse_address(true)?;
        socket.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
        socket.listen(128)?;
        Ok(socket.into())
    };
    dual().or_else(|_| std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))))
}

fn respond(service: &str, local: usize) -> impl IntoResponse {
    let (ns, name) = service.split_once('/').unwrap_or(("", service));
    let body = serde_json::json!({"service": {"namespace": ns, "name": name}, "localEndpoints": local, "serviceProxyHealthy": true});
    let status = if local > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
}
