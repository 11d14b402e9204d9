//! Direct server return (`--nodeport-mode dsr|hybrid`) as the agent sees it: what the DSR
//! programs (proxy-ebpf's `dsr.rs`) counted. Attaching them is `tc`'s, marking frontends
//! `compile`'s.

use std::path::Path;

use proxy_common::{
    DSR_STAT_OPT_ADDED, DSR_STAT_OPT_FAILED, DSR_STAT_RECORDED, DSR_STAT_REPLY_REWRITTEN,
};

use super::maps::{PinnedCounters, DSR_STATS};
use crate::error::DataplaneError;

/// What the DSR programs did, summed over the CPUs, since the maps were created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DsrCounts {
    /// Packets of DSR flows sent on to their backend with the option added (this node is the
    /// one the client sent to).
    pub options_added: u64,
    /// Packets of DSR flows dropped because the option could not be added.
    pub options_failed: u64,
    /// Packets that arrived with the option, recorded (this node has the backend).
    pub recorded: u64,
    /// Replies of recorded flows rewritten on egress to the frontend's address and port.
    pub replies_rewritten: u64,
}

impl DsrCounts {
    /// Reads the pinned `KPR_DSR_STATS`.
    pub fn from_pin(maps_dir: &Path) -> Result<Self, DataplaneError> {
        let stats = PinnedCounters::open(maps_dir, DSR_STATS)?;
        Ok(DsrCounts {
            options_added: stats.sum(DSR_STAT_OPT_ADDED)?,
            options_failed: stats.sum(DSR_STAT_OPT_FAILED)?,
            recorded: stats.sum(DSR_STAT_RECORDED)?,
            replies_rewritten: stats.sum(DSR_STAT_REPLY_REWRITTEN)?,
        })
    }

    /// What was counted since `before` (a read of the same maps).
    pub fn since(self, before: DsrCounts) -> DsrCounts {
        DsrCounts {
            options_added: self.options_added.saturating_sub(before.options_added),
            options_failed: self.options_failed.saturating_sub(before.options_failed),
            recorded: self.recorded.saturating_sub(before.recorded),
            replies_rewritten: self
                .replies_rewritten
                .saturating_sub(before.replies_rewritten),
        }
    }
}

/// The interfaces with a pinned DSR egress link under `bpffs` (`links/tc-egress-<name>`; TCX,
/// 6.6+), sorted.
pub fn pinned_egress_interfaces(bpffs: &Path) -> Vec<String> {
    let mut interfaces: Vec<String> = std::fs::read_dir(bpffs.join("links"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(super::tc::EGRESS_PIN_PREFIX))
                .map(str::to_string)
        })
        .collect();
    interfaces.sort();
    interfaces
}
