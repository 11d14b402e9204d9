//! Benchmarks of the control plane against the test API server (wired into `cargo xtask bench`).
//!
//! `cold_start` seeds N Services with M ready Pods each straight into a fresh test API server, starts
//! the EndpointSlice controller and measures the time until every Service has its EndpointSlice
//! (listing, indexing and writing included), then checks every slice holds all its endpoints.

use std::time::{Duration, Instant};

use serde_json::json;
use test_apiserver::TestApiServer;

use crate::endpointslice;
use crate::error::{Error, Result};

const NS: &str = "bench";

fn bench_err(e: impl std::fmt::Display) -> Error {
    Error::Bench(e.to_string())
}

fn seed(srv: &TestApiServer, services: usize, pods_per_service: usize) -> Result<()> {
    for s in 0..services {
        let name = format!("svc-{s}");
        srv.insert("services", json!({"metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
            .map_err(bench_err)?;
        for p in 0..pods_per_service {
            let n = s * pods_per_service + p;
            let ip = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
            srv.insert("pods", json!({"metadata": {"name": format!("{name}-{p}"), "namespace": NS, "labels": {"app": name}},
                "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}))
                .map_err(bench_err)?;
        }
    }
    Ok(())
}

fn check_complete(srv: &TestApiServer, services: usize, pods_per_service: usize) -> Result<()> {
    let slices = srv.list("endpointslices").map_err(bench_err)?;
    let endpoints: usize = slices
        .iter()
        .map(|s| s["endpoints"].as_array().map_or(0, Vec::len))
        .sum();
    if endpoints != services * pods_per_service {
        return Err(Error::Bench(format!(
            "expected {} endpoints in {} slices, found {endpoints} in {}",
            services * pods_per_service,
            services,
            slices.len()
        )));
    }
    Ok(())
}

async fn run(services: usize, pods_per_service: usize, timeout: Duration) -> Result<Duration> {
    let history = (services * (pods_per_service + 2)).max(100_000);
    // A /12 (a million clusterIPs) so 100,000 Services and more fit; the default /16 holds 65,534.
    let srv = TestApiServer::builder()
        .history(history)
        .service_cidr(std::net::Ipv4Addr::new(10, 96, 0, 0), 12)
        .start()
        .await
        .map_err(bench_err)?;
    seed(&srv, services, pods_per_service)?;
    let client = srv.client().map_err(bench_err)?;
    let start = Instant::now();
    let controller = tokio::spawn(endpointslice::run(
        client,
        endpointslice::Config { concurrency: 32 },
    ));
    let want = services
        * pods_per_service
            .div_ceil(endpointslice::plan::MAX_ENDPOINTS_PER_SLICE)
            .max(1);
    while srv.count("endpointslices").map_err(bench_err)? < want {
        if start.elapsed() > timeout {
            controller.abort();
            let have = srv.count("endpointslices").map_err(bench_err)?;
            return Err(Error::Bench(format!(
                "only {have} of {want} EndpointSlices after {timeout:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed();
    controller.abort();
    check_complete(&srv, services, pods_per_service)?;
    Ok(elapsed)
}

/// Time for the EndpointSlice controller to create the slices of `services` Services with
/// `pods_per_service` ready Pods each, from a cold start against a fresh test API server. Runs its
/// own tokio runtime; gives up after 10 minutes.
pub fn cold_start(services: usize, pods_per_service: usize) -> Result<Duration> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(bench_err)?;
    rt.block_on(run(services, pods_per_service, Duration::from_secs(600)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cold_start_small() {
        let d = super::cold_start(200, 4).unwrap();
        assert!(d < std::time::Duration::from_secs(60), "{d:?}");
    }
}
