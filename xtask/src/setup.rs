//! `cargo xtask setup`: installs what building and testing kpr needs, skipping what is present.
//! Idempotent, one line per step, no standard input (Debian 12, as root). Presence is checked by
//! looking at the filesystem (dpkg's status file, rustup's toolchain directories, PATH), so a machine
//! that has everything runs no command at all.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use crate::exec::Cmd;

/// Debian packages: the dataplanes' tools, the VM runner, and LLVM 22 for bpf-linker. gcc and
/// libc6-dev are the host linker a rustup-only machine may lack. containerd, runc, the CNI plugins
/// and socat run the nodes of `cargo xtask cluster up --nodes N`; curl, wget, netcat-openbsd,
/// bind9-dnsutils and bash go into the test images built from this machine's files.
pub const APT_PACKAGES: &[&str] = &[
    "nftables",
    "iptables",
    "iproute2",
    // The XDP tests turn GRO on for the veth peer an XDP_TX sends to (the kernel delivers to a
    // veth only with NAPI on, which an XDP program or GRO enables on it).
    "ethtool",
    "conntrack",
    "kmod",
    "qemu-system-x86",
    "busybox-static",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "gcc",
    "libc6-dev",
    "make",
    "bzip2",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "socat",
    "curl",
    "wget",
    "netcat-openbsd",
    "bind9-dnsutils",
    "bash",
    // The e2e images (crate::e2e_images::HOST_PACKAGES).
    "apache2-bin",
    "nginx",
    "stress",
    "perl-base",
    "util-linux",
];

const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const DPKG_STATUS: &str = "/var/lib/dpkg/status";

#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// Also build the reference Kubernetes binaries (kube-apiserver, kube-controller-manager,
    /// kube-scheduler, kube-proxy, kubectl, etcd, kwok) into target/k8s/bin with Go.
    #[arg(long)]
    pub k8s: bool,
    /// Also build Helm (pinned in xtask/k8s/helm/go.mod) into target/helm/bin, for the chart in
    /// deploy/helm/kpr.
    #[arg(long)]
    pub helm: bool,
    /// Also install Debian's Docker engine (docker.io), which `cargo xtask docker` runs in a
    /// network namespace of its own. Installing starts no daemon.
    #[arg(long)]
    pub docker: bool,
    /// Also what `cargo xtask kind --local` needs: the Docker engine (as --docker), debootstrap,
    /// and kind, crictl and kubeadm built (pinned in xtask/k8s/kind/go.mod) into target/kind/bin.
    #[arg(long)]
    pub kind: bool,
}

/// `cargo xtask setup [--k8s] [--helm]`.
pub fn run_with(args: &SetupArgs) -> anyhow::Result<()> {
    run()?;
    if args.k8s {
        crate::k8s::build()?;
    }
    if args.helm {
        crate::helm::build()?;
    }
    if args.docker || args.kind {
        docker_engine()?;
        debian_package("jq", "the engine's runtime wrapper edits OCI specs with it")?;
    }
    if args.kind {
        debian_package(
            "debootstrap",
            "building the kind node image's root filesystem",
        )?;
        crate::kind_tools::build()?;
    }
    Ok(())
}

/// Runs every step; the first failing step stops setup with its error.
pub fn run() -> anyhow::Result<()> {
    apt_packages()?;
    nightly_toolchain()?;
    crate::fuzz::ensure_cargo_fuzz()?;
    host_components()?;
    bpf_linker()?;
    crate::vm::ensure_tools()?;
    crate::vm::ensure_kernels()
}

fn apt_packages() -> anyhow::Result<()> {
    let status = fs::read_to_string(DPKG_STATUS)
        .with_context(|| format!("reading {DPKG_STATUS} (setup supports Debian 12 only)"))?;
    let installed = installed_packages(&status);
    let mut missing = Vec::new();
    for &package in APT_PACKAGES {
        if installed.contains(&package) {
            println!("[ok] {package} already installed");
        } else {
            println!("[install] {package}");
            missing.push(package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    require_root("installing Debian packages")?;
    let apt = |args: &[&str]| {
        Cmd::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
    };
    apt(&["update", "-q"]).run()?;
    // nginx's postinst would start a web server on the machine's port 80 (the e2e images take
    // only its binary).
    without_service_starts(|| {
        apt(&["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .run()
    })
}

/// Debian's docker.io, without starting its service: on a machine with an init system its
/// postinst would start dockerd in the machine's own network namespace, with its bridge and NAT
/// rules there. A policy-rc.d that refuses every start is put in place for the installation (the
/// machine's own, if it has one, is restored after), and `docker.service` and `docker.socket` are
/// masked where systemd runs.
fn docker_engine() -> anyhow::Result<()> {
    let status = fs::read_to_string(DPKG_STATUS)
        .with_context(|| format!("reading {DPKG_STATUS} (setup supports Debian 12 only)"))?;
    let package = crate::docker::PACKAGE;
    if installed_packages(&status).contains(&package) {
        println!("[ok] {package} already installed");
        return Ok(());
    }
    require_root("installing Debian packages")?;
    println!("[install] {package} (its service is not started: `cargo xtask docker up` runs it)");
    let systemd = Path::new("/run/systemd/system").is_dir();
    if systemd {
        Cmd::new("systemctl")
            .args(["mask", "docker.service", "docker.socket"])
            .run()?;
    }
    without_service_starts(|| {
        Cmd::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .run()
    })
}

/// One Debian package, installed unless it is.
fn debian_package(package: &str, why: &str) -> anyhow::Result<()> {
    let status = fs::read_to_string(DPKG_STATUS)
        .with_context(|| format!("reading {DPKG_STATUS} (setup supports Debian 12 only)"))?;
    if installed_packages(&status).contains(&package) {
        println!("[ok] {package} already installed");
        return Ok(());
    }
    require_root("installing Debian packages")?;
    println!("[install] {package} ({why})");
    Cmd::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()
}

/// Runs `install` with a policy-rc.d that refuses every service start (invoke-rc.d and
/// deb-systemd-invoke ask it), the machine's own, if it has one, restored after.
fn without_service_starts(install: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let saved = Path::new("/usr/sbin/policy-rc.d.kpr-saved");
    let had_one = policy.exists();
    if had_one {
        fs::rename(policy, saved)?;
    }
    fs::write(
        policy,
        "#!/bin/sh\n# cargo xtask setup: start no service.\nexit 101\n",
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(policy, fs::Permissions::from_mode(0o755))?;
    let installed = install();
    if had_one {
        fs::rename(saved, policy)?;
    } else {
        fs::remove_file(policy)?;
    }
    installed
}

/// Names of the packages dpkg lists as `install ok installed`.
fn installed_packages(status: &str) -> Vec<&str> {
    status
        .split("\n\n")
        .filter(|stanza| stanza.lines().any(|l| l == "Status: install ok installed"))
        .filter_map(|stanza| stanza.lines().find_map(|l| l.strip_prefix("Package: ")))
        .collect()
}

/// The dated nightly the eBPF crate builds with, from `proxy-ebpf/rust-toolchain.toml` (the one
/// place it is pinned; proxy/build.rs reads it too).
pub fn pinned_nightly() -> anyhow::Result<String> {
    let path = crate::workspace_root().join("proxy-ebpf/rust-toolchain.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    toolchain_channel(&text)
        .with_context(|| format!("no `channel = \"...\"` in {}", path.display()))
}

fn toolchain_channel(toml: &str) -> Option<String> {
    toml.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "channel").then(|| value.trim().trim_matches('"').to_string())
    })
}

fn nightly_toolchain() -> anyhow::Result<()> {
    let home = rustup_home()?;
    let channel = pinned_nightly()?;
    let Some(nightly) = find_toolchain(&home, &format!("{channel}-"))? else {
        println!("[install] {channel} toolchain with rust-src and clippy");
        return Cmd::new("rustup")
            .args(["toolchain", "install", &channel, "--profile", "minimal"])
            .args(["--component", "rust-src,clippy"])
            .run();
    };
    println!(
        "[ok] {channel} toolchain already installed ({})",
        nightly.display()
    );
    let mut wanted = Vec::new();
    if nightly.join("lib/rustlib/src/rust/library").is_dir() {
        println!("[ok] rust-src already installed for {channel}");
    } else {
        println!("[install] rust-src for {channel}");
        wanted.push("rust-src");
    }
    if nightly.join("bin/cargo-clippy").is_file() {
        println!("[ok] clippy already installed for {channel}");
    } else {
        println!("[install] clippy for {channel}");
        wanted.push("clippy");
    }
    component_add(&channel, &wanted)
}

/// clippy and rustfmt for the toolchain that runs xtask (the one `cargo xtask test` lints with).
fn host_components() -> anyhow::Result<()> {
    let Ok(name) = env::var("RUSTUP_TOOLCHAIN") else {
        println!("[ok] not run through rustup: clippy and rustfmt are assumed present");
        return Ok(());
    };
    let toolchain = rustup_home()?.join("toolchains").join(&name);
    let mut wanted = Vec::new();
    for (component, binary) in [("clippy", "cargo-clippy"), ("rustfmt", "rustfmt")] {
        if toolchain.join("bin").join(binary).is_file() || !toolchain.is_dir() {
            println!("[ok] {component} already installed for {name}");
        } else {
            println!("[install] {component} for {name}");
            wanted.push(component);
        }
    }
    component_add(&name, &wanted)
}

fn component_add(toolchain: &str, components: &[&str]) -> anyhow::Result<()> {
    if components.is_empty() {
        return Ok(());
    }
    Cmd::new("rustup")
        .args(["component", "add"])
        .args(components)
        .args(["--toolchain", toolchain])
        .run()
}

fn bpf_linker() -> anyhow::Result<()> {
    if let Some(found) =
        find_on_path("bpf-linker").or_else(|| existing(cargo_home().join("bin/bpf-linker")))
    {
        println!("[ok] bpf-linker already installed ({})", found.display());
        return Ok(());
    }
    println!("[install] bpf-linker (about 90 s)");
    // bpf-linker 0.13 reads LLVM_PREFIX; llvm-sys reads LLVM_SYS_221_PREFIX.
    Cmd::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        .run()
}

pub(crate) fn rustup_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = env::var_os("RUSTUP_HOME") {
        return Ok(home.into());
    }
    let home = env::var_os("HOME").context("neither RUSTUP_HOME nor HOME is set")?;
    Ok(Path::new(&home).join(".rustup"))
}

pub(crate) fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

/// The installed toolchain directory whose name starts with `prefix` (e.g. `nightly-`).
fn find_toolchain(rustup_home: &Path, prefix: &str) -> anyhow::Result<Option<PathBuf>> {
    let dir = rustup_home.join("toolchains");
    if !dir.is_dir() {
        bail!(
            "no rustup toolchains at {}: install Rust with rustup (https://rustup.rs) first",
            dir.display()
        );
    }
    let entries = fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// The first executable file called `name` in a PATH directory.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = env::var_os("PATH")?;
    env::split_paths(&paths).find_map(|dir| existing(dir.join(name)))
}

fn existing(path: PathBuf) -> Option<PathBuf> {
    path.is_file().then_some(path)
}

fn require_root(what: &str) -> anyhow::Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1));
    if euid == Some("0") {
        Ok(())
    } else {
        bail!("{what} needs root: run `cargo xtask setup` as root (effective uid is {euid:?})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fully_installed_packages_count() {
        let status = "Package: nftables\nStatus: install ok installed\nVersion: 1\n\n\
                      Package: kmod\nStatus: deinstall ok config-files\n\n\
                      Package: gcc\nVersion: 12\nStatus: install ok installed\n";
        assert_eq!(installed_packages(status), vec!["nftables", "gcc"]);
    }

    #[test]
    fn the_nightly_is_pinned_by_date() {
        let channel = pinned_nightly().unwrap();
        assert!(channel.starts_with("nightly-20"), "{channel}");
        assert_eq!(
            toolchain_channel("[toolchain]\nchannel = \"nightly-2026-05-19\"\n").as_deref(),
            Some("nightly-2026-05-19")
        );
    }

    #[test]
    fn this_machine_has_dpkg_status_with_packages() {
        let status = fs::read_to_string(DPKG_STATUS).unwrap();
        assert!(installed_packages(&status).contains(&"iproute2"));
    }
}
