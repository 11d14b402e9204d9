//! `cargo xtask vm`: the project's tests inside VMs, one per Debian kernel, so the kernel-facing
//! suites (nftables, iptables, eBPF, netns) are checked on the kernels we claim and not only on
//! the build machine's.
//!
//! Owns: `target/vm/` (downloaded kernel packages, extracted kernels, per-kernel plan files; never
//! committed), the KVM probe, the guest runs (virtme-ng over the host's root filesystem, running
//! `tests/vm/guest.sh`), the watchdog, and the verdict read from the guest's output. Test binaries
//! are built on the host; nothing here touches the host's own networking, everything kernel-facing
//! happens inside the guest kernel. See docs/VM.md for the choices and the per-kernel notes.
//!
//! Files: `plan` (suites, plan files, kernels asked for), `kernel` (kernel packages, the KVM
//! probe), `guest` (one guest run and its watchdog), `report` (the verdict and the summary).

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
        "ebpf_xdp",
        &["a_flow_to_a_backend_behind_the_external_interface_is_sent_back_out_by_xdp"],
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
    // seconds to start and to sync, and every conformance test of the full matrix starts one: an
    // optimised build pays for itself there. The smoke starts a handful of agents, each well
    // inside the guest's 180 s ready timeout, so it takes the debug binaries too rather than a
    // release build of the whole tree (about 5 of CI's minutes on 2 cores).
    let agent = if kvm || args.smoke {
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

mod guest;
mod kernel;
mod plan;
mod report;

use guest::*;
use kernel::*;
use plan::*;
use report::*;

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
