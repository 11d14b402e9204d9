//! A cgroup v2 directory owned by a test, for the eBPF backend's socket programs (`--cgroup-path`)
//! and the client processes they must see.
//!
//! Owns: one directory under the cgroup2 mount (found in `/proc/self/mounts`, never assumed). It
//! never attaches anything and never moves processes it did not start; on drop it kills what is
//! still inside and removes the directory.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::netns::{stale_owner, unique_prefix};
use crate::HarnessError;

/// The cgroup2 mount point, from `/proc/self/mounts`.
pub fn cgroup2_mount() -> Result<PathBuf, HarnessError> {
    let mounts = fs::read_to_string("/proc/self/mounts").map_err(|e| HarnessError::Io {
        what: "reading /proc/self/mounts".into(),
        source: e,
    })?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .and_then(|f| f.get(1).map(PathBuf::from))
        .ok_or_else(|| HarnessError::Agent("no cgroup2 mount in /proc/self/mounts".into()))
}

/// A cgroup `kpr-<pid>-<counter>-<tag>` directly under the cgroup2 mount.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn new(tag: &str) -> Result<Cgroup, HarnessError> {
        let mount = cgroup2_mount()?;
        remove_stale(&mount);
        let path = mount.join(format!("{}-{tag}", unique_prefix()));
        fs::create_dir(&path).map_err(|e| HarnessError::Io {
            what: format!("creating cgroup {}", path.display()),
            source: e,
        })?;
        Ok(Cgroup { path })
    }

    /// The directory (what `--cgroup-path` takes).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Processes inside.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Makes `cmd` join this cgroup between fork and exec (so the program runs inside from its
    /// first instruction).
    pub fn add_on_exec(&self, cmd: &mut Command) -> Result<(), HarnessError> {
        let procs = self.path.join("cgroup.procs");
        let mut file: File =
            OpenOptions::new()
                .write(true)
                .open(&procs)
                .map_err(|e| HarnessError::Io {
                    what: format!("opening {}", procs.display()),
                    source: e,
                })?;
        // SAFETY: the closure only write(2)s to a file opened before the fork.
        unsafe {
            cmd.pre_exec(move || file.write_all(b"0"));
        }
        Ok(())
    }
}

/// Removes cgroups left by killed test runs (named `kpr-<pid>-...` with a dead pid).
fn remove_stale(mount: &Path) {
    let Ok(dir) = fs::read_dir(mount) else { return };
    for entry in dir.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if stale_owner(&name).is_some() {
            drop(Cgroup { path: entry.path() });
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(e) = fs::remove_dir(&self.path) {
            eprintln!(
                "kpr-tests: could not remove cgroup {}: {e}",
                self.path.display()
            );
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
    fn a_process_started_into_the_cgroup_is_inside_and_gone_after_drop() {
        let cg = Cgroup::new("unit").unwrap();
        let path = cg.path().to_path_buf();
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        cg.add_on_exec(&mut cmd).unwrap();
        let mut child = cmd.spawn().unwrap();
        assert_eq!(cg.pids(), vec![child.id() as i32]);
        let own = fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
        let rel = path.strip_prefix(cgroup2_mount().unwrap()).unwrap();
        assert!(own.contains(&format!("0::/{}", rel.display())), "{own}");
        drop(cg);
        assert!(!child.wait().unwrap().success(), "killed by the guard");
        assert!(!path.exists());
    }
}
