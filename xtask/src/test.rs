//! `cargo xtask test`: everything CI runs, in order: setup, build, lints, tests, with a summary.
//! Setup and build failures stop the run (nothing after them could pass); lint and test steps all
//! run so one report shows every failure. The process exits non-zero if any step failed.

use std::env;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;

use crate::exec::Cmd;
use crate::{free_disk_summary, setup, target_dir, workspace_root};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Arguments for the test binaries after `--`, e.g. a name filter or `--nocapture`.
    #[arg(last = true)]
    pub test_args: Vec<String>,
}

/// The test gates `cargo xtask test` opens: a suite that needs root requires `kpr-tests/root`, one
/// that starts the reference Kubernetes `kpr-controlplane/reference` (both, if it needs both). A
/// plain `cargo test` leaves those suites out; every step here that builds or lints the tests
/// passes this list, so every suite runs in CI (`every_required_feature_is_a_test_gate_we_enable`
/// fails on a target gated on anything else).
pub const TEST_FEATURES: &[&str] = &["kpr-tests/root", "kpr-controlplane/reference"];

/// `--features` with [`TEST_FEATURES`], for a cargo command that builds the test targets.
pub fn test_features() -> [String; 2] {
    ["--features".into(), TEST_FEATURES.join(",")]
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    // Incremental caches are for editing, not for one build of everything: on a clean CI checkout
    // they double what the workspace build writes to disk, and would be thrown away anyway.
    // Whoever sets CARGO_INCREMENTAL keeps their choice.
    if env::var_os("CARGO_INCREMENTAL").is_none() {
        // Set before this process starts any thread or child.
        env::set_var("CARGO_INCREMENTAL", "0");
    }
    let mut summary = Summary::default();
    let root = workspace_root();
    // The suites run against the reference Kubernetes, the chart's with Helm: setup builds both
    // (cached after the first time).
    let fatal = summary.step("setup", || {
        setup::run_with(&setup::SetupArgs {
            k8s: true,
            helm: true,
            docker: false,
            kind: false,
        })
    }) && summary.step("build", || {
        Cmd::new("cargo")
            .args(["build", "--workspace", "--bins"])
            .dir(&root)
            .run()
    });
    if fatal {
        lints_and_tests(&mut summary, args);
    }
    summary.print();
    summary.result()
}

fn lints_and_tests(summary: &mut Summary, args: &TestArgs) {
    let root = workspace_root();
    let cargo = |args: &[&str]| Cmd::new("cargo").args(args).dir(&root);
    summary.step("rustfmt", || {
        cargo(&["fmt", "--all", "--", "--check"]).run()
    });
    summary.step("clippy", || {
        // With the test gates open: the gated suites are linted too.
        cargo(&["clippy", "--workspace", "--all-targets"])
            .args(test_features())
            .args(["--", "-D", "warnings"])
            .run()
    });
    let ebpf = root.join("proxy-ebpf");
    if ebpf.is_dir() {
        summary.step("clippy proxy-ebpf", || {
            Cmd::new("cargo")
                .arg(format!("+{}", setup::pinned_nightly()?))
                .args([
                    "clippy",
                    "--target",
                    "bpfel-unknown-none",
                    "-Z",
                    "build-std=core",
                ])
                .args(["--", "-D", "warnings"])
                .dir(&ebpf)
                .run()
        });
    }
    let proxy_bin = target_dir().join("debug/proxy");
    summary.step("cargo test", || {
        // --no-fail-fast: every test binary runs, so the log shows every failure, not the first.
        let (result, output) = cargo(&["test", "--workspace", "--no-fail-fast"])
            .args(test_features())
            .arg("--")
            .args(&args.test_args)
            .env("KPR_PROXY_BIN", &proxy_bin)
            .run_tee();
        // The summary is the part of a long log that is always read: it names what failed and
        // why, so a red run is diagnosable from its last lines.
        result.map_err(|e| match failed_tests(&output) {
            failures if failures.is_empty() => e,
            failures => e.context(failures.join("\n        ")),
        })
    });
    // The manifest parser under libFuzzer for a minute: a crash or a slow input fails the step.
    summary.step("fuzz smoke", || crate::fuzz::smoke(60));
    // The kernel-facing suites once more inside a VM booted on the oldest kernel we claim, one
    // fast test each (`cargo xtask vm` runs the full matrix), and the benchmark on 1,000 Services,
    // which fails only when a backend errors, never on a time.
    summary.step("vm smoke", || {
        let (result, output) = cargo(&["xtask", "vm", "--smoke"]).run_tee();
        // As for `cargo test`: what failed, in the summary, since the guests' log scrolls away.
        result.map_err(|e| match vm_failures(&output) {
            failures if failures.is_empty() => e,
            failures => e.context(failures.join("\n        ")),
        })
    });
    // The last two steps need the binaries and the reference Kubernetes, no longer the test
    // executables or the fuzzer's build; on a small disk those go (CI's machines have had about
    // 11 GiB free after setup, and the cluster smoke needs 2 GiB for its node images).
    // KPR_MAKE_ROOM_BELOW_GIB moves the threshold (a large value exercises the pruning on a
    // roomy machine, as CI's disk does).
    let min_free = env::var("KPR_MAKE_ROOM_BELOW_GIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(MIN_FREE_FOR_CLUSTER, |gib| gib << 30);
    make_room(min_free);
    // On the debug binaries the build step made and the suites tested: an optimised build only
    // for a smoke would cost CI minutes, and the smoke checks that every part runs, not numbers.
    summary.step("bench quick", || {
        crate::bench::run_with(crate::Profile::Debug, &["--quick".into()])
    });
    // A one-node cluster with kpr deployed from deploy/proxy.yaml (the debug binaries too) and a
    // handful of upstream's e2e Services specs (`cargo xtask cluster matrix` runs all of them on
    // every proxy).
    summary.step("cluster e2e smoke", crate::cluster::e2e::smoke);
}

/// Free space below which [`make_room`] removes what the last steps do not need.
const MIN_FREE_FOR_CLUSTER: u64 = 10 << 30;

/// When the target directory's disk has less than `min_free` bytes free: removes the outputs no
/// step after the VM smoke reads, all rebuilt by the next run that needs them: the fuzzer's own
/// build, the downloaded kernel packages (the extracted kernels stay), and the test executables.
/// Prints what went and how much it freed.
fn make_room(min_free: u64) {
    let target = target_dir();
    let free = || crate::free_bytes(&target).unwrap_or(u64::MAX);
    let before = free();
    if before >= min_free {
        return;
    }
    println!(
        "\n==> making room ({:.1} GiB free, under {} GiB)",
        crate::gib(before),
        min_free >> 30
    );
    for dir in [target.join("fuzz"), target.join("vm/debs")] {
        if dir.exists() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => println!("removed {}", dir.display()),
                Err(e) => println!("could not remove {}: {e}", dir.display()),
            }
        }
    }
    let removed = remove_test_executables(&target.join("debug/deps"));
    println!("removed {removed} test executables from target/debug/deps");
    println!("freed {:.1} GiB", crate::gib(free().saturating_sub(before)));
}

/// Removes the test executables in a profile's `deps` directory: the executables there with a
/// single link. Cargo hard-links every binary target it builds to the profile directory, so a
/// binary the later steps run (`proxy`, `controller-manager`, `xtask` itself) has two links and
/// stays; test harnesses are never uplifted.
fn remove_test_executables(deps: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(deps) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        let executable = meta.is_file() && meta.mode() & 0o111 != 0 && path.extension().is_none();
        if executable && meta.nlink() == 1 && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// What failed in `cargo xtask vm` output: the failed tests with their panic messages (the
/// guests' lines carry a `[kernel] ` prefix, removed so that they read as `cargo test` output),
/// and the lines of its closing report that name a failure.
fn vm_failures(output: &str) -> Vec<String> {
    let guest: String = output
        .lines()
        .map(
            |l| match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
                Some((_, rest)) => rest,
                None => l,
            },
        )
        .flat_map(|l| [l, "\n"])
        .collect();
    let mut failed = failed_tests(&guest);
    if let Some(report) = output.split("failure(s) in the VMs:").nth(1) {
        failed.extend(
            report
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    failed
}

/// The failed tests in `cargo test` output, one line each: the test's name and the first lines
/// of its panic message; and every test binary cargo reports as failed (a binary that crashed
/// lists no test).
fn failed_tests(output: &str) -> Vec<String> {
    const MESSAGE_LINES: usize = 3;
    const MESSAGE_CHARS: usize = 400;
    let lines: Vec<&str> = output.lines().collect();
    // The panic message from each `---- name stdout ----` section.
    let mut messages = std::collections::HashMap::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        else {
            continue;
        };
        let section = lines[i + 1..]
            .iter()
            .take_while(|l| !l.starts_with("---- ") && **l != "failures:");
        let mut message = Vec::new();
        let mut in_panic = false;
        for l in section {
            if l.contains("panicked at") {
                in_panic = true;
                continue;
            }
            if in_panic {
                if l.is_empty() || l.starts_with("note: ") || message.len() == MESSAGE_LINES {
                    break;
                }
                message.push(l.trim());
            }
        }
        let mut message = message.join(" / ");
        if message.len() > MESSAGE_CHARS {
            let cut = (0..=MESSAGE_CHARS)
                .rev()
                .find(|&i| message.is_char_boundary(i))
                .unwrap_or(0);
            message.truncate(cut);
            message.push_str(" ...");
        }
        messages.insert(name.to_string(), message);
    }
    // The names from each binary's closing `failures:` list (indented), in order.
    let mut failed = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if *line != "failures:" || lines.get(i + 1).is_some_and(|l| l.is_empty()) {
            continue;
        }
        for l in &lines[i + 1..] {
            let Some(name) = l.strip_prefix("    ") else {
                break;
            };
            let name = name.trim();
            failed.push(match messages.get(name) {
                Some(m) if !m.is_empty() => format!("test {name}: {m}"),
                _ => format!("test {name}"),
            });
        }
    }
    // cargo's own line per failed binary, which also covers a binary that died without a list.
    for line in &lines {
        if let Some(rest) = line
            .trim()
            .strip_prefix("error: test failed, to rerun pass ")
        {
            failed.push(format!("binary {rest}"));
        }
    }
    failed
}

/// What each step did, for the table printed at the end.
#[derive(Default)]
struct Summary {
    steps: Vec<(&'static str, Duration, String, Result<(), String>)>,
}

impl Summary {
    /// Runs one step, records its outcome, and returns whether it passed.
    fn step(&mut self, name: &'static str, f: impl FnOnce() -> anyhow::Result<()>) -> bool {
        println!("\n==> {name}");
        let start = Instant::now();
        let outcome = f().map_err(|e| format!("{e:#}"));
        let passed = outcome.is_ok();
        // After each step: a step that fails on a full disk shows it in the table.
        self.steps
            .push((name, start.elapsed(), free_disk_summary(), outcome));
        passed
    }

    fn print(&self) {
        println!("\n==> summary");
        for (name, took, disk, outcome) in &self.steps {
            let took = format!("{:.1}s", took.as_secs_f64());
            match outcome {
                Ok(()) => println!("[pass] {name:<20} {took:>8}  ({disk})"),
                Err(e) => println!("[FAIL] {name:<20} {took:>8}  ({disk})  {e}"),
            }
        }
    }

    fn result(&self) -> anyhow::Result<()> {
        let failed: Vec<&str> = self
            .steps
            .iter()
            .filter(|(_, _, _, outcome)| outcome.is_err())
            .map(|(name, _, _, _)| *name)
            .collect();
        if failed.is_empty() {
            println!("all {} steps passed", self.steps.len());
            Ok(())
        } else {
            bail!(
                "{} of {} steps failed: {}",
                failed.len(),
                self.steps.len(),
                failed.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unlinked_executables_are_removed_as_test_executables() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = env::temp_dir().join(format!("kpr-deps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("deps")).unwrap();
        let write = |name: &str, mode: u32| {
            let path = dir.join("deps").join(name);
            std::fs::write(&path, b"x").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        write("rules_nftables-0123456789abcdef", 0o755);
        let bin = write("proxy-0123456789abcdef", 0o755);
        std::fs::hard_link(&bin, dir.join("proxy")).unwrap();
        write("libproxy-0123456789abcdef.rlib", 0o644);
        write("libfoo-0123456789abcdef.so", 0o755);
        write("notes-0123456789abcdef", 0o644);
        assert_eq!(remove_test_executables(&dir.join("deps")), 1);
        let mut left: Vec<String> = std::fs::read_dir(dir.join("deps"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            left,
            [
                "libfoo-0123456789abcdef.so",
                "libproxy-0123456789abcdef.rlib",
                "notes-0123456789abcdef",
                "proxy-0123456789abcdef"
            ]
        );
    }

    #[test]
    fn a_failed_step_fails_the_summary_and_is_named() {
        let mut summary = Summary::default();
        assert!(summary.step("good", || Ok(())));
        assert!(!summary.step("bad", || bail!("boom")));
        let err = summary.result().unwrap_err().to_string();
        assert_eq!(err, "1 of 2 steps failed: bad");
    }

    #[test]
    fn failed_tests_are_named_with_their_panic_message() {
        let output = "\
running 2 tests
test a::ok ... ok
test a::bad ... FAILED

failures:

---- a::bad stdout ----

thread 'a::bad' panicked at tests/a.rs:3:5:
relisted after 410: not reached within 240s
source task running: true
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    a::bad

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out

error: test failed, to rerun pass `-p kpr-tests --test a`
error: test failed, to rerun pass `-p proxy --lib`
";
        assert_eq!(
            failed_tests(output),
            [
                "test a::bad: relisted after 410: not reached within 240s / source task running: true",
                "binary `-p kpr-tests --test a`",
                "binary `-p proxy --lib`",
            ]
        );
        assert!(failed_tests("test result: ok. 3 passed\n").is_empty());
    }

    #[test]
    fn vm_failures_are_named_from_the_guests_output_and_the_report() {
        let output = "\
[6.1.0-56] test conformance::nftables::sctp ... FAILED
[6.1.0-56] failures:
[6.1.0-56] 
[6.1.0-56] ---- conformance::nftables::sctp stdout ----
[6.1.0-56] thread 'x' panicked at tests/conformance.rs:9:5:
[6.1.0-56] no answer from 10.96.0.10:80
[6.1.0-56] 
[6.1.0-56] failures:
[6.1.0-56]     conformance::nftables::sctp
[6.1.0-56] KPR-VM-SUITE-END conformance exit=101

kernel               time     result
6.1.0-56               113 s  FAILED
    conformance: conformance::nftables::sctp
error: 1 failure(s) in the VMs:
  [6.1.0-56] conformance: conformance::nftables::sctp
";
        assert_eq!(
            vm_failures(output),
            [
                "test conformance::nftables::sctp: no answer from 10.96.0.10:80",
                "[6.1.0-56] conformance: conformance::nftables::sctp",
            ]
        );
    }

    /// Every test target that requires a feature requires only [`TEST_FEATURES`]: a target gated
    /// on anything else would never be built by `cargo xtask test`, and drop out of CI unseen.
    #[test]
    fn every_required_feature_is_a_test_gate_we_enable() {
        let output = std::process::Command::new(env::var("CARGO").unwrap_or("cargo".into()))
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(workspace_root())
            .output()
            .unwrap();
        assert!(output.status.success(), "cargo metadata: {output:?}");
        let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let mut gated = 0;
        for package in metadata["packages"].as_array().unwrap() {
            for target in package["targets"].as_array().unwrap() {
                for feature in target["required-features"].as_array().into_iter().flatten() {
                    let feature = feature.as_str().unwrap();
                    // A package's own feature is named without its package.
                    let qualified = if feature.contains('/') {
                        feature.to_string()
                    } else {
                        format!("{}/{feature}", package["name"].as_str().unwrap())
                    };
                    assert!(
                        TEST_FEATURES.contains(&qualified.as_str()),
                        "{} of {} requires {qualified}, which `cargo xtask test` does not enable",
                        target["name"],
                        package["name"]
                    );
                    gated += 1;
                }
            }
        }
        assert!(
            gated > 0,
            "no test target is gated: the test gates are gone?"
        );
    }

    #[test]
    fn all_passed_is_ok() {
        let mut summary = Summary::default();
        summary.step("good", || Ok(()));
        assert!(summary.result().is_ok());
    }
}
