//! rancher's local-path-provisioner, the node-local dynamic provisioner kind deploys as its default
//! storage, for the real nodes of `cargo xtask cluster up --nodes N --local-path`: built from its
//! Go module at the version `xtask/k8s/local-path-provisioner/go.mod` pins, packed into an image
//! under rancher's name, and deployed with `xtask/k8s/manifests/local-path-storage.yaml` (kind's
//! manifest; see its header for the one change): namespace `local-path-storage`, its ConfigMap,
//! and the StorageClass `standard` (default, WaitForFirstConsumer, reclaim Delete). A claim of
//! that class is provisioned once the scheduler has picked its Pod's node (the
//! `volume.kubernetes.io/selected-node` annotation): a helper Pod on that node makes the
//! directory under the node's own /var/local-path-provisioner, and the PersistentVolume is a
//! hostPath volume with node affinity to that node. Never part of the product.
//!
//! Owns `<target>/local-path-provisioner` (the binary and its stamp).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::images::{Entry, Image};
use crate::{target_dir, workspace_root};

/// The main package (the module's root) and the binary's name.
const PACKAGE: (&str, &str) = (
    "github.com/rancher/local-path-provisioner",
    "local-path-provisioner",
);

/// The namespace the manifest deploys to, and the default StorageClass it creates.
pub const NAMESPACE: &str = "local-path-storage";
pub const STORAGE_CLASS: &str = "standard";

/// The module pinning the provisioner.
fn module_dir() -> PathBuf {
    crate::k8s::module_dir().join("local-path-provisioner")
}

/// The pinned version (`v0.0.33`), from the module's go.mod.
pub fn version() -> anyhow::Result<String> {
    let path = module_dir().join("go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    crate::k8s::pinned(&text, PACKAGE.0)
        .with_context(|| format!("{} does not require {}", path.display(), PACKAGE.0))
}

/// The image's name, rancher's (what its own release manifest runs).
pub fn image_name(version: &str) -> String {
    format!("docker.io/rancher/local-path-provisioner:{version}")
}

/// Builds the binary unless the stamp says the pinned module is what it was built from; returns
/// its path.
pub fn build() -> anyhow::Result<PathBuf> {
    let version = version()?;
    // The provisioner's own version string (`local-path-provisioner --version`, its log).
    let ldflags = format!("-s -w -X main.VERSION={version}");
    crate::k8s::build_pinned_component(
        &module_dir(),
        &target_dir().join("local-path-provisioner"),
        PACKAGE,
        &ldflags,
        &format!("local-path-provisioner {version}"),
    )
}

/// The image: the static binary on PATH (the manifest's command is the bare name, as rancher's
/// image has it in /usr/bin).
pub fn image(binary: &Path, version: &str) -> Image {
    Image {
        name: image_name(version),
        entrypoint: vec!["local-path-provisioner".into()],
        cmd: Vec::new(),
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        user: None,
        entries: vec![Entry::File {
            src: binary.to_path_buf(),
            dest: "/usr/bin/local-path-provisioner".into(),
            mode: Some(0o755),
        }],
    }
}

/// The committed manifest.
pub fn manifest_path() -> PathBuf {
    workspace_root().join("xtask/k8s/manifests/local-path-storage.yaml")
}

/// The manifest with the provisioner's image of `version` and `helper` (the busybox image) for
/// its helper Pods.
pub fn render(text: &str, version: &str, helper: &str) -> anyhow::Result<String> {
    const PROVISIONER: &str = "image: PROVISIONER_IMAGE";
    const HELPER: &str = "HELPER_IMAGE";
    if text.matches(PROVISIONER).count() != 1 || text.matches(HELPER).count() != 2 {
        bail!(
            "xtask/k8s/manifests/local-path-storage.yaml: expected one {PROVISIONER:?} and two \
             {HELPER:?} (the --helper-image flag and helperPod.yaml)"
        );
    }
    Ok(text
        .replace(PROVISIONER, &format!("image: {}", image_name(version)))
        .replace(HELPER, helper))
}

/// Applies the manifest and waits for the provisioner's Deployment.
pub fn deploy(cp: &controlplane::ControlPlane) -> anyhow::Result<()> {
    let text = fs::read_to_string(manifest_path())?;
    let helper = crate::images::busybox()?.name;
    crate::cluster::nodes::apply(cp, &render(&text, &version()?, &helper)?)?;
    let waited = cp.kubectl_run(
        &[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            "deployment/local-path-provisioner",
            &format!("--timeout={}s", Duration::from_secs(180).as_secs()),
        ],
        None,
    );
    if let Err(e) = waited {
        let pods = cp
            .kubectl_run(&["-n", NAMESPACE, "get", "pods", "-o", "wide"], None)
            .unwrap_or_else(|e| format!("{e:#}"));
        let logs = cp
            .kubectl_run(
                &[
                    "-n",
                    NAMESPACE,
                    "logs",
                    "deployment/local-path-provisioner",
                    "--tail=30",
                ],
                None,
            )
            .unwrap_or_else(|e| format!("{e:#}"));
        return Err(e.context(format!(
            "waiting for the local-path-provisioner; pods:\n{pods}\nits log:\n{logs}"
        )));
    }
    println!(
        "[ok] local-path-provisioner runs; StorageClass {STORAGE_CLASS} (default, \
         WaitForFirstConsumer)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_is_kinds_default_storage_with_the_pinned_image() {
        let version = version().unwrap();
        assert!(version.starts_with("v0."), "{version}");
        let helper = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1";
        let text = render(
            &fs::read_to_string(manifest_path()).unwrap(),
            &version,
            helper,
        )
        .unwrap();
        assert!(text.contains(&format!(
            "image: docker.io/rancher/local-path-provisioner:{version}"
        )));
        assert_eq!(text.matches(helper).count(), 2);
        assert!(text.contains("name: local-path-storage"));
        assert!(text.contains("storageclass.kubernetes.io/is-default-class: \"true\""));
        assert!(text.contains("volumeBindingMode: WaitForFirstConsumer"));
        assert!(text.contains("reclaimPolicy: Delete"));
        assert!(text.contains("\"paths\":[\"/var/local-path-provisioner\"]"));
        assert!(render("no token", &version, helper).is_err());
    }
}
