//! One reference process (etcd, kube-apiserver, ...): spawned with its output in a log file,
//! stopped on drop, and reported with the last lines of its log when it died.
//!
//! Two lifetimes: [`Lifetime::Owned`] processes die with the process that started them (the
//! kernel's parent-death signal, armed from one long-lived spawner thread, because the signal
//! follows the *thread* that forked: a test thread that ends would otherwise take the shared
//! control plane with it); [`Lifetime::Detached`] processes get a session of their own and outlive
//! their starter (`cargo xtask cluster up`), which records their pids for `cluster down`.
//!
//! Owns: its child and its log file; nothing else.

use std::fs::{self, File};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// Whether a process ends with its starter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    Owned,
    Detached,
}

/// What to start: the program, its arguments, and where its log goes.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// A network namespace (its `/run/netns/<name>` file) the process runs in instead of ours.
    pub netns: Option<PathBuf>,
}

/// A running reference process.
#[derive(Debug)]
pub struct Process {
    pub spec: Spec,
    child: Option<Child>,
    /// Set for detached processes, which are not our children once recorded.
    pid: u32,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread that forks every owned process; it lives as long as the process.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the control plane's spawner thread");
        Mutex::new(tx)
    })
}

impl Process {
    pub fn start(spec: Spec, lifetime: Lifetime) -> anyhow::Result<Process> {
        if !spec.program.is_file() {
            bail!(
                "{} not found at {}: build the reference binaries with `cargo xtask setup --k8s`",
                spec.name,
                spec.program.display()
            );
        }
        let log =
            File::create(&spec.log).with_context(|| format!("creating {}", spec.log.display()))?;
        let mut cmd = Command::new(&spec.program);
        if let Some(netns) = &spec.netns {
            let ns = File::open(netns)
                .with_context(|| format!("opening network namespace {}", netns.display()))?;
            // SAFETY: setns is async-signal-safe; the child is single-threaded until exec, and
            // `ns` lives in the closure until then.
            unsafe {
                cmd.pre_exec(move || {
                    use std::os::fd::AsRawFd as _;
                    if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = match lifetime {
            Lifetime::Owned => {
                // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let (tx, rx) = mpsc::channel();
                spawner()
                    .lock()
                    .expect("spawner lock")
                    .send((cmd, tx))
                    .context("the spawner thread is gone")?;
                rx.recv().context("the spawner thread is gone")?
            }
            Lifetime::Detached => {
                // SAFETY: setsid is async-signal-safe.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::setsid() < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                cmd.spawn()
            }
        }
        .with_context(|| format!("starting {} ({})", spec.name, spec.program.display()))?;
        Ok(Process {
            pid: child.id(),
            spec,
            child: Some(child),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Err` with the log's last lines if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait()? {
            bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.spec.name,
                self.spec.log.display(),
                tail(&self.spec.log, 30)
            );
        }
        Ok(())
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            terminate(child.id(), grace);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL, as a crash: the process gets no chance to release anything (a leader Lease).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Forgets the child without stopping it (a detached process handed to `cluster down`).
    pub fn release(mut self) -> u32 {
        self.child.take();
        self.pid
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// SIGTERM to `pid`, waiting up to `grace` for it to go, then SIGKILL.
pub fn terminate(pid: u32, grace: Duration) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid.as_raw() as u32) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
