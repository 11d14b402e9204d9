//! Loading the embedded object with its maps pinned under bpffs, attaching the cgroup programs,
//! and pinning their links; plus removing all of that again.
//!
//! Layout under `--bpffs-path` (default /sys/fs/bpf/kpr): `maps/<MAP>` and `links/<program>`.
//! A restart reuses the pinned maps (same state, same counters) and replaces each pinned link
//! make-before-break: the new program is attached before the old link is unpinned and dropped,
//! so no connect() goes untranslated in between.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr};
use aya::{Ebpf, EbpfLoader};

use super::maps;
use super::object;
use super::sockterm;
use crate::error::DataplaneError;

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The programs of the object: (name in the object, link pin name).
pub const SOCK_ADDR_PROGRAMS: [(&str, &str); 8] = [
    ("kpr_connect4", "connect4"),
    ("kpr_sendmsg4", "sendmsg4"),
    ("kpr_recvmsg4", "recvmsg4"),
    ("kpr_getpeername4", "getpeername4"),
    ("kpr_connect6", "connect6"),
    ("kpr_sendmsg6", "sendmsg6"),
    ("kpr_recvmsg6", "recvmsg6"),
    ("kpr_getpeername6", "getpeername6"),
];
pub const SOCK_PROGRAMS: [(&str, &str); 1] = [("kpr_sock_release", "sock_release")];

/// Map sizes (`max_entries`), applied when the maps are created (pinned maps keep their size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    /// Frontends (service address, port, protocol): `KPR_SERVICES`, and backend sets: `KPR_RR`.
    pub services: u32,
    /// Backend slots over all sets: `KPR_SLOTS`.
    pub backend_slots: u32,
    /// Distinct endpoints: `KPR_BACKENDS`, `KPR_COUNTERS`.
    pub backends: u32,
    /// Session affinity entries (LRU): `KPR_AFFINITY`.
    pub affinity: u32,
    /// Open translated sockets tracked for least-connection: `KPR_SOCKS`.
    pub sockets: u32,
    /// Reverse translations and unconnected-UDP flows (LRU): `KPR_REVNAT`, `KPR_UDP_FWD`.
    pub flows: u32,
    /// tc connection tracking (LRU): `KPR_CT`.
    pub conntrack: u32,
    /// DSR flows whose backend is on this node (LRU): `KPR_DSR`. The agent makes it 1 entry
    /// unless `--nodeport-mode` is dsr or hybrid (an LRU map is allocated whole).
    pub dsr_flows: u32,
    /// loadBalancerSourceRanges entries (one per range, LB IP and node address, per LB IP
    /// frontend): `KPR_SRC_RANGES`.
    pub source_ranges: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            services: 262_144,
            backend_slots: 1_048_576,
            backends: 1_048_576,
            affinity: 65_536,
            sockets: 262_144,
            flows: 262_144,
            conntrack: 262_144,
            dsr_flows: 262_144,
            source_ranges: 65_536,
        }
    }
}

impl MapSizes {
    /// The size asked for `map`; None for the fixed-size arrays.
    pub fn of(&self, map: &str) -> Option<u32> {
        Some(match map {
            maps::SERVICES | maps::RR => self.services,
            maps::SLOTS => self.backend_slots,
            maps::BACKENDS | maps::COUNTERS => self.backends,
            maps::AFFINITY => self.affinity,
            maps::SOCKS => self.sockets,
            maps::REVNAT | maps::UDP_FWD => self.flows,
            maps::CT => self.conntrack,
            maps::DSR => self.dsr_flows,
            maps::SRC_RANGES => self.source_ranges,
            _ => return None,
        })
    }
}

/// Where things are pinned.
#[derive(Debug, Clone)]
pub struct Pins {
    pub root: PathBuf,
}

impl Pins {
    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> DataplaneError {
    move |e| DataplaneError::io(what, e)
}

/// Makes sure `root` is a directory on a bpf filesystem, mounting bpffs at /sys/fs/bpf when the
/// path is below it and nothing is mounted there (what a node agent does on a fresh node).
pub fn prepare_bpffs(root: &Path) -> Result<(), DataplaneError> {
    let sys_bpf = Path::new("/sys/fs/bpf");
    if root.starts_with(sys_bpf) && fs_magic(sys_bpf) != Some(BPF_FS_MAGIC) {
        nix::mount::mount(
            Some("bpf"),
            sys_bpf,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| DataplaneError::io("mounting bpffs at /sys/fs/bpf", e.into()))?;
    }
    let parent = root.parent().unwrap_or(root);
    let fs_of = if root.exists() { root } else { parent };
    if fs_magic(fs_of) != Some(BPF_FS_MAGIC) {
        return Err(DataplaneError::MissingKernelFeature(format!(
            "--bpffs-path {}: {} is not on a bpf filesystem (mount one with \
             `mount -t bpf bpf {}`)",
            root.display(),
            fs_of.display(),
            fs_of.display()
        )));
    }
    Ok(())
}

/// Checks that `path` is a cgroup v2 directory.
pub fn check_cgroup(path: &Path) -> Result<fs::File, DataplaneError> {
    if fs_magic(path) != Some(CGROUP2_SUPER_MAGIC) {
        return Err(DataplaneError::MissingKernelFeature(format!(
            "--cgroup-path {}: not a cgroup v2 directory (find the cgroup2 mount with \
             `findmnt -t cgroup2`)",
            path.display()
        )));
    }
    fs::File::open(path).map_err(io_err(format!("opening --cgroup-path {}", path.display())))
}

fn fs_magic(path: &Path) -> Option<i64> {
    nix::sys::statfs::statfs(path)
        .ok()
        .map(|s| s.filesystem_type().0)
}

/// Loads the embedded object, creating or reusing the pinned maps. Where the kernel has the
/// `bpf_sock_destroy` kfunc, the object's calls to it are resolved first (`sockterm::patch`);
/// `support` becomes `Missing` if the object has none to resolve.
pub fn load(
    pins: &Pins,
    sizes: &MapSizes,
    support: &mut sockterm::Support,
) -> Result<Ebpf, DataplaneError> {
    let embedded = object::embedded()?;
    let patched = match support {
        sockterm::Support::Kfunc(id) => {
            let (obj, resolved) = sockterm::patch(embedded, *id);
            if resolved == 0 {
                *support = sockterm::Support::Missing(
                    "the eBPF object has no bpf_sock_destroy call to resolve".into(),
                );
            }
            Some(obj)
        }
        sockterm::Support::Missing(_) => None,
    };
    let bytes = match &patched {
        Some(obj) => obj.bytes(),
        None => embedded,
    };
    let maps_dir = pins.maps();
    fs::create_dir_all(&maps_dir).map_err(io_err(format!("creating {}", maps_dir.display())))?;
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(&maps_dir);
    for name in maps::ALL {
        if let Some(size) = sizes.of(name) {
            loader.map_max_entries(name, size);
        }
    }
    loader.load(bytes).map_err(|e| {
        DataplaneError::Other(format!(
            "loading the eBPF object (maps pinned in {}): {e}{}",
            maps_dir.display(),
            error_chain(&e)
        ))
    })
}

/// Loads every program and attaches it to `cgroup`, pinning (or replacing) its link.
///
/// `CgroupAttachMode::Single` is what bpf_link_create needs (the kernel rejects any flag on cgroup
/// links with EINVAL); links are multi-attach by nature, which the make-before-break relies on.
pub fn attach_all(ebpf: &mut Ebpf, cgroup: &fs::File, pins: &Pins) -> Result<(), DataplaneError> {
    let links = pins.links();
    fs::create_dir_all(&links).map_err(io_err(format!("creating {}", links.display())))?;
    for (prog, pin) in SOCK_ADDR_PROGRAMS {
        let p: &mut CgroupSockAddr = program(ebpf, prog)?;
        p.load().map_err(|e| prog_err(prog, "loading", &e))?;
        let id = p
            .attach(cgroup.as_fd(), CgroupAttachMode::Single)
            .map_err(|e| prog_err(prog, "attaching", &e))?;
        let link = p
            .take_link(id)
            .map_err(|e| prog_err(prog, "taking the link", &e))?;
        let link = FdLink::try_from(link).map_err(|e| prog_err(prog, "converting the link", &e))?;
        replace_pin(link, &links.join(pin))?;
    }
    for (prog, pin) in SOCK_PROGRAMS {
        let p: &mut CgroupSock = program(ebpf, prog)?;
        p.load().map_err(|e| prog_err(prog, "loading", &e))?;
        let id = p
            .attach(cgroup.as_fd(), CgroupAttachMode::Single)
            .map_err(|e| prog_err(prog, "attaching", &e))?;
        let link = p
            .take_link(id)
            .map_err(|e| prog_err(prog, "taking the link", &e))?;
        let link = FdLink::try_from(link).map_err(|e| prog_err(prog, "converting the link", &e))?;
        replace_pin(link, &links.join(pin))?;
    }
    Ok(())
}

/// Logs how many instructions the verifier processed for each loaded program (kernel 5.16+):
/// its limit is 1,000,000, and a kernel whose verifier prunes less may come closer to it.
pub fn log_verified(ebpf: &Ebpf) {
    for (name, p) in ebpf.programs() {
        if let Some(n) = p.info().ok().and_then(|i| i.verified_instruction_count()) {
            tracing::info!("ebpf: program {name}: {n} instructions verified");
        }
    }
}

/// The program `name` of the loaded object, as its type `T`.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, DataplaneError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no program {name}")))?;
    p.try_into().map_err(|e| prog_err(name, "typing", &e))
}

/// An error of the program `prog` while `what`, with its cause chain.
pub(super) fn prog_err(prog: &str, what: &str, e: &dyn std::error::Error) -> DataplaneError {
    DataplaneError::Other(format!(
        "eBPF program {prog}: {what}: {e}{}",
        error_chain(e)
    ))
}

/// The sources of an error (the verifier log, the errno), which aya keeps out of `Display`.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Pins `link` at `path`, replacing an older pinned link there only after the new one is attached.
pub(crate) fn replace_pin(link: FdLink, path: &Path) -> Result<(), DataplaneError> {
    let old = if path.exists() {
        PinnedLink::from_pin(path).ok()
    } else {
        None
    };
    if path.exists() {
        fs::remove_file(path)
            .map_err(io_err(format!("unpinning the old link {}", path.display())))?;
    }
    link.pin(path).map_err(|e| {
        DataplaneError::Other(format!(
            "pinning the link {}: {e}{}",
            path.display(),
            error_chain(&e)
        ))
    })?;
    // Dropping the old link's last reference detaches the old program.
    drop(old);
    Ok(())
}

/// Unpins every link (detaching the programs) and every map under `pins`, then removes the
/// directories. Missing pieces are not an error.
pub fn unpin_all(pins: &Pins) -> Result<(), DataplaneError> {
    let mut first_err = None;
    for dir in [pins.links(), pins.maps()] {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(DataplaneError::io(format!("listing {}", dir.display()), e)),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if let Err(e) = fs::remove_file(&path) {
                first_err.get_or_insert(DataplaneError::io(
                    format!("unpinning {}", path.display()),
                    e,
                ));
            }
        }
        if let Err(e) = fs::remove_dir(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err
                    .get_or_insert(DataplaneError::io(format!("removing {}", dir.display()), e));
            }
        }
    }
    match fs::remove_dir(&pins.root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            first_err.get_or_insert(DataplaneError::io(
                format!("removing {}", pins.root.display()),
                e,
            ));
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
