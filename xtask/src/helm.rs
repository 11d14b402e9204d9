//! Helm, for the chart in `deploy/helm/kpr`: `cargo xtask setup --helm` builds it into
//! `<target>/helm/bin/helm` from the Go module pinned in `xtask/k8s/helm/go.mod`, the way
//! [`crate::k8s`] builds the reference Kubernetes components (its own module, so that pinning
//! Helm moves none of Kubernetes' dependencies, and its own stamp, so that it rebuilds alone).
//! Never part of kpr.
//!
//! Owns `<target>/helm`, the chart's location and the values every chart test renders with.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

const MODULE: &str = "helm.sh/helm/v3";
const PACKAGE: &str = "helm.sh/helm/v3/cmd/helm";

/// The module directory pinning Helm.
pub fn module_dir() -> PathBuf {
    workspace_root().join("xtask/k8s/helm")
}

/// `<target>/helm/bin/helm`.
pub fn binary() -> PathBuf {
    target_dir().join("helm/bin/helm")
}

/// The chart: `deploy/helm/kpr`.
pub fn chart_dir() -> PathBuf {
    crate::deploy::deploy_dir().join("helm/kpr")
}

/// Builds Helm unless the stamp says the pinned version is already built.
pub fn build() -> anyhow::Result<()> {
    let out = binary();
    let dir = out.parent().expect("bin/helm has a parent");
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stamp_path = target_dir().join("helm/stamp");
    let go_mod_path = module_dir().join("go.mod");
    let go_mod = fs::read_to_string(&go_mod_path)
        .with_context(|| format!("reading {}", go_mod_path.display()))?;
    let version = crate::k8s::pinned(&go_mod, MODULE)
        .with_context(|| format!("{} does not require {MODULE}", go_mod_path.display()))?;
    let go_sum = fs::read_to_string(module_dir().join("go.sum")).context("reading go.sum")?;
    let client_go = crate::k8s::pinned(&go_mod, "k8s.io/client-go").with_context(|| {
        format!(
            "{} does not require k8s.io/client-go",
            go_mod_path.display()
        )
    })?;
    let ldflags = ldflags(&version, &client_go)?;
    let stamp = format!("{go_mod}{go_sum}{ldflags}");
    if out.is_file() && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        println!("[ok] Helm {version} already built ({})", out.display());
        return Ok(());
    }
    println!(
        "[build] Helm {version} into {} (cold: about 5 minutes on 2 cores)",
        out.display()
    );
    let started = Instant::now();
    crate::k8s::go_compile_package(&module_dir(), dir, (PACKAGE, "helm"), &ldflags)?;
    fs::write(&stamp_path, stamp).with_context(|| format!("writing {}", stamp_path.display()))?;
    let built = Cmd::new(&out).args(["version", "--short"]).read()?;
    println!(
        "[ok] Helm {} built in {:.0} s",
        built.trim(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What Helm's Makefile stamps in: its version, and the Kubernetes version its client libraries
/// are (`helm lint` and `helm template` take it as the cluster's without one to ask).
fn ldflags(version: &str, client_go: &str) -> anyhow::Result<String> {
    let minor = client_go
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .with_context(|| format!("parsing k8s.io/client-go version {client_go}"))?;
    let mut flags = vec![
        "-s".to_string(),
        "-w".to_string(),
        format!("-X helm.sh/helm/v3/internal/version.version={version}"),
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean".to_string(),
    ];
    // client-go v0.N is Kubernetes 1.N.
    for pkg in [
        "helm.sh/helm/v3/pkg/lint/rules",
        "helm.sh/helm/v3/pkg/chartutil",
    ] {
        flags.push(format!("-X {pkg}.k8sVersionMajor=1"));
        flags.push(format!("-X {pkg}.k8sVersionMinor={minor}"));
    }
    Ok(flags.join(" "))
}

/// Helm's cache, configuration and data homes under `<target>/helm/home` (not the user's
/// `~/.config/helm`, `~/.cache/helm`), as environment variables.
pub fn home_env() -> [(&'static str, PathBuf); 3] {
    let home = target_dir().join("helm/home");
    [
        ("HELM_CACHE_HOME", home.join("cache")),
        ("HELM_CONFIG_HOME", home.join("config")),
        ("HELM_DATA_HOME", home.join("data")),
    ]
}

/// `helm` with a kubeconfig and [`home_env`].
pub fn helm(kubeconfig: Option<&Path>) -> Cmd {
    let mut cmd = Cmd::new(binary());
    for (key, value) in home_env() {
        cmd = cmd.env(key, value);
    }
    if let Some(kubeconfig) = kubeconfig {
        cmd = cmd.env("KUBECONFIG", kubeconfig);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldflags_name_the_versions() {
        let flags = ldflags("v3.19.5", "v0.34.2").unwrap();
        assert!(
            flags.contains("internal/version.version=v3.19.5"),
            "{flags}"
        );
        assert!(
            flags.contains("pkg/chartutil.k8sVersionMinor=34"),
            "{flags}"
        );
        assert!(
            flags.contains("pkg/lint/rules.k8sVersionMajor=1"),
            "{flags}"
        );
    }

    #[test]
    fn helm_is_pinned_in_its_module() {
        let go_mod = fs::read_to_string(module_dir().join("go.mod")).unwrap();
        let version = crate::k8s::pinned(&go_mod, MODULE).unwrap();
        assert!(version.starts_with("v3."), "{version}");
        assert!(crate::k8s::pinned(&go_mod, "k8s.io/client-go").is_some());
    }
}
