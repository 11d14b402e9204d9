//! kpr's node agent: a kube-proxy replacement with userspace, iptables, nftables and eBPF dataplanes.
//!
//! Data flow: a source (`source::kube` or `source::file`) feeds the change tracker (`tracker`), the
//! sync runner (`sync`) asks `selection` which endpoints each kind of traffic may use and hands the
//! result to a [`dataplane::Dataplane`]. Metrics, health and the state `proxy inspect` reads are
//! served by `server`.

pub mod allocator;
pub mod balance;
pub mod cli;
pub mod conntrack;
pub mod convert;
pub mod dataplane;
pub mod error;
pub mod healthcheck;
pub mod kube_proxy_config;
pub mod maglev;
pub mod metrics;
pub mod model;
pub mod nft;
pub mod node_ips;
pub mod selection;
pub mod server;
pub mod source;
pub mod state;
pub mod status;
pub mod sync;
pub mod tracker;
