//! `cargo xtask cluster proxy` and `cargo xtask cluster leftovers` (being written).

use clap::Args;

use super::Cluster;

#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {}

pub fn run(_cluster: &Cluster, _args: &ProxyArgs) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask cluster proxy: not written yet")
}

pub fn leftovers(_cluster: &Cluster) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask cluster leftovers: not written yet")
}
