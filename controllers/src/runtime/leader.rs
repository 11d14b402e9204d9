//! Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does: the
//! holder renews `renewTime` every retry period; anyone may take the Lease over once
//! `renewTime + leaseDurationSeconds` has passed; a leader that cannot renew within the renew
//! deadline stops its work. Every write carries the resourceVersion read, so two candidates racing
//! for the same Lease cannot both win.
//!
//! `decide` and `next_lease` are pure; `run_as_leader` is the loop around them.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result};

/// Lease timing and identity.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps working without a successful renewal.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// kube-controller-manager's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What a candidate does with the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Nobody holds it or the holder let it expire: take it over.
    TakeOver,
    /// Someone else holds a valid Lease.
    Wait {
        /// The current holder.
        holder: String,
    },
}

/// Decides from the Lease as read at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.map(|l| l.spec.clone().unwrap_or_default()) else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.unwrap_or_default();
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    if holder == identity {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    let expires = spec.renew_time.and_then(|t| t.0.checked_add(duration).ok());
    match expires {
        Some(e) if e > now => Decision::Wait { holder },
        _ => Decision::TakeOver,
    }
}

/// The Lease to write for a decision (None for `Wait`).
pub fn next_lease(
    current: Option<&Lease>,
    cfg: &LeaderConfig,
    decision: &Decision,
    now: Timestamp,
) -> Option<Lease> {
    let old = current.and_then(|l| l.spec.clone()).unwrap_or_default();
    let transitions = old.lease_transitions.unwrap_or(0);
    let spec = match decision {
        Decision::Wait { .. } => return None,
        Decision::Renew => LeaseSpec {
            renew_time: Some(MicroTime(now)),
            ..old
        },
        Decision::Create | Decision::TakeOver => LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if *decision == Decision::Create {
                0
            } else {
                transitions + 1
            }),
            ..old
        },
    };
    let metadata = match current {
        Some(l) => l.metadata.clone(),
        None => ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            ..Default::default()
        },
    };
    Some(Lease {
        metadata,
        spec: Some(spec),
    })
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// One acquire-or-renew attempt: true when we hold the Lease afterwards.
pub async fn try_acquire_or_renew(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool> {
    let current = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube("reading Lease", cfg.lease_ref(), e))?;
    let decision = decide(current.as_ref(), &cfg.identity, Timestamp::now());
    let Some(lease) = next_lease(current.as_ref(), cfg, &decision, Timestamp::now()) else {
        return Ok(false);
    };
    let written = match decision {
        Decision::Create => api.create(&PostParams::default(), &lease).await,
        _ => api.replace(&cfg.name, &PostParams::default(), &lease).await,
    };
    match written {
        Ok(_) => Ok(true),
        Err(e) if conflict(&e) => Ok(false),
        Err(e) => Err(Error::kube("writing Lease", cfg.lease_ref(), e)),
    }
}

/// Gives the Lease up if we hold it (on orderly shutdown), so another candidate need not wait for
/// it to expire.
pub async fn release(client: &Client, cfg: &LeaderConfig) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let Some(mut lease) = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube("reading Lease", cfg.lease_ref(), e))?
    else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(e) if conflict(&e) => Ok(()),
        Err(e) => Err(Error::kube("releasing Lease", cfg.lease_ref(), e)),
    }
}

/// Waits until this candidate holds the Lease, then runs `work` while renewing. Returns `work`'s
/// result when it ends, `Err(Leadership)` when the Lease is lost (another holder, or no renewal within the
/// renew deadline); `work` is dropped then, as a leader must stop at once.
pub async fn run_as_leader<F>(client: Client, cfg: LeaderConfig, work: F) -> Result<()>
where
    F: Future<Output = Result<()>> + Send + 'static,
{
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    loop {
        match try_acquire_or_renew(&api, &cfg).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("leader election: {e}"),
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
    tracing::info!(
        "leader election: {} now holds Lease {}",
        cfg.identity,
        cfg.lease_ref()
    );
    let mut work = tokio::spawn(work);
    // Dropping this future (the caller gave up) must stop the work too.
    let _abort = AbortOnDrop(work.abort_handle());
    let mut renewed = Instant::now();
    loop {
        tokio::select! {
            ended = &mut work => {
                return match ended {
                    Ok(result) => result,
                    Err(e) => Err(Error::Invalid {
                        object: format!("leader work under Lease {}", cfg.lease_ref()),
                        reason: format!("task failed: {e}"),
                    }),
                };
            }
            _ = tokio::time::sleep(cfg.retry_period) => {}
        }
        match try_acquire_or_renew(&api, &cfg).await {
            Ok(true) => renewed = Instant::now(),
            Ok(false) => {
                work.abort();
                return Err(Error::Leadership {
                    lease: cfg.lease_ref(),
                    reason: format!("{} lost it to another holder", cfg.identity),
                });
            }
            Err(e) => tracing::warn!("leader election: renewing: {e}"),
        }
        if renewed.elapsed() > cfg.renew_deadline {
            work.abort();
            return Err(Error::Leadership {
                lease: cfg.lease_ref(),
                reason: format!(
                    "{} could not renew within the renew deadline of {:?}",
                    cfg.identity, cfg.renew_deadline
                ),
            });
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(holder: &str, renewed_secs_ago: i64, duration: i32) -> Lease {
        let renew = Timestamp::now()
            .checked_sub(SignedDuration::from_secs(renewed_secs_ago))
            .unwrap();
        serde_json::from_value(json!({
            "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "renewTime": MicroTime(renew), "leaseTransitions": 2}
        }))
        .unwrap()
    }

    #[test]
    fn decision_cases() {
        let now = Timestamp::now();
        let cases = [
            ("no lease", None, Decision::Create),
            ("we hold it", Some(lease("me", 1, 15)), Decision::Renew),
            (
                "other holder, fresh",
                Some(lease("other", 5, 15)),
                Decision::Wait {
                    holder: "other".into(),
                },
            ),
            (
                "other holder, expired",
                Some(lease("other", 20, 15)),
                Decision::TakeOver,
            ),
            (
                "released (no holder)",
                Some(lease("", 0, 1)),
                Decision::TakeOver,
            ),
        ];
        for (name, l, want) in cases {
            assert_eq!(decide(l.as_ref(), "me", now), want, "{name}");
        }
    }

    #[test]
    fn next_lease_counts_transitions_and_keeps_the_version() {
        let cfg = LeaderConfig::new("ns", "l", "me");
        let now = Timestamp::now();
        let old = lease("other", 20, 15);
        let taken = next_lease(Some(&old), &cfg, &Decision::TakeOver, now).unwrap();
        let spec = taken.spec.as_ref().unwrap();
        assert_eq!(
            (spec.holder_identity.as_deref(), spec.lease_transitions),
            (Some("me"), Some(3))
        );
        assert_eq!(
            taken.metadata.resource_version.as_deref(),
            Some("7"),
            "the write is conditional on what was read"
        );
        let renewed = next_lease(Some(&taken), &cfg, &Decision::Renew, now).unwrap();
        assert_eq!(renewed.spec.unwrap().lease_transitions, Some(3));
        let created = next_lease(None, &cfg, &Decision::Create, now).unwrap();
        assert_eq!(created.spec.unwrap().lease_duration_seconds, Some(15));
        assert!(next_lease(
            Some(&old),
            &cfg,
            &Decision::Wait {
                holder: "other".into()
            },
            now
        )
        .is_none());
    }
}
