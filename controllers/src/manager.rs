//! The controller manager: runs the selected controllers, optionally only while holding the leader
//! Lease. Used by the `controller-manager` binary and by tests that run managers in-process.

use std::str::FromStr;

use kube::Client;

use crate::error::{Error, Result};
use crate::lbipam::pool::Pool;
use crate::leader::{self, LeaderConfig};

/// A controller the manager can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// EndpointSlices from Services and Pods.
    EndpointSlice,
    /// Legacy Endpoints from Services and Pods.
    Endpoints,
    /// LoadBalancer address allocation.
    LbIpam,
}

impl FromStr for ControllerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "endpointslice" => Ok(Self::EndpointSlice),
            "endpoints" => Ok(Self::Endpoints),
            "lb-ipam" => Ok(Self::LbIpam),
            other => Err(Error::UnknownController(other.to_string())),
        }
    }
}

/// Parses `endpointslice,endpoints,lb-ipam`.
pub fn parse_controllers(list: &str) -> Result<Vec<ControllerKind>> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Controllers to run.
    pub controllers: Vec<ControllerKind>,
    /// Pool for lb-ipam (required when it runs).
    pub lb_pool: Option<Pool>,
    /// Run only while holding this Lease.
    pub leader: Option<LeaderConfig>,
    /// Reconciles at once per controller.
    pub concurrency: u16,
}

/// Runs the controllers; with leader election, only while leading. Returns `Err(Leadership)` when
/// the Lease is lost (the caller should exit, as kube-controller-manager does).
pub async fn run(client: Client, cfg: ManagerConfig) -> Result<()> {
    if cfg.controllers.contains(&ControllerKind::LbIpam) && cfg.lb_pool.is_none() {
        return Err(Error::Pool {
            pool: String::new(),
            reason: "controller lb-ipam needs --lb-pool CIDR or a-b range".into(),
        });
    }
    let work = run_controllers(
        client.clone(),
        cfg.controllers.clone(),
        cfg.lb_pool.clone(),
        cfg.concurrency,
    );
    match cfg.leader {
        Some(l) => leader::run_as_leader(client, l, work).await,
        None => {
            work.await;
            Ok(())
        }
    }
}

async fn run_controllers(
    client: Client,
    kinds: Vec<ControllerKind>,
    pool: Option<Pool>,
    concurrency: u16,
) {
    let mut tasks = Vec::new();
    for kind in kinds {
        let client = client.clone();
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            match kind {
                ControllerKind::EndpointSlice => {
                    crate::endpointslice::run(client, crate::endpointslice::Config { concurrency })
                        .await
                }
                ControllerKind::Endpoints => crate::endpoints::run(client, concurrency).await,
                ControllerKind::LbIpam => {
                    if let Some(pool) = pool {
                        if let Err(e) = crate::lbipam::run(client, pool).await {
                            tracing::error!("lb-ipam: {e}");
                        }
                    }
                }
            }
        }));
    }
    // Aborting this future (lost leadership) must stop every controller: abort on drop.
    let _guard = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    for t in tasks {
        let _ = t.await;
    }
}

struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_lists_parse_and_unknown_names_are_errors() {
        assert_eq!(
            parse_controllers("endpointslice,endpoints,lb-ipam").unwrap(),
            [
                ControllerKind::EndpointSlice,
                ControllerKind::Endpoints,
                ControllerKind::LbIpam
            ]
        );
        let err = parse_controllers("endpointslice,replicaset")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"replicaset\""), "{err}");
    }
}
