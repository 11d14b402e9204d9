//! The controllers that feed the proxy: EndpointSlices ([`endpointslice`]) and legacy Endpoints
//! ([`endpoints`]) from Services and Pods, and LoadBalancer address allocation ([`lbipam`]).
//!
//! Each is a pure plan over cached state plus a thin apply layer, run on the shared
//! [`crate::runtime`] as the workload controllers are: handlers on the process's shared informers
//! (one Service, Pod, Node, EndpointSlice and Endpoints cache each, whatever runs) turn changes into
//! Service keys on the controller's work queue, and workers sync one Service at a time. They
//! import no workload controller and no sibling of their own group except through
//! [`endpointutil`] (what upstream keeps in `pkg/controller/util/endpoint`) and [`membership`]
//! (which Pods a Service selects, which Services select a Pod).

pub mod endpoints;
pub mod endpointslice;
pub mod endpointutil;
pub mod lbipam;
pub mod membership;

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::queue::{Bucket, ItemBackoff, RateLimiter, WorkQueue};

/// The work queue of an endpoint controller: a failed sync is retried after 1 s doubling up to
/// 1,000 s, overall at most 10 a second with a burst of 100, as upstream's EndpointSlice and
/// Endpoints controllers (`defaultSyncBackOff`, `maxSyncBackOff`) rather than the 5 ms of
/// `DefaultControllerRateLimiter`: a sync that failed on a conflict needs the cache to catch up.
fn work_queue(name: &str) -> Arc<WorkQueue<String>> {
    WorkQueue::with_limiter(
        name,
        RateLimiter::new(
            ItemBackoff::new(Duration::from_secs(1), Duration::from_secs(1000)),
            Bucket::new(10.0, 100),
        ),
    )
}
