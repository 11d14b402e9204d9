//! What the two rule backends (nftables and iptables) share, so that each is written once and
//! neither imports the other:
//!
//! - [`route`]: the per-port route description both render (routes per source class, targets
//!   and their conntrack ids, the addresses of one family);
//! - [`driver`]: the `Dataplane` both are, around a backend's plan and apply (least-connection
//!   start and bookkeeping, recovery after a failed apply, stale conntrack cleanup, stats).

pub mod driver;
pub mod route;

pub use driver::{RuleBackend, RuleDataplane};
pub use route::{
    class_index, class_routes, family_addrs, family_endpoints, ClassRoute, Tag, TargetIds,
    SOURCE_CLASSES,
};
