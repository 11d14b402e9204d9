//! The control-plane row: the EndpointSlice controller's cold start (N Services x M ready Pods
//! against a fresh test API server, until every slice exists), measured by the `controllers`
//! crate's `cold_start` example (`controllers::bench::cold_start`), built with `--release` and run
//! as its own process so its memory and threads do not mix with the harness's.

use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use xtask::exec::Cmd;

use super::Plan;

/// One cold start.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    pub services: usize,
    pub pods_per_service: usize,
    /// As the example reports it (controller start to the last slice created).
    pub seconds: f64,
    /// The example process, start to exit (API server setup and Pod creation included).
    pub process_seconds: f64,
}

/// Builds the example (`cargo build --release -p controllers --example cold_start`).
pub fn build() -> anyhow::Result<()> {
    Cmd::new("cargo")
        .args([
            "build",
            "--release",
            "-p",
            "controllers",
            "--example",
            "cold_start",
        ])
        .dir(xtask::workspace_root())
        .run()
}

/// Runs the example with the plan's N and M and parses its line.
pub fn cold_start(plan: &Plan) -> anyhow::Result<ColdStart> {
    let bin = xtask::target_dir().join("release/examples/cold_start");
    let start = Instant::now();
    let out = Cmd::new(&bin)
        .args([plan.services.to_string(), plan.endpoints.to_string()])
        .read()
        .with_context(|| format!("running {}", bin.display()))?;
    let process_seconds = start.elapsed().as_secs_f64();
    let seconds =
        parse(&out).with_context(|| format!("{}: unexpected output {out:?}", bin.display()))?;
    println!(
        "  endpointslice cold start: {} Services x {} Pods: {seconds:.2} s",
        plan.services, plan.endpoints
    );
    Ok(ColdStart {
        services: plan.services,
        pods_per_service: plan.endpoints,
        seconds,
        process_seconds,
    })
}

/// The seconds in `endpointslice cold start: N services x M pods: S s`.
fn parse(out: &str) -> Option<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with("endpointslice cold start:"))?;
    line.rsplit(": ")
        .next()?
        .strip_suffix(" s")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_examples_line() {
        let out = "endpointslice cold start: 20000 services x 4 pods: 12.34 s\n";
        assert_eq!(super::parse(out), Some(12.34));
        assert_eq!(super::parse("something else"), None);
    }
}
