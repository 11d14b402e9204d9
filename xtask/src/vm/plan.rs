//! Which suites run on which kernel: the test executables cargo built, the plan file each guest
//! reads, and the kernels asked for.

use super::*;

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
pub(super) struct PlanEntry {
    pub(super) suite: Suite,
    pub(super) args: Vec<String>,
    /// A filtered entry that must run at least one test (a filter matching nothing is a failure,
    /// not a silent pass).
    pub(super) must_match: bool,
}

/// Builds the binaries the tests spawn and every test binary, and returns the latter. A test
/// build that fails for some targets (`--no-fail-fast` builds the others) is returned as a failure
/// to report, so a half-built workspace still runs what it can and still fails the run.
pub(super) fn build_suites(agent: crate::Profile) -> anyhow::Result<(Vec<Suite>, Option<String>)> {
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
        // The suites that need root are behind a test gate (what `cargo xtask test` opens).
        .args(crate::test::test_features())
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
pub(super) fn parse_test_executables(json: &str) -> anyhow::Result<Vec<Suite>> {
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

pub(super) fn plan(args: &VmArgs, suites: &[Suite]) -> anyhow::Result<Vec<PlanEntry>> {
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
pub(super) fn with_ignored(suite: &str, mut args: Vec<String>) -> Vec<String> {
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
        || ["userspace", "conformance", "controlplane_e2e", "topology"].contains(&suite)
}

pub(super) fn kernels(args: &VmArgs) -> Vec<String> {
    if !args.kernels.is_empty() {
        args.kernels.clone()
    } else if args.smoke {
        vec![SMOKE_KERNEL.to_owned()]
    } else {
        MATRIX.iter().map(|&k| k.to_owned()).collect()
    }
}

pub(super) fn render_plan(plan: &[PlanEntry]) -> String {
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
