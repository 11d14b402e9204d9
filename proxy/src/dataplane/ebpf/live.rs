//! Live per-endpoint numbers read from the pinned counters map (least-connection input).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use proxy_common::{Backend, BackendCounters};

use super::maps::{Table, BACKENDS, COUNTERS};
use super::programmed::backend_addr;
use crate::error::DataplaneError;
use crate::state::LiveView;

/// Reads `KPR_BACKENDS` and `KPR_COUNTERS` from their pins on every call.
#[derive(Debug, Clone)]
pub struct EbpfLive {
    maps_dir: PathBuf,
}

impl EbpfLive {
    pub fn new(maps_dir: PathBuf) -> Self {
        EbpfLive { maps_dir }
    }

    /// Counters per endpoint address (TCP and UDP backends of one address are added up).
    pub fn counters(&self) -> Result<BTreeMap<SocketAddr, BackendCounters>, DataplaneError> {
        let backends: Table<u32, Backend> = Table::from_pin(&self.maps_dir, BACKENDS)?;
        let counters: Table<u32, BackendCounters> = Table::from_pin(&self.maps_dir, COUNTERS)?;
        let mut out: BTreeMap<SocketAddr, BackendCounters> = BTreeMap::new();
        for (id, b) in backends.entries()? {
            let Some(addr) = backend_addr(&b) else {
                continue;
            };
            let c = counters.get(&id)?.unwrap_or_default();
            let e = out.entry(addr.socket_addr()).or_default();
            e.active += c.active;
            e.total += c.total;
        }
        Ok(out)
    }
}

impl LiveView for EbpfLive {
    fn active_connections(&self) -> BTreeMap<SocketAddr, u64> {
        match self.counters() {
            Ok(c) => c.into_iter().map(|(a, c)| (a, c.active)).collect(),
            Err(e) => {
                tracing::warn!("ebpf live view: {e}");
                BTreeMap::new()
            }
        }
    }
}
