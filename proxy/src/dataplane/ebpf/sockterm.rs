//! Destroying the sockets connected to endpoints that left: a connected UDP socket is translated
//! once, at `connect()`, and would otherwise keep sending to a removed endpoint until the
//! application reconnects (a TCP connection would hang on a dead peer).
//!
//! Owns: probing the kernel for socket iterators and the `bpf_sock_destroy` kfunc, resolving the
//! kfunc call in the object (`patch`), loading the `iter/tcp` and `iter/udp` programs, and
//! running them in every network namespace where sockets may be (`SockTerminator::run`).
//!
//! After a sync deleted backends (an endpoint left every Service that had it), the dataplane puts
//! them into `KPR_SOCK_TERM` and reads both iterators once in its own network namespace and once
//! in each namespace under `/run/netns` (where container runtimes and `ip netns` put pod
//! namespaces; a socket iterator only walks the namespace of the thread that creates it). The
//! programs destroy the sockets whose `connect()` was translated to one of those backends
//! (`KPR_SOCKS`) and count them in `KPR_SOCK_TERM_STATS`. TCP: the application's next call fails
//! with ECONNABORTED and the endpoint gets a reset. Connected UDP: the socket is disconnected with
//! ECONNABORTED pending, so its next send or receive fails and a reconnect is balanced again.
//!
//! Which backends come here is the dataplane's choice (`EbpfDataplane::destroy_released`): a UDP
//! backend when it is deleted, a TCP one only once no Service port lists its endpoint (a
//! terminating endpoint's connections drain, as under kube-proxy).
//!
//! Needs Linux 6.5 (the kfunc; the iterators are 5.9). On an older kernel the agent says so once
//! at start and sockets stay where they are, as they did before. Entering another namespace needs
//! CAP_SYS_ADMIN: without it only the agent's own namespace is covered (said once).

use std::collections::HashSet;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, MapData};
use aya::programs::Iter;
use aya::{Btf, Ebpf};
use aya_obj::btf::BtfKind;
use nix::sched::{setns, CloneFlags};
use proxy_common::{
    Backend, KFUNC_CALL_PLACEHOLDER, TERM_TCP_DESTROYED, TERM_TCP_FAILED, TERM_UDP_DESTROYED,
    TERM_UDP_FAILED,
};

use super::attach::{prog_err, program};
use super::maps::{SOCK_TERM, SOCK_TERM_STATS};
use crate::error::DataplaneError;

/// The iterator programs: (name in the object, iterator target).
pub const PROGRAMS: [(&str, &str); 2] = [("kpr_term_tcp", "tcp"), ("kpr_term_udp", "udp")];

/// Where named network namespaces are (pods' under containerd and CRI-O, `ip netns`'s).
pub const NETNS_DIR: &str = "/run/netns";

/// Whether this kernel can destroy sockets from the iterators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The BTF id of `bpf_sock_destroy` in the running kernel.
    Kfunc(u32),
    /// Why not (one sentence naming what is missing).
    Missing(String),
}

/// Reads the kernel's BTF (parsing it is a noticeable part of an emulated guest's start: do it
/// once and hand it to [`probe_btf`] and [`SockTerminator::new`]).
pub fn kernel_btf() -> Result<Btf, String> {
    Btf::from_sys_fs()
        .map_err(|e| format!("the kernel's BTF (/sys/kernel/btf/vmlinux) cannot be read: {e}"))
}

/// Looks for the TCP and UDP socket iterators and the kfunc in the kernel's BTF.
pub fn probe() -> Support {
    match kernel_btf() {
        Ok(btf) => probe_btf(&btf),
        Err(why) => Support::Missing(why),
    }
}

/// [`probe`] on BTF already read.
pub fn probe_btf(btf: &Btf) -> Support {
    for target in ["bpf_iter_tcp", "bpf_iter_udp"] {
        if btf.id_by_type_name_kind(target, BtfKind::Func).is_err() {
            return Support::Missing(format!(
                "this kernel has no {target} socket iterator (Linux 5.9+)"
            ));
        }
    }
    match btf.id_by_type_name_kind("bpf_sock_destroy", BtfKind::Func) {
        Ok(id) => Support::Kfunc(id),
        Err(_) => Support::Missing("this kernel has no bpf_sock_destroy kfunc (Linux 6.5+)".into()),
    }
}

/// An object copy on 8-byte aligned storage (the ELF parser reads its headers in place).
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// A copy of `object` whose kfunc call placeholders (`proxy_common::KFUNC_CALL_PLACEHOLDER`, one
/// per iterator program) call BTF id `id`; and how many it resolved. Instructions are 8-byte
/// aligned within their section and sections are aligned in the file, so only aligned positions
/// are compared.
pub fn patch(object: &[u8], id: u32) -> (AlignedObject, usize) {
    let mut out = AlignedObject {
        words: vec![0u64; object.len().div_ceil(8)],
        len: object.len(),
    };
    out.bytes_mut().copy_from_slice(object);
    let placeholder = KFUNC_CALL_PLACEHOLDER.to_le_bytes();
    let mut resolved = 0;
    for insn in out.bytes_mut().chunks_exact_mut(8) {
        if insn == placeholder {
            insn[4..].copy_from_slice(&id.to_le_bytes());
            resolved += 1;
        }
    }
    (out, resolved)
}

/// Sockets destroyed (and destroys the kernel refused) by the iterators, by protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TermCounts {
    pub tcp: u64,
    pub udp: u64,
    pub tcp_failed: u64,
    pub udp_failed: u64,
}

impl TermCounts {
    fn from_stats(stats: &Array<MapData, u64>) -> Self {
        let get = |i| stats.get(&i, 0).unwrap_or(0);
        TermCounts {
            tcp: get(TERM_TCP_DESTROYED),
            udp: get(TERM_UDP_DESTROYED),
            tcp_failed: get(TERM_TCP_FAILED),
            udp_failed: get(TERM_UDP_FAILED),
        }
    }

    /// Reads the pinned `KPR_SOCK_TERM_STATS` (totals since the maps were created).
    pub fn from_pin(maps_dir: &Path) -> Result<Self, DataplaneError> {
        let path = maps_dir.join(SOCK_TERM_STATS);
        let data = MapData::from_pin(&path).map_err(|e| {
            DataplaneError::Other(format!("eBPF map {SOCK_TERM_STATS}: opening the pin: {e}"))
        })?;
        let stats = Array::try_from(aya::maps::Map::Array(data)).map_err(|e| {
            DataplaneError::Other(format!("eBPF map {SOCK_TERM_STATS}: opening: {e}"))
        })?;
        Ok(Self::from_stats(&stats))
    }

    fn since(self, before: TermCounts) -> TermCounts {
        TermCounts {
            tcp: self.tcp.saturating_sub(before.tcp),
            udp: self.udp.saturating_sub(before.udp),
            tcp_failed: self.tcp_failed.saturating_sub(before.tcp_failed),
            udp_failed: self.udp_failed.saturating_sub(before.udp_failed),
        }
    }
}

/// The loaded iterator programs and their maps.
pub struct SockTerminator {
    term: HashMap<MapData, u32, Backend>,
    stats: Array<MapData, u64>,
    /// The agent's own network namespace (the thread that built the dataplane).
    own_netns: File,
    netns_dir: PathBuf,
    /// Whether "cannot enter other namespaces" was logged already.
    warned_enter: bool,
}

impl SockTerminator {
    /// Loads the iterator programs (the object was patched for `support`) and takes their maps.
    /// Returns None, having said why once, where the kernel cannot destroy sockets or the
    /// programs do not load: the rest of the dataplane works without them.
    pub fn new(ebpf: &mut Ebpf, support: &Support, btf: Option<&Btf>) -> Option<Self> {
        let Support::Kfunc(_) = support else {
            if let Support::Missing(why) = support {
                tracing::warn!(
                    "ebpf: sockets connected to a removed endpoint are not destroyed: {why}; a \
                     connected UDP socket keeps sending to the endpoint it got at connect() \
                     until the application reconnects"
                );
            }
            return None;
        };
        let Some(btf) = btf else {
            tracing::error!(
                "ebpf: sockets connected to a removed endpoint cannot be destroyed: no kernel BTF"
            );
            return None;
        };
        match Self::load(ebpf, btf) {
            Ok(t) => {
                tracing::info!(
                    "ebpf: sockets connected to a removed endpoint are destroyed \
                     (socket iterators + bpf_sock_destroy)"
                );
                Some(t)
            }
            Err(e) => {
                tracing::error!(
                    "ebpf: sockets connected to a removed endpoint cannot be destroyed: {e}"
                );
                None
            }
        }
    }

    fn load(ebpf: &mut Ebpf, btf: &Btf) -> Result<Self, DataplaneError> {
        for (name, target) in PROGRAMS {
            program::<Iter>(ebpf, name)?
                .load(target, btf)
                .map_err(|e| prog_err(name, "loading", &e))?;
        }
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no map {name}")))
        };
        let term = HashMap::try_from(take(SOCK_TERM)?)
            .map_err(|e| DataplaneError::Other(format!("eBPF map {SOCK_TERM}: {e}")))?;
        let stats = Array::try_from(take(SOCK_TERM_STATS)?)
            .map_err(|e| DataplaneError::Other(format!("eBPF map {SOCK_TERM_STATS}: {e}")))?;
        let own_netns = File::open("/proc/thread-self/ns/net")
            .map_err(|e| DataplaneError::io("opening /proc/thread-self/ns/net", e))?;
        Ok(SockTerminator {
            term,
            stats,
            own_netns,
            netns_dir: PathBuf::from(NETNS_DIR),
            warned_enter: false,
        })
    }

    /// Destroys the sockets connected to `removed` (backend id, address) in every namespace and
    /// returns how many went.
    pub fn run(
        &mut self,
        ebpf: &mut Ebpf,
        removed: &[(u32, Backend)],
    ) -> Result<TermCounts, DataplaneError> {
        if removed.is_empty() {
            return Ok(TermCounts::default());
        }
        let before = TermCounts::from_stats(&self.stats);
        for (id, b) in removed {
            self.term.insert(id, b, 0).map_err(|e| {
                DataplaneError::Other(format!("eBPF map {SOCK_TERM}: writing backend {id}: {e}"))
            })?;
        }
        let result = self.iterate(ebpf);
        for (id, _) in removed {
            let _ = self.term.remove(id);
        }
        result?;
        Ok(TermCounts::from_stats(&self.stats).since(before))
    }

    /// Reads both iterators in the agent's namespace and in each one under `netns_dir`.
    fn iterate(&mut self, ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
        let namespaces = self.namespaces();
        // One link per (namespace, program): a link's iterator is created (and walks the
        // namespace of the thread creating it) on the thread that entered that namespace.
        let mut work = Vec::with_capacity(namespaces.len());
        for (label, ns) in namespaces {
            let mut links = Vec::with_capacity(PROGRAMS.len());
            for (name, _) in PROGRAMS {
                let p = program::<Iter>(ebpf, name)?;
                let id = p.attach().map_err(|e| prog_err(name, "attaching", &e))?;
                links.push((
                    name,
                    p.take_link(id).map_err(|e| prog_err(name, "link", &e))?,
                ));
            }
            work.push((label, ns, links));
        }
        let denied = std::thread::scope(|s| {
            s.spawn(move || -> Result<Option<String>, DataplaneError> {
                let mut denied = None;
                for (label, ns, links) in work {
                    if let Some(ns) = ns {
                        match setns(ns.as_fd(), CloneFlags::CLONE_NEWNET) {
                            Ok(()) => {}
                            Err(nix::errno::Errno::EPERM) => {
                                denied.get_or_insert(label);
                                continue;
                            }
                            // The namespace went away meanwhile (its pod was deleted).
                            Err(_) => continue,
                        }
                    }
                    for (name, link) in links {
                        let mut file = link
                            .into_file()
                            .map_err(|e| prog_err(name, &format!("iterating in {label}"), &e))?;
                        let mut sink = Vec::new();
                        file.read_to_end(&mut sink).map_err(|e| {
                            DataplaneError::io(format!("reading the {name} iterator in {label}"), e)
                        })?;
                    }
                }
                Ok(denied)
            })
            .join()
            .map_err(|_| DataplaneError::Other("the socket iterator thread panicked".into()))?
        })?;
        if let Some(label) = denied {
            if !self.warned_enter {
                self.warned_enter = true;
                tracing::warn!(
                    "ebpf: entering network namespace {label} was refused (it needs \
                     CAP_SYS_ADMIN): sockets connected to removed endpoints are destroyed in \
                     the agent's own network namespace only"
                );
            }
        }
        Ok(())
    }

    /// The agent's namespace (None: the thread is there already) and the other ones under
    /// `netns_dir`, each once.
    fn namespaces(&self) -> Vec<(String, Option<File>)> {
        let mut seen = HashSet::new();
        if let Ok(m) = self.own_netns.metadata() {
            seen.insert((m.dev(), m.ino()));
        }
        let mut out = vec![("the agent's network namespace".to_string(), None)];
        let Ok(entries) = std::fs::read_dir(&self.netns_dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let Ok(m) = file.metadata() else {
                continue;
            };
            if seen.insert((m.dev(), m.ino())) {
                out.push((path.display().to_string(), Some(file)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_resolves_every_aligned_placeholder_and_nothing_else() {
        let call = KFUNC_CALL_PLACEHOLDER.to_le_bytes();
        let mut object = vec![0xaa; 8];
        object.extend_from_slice(&call);
        object.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        object.extend_from_slice(&call);
        // A placeholder that straddles an instruction boundary is no instruction.
        object.extend_from_slice(&[0; 4]);
        object.extend_from_slice(&call);
        object.extend_from_slice(&[0; 4]);
        let (patched, n) = patch(&object, 0x1234_5678);
        assert_eq!(n, 2);
        let b = patched.bytes();
        assert_eq!(b.len(), object.len());
        assert_eq!(&b[8..16], &[0x85, 0x20, 0, 0, 0x78, 0x56, 0x34, 0x12]);
        assert_eq!(&b[16..24], &object[16..24]);
        assert_eq!(&b[24..32], &[0x85, 0x20, 0, 0, 0x78, 0x56, 0x34, 0x12]);
        assert_eq!(&b[32..], &object[32..]);
        assert_eq!(b.as_ptr() as usize % 8, 0);
    }

    kpr_tests::needs_root! {
        /// This machine's kernel (6.18) has the kfunc; a probe that wrongly found it missing
        /// would silently turn the feature off.
        #[test]
        fn this_kernel_can_destroy_sockets() {
            assert!(matches!(probe(), Support::Kfunc(id) if id > 0), "{:?}", probe());
        }
    }
}
