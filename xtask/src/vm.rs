//! `cargo xtask vm`: the project's tests inside VMs, one per Debian kernel, so the kernel-facing
//! suites (nftables, iptables, eBPF, netns) are checked on the kernels we claim and not only on
//! the build machine's.
//!
//! Owns: `target/vm/` (downloaded kernel packages, extracted kernels, per-kernel plan files; never
//! committed), the KVM probe, the guest runs (virtme-ng over the host's root filesystem, running
//! `tests/vm/guest.sh`), the watchdog, and the verdict read from the guest's output. Test binaries
//! are built on the host; nothing here touches the host's own networking, everything kernel-facing
//! happens inside the guest kernel. See docs/VM.md for the choices and the per-kernel notes.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead as _, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

/// The full matrix: the oldest series we claim (6.1: its oldest and newest point releases
/// reachable here) and a current one (6.12). Only these two series are in this machine's apt
/// sources (bookworm, bookworm-security, bookworm-updates); see docs/VM.md.
pub const MATRIX: &[&str] = &["6.1.0-47", "6.1.0-56", "6.12.117+deb12"];

/// The kernel `--smoke` boots: the oldest series, where the fallbacks (clsact instead of TCX)
/// are exercised.
pub const SMOKE_KERNEL: &str = "6.1.0-56";

/// `--smoke`: one fast test per kernel-facing suite (suite name, libtest filters), and the SCTP
/// row of the conformance table, which only the guests' kernels can run.
pub const SMOKE: &[(&str, &[&str])] = &[
    ("rules_nftables", &["interleaved_services_each_round_robin"]),
    (
        "rules_iptables",
        &["nft::interleaved_services_each_round_robin"],
    ),
    (
        "ebpf_socket_lb",
        &["session_affinity_sticks_to_one_endpoint"],
    ),
    (
        "userspace",
        &["a_service_without_endpoints_rejects_at_once"],
    ),
    (
        "conformance",
        &["ebpf::node_port_from_external", "nftables::sctp"],
    ),
];

/// Suites whose ignored tests need what this machine kind's kernel lacks (the conformance
/// table's SCTP rows) and run in the guests: they get `--include-ignored` there.
pub const INCLUDE_IGNORED: &[&str] = &["conformance"];

/// Set in the guest by `--selftest-fail`: the hidden test [`SELFTEST_TEST`] then fails.
pub const SELFTEST_ENV: &str = "KPR_VM_SELFTEST_FAIL";
const SELFTEST_SUITE: &str = "xtask (lib)";
const SELFTEST_TEST: &str = "vm::tests::selftest_fails_when_asked";

const GUEST_SCRIPT: &str = "tests/vm/guest.sh";

#[derive(Debug, Args)]
pub struct VmArgs {
    /// Debian kernel to boot, as in `linux-image-<VERSION>-amd64` (e.g. 6.1.0-56,
    /// 6.12.117+deb12); repeat for several. Default: the full matrix, or one kernel with --smoke.
    #[arg(long = "kernel", value_name = "VERSION")]
    pub kernels: Vec<String>,
    /// Boot one kernel and run one fast test of each kernel-facing suite (for CI).
    #[arg(long)]
    pub smoke: bool,
    /// Seconds a guest may run in all before it is ended and counted as failed.
    /// Default: 900 with --smoke, 3600 otherwise.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Watchdog: seconds a guest may print nothing before it is ended and counted as failed.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub idle_timeout: u64,
    /// Only the test binaries with these suite names (e.g. rules_nftables, "proxy (lib)").
    /// Default: every kernel-facing suite (rules_*, ebpf_*, userspace, conformance,
    /// controlplane_e2e).
    #[arg(long = "suite", value_name = "NAME")]
    pub suites: Vec<String>,
    /// Also run a hidden test that fails on purpose, to show a failure is reported by name.
    #[arg(long)]
    pub selftest_fail: bool,
    /// Skip the KVM probe and use TCG (software emulation).
    #[arg(long)]
    pub tcg: bool,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest memory (qemu syntax).
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// Show the guest kernel's boot console too.
    #[arg(long)]
    pub verbose: bool,
    /// Arguments for every test binary after `--`, e.g. a name filter.
    #[arg(last = true)]
    pub test_args: Vec<String>,
}

/// Installs what the VM runner needs, skipping what is present: qemu, a static busybox (virtme-ng
/// builds an initramfs with it, since Debian kernels have 9p as a module) and virtme-ng from PyPI.
pub fn ensure_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("dpkg-deb", "dpkg"),
    ]
    .into_iter()
    .filter(|(program, _)| find_on_path(program).is_none())
    .map(|(_, package)| package)
    .collect();
    if missing.is_empty() {
        println!("[ok] qemu-system-x86, busybox-static already installed");
    } else {
        Cmd::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .run()?;
    }
    if find_on_path("vng").is_some() {
        println!("[ok] virtme-ng already installed");
        return Ok(());
    }
    let pip = || Cmd::new("python3").args(["-m", "pip", "install", "--quiet", "virtme-ng"]);
    if pip().run().is_err() {
        // Debian's own python3 refuses pip installs outside a venv (PEP 668); virtme-ng is a
        // standalone tool, so install it anyway, as its documentation suggests.
        pip()
            .arg("--break-system-packages")
            .run()
            .context("installing virtme-ng from PyPI")?;
    }
    // pyenv puts new console scripts on PATH only after a rehash; harmless elsewhere.
    if find_on_path("pyenv").is_some() {
        Cmd::new("pyenv").arg("rehash").run()?;
    }
    if find_on_path("vng").is_none() {
        bail!(
            "virtme-ng installed, but `vng` is not on PATH (PATH={:?})",
            std::env::var("PATH")
        );
    }
    Ok(())
}

/// Downloads and extracts the smoke kernel (cached under target/vm/, skipped when present).
pub fn ensure_kernels() -> anyhow::Result<()> {
    // Only the smoke kernel: `cargo xtask test` boots it; the full matrix fetches the others
    // when it runs, so `setup` (run by `demo` too) downloads one kernel package, not three.
    fetch_kernel(SMOKE_KERNEL).map(drop)
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

pub fn run(args: &VmArgs) -> anyhow::Result<()> {
    ensure_tools()?;
    let kernels = kernels(args);
    let images = kernels
        .iter()
        .map(|version| fetch_kernel(version))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let kvm = !args.tcg && probe_kvm(&images[0]);
    // Under KVM a guest runs the agent as fast as the host does: the plain `cargo build` binaries
    // (which `cargo xtask test` has already built) serve. Under TCG an unoptimised agent takes
    // seconds to start and to sync, and every conformance test starts one.
    let agent = if kvm {
        crate::Profile::Debug
    } else {
        crate::Profile::Release
    };
    let (suites, build_failure) = build_suites(agent)?;
    if let Some(failure) = &build_failure {
        println!("warning: {failure}; running the test binaries that built");
    }
    let plan = plan(args, &suites)?;
    let mut results = Vec::new();
    for (version, image) in kernels.iter().zip(&images) {
        let started = Instant::now();
        let failures = run_guest(args, version, image, &plan, kvm, agent)?;
        let elapsed = started.elapsed();
        println!(
            "[{version}] {} in {:.0} s",
            if failures.is_empty() {
                "passed"
            } else {
                "FAILED"
            },
            elapsed.as_secs_f64()
        );
        results.push((version.clone(), elapsed, failures));
    }
    if let Some(failure) = build_failure {
        results.push(("host build".to_owned(), Duration::ZERO, vec![failure]));
    }
    summarize(&results)
}

/// One test binary built on the host, as cargo reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suite {
    /// The test target's name, with ` (lib)` / ` (bin)` for unit tests of those targets.
    pub name: String,
    pub executable: PathBuf,
    /// The package directory: tests run there, as under `cargo test`.
    pub dir: PathBuf,
}

/// One line of the plan: a suite and its libtest arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlanEntry {
    suite: Suite,
    args: Vec<String>,
    /// A filtered entry that must run at least one test (a filter matching nothing is a failure,
    /// not a silent pass).
    must_match: bool,
}

/// Builds the binaries the tests spawn and every test binary, and returns the latter. A test
/// build that fails for some targets (`--no-fail-fast` builds the others) is returned as a failure
/// to report, so a half-built workspace still runs what it can and still fails the run.
fn build_suites(agent: crate::Profile) -> anyhow::Result<(Vec<Suite>, Option<String>)> {
    let root = workspace_root();
    // The agent and the probe in `agent`'s profile (the test binaries themselves stay as cargo
    // test builds them).
    let release = (agent == crate::Profile::Release).then_some("--release");
    Cmd::new("cargo")
        .arg("build")
        .args(release)
        .args(["-p", "proxy", "-p", "kpr-tests", "--bins"])
        .dir(&root)
        .run()?;
    // Through sh so the JSON survives a failing build: cargo's status comes as a last line.
    let output = Cmd::new("sh")
        .args(["-c", "cargo \"$@\"; echo \"cargo-status $?\"", "sh"])
        .args(["test", "--workspace", "--no-run", "--no-fail-fast"])
        .arg("--message-format=json-render-diagnostics")
        .dir(&root)
        .read()?;
    let status = output
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("cargo-status "))
        .unwrap_or("?");
    let failure = (status != "0").then(|| {
        format!("`cargo test --workspace --no-run` failed (status {status}): some test binaries did not build (errors above)")
    });
    Ok((parse_test_executables(&output)?, failure))
}

/// The test executables in `cargo test --no-run --message-format=json` output.
fn parse_test_executables(json: &str) -> anyhow::Result<Vec<Suite>> {
    let mut suites = Vec::new();
    for line in json.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("cargo printed a line that is not JSON: {line}"))?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let target = &message["target"];
        let name = target["name"].as_str().unwrap_or("?");
        let kind = target["kind"][0].as_str().unwrap_or("?");
        let manifest = message["manifest_path"]
            .as_str()
            .with_context(|| format!("cargo artifact {name} has no manifest_path"))?;
        suites.push(Suite {
            name: if kind == "test" {
                name.to_owned()
            } else {
                format!("{name} ({kind})")
            },
            executable: executable.into(),
            dir: Path::new(manifest)
                .parent()
                .unwrap_or(Path::new("/"))
                .to_owned(),
        });
    }
    if suites.is_empty() {
        bail!("`cargo test --no-run` reported no test executable");
    }
    Ok(suites)
}

fn plan(args: &VmArgs, suites: &[Suite]) -> anyhow::Result<Vec<PlanEntry>> {
    let find = |name: &str| {
        suites.iter().find(|s| s.name == name).with_context(|| {
            let names: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
            format!("no test binary named {name:?}; built: {}", names.join(", "))
        })
    };
    let mut plan = Vec::new();
    if args.smoke {
        for &(name, filters) in SMOKE {
            let mut entry_args: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
            entry_args.extend(args.test_args.iter().cloned());
            plan.push(PlanEntry {
                suite: find(name)?.clone(),
                args: with_ignored(name, entry_args),
                must_match: true,
            });
        }
    } else {
        for name in &args.suites {
            find(name)?;
        }
        let chosen = suites.iter().filter(|s| {
            if args.suites.is_empty() {
                is_kernel_facing(&s.name)
            } else {
                args.suites.contains(&s.name)
            }
        });
        for suite in chosen {
            plan.push(PlanEntry {
                suite: suite.clone(),
                args: with_ignored(&suite.name, args.test_args.clone()),
                must_match: false,
            });
        }
    }
    if args.selftest_fail {
        plan.push(PlanEntry {
            suite: Suite {
                name: format!("{SELFTEST_SUITE} selftest"),
                ..find(SELFTEST_SUITE)?.clone()
            },
            args: ["--exact", "--include-ignored", SELFTEST_TEST]
                .map(String::from)
                .to_vec(),
            must_match: true,
        });
    }
    Ok(plan)
}

/// `args` with `--include-ignored` for the suites of [`INCLUDE_IGNORED`].
fn with_ignored(suite: &str, mut args: Vec<String>) -> Vec<String> {
    if INCLUDE_IGNORED.contains(&suite) && !args.iter().any(|a| a == "--include-ignored") {
        args.push("--include-ignored".into());
    }
    args
}

/// The suites the full matrix runs by default: those whose outcome depends on the kernel
/// (nftables, iptables, eBPF, network namespaces). Unit tests and the control plane's API tests
/// are the same on every kernel and run on the host (`--suite NAME` runs any suite).
pub fn is_kernel_facing(suite: &str) -> bool {
    suite.starts_with("rules_")
        || suite.starts_with("ebpf_")
        || ["userspace", "conformance", "controlplane_e2e"].contains(&suite)
}

fn kernels(args: &VmArgs) -> Vec<String> {
    if !args.kernels.is_empty() {
        args.kernels.clone()
    } else if args.smoke {
        vec![SMOKE_KERNEL.to_owned()]
    } else {
        MATRIX.iter().map(|&k| k.to_owned()).collect()
    }
}

fn vm_dir() -> PathBuf {
    target_dir().join("vm")
}

/// Downloads `linux-image-<version>-amd64` (once) and extracts it (once) under target/vm/;
/// returns the vmlinuz path. The modules sit next to it in `lib/modules/`, where virtme-ng looks.
fn fetch_kernel(version: &str) -> anyhow::Result<PathBuf> {
    let package = format!("linux-image-{version}-amd64");
    let dir = vm_dir().join("kernels").join(version);
    let image = dir.join(format!("boot/vmlinuz-{version}-amd64"));
    if image.is_file() {
        println!("[ok] kernel {version} cached at {}", dir.display());
        return Ok(image);
    }
    let debs = vm_dir().join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let deb = match find_deb(&debs, &package)? {
        Some(deb) => deb,
        None => {
            let download = || {
                Cmd::new("apt-get")
                    .args(["download", "-q", &package])
                    .dir(&debs)
                    .run()
            };
            download()
                .or_else(|_| {
                    // A fresh machine's package lists may predate this kernel package.
                    Cmd::new("apt-get").args(["update", "-q"]).run()?;
                    download()
                })
                .with_context(|| {
                    format!("downloading {package} (`apt-cache search linux-image | grep amd64` lists what exists)")
                })?;
            find_deb(&debs, &package)?.with_context(|| {
                format!(
                    "apt-get download left no {package}_*.deb in {}",
                    debs.display()
                )
            })?
        }
    };
    // Not with_extension: versions hold dots. Extracted beside, renamed when complete.
    let kernels = vm_dir().join("kernels");
    fs::create_dir_all(&kernels).with_context(|| format!("creating {}", kernels.display()))?;
    let partial = kernels.join(format!("{version}.partial"));
    if partial.exists() {
        fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    Cmd::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&partial)
        .run()?;
    if !partial
        .join(format!("boot/vmlinuz-{version}-amd64"))
        .is_file()
    {
        bail!("{} holds no boot/vmlinuz-{version}-amd64", deb.display());
    }
    fs::rename(&partial, &dir)
        .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
    Ok(image)
}

fn find_deb(dir: &Path, package: &str) -> anyhow::Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Whether KVM really runs a guest: boots `image` with no root filesystem under KVM, which ends
/// in a kernel panic within seconds when KVM works. On this project's machine /dev/kvm exists but
/// the guest hangs after an emulation failure, hence the hard timeout.
fn probe_kvm(image: &Path) -> bool {
    if !Path::new("/dev/kvm").exists() {
        println!("KVM probe: no /dev/kvm, using TCG");
        return false;
    }
    let output = Cmd::new("sh")
        .args([
            "-c",
            "exec 2>&1; exec timeout -s KILL 20 qemu-system-x86_64 \"$@\"",
            "kvm-probe",
        ])
        .args([
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
        ])
        .args([
            "-no-reboot",
            "-serial",
            "stdio",
            "-append",
            "console=ttyS0 panic=-1",
            "-kernel",
        ])
        .arg(image)
        .read();
    let works = matches!(&output, Ok(text) if text.contains("Kernel panic"));
    if works {
        println!("KVM probe: a guest booted under KVM, using KVM");
    } else {
        println!("KVM probe: no guest kernel ran to its end under KVM within 20 s, using TCG");
    }
    works
}

/// Boots one kernel, streams the guest's output with a `[version]` prefix, and returns the
/// failures (empty when every planned suite passed).
fn run_guest(
    args: &VmArgs,
    version: &str,
    image: &Path,
    plan: &[PlanEntry],
    kvm: bool,
    agent: crate::Profile,
) -> anyhow::Result<Vec<String>> {
    let run_dir = vm_dir().join("run").join(version);
    fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    // One plan per run: two runs on the same kernel (two engineers, one machine) must not
    // rewrite each other's plan while a guest reads it.
    let plan_file = run_dir.join(format!("plan-{}.tsv", std::process::id()));
    fs::write(&plan_file, render_plan(plan))
        .with_context(|| format!("writing {}", plan_file.display()))?;
    let root = workspace_root();
    let mut guest_env = format!(
        // Emulated guests are slow: the agents the tests start get 180 s to become healthy.
        "env RUST_BACKTRACE=1 KPR_TEST_READY_TIMEOUT=180 KPR_PROXY_BIN={} KPR_PROBE_BIN={}",
        agent.dir().join("proxy").display(),
        agent.dir().join("probe").display()
    );
    if args.selftest_fail {
        write!(guest_env, " {SELFTEST_ENV}=1").expect("writing to a String");
    }
    let script = format!(
        "{guest_env} bash {} {}",
        root.join(GUEST_SCRIPT).display(),
        plan_file.display()
    );
    let mut cmd = Cmd::new("vng")
        .arg("--run")
        .arg(image)
        .args([
            "--force-9p",
            "--cpus",
            &args.cpus.to_string(),
            "--memory",
            &args.memory,
        ])
        .args(["--name", "kpr-vm", "--exec", &script])
        .dir(&root);
    if !kvm {
        cmd = cmd.arg("--disable-kvm");
    }
    // The guest's script output reaches the host only on the serial console: virtme-ng-init
    // finds no virtio-serial script ports without udev (Debian kernels) and falls back to the
    // console, which vng shows only with --verbose. loglevel=1 keeps the kernel's own messages
    // off it (after the early boot lines) unless the user asked to see them.
    cmd = cmd.arg("--verbose");
    if !args.verbose {
        cmd = cmd.args(["--append", "loglevel=1"]);
    }
    let timeout = Duration::from_secs(args.timeout.unwrap_or(if args.smoke { 900 } else { 3600 }));
    let mut report = GuestReport::default();
    let ended = stream(
        cmd.spawn_piped()?,
        version,
        timeout,
        Duration::from_secs(args.idle_timeout),
        &mut report,
    )?;
    let mut failures = report.failures(plan);
    if let Some(reason) = ended {
        failures.push(reason);
    }
    Ok(failures)
}

fn render_plan(plan: &[PlanEntry]) -> String {
    let mut text = String::new();
    for entry in plan {
        let fields = [
            entry.suite.name.clone(),
            entry.suite.dir.display().to_string(),
            entry.suite.executable.display().to_string(),
        ];
        let line: Vec<String> = fields
            .into_iter()
            .chain(entry.args.iter().cloned())
            .collect();
        text.push_str(&line.join("\t"));
        text.push('\n');
    }
    text
}

/// Prints every line the guest prints, prefixed, feeding `report`; ends the guest (its whole
/// process group) when it runs past `timeout` or prints nothing but kernel messages for `idle`
/// (a guest stuck in a soft lockup keeps printing the kernel's lockup warnings, and those must
/// not keep it alive). Returns why it was ended, if it was.
fn stream(
    mut child: Child,
    version: &str,
    timeout: Duration,
    idle: Duration,
    report: &mut GuestReport,
) -> anyhow::Result<Option<String>> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().context("guest stdout was not piped")?;
    let stderr = child.stderr.take().context("guest stderr was not piped")?;
    let readers = [forward_lines(stdout, tx.clone()), forward_lines(stderr, tx)];
    let started = Instant::now();
    let mut progress = Instant::now();
    let mut ended = None;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let quiet_left = idle.saturating_sub(progress.elapsed());
        if left.is_zero() || quiet_left.is_zero() {
            ended = Some(watchdog_reason(left.is_zero(), timeout, idle));
            break;
        }
        match rx.recv_timeout(left.min(quiet_left)) {
            Ok(line) => {
                println!("[{version}] {line}");
                report.feed(&line);
                if !is_kernel_message(&line) {
                    progress = Instant::now();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    if let Some(reason) = &ended {
        println!("[{version}] {reason}");
        // The group holds vng, qemu and virtiofsd/9p helpers.
        let group = format!("-{}", child.id());
        if let Err(e) = Cmd::new("kill").args(["-KILL", "--", &group]).run() {
            println!("[{version}] ending the guest: {e:#}");
        }
    }
    child.wait().context("waiting for vng")?;
    for reader in readers {
        let _ = reader.join();
    }
    Ok(ended)
}

fn watchdog_reason(past_timeout: bool, timeout: Duration, idle: Duration) -> String {
    if past_timeout {
        format!(
            "guest ran past --timeout {} s and was ended",
            timeout.as_secs()
        )
    } else {
        format!(
            "watchdog: guest printed nothing but kernel messages for {} s (--idle-timeout) and was ended",
            idle.as_secs()
        )
    }
}

/// A line of the guest kernel's log on the console (`[ 1044.829629] watchdog: BUG: ...`), as
/// opposed to output of the tests.
fn is_kernel_message(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix('[') else {
        return false;
    };
    let Some((stamp, _)) = rest.split_once(']') else {
        return false;
    };
    let stamp = stamp.trim();
    stamp.split_once('.').is_some_and(|(secs, frac)| {
        !secs.is_empty()
            && !frac.is_empty()
            && secs.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
    })
}

/// A thread sending each line read from `pipe` (lossily decoded, without `\r`) to `tx`.
fn forward_lines(
    pipe: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// What the guest reported, read from its output markers (tests/vm/guest.sh) and libtest's lines.
#[derive(Debug, Default)]
struct GuestReport {
    suites: Vec<SuiteReport>,
    done: bool,
}

#[derive(Debug, Default)]
struct SuiteReport {
    name: String,
    exit: Option<i32>,
    passed: u64,
    failed_tests: Vec<String>,
}

impl GuestReport {
    fn feed(&mut self, line: &str) {
        let plain = strip_ansi(line);
        let line = plain.trim();
        if let Some(name) = line.strip_prefix("KPR-VM-SUITE-BEGIN ") {
            self.suites.push(SuiteReport {
                name: name.to_owned(),
                ..SuiteReport::default()
            });
        } else if let Some(rest) = line.strip_prefix("KPR-VM-SUITE-END ") {
            let code = rest.rsplit_once(" exit=").and_then(|(_, c)| c.parse().ok());
            if let Some(suite) = self.suites.last_mut() {
                suite.exit = code.or(Some(-1));
            }
        } else if line == "KPR-VM-DONE" {
            self.done = true;
        } else if let Some(suite) = self.suites.last_mut().filter(|s| s.exit.is_none()) {
            suite.feed_libtest(line);
        }
    }

    /// Every failure, each naming the kernel-independent thing that failed.
    fn failures(&self, plan: &[PlanEntry]) -> Vec<String> {
        let mut failures = Vec::new();
        for entry in plan {
            let name = &entry.suite.name;
            let Some(suite) = self.suites.iter().find(|s| &s.name == name) else {
                failures.push(format!("suite {name} never ran"));
                continue;
            };
            for test in &suite.failed_tests {
                failures.push(format!("test {name}::{test} failed"));
            }
            match suite.exit {
                None => failures.push(format!("suite {name} did not finish")),
                Some(0) if entry.must_match && suite.passed == 0 => failures.push(format!(
                    "suite {name}: the filter {:?} matched no test",
                    entry.args
                )),
                Some(0) => {}
                Some(code) if suite.failed_tests.is_empty() => {
                    failures.push(format!("suite {name} exited with status {code} (crashed?)"))
                }
                Some(_) => {}
            }
        }
        if !self.done {
            failures.push("the guest did not report the end of its run (KPR-VM-DONE)".into());
        }
        failures
    }
}

/// The line without terminal colour sequences (`ESC [ ... m`) and other control characters:
/// libtest colours `ok`/`FAILED` when it thinks it writes to a terminal, and the guest's console
/// is one whose terminfo ends each colour with `ESC [ m` and a shift-in (0x0f); the serial
/// console may also end lines with a carriage return.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

impl SuiteReport {
    fn feed_libtest(&mut self, line: &str) {
        if let Some(test) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            self.failed_tests.push(test.to_owned());
        } else if let Some(rest) = line.strip_prefix("test result: ") {
            let passed = rest
                .split(". ")
                .nth(1)
                .and_then(|counts| counts.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok());
            self.passed += passed.unwrap_or(0);
        }
    }
}

fn summarize(results: &[(String, Duration, Vec<String>)]) -> anyhow::Result<()> {
    println!("\nkernel               time     result");
    let mut failed = Vec::new();
    for (version, elapsed, failures) in results {
        let verdict = if failures.is_empty() {
            "passed"
        } else {
            "FAILED"
        };
        println!("{version:<20} {:>5.0} s  {verdict}", elapsed.as_secs_f64());
        for failure in failures {
            println!("    {failure}");
            failed.push(format!("[{version}] {failure}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} failure(s) in the VMs:\n  {}",
            failed.len(),
            failed.join("\n  ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, args: &[&str], must_match: bool) -> PlanEntry {
        PlanEntry {
            suite: Suite {
                name: name.into(),
                executable: format!("/t/{name}").into(),
                dir: "/w".into(),
            },
            args: args.iter().map(|&a| a.to_owned()).collect(),
            must_match,
        }
    }

    #[test]
    fn kernel_console_lines_are_told_from_test_output() {
        for kernel in [
            "[ 1044.829629] watchdog: BUG: soft lockup - CPU#1 stuck for 179s!",
            "[    0.000000] Linux version 6.1.0-56-amd64",
        ] {
            assert!(is_kernel_message(kernel), "{kernel}");
        }
        for test in [
            "test ebpf::cluster_ip_from_node ... \x1b[32mok\x1b[m",
            "[ok] qemu-system-x86 already installed",
            "[6.1.0-56] passed",
            "KPR-VM-SUITE-END conformance exit=0",
            "[ 12.] half a stamp",
        ] {
            assert!(!is_kernel_message(test), "{test}");
        }
    }

    #[test]
    fn a_guest_printing_only_kernel_messages_is_ended_by_the_watchdog() {
        // A stand-in guest: the lockup warning forever, every 0.1 s, and never a test line.
        let child = Cmd::new("sh")
            .args([
                "-c",
                "echo 'test a ... ok'; while :; do echo '[ 1.5] watchdog: BUG: soft lockup'; sleep 0.1; done",
            ])
            .spawn_piped()
            .expect("sh runs");
        let mut report = GuestReport::default();
        let ended = stream(
            child,
            "test",
            Duration::from_secs(60),
            Duration::from_secs(1),
            &mut report,
        )
        .expect("streamed");
        let reason = ended.expect("the watchdog ended it");
        assert!(reason.contains("nothing but kernel messages"), "{reason}");
    }

    fn report(output: &str) -> GuestReport {
        let mut report = GuestReport::default();
        output.lines().for_each(|line| report.feed(line));
        report
    }

    /// Hidden (ignored) test: `cargo xtask vm --selftest-fail` runs it with the variable set in
    /// the guest, to prove a failing test inside a VM fails the run and is named.
    #[test]
    #[ignore = "run by `cargo xtask vm --selftest-fail`"]
    fn selftest_fails_when_asked() {
        assert!(
            std::env::var_os(SELFTEST_ENV).is_none(),
            "{SELFTEST_ENV} is set: this test fails on purpose (cargo xtask vm --selftest-fail)"
        );
    }

    #[test]
    fn passing_run_has_no_failures() {
        let plan = [entry("rules_nftables", &["round_robin"], true)];
        let r = report(
            "KPR-VM-SUITE-BEGIN rules_nftables\r\nrunning 1 test\ntest round_robin ... ok\n\
             test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 11 filtered out; finished in 2.1s\n\
             KPR-VM-SUITE-END rules_nftables exit=0\nKPR-VM-DONE\n",
        );
        assert_eq!(r.failures(&plan), Vec::<String>::new());
    }

    #[test]
    fn failing_test_is_named_with_its_suite() {
        let plan = [entry("userspace", &[], false)];
        let r = report(
            "KPR-VM-SUITE-BEGIN userspace\ntest a ... ok\ntest udp_works ... FAILED\n\
             test result: FAILED. 1 passed; 1 failed; 0 ignored\nKPR-VM-SUITE-END userspace exit=101\nKPR-VM-DONE",
        );
        assert_eq!(r.failures(&plan), vec!["test userspace::udp_works failed"]);
    }

    #[test]
    fn coloured_libtest_output_is_read_like_plain_output() {
        let plan = [entry("xtask (lib) selftest", &[], false)];
        let r = report(
            "KPR-VM-SUITE-BEGIN xtask (lib) selftest\ntest vm::tests::selftest_fails_when_asked ... \u{1b}[31mFAILED\u{1b}[m\u{f}\r\n\
             test result: \u{1b}[31mFAILED\u{1b}[m. 0 passed; 1 failed\nKPR-VM-SUITE-END xtask (lib) selftest exit=101\nKPR-VM-DONE",
        );
        assert_eq!(
            r.failures(&plan),
            vec!["test xtask (lib) selftest::vm::tests::selftest_fails_when_asked failed"]
        );
    }

    #[test]
    fn filter_matching_nothing_crash_and_missing_end_are_failures() {
        let plan = [
            entry("a", &["nothing"], true),
            entry("b", &[], false),
            entry("c", &[], false),
            entry("d", &[], false),
        ];
        let r = report(
            "KPR-VM-SUITE-BEGIN a\ntest result: ok. 0 passed; 0 failed; 9 filtered out\nKPR-VM-SUITE-END a exit=0\n\
             KPR-VM-SUITE-BEGIN b\nKPR-VM-SUITE-END b exit=139\nKPR-VM-SUITE-BEGIN c\ntest x ... ok\n",
        );
        assert_eq!(
            r.failures(&plan),
            vec![
                "suite a: the filter [\"nothing\"] matched no test",
                "suite b exited with status 139 (crashed?)",
                "suite c did not finish",
                "suite d never ran",
                "the guest did not report the end of its run (KPR-VM-DONE)",
            ]
        );
    }

    #[test]
    fn test_executables_are_read_from_cargo_json() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/userspace-1","#,
            r#""target":{"name":"userspace","kind":["test"]},"manifest_path":"/w/tests/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/proxy-2","#,
            r#""target":{"name":"proxy","kind":["lib"]},"manifest_path":"/w/proxy/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/proxy","#,
            r#""target":{"name":"proxy","kind":["bin"]},"manifest_path":"/w/proxy/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let suites = parse_test_executables(json).unwrap();
        let names: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["userspace", "proxy (lib)"]);
        assert_eq!(suites[0].dir, Path::new("/w/tests"));
    }

    #[test]
    fn plan_file_is_tab_separated_with_args() {
        let text = render_plan(&[entry("proxy (lib)", &["--exact", "a b"], true)]);
        assert_eq!(text, "proxy (lib)\t/w\t/t/proxy (lib)\t--exact\ta b\n");
    }
}
