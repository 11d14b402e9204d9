//! `cargo xtask`: set up a machine, build, lint and test kpr, run the demo, deploy to kind.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::exec::Cmd;
use xtask::{bench, cluster, docker, kind, load, setup, test, vm, workspace_root};

mod demo;

/// kpr's project automation. Run as root on Debian 12; `cargo` is the only prerequisite.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what building and testing needs (Debian packages, the pinned nightly with rust-src,
    /// bpf-linker), skipping what is present; --k8s also builds the reference Kubernetes binaries,
    /// --helm Helm (for deploy/helm/kpr), --docker installs Debian's docker.io (its engine is
    /// started only by `cargo xtask docker`), --kind that and kind, crictl, kubeadm and
    /// debootstrap for `cargo xtask kind --local`.
    Setup(setup::SetupArgs),
    /// Setup, build, lints (rustfmt, clippy, the eBPF crate's clippy) and every test, then a summary.
    Test(test::TestArgs),
    /// Setup, build, then the demo: the agent and its backends on network namespaces.
    Demo(demo::DemoArgs),
    /// A reference control plane in the background (etcd, kube-apiserver, controllers, scheduler,
    /// kwok nodes of the pinned Kubernetes): up, down, env, status.
    Cluster(cluster::ClusterArgs),
    /// A Docker engine in a network namespace of its own, its state under target/docker: up,
    /// down, smoke (version and info; the machine's network state unchanged).
    Docker(docker::DockerArgs),
    /// kpr on a kind cluster without kube-proxy: create, build, load, deploy, smoke test.
    Kind(kind::KindArgs),
    /// The tests inside VMs, one per Debian kernel (virtme-ng + qemu); --smoke boots one kernel.
    Vm(vm::VmArgs),
    /// N Services per backend next to kube-proxy's iptables and nftables layouts (--quick: 1,000).
    Bench(bench::BenchArgs),
    /// The chaos scenarios' load client (`cluster chaos` starts it in pods' and nodes' network
    /// namespaces): new TCP connections, long-lived TCP, UDP request/response against agnhost
    /// netexec targets until a stop file appears; a JSON report on stdout.
    Load(load::LoadArgs),
}

/// Errors are printed with their whole context chain (`error: what: why`), without the backtrace
/// anyhow would add under RUST_BACKTRACE: the failing command line is what a reader needs.
fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Setup(args) => setup::run_with(&args),
        Command::Test(args) => test::run(&args),
        Command::Demo(args) => {
            setup::run()?;
            Cmd::new("cargo")
                .args(["build", "-p", "proxy", "-p", "kpr-tests", "--bins"])
                .dir(workspace_root())
                .run()?;
            demo::run(&args)
        }
        Command::Kind(args) => kind::run(&args),
        Command::Docker(args) => docker::run(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Vm(args) => vm::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Load(args) => load::run(&args),
    }
}
