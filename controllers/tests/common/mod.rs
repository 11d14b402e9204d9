//! What every controller suite of this directory shares (each test binary mounts it with
//! `mod common;` and uses a part of it): the two controller managers a suite compares
//! ([`Flavour`]), one reference control plane per flavour ([`Cluster`]), the watch of one
//! scenario's namespace feeding the suite's model ([`Recorder`], [`Watched`]), a scenario's
//! namespace on a cluster with its watch and its bounded waits ([`Run`]), and the test's part as
//! the kubelet of gated Pods ([`GATE`], [`Kubelet`]).
//!
//! A suite brings what is its own: its [`Suite`] (the model of what its watches show, which
//! control plane it needs, what a failed wait prints), its scenarios and their checks.

// Each test binary uses a different part of this module.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod cluster;
pub mod events;
pub mod kubelet;
pub mod run;
pub mod wait;
pub mod watch;

pub use cluster::{Cluster, Flavour};
pub use kubelet::{is_gated, is_ready, Kubelet, GATE};
pub use run::{Run, Suite};
pub use watch::{Recorder, Watched};

/// The three tests of each scenario of a differential suite: `$upstream` and `$kpr` run the
/// suite's own `check(flavour, scenario)` on one flavour, `$diff` its `differential(scenario)`
/// (both functions, `Flavour` and the suite's `Scenario` are resolved where this is invoked).
macro_rules! scenario_tests {
    ($($scenario:ident => $upstream:ident, $kpr:ident, $diff:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $upstream() {
            check(Flavour::Upstream, Scenario::$scenario).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $kpr() {
            check(Flavour::Kpr, Scenario::$scenario).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $diff() {
            differential(Scenario::$scenario).await;
        }
    )*};
}
pub(crate) use scenario_tests;
