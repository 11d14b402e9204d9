//! `cargo xtask demo`: placeholder until the demo is written (its owner replaces this file).

/// Options of the demo.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub fn run(_args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("demo not written yet")
}
