//! Network namespaces owned by a test: creation with a unique name, running code and commands
//! inside, and removal (killing whatever still runs inside) when the guard drops.
//!
//! Owns: the namespaces it creates (`/run/netns/kpr-*`). It never touches the machine's own
//! (root) network namespace: every `ip` command it runs is scoped with `-n NAME` or `netns exec`.
//!
//! Process spawns are the expensive part under emulation (`cargo xtask vm` runs the suites under
//! TCG, where one costs a large fraction of a second): many commands go to one `ip -batch`,
//! sysctls are written from a thread inside the namespace, and deletion (unmount and unlink, as
//! `ip netns del` does) and listing the processes inside happen in this process.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use nix::sched::{setns, CloneFlags};

use crate::HarnessError;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique prefix `kpr-<pid>-<counter>` for names of objects created by this process.
pub fn unique_prefix() -> String {
    format!(
        "kpr-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid in a name `kpr-<pid>-<counter>-...` when that process no longer exists: the object was
/// left by a test run that was killed before its guards ran.
pub fn stale_owner(name: &str) -> Option<u32> {
    let pid: u32 = name.strip_prefix("kpr-")?.split('-').next()?.parse().ok()?;
    let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
    (!alive).then_some(pid)
}

/// Deletes namespaces left by killed test runs (see [`stale_owner`]), killing what runs inside.
/// Returns their names.
pub fn remove_stale() -> Vec<String> {
    let names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let stale: Vec<String> = names
        .into_iter()
        .filter(|n| stale_owner(n).is_some())
        .collect();
    for name in &stale {
        if let Ok(fd) = File::open(Path::new("/run/netns").join(name)) {
            drop(Netns {
                name: name.clone(),
                fd,
            });
        }
    }
    stale
}

/// Runs a command to completion and turns a non-zero exit into an error naming the command.
pub fn run_cmd(cmd: &mut Command) -> Result<String, HarnessError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HarnessError::Command {
            command: shown.clone(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            command: shown,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip ARGS...`.
pub fn ip(args: &[&str]) -> Result<String, HarnessError> {
    run_cmd(Command::new("ip").args(args))
}

/// A network namespace that exists as long as this guard lives.
#[derive(Debug)]
pub struct Netns {
    name: String,
    fd: File,
}

impl Netns {
    /// Creates `kpr-<pid>-<counter>-<tag>` with `lo` up.
    pub fn new(tag: &str) -> Result<Netns, HarnessError> {
        Netns::with_name(format!("{}-{tag}", unique_prefix()))
    }

    /// Creates a namespace with exactly this name (it must not exist yet).
    pub fn with_name(name: String) -> Result<Netns, HarnessError> {
        ip(&["netns", "add", &name])?;
        let path = PathBuf::from("/run/netns").join(&name);
        let fd = match File::open(&path) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = ip(&["netns", "del", &name]);
                return Err(HarnessError::Io {
                    what: format!("opening {}", path.display()),
                    source: e,
                });
            }
        };
        let ns = Netns { name, fd };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (as `ip netns` lists it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<String, HarnessError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Runs `commands` (each an `ip` command line without `ip -n NAME`) inside the namespace
    /// with one `ip -batch` process, stopping at the first that fails.
    pub fn ip_batch(&self, commands: &[String]) -> Result<(), HarnessError> {
        ip_batch(Some(&self.name), commands)
    }

    /// Sets a sysctl inside the namespace (per-namespace keys such as `net.ipv4.ip_forward`):
    /// written from a thread inside it, as `/proc/sys/net` is the writer's namespace's.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), HarnessError> {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        self.run(|| std::fs::write(&path, value))?
            .map_err(|e| HarnessError::Io {
                what: format!("setting {key}={value} in netns {}", self.name),
                source: e,
            })
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// A command that runs `program` with only its network namespace switched (a `setns` between
    /// fork and exec). Unlike [`Netns::command`] it keeps the machine's mounts, so `/sys/fs/bpf`
    /// and the cgroup2 mount stay visible (`ip netns exec` remounts `/sys`): use it for the agent
    /// and for processes that must be put into a cgroup.
    pub fn exec(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command, HarnessError> {
        let fd = self.fd.try_clone().map_err(|e| HarnessError::Io {
            what: format!("duplicating the handle of netns {}", self.name),
            source: e,
        })?;
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls setns(2) on an fd opened before the fork; no allocation,
        // no locks.
        unsafe {
            cmd.pre_exec(move || {
                setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
            });
        }
        Ok(cmd)
    }

    /// Runs `f` on a thread that has entered the namespace and waits for its result. Sockets `f`
    /// creates belong to the namespace for their whole life, whichever thread uses them later.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, HarnessError> {
        std::thread::scope(|s| {
            let handle = s.spawn(|| {
                self.enter()?;
                Ok(f())
            });
            handle
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Starts `f` on a new thread inside the namespace (for servers that outlive the call). Threads
    /// `f` spawns inherit the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<JoinHandle<T>, HarnessError> {
        let fd = self.fd.try_clone().map_err(|e| HarnessError::Io {
            what: format!("duplicating the handle of netns {}", self.name),
            source: e,
        })?;
        let name = self.name.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(format!("ns-{name}"))
            .spawn(move || {
                let entered =
                    setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| HarnessError::Setns {
                        netns: name,
                        message: e.to_string(),
                    });
                let ok = entered.is_ok();
                let _ = tx.send(entered);
                assert!(ok, "thread could not enter its namespace");
                f()
            })
            .map_err(|e| HarnessError::Io {
                what: "spawning a thread".into(),
                source: e,
            })?;
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(HarnessError::Setns {
                netns: self.name.clone(),
                message: "thread died".into(),
            }),
        }
    }

    /// Moves the calling thread into the namespace (for threads dedicated to it).
    pub fn enter(&self) -> Result<(), HarnessError> {
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| HarnessError::Setns {
            netns: self.name.clone(),
            message: e.to_string(),
        })
    }

    /// Process ids running inside the namespace (as `ip netns pids` finds them: processes whose
    /// `/proc/PID/ns/net` is this namespace).
    pub fn pids(&self) -> Vec<i32> {
        let Ok(me) = self.fd.metadata() else {
            return Vec::new();
        };
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        procs
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::metadata(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|m| m.ino() == me.ino() && m.dev() == me.dev())
            })
            .collect()
    }

    /// Creates every namespace of `names` with one `ip -batch` (their `lo` is still down: the
    /// caller's batch brings it up). On error the ones that exist are deleted again.
    pub fn add_many(names: &[String]) -> Result<Vec<Netns>, HarnessError> {
        let added = ip_batch(
            None,
            &names
                .iter()
                .map(|n| format!("netns add {n}"))
                .collect::<Vec<_>>(),
        );
        let mut out = Vec::new();
        let mut opened = Ok(());
        for name in names {
            match File::open(Path::new("/run/netns").join(name)) {
                Ok(fd) => out.push(Netns {
                    name: name.clone(),
                    fd,
                }),
                Err(e) => {
                    opened = opened.and(Err(HarnessError::Io {
                        what: format!("opening /run/netns/{name}"),
                        source: e,
                    }))
                }
            }
        }
        added?;
        opened?;
        Ok(out)
    }
}

/// `ip [-n NETNS] -batch -` with `commands` on its standard input: one process for all of them.
pub fn ip_batch(netns: Option<&str>, commands: &[String]) -> Result<(), HarnessError> {
    if commands.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?} <<< {commands:?}");
    let io = |e| HarnessError::Io {
        what: format!("running {shown}"),
        source: e,
    };
    let mut child = cmd.spawn().map_err(io)?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let written = stdin.write_all(format!("{}\n", commands.join("\n")).as_bytes());
    drop(stdin);
    let out = child.wait_with_output().map_err(io)?;
    written.map_err(io)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Command {
            command: shown,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// Deletes the namespace `name` as `ip netns del` does: detach its bind mount and remove the file
/// (the namespace goes when nothing holds it any more).
fn delete_netns(name: &str) -> std::io::Result<()> {
    let path = Path::new("/run/netns").join(name);
    match nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::remove_file(&path)
}

impl Drop for Netns {
    fn drop(&mut self) {
        let me = std::process::id() as i32;
        for pid in self.pids().into_iter().filter(|p| *p != me) {
            // Only processes inside our own namespace: started by this test.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Err(e) = delete_netns(&self.name) {
            eprintln!("kpr-tests: could not delete netns {}: {e}", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn namespace_is_created_with_lo_up_and_removed_on_drop() {
        let ns = Netns::new("unit").unwrap();
        let path = Path::new("/run/netns").join(ns.name());
        assert!(path.exists());
        let links = ns.ip(&["-o", "link", "show"]).unwrap();
        assert_eq!(
            links.lines().count(),
            1,
            "a fresh namespace holds only lo: {links}"
        );
        assert!(
            links.contains("UP") || links.contains("UNKNOWN"),
            "lo is up: {links}"
        );
        drop(ns);
        assert!(!path.exists(), "{} still exists after drop", path.display());
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn drop_kills_processes_left_inside() {
        let ns = Netns::new("kill").unwrap();
        let mut child = ns.command("sleep").arg("600").spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while ns.pids().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(ns.pids(), vec![child.id() as i32]);
        drop(ns);
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "sleep was killed, not finished: {status}"
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn run_executes_inside_the_namespace() {
        let ns = Netns::new("run").unwrap();
        let inside = ns
            .run(|| {
                nix::ifaddrs::getifaddrs()
                    .unwrap()
                    .map(|i| i.interface_name)
                    .collect::<Vec<_>>()
            })
            .unwrap();
        assert!(
            inside.iter().all(|n| n == "lo"),
            "only lo inside, found {inside:?}"
        );
        let outside: Vec<_> = nix::ifaddrs::getifaddrs()
            .unwrap()
            .map(|i| i.interface_name)
            .collect();
        assert!(
            outside.iter().any(|n| n != "lo"),
            "the test host has more than lo: {outside:?}"
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn exec_switches_only_the_network_namespace() {
        let ns = Netns::new("exec").unwrap();
        let out = ns
            .exec("ip")
            .unwrap()
            .args(["-o", "link", "show"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            links.lines().count(),
            1,
            "only lo in the namespace: {links}"
        );
        let mine = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        let out = ns
            .exec("readlink")
            .unwrap()
            .arg("/proc/self/ns/mnt")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            mine.to_string_lossy(),
            "same mount namespace"
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn a_namespace_of_a_dead_test_process_is_stale_and_removed() {
        // pid_max is at most 2^22, so this pid cannot exist.
        let name = "kpr-99999999-0-stale".to_string();
        assert_eq!(stale_owner(&name), Some(99_999_999));
        assert_eq!(
            stale_owner(&format!("kpr-{}-0-x", std::process::id())),
            None
        );
        assert_eq!(stale_owner("kpr-1-0-init"), None, "pid 1 lives");
        assert_eq!(stale_owner("other-99999999"), None);
        ip(&["netns", "add", &name]).unwrap();
        let removed = remove_stale();
        assert!(removed.contains(&name), "{removed:?}");
        assert!(!Path::new("/run/netns").join(&name).exists());
    }

    #[test]
    fn names_are_unique_and_short() {
        let a = unique_prefix();
        let b = unique_prefix();
        assert_ne!(a, b);
        assert!(a.starts_with("kpr-"));
    }
}
