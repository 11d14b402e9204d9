//! `cargo xtask bench`: builds the `proxy` agent and the benchmark (`bench/`, binary `kpr-bench`)
//! with `--release` and runs the benchmark with the flags given here, so the backends are measured
//! as they ship. The benchmark is its own crate because it links the agent's library, whose build
//! needs bpf-linker; xtask itself must build before `cargo xtask setup` has installed it.

use std::ffi::OsString;

use clap::Args;

use crate::exec::Cmd;
use crate::{setup, workspace_root, Profile};

/// Flags for the benchmark, passed through unchanged (`cargo xtask bench --help` lists them).
#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct BenchArgs {
    /// `--services N`, `--backends a,b`, `--quick`, `--controllers` (the workload controllers
    /// benchmark alone), `--apps` (Jobs, DaemonSet, StatefulSets alone), `--scheduler` (the
    /// scheduler benchmark alone), ... (see `cargo xtask bench --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    run_with(Profile::Release, &args.args)
}

/// The benchmark on the given build of kpr's binaries (the benchmark starts the agent, the
/// controller-manager and the scheduler from the directory its own executable is in).
pub fn run_with(profile: Profile, args: &[OsString]) -> anyhow::Result<()> {
    // Help needs neither the reference Kubernetes nor kpr's other binaries.
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Cmd::new("cargo")
            .args(["run", "--quiet", "-p", "kpr-bench"])
            .args((profile == Profile::Release).then_some("--release"))
            .arg("--")
            .args(args)
            .dir(workspace_root())
            .run();
    }
    // The control-plane parts (EndpointSlice, workload controllers, scheduler) run against the
    // reference Kubernetes.
    setup::run_with(&setup::SetupArgs {
        k8s: true,
        helm: false,
        docker: false,
        kind: false,
    })?;
    build(profile)?;
    let dir = profile.dir();
    Cmd::new(dir.join("kpr-bench"))
        .args(args)
        .env("KPR_PROXY_BIN", dir.join("proxy"))
        .dir(workspace_root())
        .run()
}

/// [`build_release`], or for [`Profile::Debug`] every binary of the workspace in the dev profile:
/// the very build `cargo xtask test` makes first (the same package set, so the same features and
/// nothing rebuilt).
pub fn build(profile: Profile) -> anyhow::Result<()> {
    match profile {
        Profile::Release => build_release(),
        Profile::Debug => Cmd::new("cargo")
            .args(["build", "--workspace", "--bins"])
            .dir(workspace_root())
            .run(),
    }
}

/// The release binaries: the agent, the controller-manager and the benchmark (`cargo xtask
/// cluster` ships the first two in its images).
pub fn build_release() -> anyhow::Result<()> {
    Cmd::new("cargo")
        // One cargo run for every binary the benchmark starts: separate runs would resolve the
        // shared crates' features differently and build them twice.
        .args([
            "build",
            "--release",
            "-p",
            "proxy",
            "-p",
            "kpr-bench",
            "-p",
            "controllers",
        ])
        .args(["--bins"])
        .dir(workspace_root())
        .run()
}
