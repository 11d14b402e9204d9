//! kind and what its locally built node image needs besides the reference binaries:
//! `cargo xtask setup --kind` builds kind, crictl (cri-tools) and kubeadm into
//! `<target>/kind/bin` from the Go modules pinned in `xtask/k8s/kind/go.mod` (kubeadm of the same
//! Kubernetes release as `xtask/k8s/go.mod`, stamped with the same version), the way
//! [`crate::helm`] builds Helm: a module of its own, a stamp of its own. Never part of kpr.
//!
//! Owns `<target>/kind/bin` and the module's pins.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context as _};

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

/// The kind release: its node image is `kindest/node` of [`crate::k8s::kubernetes_version`].
pub const KIND_MODULE: &str = "sigs.k8s.io/kind";
const CRI_TOOLS_MODULE: &str = "sigs.k8s.io/cri-tools";

/// `(package, binary)` built from the module.
const BINARIES: &[(&str, &str)] = &[
    ("sigs.k8s.io/kind", "kind"),
    ("sigs.k8s.io/cri-tools/cmd/crictl", "crictl"),
    ("k8s.io/kubernetes/cmd/kubeadm", "kubeadm"),
];

/// The module directory pinning kind, cri-tools and kubeadm.
pub fn module_dir() -> PathBuf {
    workspace_root().join("xtask/k8s/kind")
}

/// `<target>/kind/bin`.
pub fn bin_dir() -> PathBuf {
    target_dir().join("kind/bin")
}

/// `<target>/kind/bin/kind`.
pub fn kind_binary() -> PathBuf {
    bin_dir().join("kind")
}

/// The version `xtask/k8s/kind/go.mod` pins of `module`.
pub fn pinned(module: &str) -> anyhow::Result<String> {
    let path = module_dir().join("go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    crate::k8s::pinned(&text, module)
        .with_context(|| format!("{} does not require {module}", path.display()))
}

/// kind's module in Go's module cache: its `images/base/files` are the node image's files.
pub fn kind_source() -> anyhow::Result<PathBuf> {
    Ok(crate::images::go_mod_cache()?.join(format!("{KIND_MODULE}@{}", pinned(KIND_MODULE)?)))
}

/// Builds kind, crictl and kubeadm unless the stamp says the pinned versions are built.
pub fn build() -> anyhow::Result<()> {
    let out = bin_dir();
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let kubernetes = crate::k8s::kubernetes_version()?;
    let kind_go = fs::read_to_string(module_dir().join("go.mod")).context("reading go.mod")?;
    let kind_sum = fs::read_to_string(module_dir().join("go.sum")).context("reading go.sum")?;
    // kubeadm must be the release the node's kubelet is.
    ensure!(
        crate::k8s::pinned(&kind_go, "k8s.io/kubernetes").as_deref() == Some(kubernetes.as_str()),
        "{} pins another k8s.io/kubernetes than xtask/k8s/go.mod ({kubernetes}): change both",
        module_dir().join("go.mod").display()
    );
    let ldflags = ldflags(&kubernetes)?;
    let stamp = format!("{kind_go}{kind_sum}{}", ldflags.join("\n"));
    let stamp_path = target_dir().join("kind/stamp");
    let all = BINARIES.iter().all(|(_, name)| out.join(name).is_file());
    if all && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        println!(
            "[ok] kind, crictl, kubeadm already built ({})",
            out.display()
        );
        return print_versions(&out);
    }
    println!(
        "[build] kind {}, crictl {}, kubeadm {kubernetes} into {} (cold: about 5 minutes on 2 cores)",
        pinned(KIND_MODULE)?,
        pinned(CRI_TOOLS_MODULE)?,
        out.display()
    );
    let started = Instant::now();
    for (&package, flags) in BINARIES.iter().zip(&ldflags) {
        crate::k8s::go_compile_package(&module_dir(), &out, package, flags)?;
    }
    fs::write(&stamp_path, stamp).with_context(|| format!("writing {}", stamp_path.display()))?;
    println!(
        "[ok] kind, crictl, kubeadm built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    print_versions(&out)
}

/// The link flags of each of [`BINARIES`], in order: the versions their own builds stamp in.
fn ldflags(kubernetes: &str) -> anyhow::Result<Vec<String>> {
    Ok(vec![
        "-s -w".to_string(),
        format!(
            "-s -w -X {CRI_TOOLS_MODULE}/pkg/version.Version={}",
            pinned(CRI_TOOLS_MODULE)?
        ),
        crate::k8s::version_ldflags(kubernetes)?,
    ])
}

fn print_versions(out: &Path) -> anyhow::Result<()> {
    for (name, args) in [
        ("kind", &["version"][..]),
        ("crictl", &["--version"][..]),
        ("kubeadm", &["version", "-o", "short"][..]),
    ] {
        let text = Cmd::new(out.join(name)).args(args).quiet().read()?;
        println!(
            "    {name}: {}",
            text.lines().next().unwrap_or_default().trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_kubeadm_are_pinned_with_the_reference_release() {
        let kind = pinned(KIND_MODULE).unwrap();
        assert!(kind.starts_with("v0."), "{kind}");
        assert_eq!(
            pinned("k8s.io/kubernetes").unwrap(),
            crate::k8s::kubernetes_version().unwrap()
        );
        let flags = ldflags("v1.34.4").unwrap();
        assert_eq!(flags.len(), BINARIES.len());
        assert!(
            flags[1].contains("cri-tools/pkg/version.Version=v1."),
            "{}",
            flags[1]
        );
        assert!(flags[2].contains("gitVersion=v1.34.4"), "{}", flags[2]);
    }
}
