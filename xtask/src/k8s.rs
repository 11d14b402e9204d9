//! `cargo xtask setup --k8s`: builds the reference Kubernetes components into `<target>/k8s/bin`
//! from the Go modules pinned in `xtask/k8s/go.mod` (Kubernetes with its kubelet, its test image
//! agnhost and its end-to-end suite `e2e.test`, and etcd), `xtask/k8s/kwok/go.mod` (kwok, which
//! builds against its own client-go) and `xtask/k8s/coredns/go.mod` (the cluster DNS). They are
//! what kpr is tested and benchmarked against, never part of it.
//!
//! Go's module and build caches (`~/go/pkg/mod`, `~/.cache/go-build`) make a second build cheap;
//! a stamp of the pinning files makes an unchanged one free. Owns `<target>/k8s`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

/// Where Debian-style machines of this project have Go when it is not on PATH.
const GO_FALLBACK: &str = "/usr/local/go/bin/go";

/// Kubernetes components, as `(package, binary name)`.
const KUBERNETES: &[(&str, &str)] = &[
    ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    (
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-controller-manager",
    ),
    ("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
    ("k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy"),
    ("k8s.io/kubernetes/cmd/kubectl", "kubectl"),
    ("k8s.io/kubernetes/cmd/kubelet", "kubelet"),
    ("k8s.io/kubernetes/test/images/agnhost", "agnhost"),
    // Runs e2e.test in parallel processes, as upstream's CI does.
    ("github.com/onsi/ginkgo/v2/ginkgo", "ginkgo"),
    ("go.etcd.io/etcd/server/v3", "etcd"),
    ("go.etcd.io/etcd/etcdctl/v3", "etcdctl"),
];

const KWOK: &[(&str, &str)] = &[("sigs.k8s.io/kwok/cmd/kwok", "kwok")];

const COREDNS: &[(&str, &str)] = &[("github.com/coredns/coredns", "coredns")];

/// Upstream's end-to-end suite, a Go test binary (`go test -c`).
const E2E: (&str, &str) = ("k8s.io/kubernetes/test/e2e", "e2e.test");

/// The module directory pinning Kubernetes and etcd.
pub fn module_dir() -> PathBuf {
    workspace_root().join("xtask/k8s")
}

/// `<target>/k8s/bin`.
pub fn bin_dir() -> PathBuf {
    target_dir().join("k8s/bin")
}

/// Builds every reference binary unless the stamp says the pinned versions are already built.
pub fn build() -> anyhow::Result<()> {
    let go = go_binary()?;
    let out = bin_dir();
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let stamp_path = target_dir().join("k8s/stamp");
    let stamp = stamp()?;
    let all_present = KUBERNETES
        .iter()
        .chain(KWOK)
        .chain(COREDNS)
        .chain([&E2E])
        .all(|(_, name)| out.join(name).is_file());
    if all_present && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        println!(
            "[ok] reference Kubernetes {} already built in {}",
            kubernetes_version()?,
            out.display()
        );
        return print_versions(&out);
    }
    let version = kubernetes_version()?;
    println!(
        "[build] reference Kubernetes {version}, etcd, kwok, CoreDNS into {} (cold: about 15 minutes on 2 cores)",
        out.display()
    );
    let started = Instant::now();
    let ldflags = version_ldflags(&version)?;
    go_build(&go, &module_dir(), &out, KUBERNETES, &ldflags)?;
    go_build(&go, &module_dir().join("kwok"), &out, KWOK, "-s -w")?;
    go_build(&go, &module_dir().join("coredns"), &out, COREDNS, "-s -w")?;
    go_compile(&go, &["test", "-c"], &module_dir(), &out, E2E, &ldflags)?;
    fs::write(&stamp_path, stamp).with_context(|| format!("writing {}", stamp_path.display()))?;
    println!(
        "[ok] reference binaries built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    print_versions(&out)
}

/// One `go build` of several main packages into a temporary directory, then each binary moved
/// to its name (`go build -o DIR` names etcd's `server` and would clash on `/v3` suffixes).
fn go_build(
    go: &Path,
    module: &Path,
    out: &Path,
    packages: &[(&str, &str)],
    ldflags: &str,
) -> anyhow::Result<()> {
    for &package in packages {
        go_compile(go, &["build"], module, out, package, ldflags)?;
    }
    Ok(())
}

/// Builds one main package of a component pinned in a Go module of its own (`module`, with its
/// go.mod and go.sum) into `out/<name>`, unless `out/.stamp` says those files and `ldflags` are
/// what the binary was built from; returns the binary. `what` names it in the build line.
pub(crate) fn build_pinned_component(
    module: &Path,
    out: &Path,
    package: (&str, &str),
    ldflags: &str,
    what: &str,
) -> anyhow::Result<PathBuf> {
    use sha2::{Digest as _, Sha256};
    let binary = out.join(package.1);
    let mut hasher = Sha256::new();
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        hasher.update(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    hasher.update(ldflags.as_bytes());
    let stamp = format!("{:x}\n", hasher.finalize());
    let stamp_path = out.join(".stamp");
    if binary.is_file() && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return Ok(binary);
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "[build] {what} into {} (cold: a few minutes)",
        out.display()
    );
    go_compile_package(module, out, package, ldflags)?;
    fs::write(&stamp_path, stamp).with_context(|| format!("writing {}", stamp_path.display()))?;
    Ok(binary)
}

/// `go build` of one main package of the module in `module` into `out/<name>` (used for Helm,
/// pinned in a module of its own: crate::helm).
pub(crate) fn go_compile_package(
    module: &Path,
    out: &Path,
    package: (&str, &str),
    ldflags: &str,
) -> anyhow::Result<()> {
    go_compile(&go_binary()?, &["build"], module, out, package, ldflags)
}

/// `go <verb> -trimpath -ldflags .. -o` of one package (`build`, or `test -c` for a test
/// package such as the e2e suite) into `out/<name>`, through a temporary file.
fn go_compile(
    go: &Path,
    verb: &[&str],
    module: &Path,
    out: &Path,
    (package, name): (&str, &str),
    ldflags: &str,
) -> anyhow::Result<()> {
    let tmp = out.join(format!(".{name}.partial"));
    Cmd::new(go)
        .args(verb)
        .args(["-trimpath", "-ldflags", ldflags, "-o"])
        .arg(&tmp)
        .arg(package)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=readonly")
        .dir(module)
        .run()
        .with_context(|| format!("building {name} from {}", module.display()))?;
    let dest = out.join(name);
    fs::rename(&tmp, &dest)
        .with_context(|| format!("moving {} to {}", tmp.display(), dest.display()))
}

/// The version strings the Kubernetes build scripts stamp in (`kubectl version` refuses the
/// `v0.0.0-master` default).
pub(crate) fn version_ldflags(version: &str) -> anyhow::Result<String> {
    let (major, minor) = version
        .trim_start_matches('v')
        .split_once('.')
        .map(|(ma, rest)| (ma, rest.split('.').next().unwrap_or("0")))
        .with_context(|| format!("parsing Kubernetes version {version}"))?;
    let mut flags = vec!["-s".to_string(), "-w".to_string()];
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        flags.push(format!("-X {pkg}.gitVersion={version}"));
        flags.push(format!("-X {pkg}.gitMajor={major}"));
        flags.push(format!("-X {pkg}.gitMinor={minor}"));
        flags.push(format!("-X {pkg}.gitTreeState=clean"));
    }
    Ok(flags.join(" "))
}

/// The `k8s.io/kubernetes` version required by the pinning go.mod.
pub fn kubernetes_version() -> anyhow::Result<String> {
    let path = module_dir().join("go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    pinned(&text, "k8s.io/kubernetes")
        .with_context(|| format!("{} does not require k8s.io/kubernetes", path.display()))
}

/// The version `go_mod` requires of `module` (not a `replace` target).
pub(crate) fn pinned(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let first = words.next()?;
        let (name, version) = if first == "require" {
            (words.next()?, words.next()?)
        } else {
            (first, words.next()?)
        };
        (name == module && version.starts_with('v')).then(|| version.to_string())
    })
}

/// The content of every pinning file: a change to any of them rebuilds.
fn stamp() -> anyhow::Result<String> {
    let mut stamp = String::new();
    for file in [
        "go.mod",
        "go.sum",
        "kwok/go.mod",
        "kwok/go.sum",
        "coredns/go.mod",
        "coredns/go.sum",
    ] {
        let path = module_dir().join(file);
        stamp.push_str(
            &fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
        );
    }
    stamp.push_str(&version_ldflags(&kubernetes_version()?)?);
    Ok(stamp)
}

fn print_versions(out: &Path) -> anyhow::Result<()> {
    let line = |program: &str, args: &[&str]| -> anyhow::Result<String> {
        let text = Cmd::new(out.join(program)).args(args).read()?;
        Ok(text.lines().next().unwrap_or_default().trim().to_string())
    };
    println!(
        "    kube-apiserver: {}",
        line("kube-apiserver", &["--version"])?
    );
    println!(
        "    kubectl: {}",
        line("kubectl", &["version", "--client"])?
    );
    println!("    etcd: {}", line("etcd", &["--version"])?);
    println!("    kwok: {}", line("kwok", &["--version"])?);
    println!("    kubelet: {}", line("kubelet", &["--version"])?);
    println!("    coredns: {}", line("coredns", &["-version"])?);
    Ok(())
}

/// `go` from PATH, else the machine's /usr/local/go.
fn go_binary() -> anyhow::Result<PathBuf> {
    if let Some(go) = crate::setup::find_on_path("go") {
        return Ok(go);
    }
    let fallback = PathBuf::from(GO_FALLBACK);
    if fallback.is_file() {
        return Ok(fallback);
    }
    bail!(
        "Go is needed to build the reference Kubernetes binaries and was found neither on PATH \
         nor at {GO_FALLBACK}; install Go 1.24 or newer"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_version_is_read_from_go_mod() {
        let go_mod = "module x\n\nrequire (\n\tk8s.io/kubernetes v1.34.4\n\tgo.etcd.io/etcd/server/v3 v3.6.4\n)\nreplace (\n\tk8s.io/api => k8s.io/api v0.34.4\n)\n";
        assert_eq!(
            pinned(go_mod, "k8s.io/kubernetes").as_deref(),
            Some("v1.34.4")
        );
        assert_eq!(pinned(go_mod, "k8s.io/api"), None);
        assert_eq!(
            pinned("require k8s.io/kubernetes v1.2.3\n", "k8s.io/kubernetes").as_deref(),
            Some("v1.2.3")
        );
    }

    #[test]
    fn ldflags_carry_major_and_minor() {
        let flags = version_ldflags("v1.34.4").unwrap();
        assert!(flags.contains("k8s.io/component-base/version.gitMajor=1"));
        assert!(flags.contains("k8s.io/component-base/version.gitMinor=34"));
        assert!(flags.contains("k8s.io/client-go/pkg/version.gitVersion=v1.34.4"));
    }
}
