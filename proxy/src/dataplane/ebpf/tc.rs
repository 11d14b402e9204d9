//! Attaching the tc program (`kpr_tc_ingress`, TCX ingress) to the node's interfaces, in the
//! network namespace the dataplane was created in, and keeping that set current.
//!
//! Kernels before 6.6 have no TCX: there the program goes on a clsact qdisc as a netlink tc
//! filter (created when missing). Such a filter outlives the agent without a pin, so a restarted
//! agent removes the filters its predecessor left on an interface just before attaching its own
//! (that interface's NodePort traffic is not translated for that instant), and `proxy cleanup`
//! removes them by program name.
//!
//! The namespace is captured at construction (`/proc/thread-self/ns/net`) and every attach runs
//! on a short-lived thread that entered it, so later syncs from any thread never touch another
//! namespace. Links are pinned as `links/tc-<interface>`; interfaces that disappeared lose their
//! pin on the next refresh.
//!
//! With `--nodeport-mode dsr|hybrid` (direct server return, proxy-ebpf's `dsr.rs`) the DSR
//! program goes into `KPR_TC_DSR` (the tc program's tail call) and the egress program
//! (`kpr_tc_egress`) onto the same interfaces' egress, pinned as `links/tc-egress-<interface>`.
//! In snat mode both are taken away again: `KPR_TC_DSR` emptied, egress links unpinned (and
//! before 6.6 their netlink filters removed), so a node leaves DSR with a restart.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::os::fd::AsFd;
use std::path::PathBuf;

use aya::maps::ProgramArray;
use aya::programs::links::FdLink;
use aya::programs::tc::{qdisc_add_clsact, qdisc_detach_program, TcError};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::util::KernelVersion;
use aya::Ebpf;
use nix::sched::{setns, CloneFlags};

use super::attach::{error_chain, replace_pin};
use super::maps::{TC_AGAIN as AGAIN, TC_DSR};
use crate::error::DataplaneError;

pub const PROGRAM: &str = "kpr_tc_ingress";
/// The DSR program (a tail call of [`PROGRAM`], never attached).
pub const DSR_PROGRAM: &str = "kpr_tc_dsr";
/// The egress program of DSR.
pub const EGRESS_PROGRAM: &str = "kpr_tc_egress";

/// Which interfaces get the tc program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcInterfaces {
    /// No tc path: only local clients (cgroup programs) are load-balanced.
    Off,
    /// Every interface except loopback, as they come and go (a node's default).
    All,
    /// Exactly these interfaces.
    Only(Vec<String>),
}

/// The tc program's attachments in one network namespace.
pub struct TcAttacher {
    netns: File,
    mode: TcInterfaces,
    links_dir: PathBuf,
    attached: BTreeSet<String>,
    /// Direct server return: the egress program attached next to the ingress one.
    dsr: bool,
}

impl TcAttacher {
    /// Captures the calling thread's network namespace and loads the program.
    pub fn new(
        ebpf: &mut Ebpf,
        mode: TcInterfaces,
        links_dir: PathBuf,
        dsr: bool,
    ) -> Result<Self, DataplaneError> {
        let netns = File::open("/proc/thread-self/ns/net")
            .map_err(|e| DataplaneError::io("opening /proc/thread-self/ns/net", e))?;
        let dsr = dsr && mode != TcInterfaces::Off;
        if mode != TcInterfaces::Off {
            program(ebpf)?.load().map_err(|e| tc_err("loading", &e))?;
            fill_again(ebpf)?;
        }
        if dsr {
            named(ebpf, DSR_PROGRAM)?
                .load()
                .map_err(|e| named_err(DSR_PROGRAM, "loading", &e))?;
            named(ebpf, EGRESS_PROGRAM)?
                .load()
                .map_err(|e| named_err(EGRESS_PROGRAM, "loading", &e))?;
        }
        fill_dsr(ebpf, dsr)?;
        if !dsr {
            unpin_egress(&links_dir);
        }
        Ok(TcAttacher {
            netns,
            mode,
            links_dir,
            attached: BTreeSet::new(),
            dsr,
        })
    }

    /// Whether the DSR programs are in place (dsr or hybrid mode with the tc path).
    pub fn dsr(&self) -> bool {
        self.dsr
    }

    pub fn enabled(&self) -> bool {
        self.mode != TcInterfaces::Off
    }

    /// Attaches to interfaces that appeared and unpins those that went away.
    pub fn refresh(&mut self, ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
        if !self.enabled() {
            return Ok(());
        }
        let dsr = self.dsr;
        let netns = &self.netns;
        let mode = &self.mode;
        let links_dir = &self.links_dir;
        let attached = &self.attached;
        let result = std::thread::scope(|s| {
            s.spawn(move || -> Result<BTreeSet<String>, DataplaneError> {
                enter(netns)?;
                let present = interfaces(mode)?;
                for name in present.difference(attached) {
                    attach_one(program(ebpf)?, name, links_dir)?;
                    if dsr {
                        attach_egress(named(ebpf, EGRESS_PROGRAM)?, name, links_dir)?;
                    } else if !tcx_supported() {
                        detach_netlink_egress(name).map_err(|e| {
                            tc_err(
                                &format!("removing the DSR egress filter on interface {name}"),
                                &e,
                            )
                        })?;
                    }
                }
                Ok(present)
            })
            .join()
            .map_err(|_| DataplaneError::Other("the tc attach thread panicked".into()))?
        })?;
        for gone in self.attached.difference(&result) {
            let _ = fs::remove_file(self.links_dir.join(pin_name(gone)));
            let _ = fs::remove_file(self.links_dir.join(egress_pin_name(gone)));
        }
        self.attached = result;
        Ok(())
    }

    /// Removes the pre-6.6 netlink filters in the dataplane's namespace (see the module docs).
    pub fn detach_netlink_filters(&self) -> Result<(), DataplaneError> {
        let netns = &self.netns;
        std::thread::scope(|s| {
            s.spawn(move || {
                enter(netns)?;
                detach_netlink_filters()
            })
            .join()
            .map_err(|_| DataplaneError::Other("the tc detach thread panicked".into()))?
        })
    }

    /// Interfaces the program is attached to.
    pub fn attached(&self) -> &BTreeSet<String> {
        &self.attached
    }
}

/// Moves the calling (short-lived) thread into `netns`, unless it is there already: setns needs
/// CAP_SYS_ADMIN, which the agent of deploy/proxy.yaml does not have, and the agent's threads are
/// in the namespace it captured (the node's) anyway; only tests construct the dataplane elsewhere.
pub(super) fn enter(netns: &File) -> Result<(), DataplaneError> {
    use std::os::unix::fs::MetadataExt as _;
    let target = netns
        .metadata()
        .map_err(|e| DataplaneError::io("reading the dataplane's network namespace", e))?;
    let current = fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| DataplaneError::io("reading /proc/thread-self/ns/net", e))?;
    if (target.dev(), target.ino()) == (current.dev(), current.ino()) {
        return Ok(());
    }
    setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| DataplaneError::io("entering the dataplane's network namespace", e.into()))
}

/// Puts the loaded program at index 0 of `KPR_TC_AGAIN`, through which it runs itself again on a
/// SYN that reuses an earlier connection's 4-tuple (proxy-ebpf's `tc.rs`). A pinned map keeps
/// the previous agent's program there until this one replaces it.
fn fill_again(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    let fd = program(ebpf)?
        .fd()
        .map_err(|e| tc_err("reading the fd of", &e))?
        .try_clone()
        .map_err(|e| DataplaneError::io("duplicating the tc program's fd", e))?;
    let map = ebpf
        .map_mut(AGAIN)
        .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no map {AGAIN}")))?;
    let mut again = ProgramArray::try_from(map)
        .map_err(|e| DataplaneError::Other(format!("eBPF map {AGAIN}: {e}{}", error_chain(&e))))?;
    again.set(0, &fd, 0).map_err(|e| {
        DataplaneError::Other(format!(
            "eBPF map {AGAIN}: putting {PROGRAM} at index 0: {e}{}",
            error_chain(&e)
        ))
    })
}

/// Puts the DSR program at index 0 of `KPR_TC_DSR` (`dsr`), or empties it: the tc program's
/// tail call then fails, and it goes on without DSR. A pinned map keeps what the previous
/// agent put there until this one decides.
fn fill_dsr(ebpf: &mut Ebpf, dsr: bool) -> Result<(), DataplaneError> {
    let fd = if dsr {
        Some(
            named(ebpf, DSR_PROGRAM)?
                .fd()
                .map_err(|e| named_err(DSR_PROGRAM, "reading the fd of", &e))?
                .try_clone()
                .map_err(|e| DataplaneError::io("duplicating the DSR program's fd", e))?,
        )
    } else {
        None
    };
    let map = ebpf
        .map_mut(TC_DSR)
        .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no map {TC_DSR}")))?;
    let mut array = ProgramArray::try_from(map)
        .map_err(|e| DataplaneError::Other(format!("eBPF map {TC_DSR}: {e}{}", error_chain(&e))))?;
    match fd {
        Some(fd) => array.set(0, &fd, 0).map_err(|e| {
            DataplaneError::Other(format!(
                "eBPF map {TC_DSR}: putting {DSR_PROGRAM} at index 0: {e}{}",
                error_chain(&e)
            ))
        }),
        // Empty already is not an error.
        None => {
            let _ = array.clear_index(&0);
            Ok(())
        }
    }
}

/// Unpins every DSR egress link under `links_dir` (detaching the program; a node left DSR).
fn unpin_egress(links_dir: &std::path::Path) {
    let prefix = egress_pin_name("");
    for entry in fs::read_dir(links_dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, DataplaneError> {
    named(ebpf, PROGRAM)
}

/// The classifier `name` of the object.
fn named<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, DataplaneError> {
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| DataplaneError::Other(format!("the eBPF object has no program {name}")))?;
    p.try_into().map_err(|e| named_err(name, "typing", &e))
}

fn tc_err(what: &str, e: &dyn std::error::Error) -> DataplaneError {
    named_err(PROGRAM, what, e)
}

fn named_err(program: &str, what: &str, e: &dyn std::error::Error) -> DataplaneError {
    DataplaneError::Other(format!(
        "eBPF program {program}: {what}: {e}{}",
        error_chain(e)
    ))
}

fn pin_name(interface: &str) -> String {
    format!("tc-{interface}")
}

/// The pin name prefix of the DSR egress links (`links/tc-egress-<interface>`).
pub const EGRESS_PIN_PREFIX: &str = "tc-egress-";

fn egress_pin_name(interface: &str) -> String {
    format!("{EGRESS_PIN_PREFIX}{interface}")
}

/// The interfaces of the current thread's namespace that `mode` selects.
fn interfaces(mode: &TcInterfaces) -> Result<BTreeSet<String>, DataplaneError> {
    let all = nix::net::if_::if_nameindex()
        .map_err(|e| DataplaneError::io("listing network interfaces", e.into()))?;
    let names: BTreeSet<String> = all
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .collect();
    Ok(match mode {
        TcInterfaces::Off => BTreeSet::new(),
        TcInterfaces::All => names,
        TcInterfaces::Only(only) => only
            .iter()
            .filter(|n| names.contains(*n))
            .cloned()
            .collect(),
    })
}

/// Whether this kernel has TCX links (6.6); aya attaches through netlink otherwise.
pub fn tcx_supported() -> bool {
    // The same test aya makes to choose between TCX and netlink.
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

fn attach_one(
    prog: &mut SchedClassifier,
    interface: &str,
    links_dir: &std::path::Path,
) -> Result<(), DataplaneError> {
    if !tcx_supported() {
        return attach_netlink(prog, interface);
    }
    let what = |step: &str| format!("{step} on interface {interface}");
    let id = prog
        .attach(interface, TcAttachType::Ingress)
        .map_err(|e| tc_err(&what("attaching (TCX ingress)"), &e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| tc_err(&what("taking the link"), &e))?;
    let link = FdLink::try_from(link).map_err(|e| tc_err(&what("converting the link"), &e))?;
    replace_pin(link, &links_dir.join(pin_name(interface)))
}

/// Attaches the DSR egress program to `interface` (TCX egress, pinned; before 6.6 a netlink
/// filter on clsact egress, as [`attach_netlink`] does for ingress).
fn attach_egress(
    prog: &mut SchedClassifier,
    interface: &str,
    links_dir: &std::path::Path,
) -> Result<(), DataplaneError> {
    let what = |step: &str| format!("{step} on interface {interface}");
    let err = |step: &str, e: &dyn std::error::Error| named_err(EGRESS_PROGRAM, &what(step), e);
    if !tcx_supported() {
        match qdisc_add_clsact(interface) {
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(err("adding the clsact qdisc (no TCX before 6.6)", &e)),
        }
        detach_netlink_egress(interface).map_err(|e| err("removing an earlier filter", &e))?;
        let id = prog
            .attach(interface, TcAttachType::Egress)
            .map_err(|e| err("attaching (netlink tc filter, clsact egress)", &e))?;
        let link = prog.take_link(id).map_err(|e| err("taking the link", &e))?;
        std::mem::forget(link);
        return Ok(());
    }
    let id = prog
        .attach(interface, TcAttachType::Egress)
        .map_err(|e| err("attaching (TCX egress)", &e))?;
    let link = prog.take_link(id).map_err(|e| err("taking the link", &e))?;
    let link = FdLink::try_from(link).map_err(|e| err("converting the link", &e))?;
    replace_pin(link, &links_dir.join(egress_pin_name(interface)))
}

/// Removes the DSR egress program's netlink tc filters from an interface; none is not an error.
fn detach_netlink_egress(interface: &str) -> Result<(), TcError> {
    match qdisc_detach_program(interface, TcAttachType::Egress, EGRESS_PROGRAM) {
        Err(TcError::IoError(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The pre-6.6 path: a clsact qdisc (created when missing) and a netlink tc filter replacing the
/// ones an earlier agent left. The link is forgotten, not dropped: dropping it would detach the
/// filter, and the filter must outlive this agent like a pinned TCX link does.
fn attach_netlink(prog: &mut SchedClassifier, interface: &str) -> Result<(), DataplaneError> {
    let what = |step: &str| format!("{step} on interface {interface}");
    match qdisc_add_clsact(interface) {
        Ok(()) => {}
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => {
            return Err(tc_err(
                &what("adding the clsact qdisc (no TCX before 6.6)"),
                &e,
            ))
        }
    }
    detach_netlink(interface).map_err(|e| tc_err(&what("removing an earlier filter"), &e))?;
    let id = prog
        .attach(interface, TcAttachType::Ingress)
        .map_err(|e| tc_err(&what("attaching (netlink tc filter, clsact ingress)"), &e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| tc_err(&what("taking the link"), &e))?;
    std::mem::forget(link);
    Ok(())
}

/// Removes this program's netlink tc filters from an interface; none is not an error.
fn detach_netlink(interface: &str) -> Result<(), TcError> {
    match qdisc_detach_program(interface, TcAttachType::Ingress, PROGRAM) {
        Err(TcError::IoError(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes the netlink tc filters of the pre-6.6 path from every interface of the calling
/// thread's network namespace (`proxy cleanup`). TCX links go with their pins instead.
pub fn detach_netlink_filters() -> Result<(), DataplaneError> {
    if tcx_supported() {
        return Ok(());
    }
    for interface in interfaces(&TcInterfaces::All)? {
        detach_netlink(&interface)
            .map_err(|e| tc_err(&format!("removing the filter on interface {interface}"), &e))?;
        detach_netlink_egress(&interface).map_err(|e| {
            named_err(
                EGRESS_PROGRAM,
                &format!("removing the filter on interface {interface}"),
                &e,
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct __user_cap_header_struct` and `struct __user_cap_data_struct` (version 3).
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_ADMIN: u32 = 21;

    /// Takes CAP_SYS_ADMIN out of the calling thread's effective set (capset acts on the calling
    /// thread only).
    fn drop_sys_admin() {
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget writes two CapData, the size version 3 defines.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
        data[0].effective &= !(1 << CAP_SYS_ADMIN);
        // SAFETY: capset reads the header and two CapData.
        let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
        assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
    }

    /// The agent of deploy/proxy.yaml has no CAP_SYS_ADMIN: entering the namespace its threads
    /// are in already must not need setns, which fails without it.
    #[test]
    fn entering_the_namespace_a_thread_is_in_needs_no_cap_sys_admin() {
        let netns = File::open("/proc/thread-self/ns/net").unwrap();
        std::thread::spawn(move || {
            drop_sys_admin();
            assert_eq!(
                setns(netns.as_fd(), CloneFlags::CLONE_NEWNET),
                Err(nix::errno::Errno::EPERM),
                "this thread runs without CAP_SYS_ADMIN"
            );
            enter(&netns).unwrap();
        })
        .join()
        .unwrap();
    }
}
