//! `cargo xtask docker`: a Docker engine (Debian's `docker.io`, installed by
//! `cargo xtask setup --docker`) that leaves the machine's own networking alone. dockerd runs in
//! a network namespace of its own (`ip netns exec kpr-docker`), so its `docker0` bridge, its
//! iptables NAT and filter chains and its forwarding sysctl exist only there; its data root,
//! exec root, socket, pid file and configuration are under `<target>/docker`, not `/var/lib/docker`,
//! `/run/docker.sock` or `/etc/docker`. The namespace has no link out: nothing dockerd starts can
//! send traffic anywhere but inside it.
//!
//! - `up` starts it in the background and prints `DOCKER_HOST`; `down` stops it, unmounts what it
//!   mounted, deletes the namespace and `<target>/docker`.
//! - `smoke` is up, `docker version` and `docker info` (checked: the server answers, with this
//!   data root; its `docker0` and NAT chains are in the namespace), down, and the machine's network
//!   state (iptables and ip6tables rules of both flavours, the nftables ruleset, routes, the
//!   forwarding sysctls) compared before, while dockerd runs, and after: any difference fails it,
//!   as does a `docker0` in the machine's namespace.
//!
//! Owns `<target>/docker` and the network namespace `kpr-docker`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::{Args, Subcommand};

use crate::exec::Cmd;
use crate::target_dir;

/// The network namespace dockerd runs in.
pub const NETNS: &str = "kpr-docker";
/// The Debian package (20.10 on Debian 12).
pub const PACKAGE: &str = "docker.io";

#[derive(Debug, Args)]
pub struct DockerArgs {
    #[command(subcommand)]
    pub command: DockerCommand,
}

#[derive(Debug, Subcommand)]
pub enum DockerCommand {
    /// Start dockerd in its network namespace, in the background; print DOCKER_HOST.
    Up,
    /// Stop dockerd, unmount, delete its namespace and <target>/docker.
    Down,
    /// Up, `docker version`, `docker info`, down; the machine's network state must not change.
    Smoke,
    /// Up, then kpr's image from deploy/Dockerfile (the Rust build stage included) on bases made
    /// here (xtask/src/image_build.rs); its build time and size are printed. The engine keeps
    /// running (`down` stops it).
    Image,
}

pub fn run(args: &DockerArgs) -> anyhow::Result<()> {
    match args.command {
        DockerCommand::Up => {
            let engine = up()?;
            println!("use it with:  export DOCKER_HOST={}", engine.host());
            println!("stop it with: cargo xtask docker down");
            Ok(())
        }
        DockerCommand::Down => down(),
        DockerCommand::Smoke => smoke(),
        DockerCommand::Image => crate::image_build::build(&up_saving_state()?),
    }
}

/// `<target>/docker`.
pub fn dir() -> PathBuf {
    target_dir().join("docker")
}

/// A running engine.
pub struct Engine {
    pub pid: u32,
    pub socket: PathBuf,
}

impl Engine {
    /// `unix://<socket>`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// `docker --host <socket> ...`, with Debian's client of the same release (another `docker`
    /// may come first on PATH).
    pub fn docker(&self) -> Cmd {
        Cmd::new(client()).arg("--host").arg(self.host())
    }
}

/// Debian's docker client if installed, else `docker` from PATH.
pub fn client() -> PathBuf {
    let client = Path::new(DEBIAN_CLIENT);
    if client.is_file() {
        client.to_path_buf()
    } else {
        PathBuf::from("docker")
    }
}

/// The client docker.io installs.
const DEBIAN_CLIENT: &str = "/usr/bin/docker";

fn socket() -> PathBuf {
    dir().join("docker.sock")
}

fn pid_file() -> PathBuf {
    dir().join("docker.pid")
}

/// Where [`up_saving_state`] keeps the machine's network state from before the engine started
/// (`cargo xtask kind --local --down` compares with it).
pub fn state_before_up() -> PathBuf {
    target_dir().join("kind/host-network.before")
}

/// [`up`]; if the engine does not run yet, the machine's network state is saved first to
/// [`state_before_up`].
pub fn up_saving_state() -> anyhow::Result<Engine> {
    if running().is_none() {
        let path = state_before_up();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(&path, host_network_state()?)?;
    }
    up()
}

/// Starts dockerd unless it runs already; waits until it answers.
pub fn up() -> anyhow::Result<Engine> {
    if let Some(pid) = running_pid() {
        println!("[ok] dockerd already runs (pid {pid})");
        return Ok(Engine {
            pid,
            socket: socket(),
        });
    }
    let dockerd = crate::setup::find_on_path("dockerd").with_context(|| {
        format!("dockerd is not installed: `cargo xtask setup --docker` installs {PACKAGE}")
    })?;
    let dir = dir();
    for sub in ["data", "exec", "logs"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    // Its own configuration file: /etc/docker/daemon.json, if the machine has one, is not read.
    // The daemon's identity key would go to /etc/docker/key.json (dockerd 20.10's default).
    let config = dir.join("daemon.json");
    let runtime = dir.join(BOUNDED_RUNC);
    fs::write(&runtime, BOUNDED_RUNC_SCRIPT)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o755))?;
    let settings = serde_json::json!({
        "deprecated-key-path": dir.join("key.json"),
        "runtimes": { BOUNDED_RUNC: { "path": runtime } },
        "default-runtime": BOUNDED_RUNC,
    });
    fs::write(&config, format!("{settings}\n"))?;
    if !Path::new("/run/netns").join(NETNS).exists() {
        Cmd::new("ip").args(["netns", "add", NETNS]).run()?;
    }
    Cmd::new("ip")
        .args(["-n", NETNS, "link", "set", "lo", "up"])
        .run()?;
    let log = fs::File::create(dir.join("logs/dockerd.log"))?;
    println!(
        "[start] dockerd in network namespace {NETNS}, root {}",
        dir.display()
    );
    // `ip netns exec` gives dockerd a mount namespace with a fresh /sys, without the cgroup
    // hierarchies mounted under it, which dockerd needs: the script mounts this machine's again
    // there (mounts in that namespace do not propagate back), then becomes dockerd.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let mut script = cgroup_mounts(&mountinfo);
    script.push_str("exec \"$@\"\n");
    let child = std::process::Command::new("ip")
        .args(["netns", "exec", NETNS, "sh", "-ec", &script, "dockerd"])
        .arg(&dockerd)
        .arg("--config-file")
        .arg(&config)
        .arg("--data-root")
        .arg(dir.join("data"))
        .arg("--exec-root")
        .arg(dir.join("exec"))
        .arg("--pidfile")
        .arg(pid_file())
        .arg("--host")
        .arg(format!("unix://{}", socket().display()))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting dockerd")?;
    let pid = child.id();
    *STARTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    let engine = Engine {
        pid,
        socket: socket(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Connecting first: a client asked too early prints an error each time.
        if std::os::unix::net::UnixStream::connect(&engine.socket).is_ok()
            && engine.docker().args(["version"]).quiet().read().is_ok()
        {
            break;
        }
        if !controlplane::process::alive(pid) || Instant::now() > deadline {
            let tail = controlplane::process::tail(&dir.join("logs/dockerd.log"), 30);
            let _ = down();
            bail!(
                "dockerd did not answer on {} within 60 s; its log:\n{tail}",
                engine.host()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    println!("[ok] dockerd runs (pid {pid}) at {}", engine.host());
    Ok(engine)
}

/// The runtime dockerd runs containers with: runc, given an OCI spec whose capabilities are those
/// of this machine's bounding set. dockerd 20.10 gives a `--privileged` container (every kind node
/// is one) every capability it knows, and runc fails (`unable to apply caps: operation not
/// permitted`) where the machine itself lacks one (these machines have no CAP_SYS_RESOURCE); and
/// it knows none of CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE, which pods in a node ask for.
const BOUNDED_RUNC: &str = "runc-bounded";
const BOUNDED_RUNC_SCRIPT: &str = r#"#!/bin/bash
# runc, with the capabilities of the container's spec (`create --bundle DIR`) or of the process
# (`exec --process FILE`) cut to this process's bounding set (xtask/src/docker.rs).
set -euo pipefail
spec=
filter=
prev=
for arg in "$@"; do
  case "$prev" in
    --bundle | -b) spec="$arg/config.json" filter=.process.capabilities ;;
    --process | -p) spec="$arg" filter=.capabilities ;;
  esac
  case "$arg" in
    --bundle=*) spec="${arg#--bundle=}/config.json" filter=.process.capabilities ;;
    --process=*) spec="${arg#--process=}" filter=.capabilities ;;
  esac
  prev="$arg"
done
if [ -n "$spec" ] && [ -f "$spec" ]; then
  bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
    LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
    SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
    SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
    CHECKPOINT_RESTORE)
  have=()
  missing=()
  for i in "${!names[@]}"; do
    if (( (bnd >> i & 1) == 0 )); then
      missing+=("\"CAP_${names[$i]}\"")
    else
      have+=("\"CAP_${names[$i]}\"")
    fi
  done
  # A privileged container's set (every capability dockerd knows, 37 or more) becomes every one
  # this machine has: dockerd 20.10 does not know CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE,
  # which the pods inside a kind node ask for. Any other set loses what the machine lacks.
  drop="[$(IFS=,; echo "${missing[*]}")]"
  all="[$(IFS=,; echo "${have[*]}")]"
  jq --argjson drop "$drop" --argjson all "$all" \
    "if $filter then $filter |= with_entries(.value = (if (.value | length) >= 37 then \$all else .value - \$drop end)) else . end" \
    "$spec" >"$spec.bounded"
  mv "$spec.bounded" "$spec"
fi
exec runc "$@"
"#;

/// Shell commands that mount, under /sys/fs/cgroup, what this machine has mounted there (the
/// tmpfs holding cgroup v1 hierarchies, each hierarchy with its controllers, the cgroup2 one), in
/// `/proc/self/mountinfo` order (parents first).
fn cgroup_mounts(mountinfo: &str) -> String {
    let mut script = String::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        if point != "/sys/fs/cgroup" && !point.starts_with("/sys/fs/cgroup/") {
            continue;
        }
        let mut fields = right.split(' ');
        let (Some(fstype), Some(source), Some(options)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // The superblock's options but `rw`/`ro` (the default, and the point's own is kept).
        let options: Vec<&str> = options
            .split(',')
            .filter(|o| *o != "rw" && *o != "ro")
            .collect();
        let options = if options.is_empty() {
            String::new()
        } else {
            format!(" -o {}", options.join(","))
        };
        script.push_str(&format!(
            "mkdir -p {point}; mount -t {fstype}{options} {source} {point}\n"
        ));
    }
    script
}

/// dockerd when this process started it: [`down`] reaps it (this machine's init may not).
static STARTED: std::sync::Mutex<Option<std::process::Child>> = std::sync::Mutex::new(None);

/// The engine, if it runs.
pub fn running() -> Option<Engine> {
    running_pid().map(|pid| Engine {
        pid,
        socket: socket(),
    })
}

/// dockerd's pid from its pid file, if that process runs.
fn running_pid() -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file()).ok()?.trim().parse().ok()?;
    controlplane::process::alive(pid).then_some(pid)
}

/// Stops dockerd (and the containerd it started), unmounts what is mounted under
/// `<target>/docker`, deletes the namespace and the directory.
pub fn down() -> anyhow::Result<()> {
    let dir = dir();
    if let Some(pid) = running_pid() {
        controlplane::process::terminate(pid, Duration::from_secs(20));
        println!("[ok] dockerd (pid {pid}) stopped");
    }
    if let Some(mut child) = STARTED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    // Whatever still names the directory (its containerd, shims): stopped too.
    for pid in processes_naming(&dir) {
        controlplane::process::terminate(pid, Duration::from_secs(10));
    }
    unmount_under(&dir)?;
    if Path::new("/run/netns").join(NETNS).exists() {
        Cmd::new("ip").args(["netns", "delete", NETNS]).run()?;
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    println!("[ok] docker engine down, {} removed", dir.display());
    Ok(())
}

/// Processes whose command line names `dir`.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Unmounts every mount point under `dir`, deepest first.
fn unmount_under(dir: &Path) -> anyhow::Result<()> {
    let mounts = fs::read_to_string("/proc/self/mountinfo")?;
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        Cmd::new("umount").args(["-l", point]).run()?;
    }
    Ok(())
}

/// The machine's own network state, as text: what dockerd would change if it ran there.
pub fn host_network_state() -> anyhow::Result<String> {
    let mut out = String::new();
    let commands: &[&[&str]] = &[
        &["iptables-nft-save"],
        &["ip6tables-nft-save"],
        &["iptables-legacy-save"],
        &["ip6tables-legacy-save"],
        &["nft", "list", "ruleset"],
        &["ip", "route", "show", "table", "all"],
        &["ip", "-6", "route", "show", "table", "all"],
        &[
            "sysctl",
            "net.ipv4.ip_forward",
            "net.ipv6.conf.all.forwarding",
        ],
    ];
    for argv in commands {
        let text = Cmd::new(argv[0]).args(&argv[1..]).quiet().read()?;
        // The save commands stamp the time they ran.
        let text: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        out.push_str(&format!("$ {}\n{}\n", argv.join(" "), text.join("\n")));
    }
    Ok(out)
}

/// `cargo xtask docker smoke`.
pub fn smoke() -> anyhow::Result<()> {
    let started = Instant::now();
    let before = host_network_state()?;
    let result = (|| -> anyhow::Result<()> {
        let engine = up()?;
        let version = engine
            .docker()
            .args([
                "version",
                "--format",
                "{{.Client.Version}} {{.Server.Version}}",
            ])
            .read()?;
        println!("docker version (client server): {}", version.trim());
        ensure!(
            version.split_whitespace().count() == 2,
            "docker version did not name a server version: {version}"
        );
        let info = engine.docker().args(["info"]).read()?;
        println!("{info}");
        let root = format!("Docker Root Dir: {}", dir().join("data").display());
        ensure!(
            info.contains(&root),
            "docker info does not show the data root under target/ ({root})"
        );
        // The bridge and its NAT are dockerd's, in its namespace, and not the machine's.
        let rules = Cmd::new("ip")
            .args(["netns", "exec", NETNS, "iptables-save", "-t", "nat"])
            .read()?;
        ensure!(
            rules.contains("DOCKER"),
            "no DOCKER chain in {NETNS}'s nat table: dockerd did not set up its NAT there:\n{rules}"
        );
        Cmd::new("ip")
            .args(["-n", NETNS, "link", "show", "docker0"])
            .run()?;
        ensure!(
            !Path::new("/sys/class/net/docker0").exists(),
            "a docker0 link exists in the machine's own network namespace"
        );
        compare(&before, &host_network_state()?, "while dockerd runs")
    })();
    let stopped = down();
    result?;
    stopped?;
    compare(&before, &host_network_state()?, "after dockerd stopped")?;
    println!(
        "[ok] docker smoke: version and info answered in {NETNS}; the machine's iptables, \
         nftables, routes and forwarding are unchanged ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Fails with the lines that differ between two [`host_network_state`]s.
pub fn compare(before: &str, now: &str, when: &str) -> anyhow::Result<()> {
    if before != now {
        bail!(
            "the machine's network state changed ({when}):\n{}",
            diff_lines(before, now).join("\n")
        );
    }
    println!("[ok] the machine's network state is unchanged ({when})");
    Ok(())
}

/// Lines only in `before` (`-`) or only in `after` (`+`).
fn diff_lines(before: &str, after: &str) -> Vec<String> {
    let b: std::collections::BTreeSet<&str> = before.lines().collect();
    let a: std::collections::BTreeSet<&str> = after.lines().collect();
    b.difference(&a)
        .map(|l| format!("- {l}"))
        .chain(a.difference(&b).map(|l| format!("+ {l}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_hierarchies_are_mounted_again_parents_first() {
        let mountinfo = "\
24 1 0:22 / /sys rw,nosuid - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 1 0:40 / /sys/fs/cgroupx rw - tmpfs tmpfs rw
";
        assert_eq!(
            cgroup_mounts(mountinfo),
            "mkdir -p /sys/fs/cgroup; mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup\n\
             mkdir -p /sys/fs/cgroup/cpu; mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu\n\
             mkdir -p /sys/fs/cgroup/systemd; mount -t cgroup -o name=systemd cgroup /sys/fs/cgroup/systemd\n\
             mkdir -p /sys/fs/cgroup/unified; mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified\n"
        );
    }

    #[test]
    fn differences_are_listed_both_ways() {
        let diff = diff_lines("a\nb\n", "b\nc\n");
        assert_eq!(diff, ["- a", "+ c"]);
        assert!(diff_lines("x\n", "x\n").is_empty());
    }
}
