//! metrics-server, the reference source of the resource metrics API (`metrics.k8s.io/v1beta1`)
//! the HorizontalPodAutoscaler and `kubectl top` read, for the real nodes of
//! `cargo xtask cluster up --nodes N --metrics-server`: built from its Go module at the version
//! `xtask/k8s/metrics-server/go.mod` pins (the one kind users install from the release manifest),
//! packed into an image under upstream's name, and deployed with
//! `xtask/k8s/manifests/metrics-server.yaml` (upstream's release manifest; see its header for the
//! one change). It scrapes the nodes' kubelets (`/metrics/resource`), verifying their serving
//! certificates against the cluster CA. Never part of the product.
//!
//! Owns `<target>/metrics-server` (the binary and its stamp).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::images::{Entry, Image};
use crate::{target_dir, workspace_root};

/// The main package and the binary's name.
const PACKAGE: (&str, &str) = (
    "sigs.k8s.io/metrics-server/cmd/metrics-server",
    "metrics-server",
);

/// The module pinning metrics-server.
fn module_dir() -> PathBuf {
    crate::k8s::module_dir().join("metrics-server")
}

/// The pinned version (`v0.8.0`), from the module's go.mod.
pub fn version() -> anyhow::Result<String> {
    let path = module_dir().join("go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    crate::k8s::pinned(&text, "sigs.k8s.io/metrics-server").with_context(|| {
        format!(
            "{} does not require sigs.k8s.io/metrics-server",
            path.display()
        )
    })
}

/// The image's name, upstream's (what the release manifest runs).
pub fn image_name(version: &str) -> String {
    format!("registry.k8s.io/metrics-server/metrics-server:{version}")
}

/// Builds the binary unless the stamp says the pinned module is what it was built from; returns
/// its path.
pub fn build() -> anyhow::Result<PathBuf> {
    let version = version()?;
    let ldflags = format!("-s -w -X k8s.io/client-go/pkg/version.gitVersion={version}");
    crate::k8s::build_pinned_component(
        &module_dir(),
        &target_dir().join("metrics-server"),
        PACKAGE,
        &ldflags,
        &format!("metrics-server {version}"),
    )
}

/// The image: the static binary alone, run as upstream's distroless image runs it (user 65534;
/// the manifest sets 1000).
pub fn image(binary: &Path, version: &str) -> Image {
    Image {
        name: image_name(version),
        entrypoint: vec!["/metrics-server".into()],
        cmd: Vec::new(),
        env: Vec::new(),
        user: Some("65534".into()),
        entries: vec![Entry::File {
            src: binary.to_path_buf(),
            dest: "/metrics-server".into(),
            mode: Some(0o755),
        }],
    }
}

/// The committed manifest.
pub fn manifest_path() -> PathBuf {
    workspace_root().join("xtask/k8s/manifests/metrics-server.yaml")
}

/// The manifest with the image of `version`.
pub fn render(text: &str, version: &str) -> anyhow::Result<String> {
    const TOKEN: &str = "image: METRICS_SERVER_IMAGE";
    if text.matches(TOKEN).count() != 1 {
        bail!("xtask/k8s/manifests/metrics-server.yaml: expected one {TOKEN:?}");
    }
    Ok(text.replace(TOKEN, &format!("image: {}", image_name(version))))
}

/// Applies the manifest, waits for the Deployment, for the APIService to be Available and for
/// every node to have a sample (metrics-server's first scrape is one resolution after it starts).
pub fn deploy(cp: &controlplane::ControlPlane, nodes: usize) -> anyhow::Result<()> {
    let text = fs::read_to_string(manifest_path())?;
    crate::cluster::nodes::apply(cp, &render(&text, &version()?)?)?;
    crate::cluster::nodes::rollout(cp, "deployment/metrics-server", Duration::from_secs(180))?;
    cp.kubectl_run(
        &[
            "wait",
            "--for=condition=Available",
            "apiservice/v1beta1.metrics.k8s.io",
            "--timeout=120s",
        ],
        None,
    )?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let last = cp.kubectl_run(&["top", "nodes", "--no-headers"], None);
        match &last {
            Ok(text) if text.lines().filter(|l| !l.trim().is_empty()).count() >= nodes => {
                println!(
                    "[ok] metrics-server serves metrics.k8s.io:\n{}",
                    text.trim_end()
                );
                return Ok(());
            }
            _ if Instant::now() >= deadline => {
                let logs = cp
                    .kubectl_run(
                        &[
                            "-n",
                            "kube-system",
                            "logs",
                            "deployment/metrics-server",
                            "--tail=30",
                        ],
                        None,
                    )
                    .unwrap_or_else(|e| format!("{e:#}"));
                bail!(
                    "metrics-server has no sample of all {nodes} nodes after 120 s (last `kubectl \
                     top nodes`: {last:?}); its log:\n{logs}"
                );
            }
            _ => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_runs_the_pinned_image_verifying_the_kubelets() {
        let version = version().unwrap();
        assert!(version.starts_with("v0."), "{version}");
        let text = render(&fs::read_to_string(manifest_path()).unwrap(), &version).unwrap();
        assert!(text.contains(&format!(
            "image: registry.k8s.io/metrics-server/metrics-server:{version}"
        )));
        assert!(text.contains("name: v1beta1.metrics.k8s.io"));
        assert!(text.contains(
            "--kubelet-certificate-authority=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
        ));
        assert!(!text.contains("--kubelet-insecure-tls"));
        assert!(render("no token", &version).is_err());
    }
}
