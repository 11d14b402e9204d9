//! Attaching the XDP program (`kpr_xdp`) to the node's external interfaces named by
//! `--xdp-interfaces`, in native (driver) mode, and keeping those attachments across restarts.
//!
//! The XDP program is the tc program's body run earlier (proxy-ebpf's `nodeport.rs`): once tc has
//! balanced a NodePort / external flow's first packet, it translates the flow's packets and sends
//! them straight back out of the interface they came in by (a backend on another node, a reply to
//! an outside client), and passes everything else on untouched to the tc program, which stays
//! attached everywhere. So an interface where XDP
//! cannot attach (no native XDP in its driver, a program of someone else's there) loses nothing
//! but the speed: it is reported once, and its traffic stays on tc.
//!
//! Links are pinned as `links/xdp-<interface>`. An interface takes one XDP link, so a restarted
//! agent does not attach a second one: it swaps its program into the pinned link (an atomic
//! `BPF_LINK_UPDATE`), and the interface never runs without the program. Runs on a short-lived
//! thread in the dataplane's namespace, as the tc attachments do.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{Xdp, XdpMode};
use aya::Ebpf;
use proxy_common::{XDP_STAT_PASS_NEW, XDP_STAT_PASS_ROUTE, XDP_STAT_TX};

use super::attach::{error_chain, replace_pin};
use super::maps::{PinnedCounters, XDP_STATS};
use crate::error::DataplaneError;

pub const PROGRAM: &str = "kpr_xdp";

/// The XDP program's attachments in one network namespace.
pub struct XdpAttacher {
    netns: File,
    wanted: Vec<String>,
    links_dir: PathBuf,
    attached: BTreeSet<String>,
    /// Interfaces named but not attached, and why (reported once each).
    refused: BTreeMap<String, String>,
    /// Why the program itself could not be loaded: then no interface gets it.
    unloaded: Option<String>,
}

impl XdpAttacher {
    /// Captures the calling thread's network namespace and, when interfaces are named, loads the
    /// program (a kernel that refuses it leaves every interface to tc, said once).
    pub fn new(
        ebpf: &mut Ebpf,
        wanted: Vec<String>,
        links_dir: PathBuf,
    ) -> Result<Self, DataplaneError> {
        let netns = File::open("/proc/thread-self/ns/net")
            .map_err(|e| DataplaneError::io("opening /proc/thread-self/ns/net", e))?;
        let mut unloaded = None;
        if !wanted.is_empty() {
            if let Err(e) = program(ebpf).and_then(|p| p.load().map_err(|e| xdp_err("loading", &e)))
            {
                tracing::warn!("XDP is off, NodePort traffic stays on tc on every interface: {e}");
                unloaded = Some(e.to_string());
            }
        }
        Ok(XdpAttacher {
            netns,
            wanted,
            links_dir,
            attached: BTreeSet::new(),
            refused: BTreeMap::new(),
            unloaded,
        })
    }

    /// Attaches to named interfaces that appeared; forgets those that went away.
    pub fn refresh(&mut self, ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
        if self.wanted.is_empty() || self.unloaded.is_some() {
            return Ok(());
        }
        let prog = program(ebpf)?;
        let (netns, wanted, links_dir) = (&self.netns, &self.wanted, &self.links_dir);
        let (attached, refused) = (&self.attached, &self.refused);
        let outcome = std::thread::scope(|s| {
            s.spawn(move || -> Result<_, DataplaneError> {
                super::tc::enter(netns)?;
                let present = present(wanted)?;
                let mut results = Vec::new();
                for name in present
                    .iter()
                    .filter(|n| !attached.contains(*n) && !refused.contains_key(*n))
                {
                    results.push((name.clone(), attach_one(prog, name, links_dir)));
                }
                Ok((present, results))
            })
            .join()
            .map_err(|_| DataplaneError::Other("the XDP attach thread panicked".into()))?
        })?;
        let (present, results) = outcome;
        for (name, result) in results {
            match result {
                Ok(()) => {
                    tracing::info!(interface = %name, "XDP attached (native mode)");
                    self.attached.insert(name);
                }
                Err(why) => {
                    tracing::warn!(interface = %name, "XDP not attached, its NodePort traffic stays on tc: {why}");
                    self.refused.insert(name, why);
                }
            }
        }
        let gone: Vec<String> = self.attached.difference(&present).cloned().collect();
        for name in gone {
            let _ = fs::remove_file(self.links_dir.join(pin_name(&name)));
            self.attached.remove(&name);
        }
        self.refused.retain(|name, _| present.contains(name));
        Ok(())
    }

    /// Interfaces the program is attached to.
    pub fn attached(&self) -> &BTreeSet<String> {
        &self.attached
    }

    /// Named interfaces it is not attached to, with the reason (a missing interface is not one).
    pub fn refused(&self) -> &BTreeMap<String, String> {
        &self.refused
    }

    /// Why the program was not loaded at all, if it was not.
    pub fn unloaded(&self) -> Option<&str> {
        self.unloaded.as_deref()
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Xdp, DataplaneError> {
    let p = ebpf.program_mut(PROGRAM).ok_or_else(|| {
        DataplaneError::Other(format!("the eBPF object has no program {PROGRAM}"))
    })?;
    p.try_into().map_err(|e| xdp_err("typing", &e))
}

fn xdp_err(what: &str, e: &dyn std::error::Error) -> DataplaneError {
    DataplaneError::Other(format!(
        "eBPF program {PROGRAM}: {what}: {e}{}",
        error_chain(e)
    ))
}

fn pin_name(interface: &str) -> String {
    format!("xdp-{interface}")
}

/// The interfaces with a pinned XDP link under `bpffs` (the agent's pins: `links/xdp-<name>`),
/// sorted: where the XDP program runs, as `proxy inspect` and `proxy trace` read it.
pub fn pinned_interfaces(bpffs: &Path) -> Vec<String> {
    let mut interfaces: Vec<String> = fs::read_dir(bpffs.join("links"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(&pin_name("")))
                .map(str::to_string)
        })
        .collect();
    interfaces.sort();
    interfaces
}

/// Which of `wanted` exist in the current thread's namespace.
fn present(wanted: &[String]) -> Result<BTreeSet<String>, DataplaneError> {
    let all = nix::net::if_::if_nameindex()
        .map_err(|e| DataplaneError::io("listing network interfaces", e.into()))?;
    let names: BTreeSet<String> = all
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .collect();
    Ok(wanted
        .iter()
        .filter(|n| names.contains(*n))
        .cloned()
        .collect())
}

/// Swaps the program into the interface's pinned link (a restart) or attaches a new link in
/// native mode and pins it. The error is the reason, for the refusal's report.
fn attach_one(prog: &mut Xdp, interface: &str, links_dir: &Path) -> Result<(), String> {
    let pin = links_dir.join(pin_name(interface));
    if let Ok(old) = PinnedLink::from_pin(&pin) {
        let link = FdLink::from(old);
        match link.try_into() {
            Ok(xdp_link) => {
                let id = prog.attach_to_link(xdp_link).map_err(|e| {
                    format!(
                        "replacing the program of the pinned link: {e}{}",
                        error_chain(&e)
                    )
                })?;
                // The link stays pinned as it was: this handle only closes its fd when dropped.
                drop(
                    prog.take_link(id)
                        .map_err(|e| format!("taking the link: {e}"))?,
                );
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(
                    interface,
                    "the pinned XDP link is not one: {e}; attaching anew"
                );
                let _ = fs::remove_file(&pin);
            }
        }
    }
    let id = prog
        .attach(interface, XdpMode::Driver)
        .map_err(|e| format!("attaching in native mode: {e}{}", error_chain(&e)))?;
    let link = prog
        .take_link(id)
        .map_err(|e| format!("taking the link: {e}"))?;
    let link = FdLink::try_from(link)
        .map_err(|e| format!("the kernel gave no bpf_link (XDP links need 5.9): {e}"))?;
    replace_pin(link, &pin).map_err(|e| e.to_string())
}

/// What the XDP program did, summed over the CPUs, since the maps were created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpCounts {
    /// Packets translated and sent back out of the interface they came in by.
    pub sent: u64,
    /// Packets of service flows passed on to tc (their translation goes elsewhere).
    pub passed_route: u64,
    /// First packets of flows passed on to tc to be balanced there.
    pub passed_new: u64,
}

impl XdpCounts {
    /// Reads the pinned `KPR_XDP_STATS`.
    pub fn from_pin(maps_dir: &Path) -> Result<Self, DataplaneError> {
        let stats = PinnedCounters::open(maps_dir, XDP_STATS)?;
        Ok(XdpCounts {
            sent: stats.sum(XDP_STAT_TX)?,
            passed_route: stats.sum(XDP_STAT_PASS_ROUTE)?,
            passed_new: stats.sum(XDP_STAT_PASS_NEW)?,
        })
    }

    /// What was counted since `before` (a read of the same maps).
    pub fn since(self, before: XdpCounts) -> XdpCounts {
        XdpCounts {
            sent: self.sent.saturating_sub(before.sent),
            passed_route: self.passed_route.saturating_sub(before.passed_route),
            passed_new: self.passed_new.saturating_sub(before.passed_new),
        }
    }
}
