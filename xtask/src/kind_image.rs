//! The images `cargo xtask kind --local` needs, made on this machine because no container registry
//! can be reached: Debian bookworm root filesystems from debootstrap (the Debian mirror is
//! reachable), imported into the engine of [`crate::docker`] with `docker import`:
//!
//! - [`RUNTIME_BASE`]: bookworm with the tools kpr's image installs (nft, iptables, conntrack,
//!   ip, kmod, CA certificates), the base `deploy/Dockerfile.prebuilt` builds on.
//! - [`node_image`]: what `kindest/node` of the pinned release holds, from kind's own
//!   `images/base` files (read from kind's module in Go's module cache, the pinned
//!   version): systemd, Debian's containerd, runc and CNI plugins, crictl, kubeadm, kubelet and
//!   kubectl of the pinned Kubernetes, and the images kubeadm and kind deploy (as `kubeadm config
//!   images list` names them), made from the reference binaries by [`crate::images`] and imported
//!   into the node's containerd when it boots, before the kubelet starts, so nothing is pulled.
//!
//! Two parts differ from `kindest/node`, both because their sources are not served by the Go
//! module proxy (kind's `images/kindnetd` module has no published version):
//! - the default CNI (`/kind/manifests/default-cni.yaml`) is [`CNI_IMAGE`], a DaemonSet doing what
//!   kindnetd does for routing (the node's CNI configuration, ptp and host-local over its
//!   podCIDRs; a route to each other node's podCIDRs via that node), without kindnetd's
//!   masquerading (nothing here leaves the cluster) and network policies;
//! - the default storage manifest is kind's own fallback StorageClass (host-path provisioner,
//!   no local-path-provisioner).
//!
//! Owns `<target>/kind/rootfs-*`, `<target>/kind/images` and the images' names.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context as _};

use crate::docker::Engine;
use crate::exec::Cmd;
use crate::images::{self, Entry, Image};
use crate::{k8s, kind_tools, target_dir};

/// The runtime base of kpr's image when no `debian:bookworm-slim` can be pulled.
pub const RUNTIME_BASE: &str = "kpr-local/bookworm-runtime:12";
/// The kind node image's repository; its tag is the Kubernetes version.
const NODE_REPOSITORY: &str = "kpr-local/kind-node";
/// The default CNI's image (see the module doc).
const CNI_REPOSITORY: &str = "docker.io/kpr-local/kind-routes";

const MIRROR: &str = "http://deb.debian.org/debian";
const SUITE: &str = "bookworm";

/// What kpr's runtime image installs (deploy/Dockerfile's runtime stage).
const RUNTIME_PACKAGES: &[&str] = &[
    "nftables",
    "iptables",
    "conntrack",
    "iproute2",
    "kmod",
    "ca-certificates",
];

/// What kind's images/base/Dockerfile installs with apt, less what is for storage tests or
/// rootless (nfs-common, open-iscsi, fuse-overlayfs), plus Debian's containerd, runc and CNI
/// plugins (kind builds those from source) and systemd-sysv, dbus (systemd as /sbin/init).
const NODE_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "e2fsprogs",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
    "containerd",
    "runc",
    "containernetworking-plugins",
];

/// The CNI plugins kind's node image carries, from Debian's containernetworking-plugins.
const CNI_PLUGINS: &[&str] = &["host-local", "loopback", "ptp", "portmap"];

/// `kpr-local/kind-node:<pinned Kubernetes>`.
pub fn node_image_name() -> anyhow::Result<String> {
    Ok(format!("{NODE_REPOSITORY}:{}", k8s::kubernetes_version()?))
}

fn dir() -> PathBuf {
    target_dir().join("kind")
}

/// Imports [`RUNTIME_BASE`] unless the engine has it.
pub fn runtime_base(engine: &Engine) -> anyhow::Result<()> {
    if has_image(engine, RUNTIME_BASE)? {
        println!("[ok] {RUNTIME_BASE} already imported");
        return Ok(());
    }
    let rootfs = debootstrap("rootfs-runtime", RUNTIME_PACKAGES)?;
    import(engine, &rootfs, RUNTIME_BASE, &[])
}

/// Builds the node image unless the engine has it with the same inputs; returns its name.
pub fn node_image(engine: &Engine) -> anyhow::Result<String> {
    let name = node_image_name()?;
    let started = Instant::now();
    let rootfs = debootstrap("rootfs-node", NODE_PACKAGES)?;
    let images = component_images(&rootfs)?;
    let stamp = format!(
        "{images}\nkind {}\n{}",
        kind_tools::pinned(kind_tools::KIND_MODULE)?,
        fs::read_to_string(kind_tools::bin_dir().join("../stamp")).unwrap_or_default()
    );
    let stamp_path = dir().join("node-image.stamp");
    if has_image(engine, &name)?
        && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str())
    {
        println!("[ok] {name} already built");
        return Ok(name);
    }
    node_files(&rootfs)?;
    import(
        engine,
        &rootfs,
        &name,
        &[
            "ENV container=docker",
            r#"ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]"#,
        ],
    )?;
    // systemd stops on SIGRTMIN+3 (SIGTERM re-executes it); `docker import` takes no STOPSIGNAL,
    // a build without a RUN step does (and needs no network).
    Cmd::new("bash")
        .args([
            "-c",
            r#"set -euo pipefail; printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$1" | "$2" --host "$3" build -q -t "$1" -"#,
            "stopsignal",
            &name,
        ])
        .arg(crate::docker::client())
        .arg(engine.host())
        .run()?;
    fs::write(&stamp_path, stamp)?;
    println!(
        "[ok] {name} built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(name)
}

/// A bookworm root filesystem at `<target>/kind/<name>` with `packages`, made once (its stamp
/// names the packages).
pub(crate) fn debootstrap(name: &str, packages: &[&str]) -> anyhow::Result<PathBuf> {
    let rootfs = dir().join(name);
    let stamp_path = dir().join(format!("{name}.stamp"));
    let stamp = format!("{SUITE} minbase {}\n", packages.join(","));
    if rootfs.is_dir() && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        println!("[ok] {} already bootstrapped", rootfs.display());
        return Ok(rootfs);
    }
    crate::setup::find_on_path("debootstrap")
        .context("debootstrap is not installed: `cargo xtask setup --kind` installs it")?;
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    let cache = dir().join("debootstrap-cache");
    fs::create_dir_all(&cache)?;
    println!(
        "[build] {SUITE} root filesystem {} with {}",
        rootfs.display(),
        packages.join(", ")
    );
    let started = Instant::now();
    Cmd::new("debootstrap")
        .args(["--variant=minbase", "--cache-dir"])
        .arg(&cache)
        .arg(format!("--include={}", packages.join(",")))
        .arg(SUITE)
        .arg(&rootfs)
        .arg(MIRROR)
        .run()?;
    // What debian:bookworm-slim leaves out too: the package lists and downloaded packages.
    for sub in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        let path = rootfs.join(sub);
        for entry in fs::read_dir(&path)?.flatten() {
            if entry.file_type()?.is_file() {
                fs::remove_file(entry.path())?;
            }
        }
    }
    fs::write(&stamp_path, stamp)?;
    println!(
        "[ok] {} bootstrapped in {:.0} s",
        rootfs.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(rootfs)
}

pub(crate) fn has_image(engine: &Engine, name: &str) -> anyhow::Result<bool> {
    let out = engine
        .docker()
        .args(["image", "ls", "-q", name])
        .quiet()
        .read()?;
    Ok(!out.trim().is_empty())
}

/// `docker import` of a root filesystem (streamed as a tar) with Dockerfile-like `changes`.
pub(crate) fn import(
    engine: &Engine,
    rootfs: &Path,
    name: &str,
    changes: &[&str],
) -> anyhow::Result<()> {
    println!("[import] {} as {name}", rootfs.display());
    let started = Instant::now();
    // tar | docker import, with the arguments as the script's positional parameters.
    let mut import = Cmd::new("bash")
        .args([
            "-c",
            r#"set -euo pipefail; rootfs="$1"; shift; tar --numeric-owner --xattrs -C "$rootfs" -c . | "$@""#,
            "import",
        ])
        .arg(rootfs)
        .arg(crate::docker::client())
        .args(["--host", &engine.host(), "import"]);
    for change in changes {
        import = import.args(["--change", change]);
    }
    import
        .args(["-", name])
        .run()
        .with_context(|| format!("importing {} as {name}", rootfs.display()))?;
    println!(
        "[ok] {name} imported in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The images kubeadm and kind deploy, written to `<rootfs>/kind/images` (imported into containerd
/// at boot by `kind-import-images.service`). Returns their inputs, for the node image's stamp.
fn component_images(rootfs: &Path) -> anyhow::Result<String> {
    let bin = k8s::bin_dir();
    let kind_bin = kind_tools::bin_dir();
    let listed = Cmd::new(kind_bin.join("kubeadm"))
        .args(["config", "images", "list", "--kubernetes-version"])
        .arg(k8s::kubernetes_version()?)
        .quiet()
        .read()?;
    let pause = images::pause_binary();
    if !pause.is_file() {
        images::build_pause(&pause)?;
    }
    let mut list = Vec::new();
    for name in listed.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let repository = name.rsplit_once(':').map_or(name, |(r, _)| r);
        let base = repository.rsplit('/').next().unwrap_or(repository);
        let image = match base {
            "pause" => Image {
                name: name.to_string(),
                ..images::pause(&pause)
            },
            "coredns" => Image {
                name: name.to_string(),
                ..crate::cluster::nodes::coredns_image(&bin.join("coredns"))
            },
            "kube-proxy" => Image {
                name: name.to_string(),
                ..images::kube_proxy(&bin.join("kube-proxy"))?
            },
            "kube-apiserver" | "kube-controller-manager" | "kube-scheduler" | "etcd" => {
                binary_image(name, &bin.join(base))
            }
            other => bail!("kubeadm lists an image this build does not make: {other} ({name})"),
        };
        list.push((base.to_string(), image));
    }
    list.push(("kind-routes".into(), cni_image(&bin.join("kubectl"))?));
    let out = rootfs.join("kind/images");
    fs::create_dir_all(&out)?;
    let mut keys = String::new();
    for (file, image) in list {
        let path = out.join(format!("{file}.tar"));
        if images::write_archive_cached(&image, &path)
            .with_context(|| format!("writing the {file} image"))?
        {
            println!("[ok] wrote {} ({})", path.display(), image.name);
        }
        keys.push_str(&fs::read_to_string(
            out.join(format!(".{file}.tar.inputs")),
        )?);
    }
    Ok(keys)
}

/// A static binary as `/usr/local/bin/<name>`, found on PATH as kubeadm's manifests run it.
fn binary_image(name: &str, binary: &Path) -> Image {
    let file = binary
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let mut entries = vec![Entry::File {
        src: binary.to_owned(),
        dest: format!("/usr/local/bin/{file}"),
        mode: Some(0o755),
    }];
    entries.extend(images::base_files(images::PASSWD, images::GROUP));
    Image {
        name: name.to_string(),
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    }
}

/// The routes agent of the default CNI: kubectl, ip and the script [`ROUTES_SCRIPT`].
fn cni_image(kubectl: &Path) -> anyhow::Result<Image> {
    let mut image = images::node_agent(
        &cni_image_name()?,
        &[(kubectl.to_owned(), "/usr/local/bin/kubectl".into())],
    )?;
    image
        .entries
        .push(Entry::text("/kind-routes.sh", ROUTES_SCRIPT, 0o755));
    image.entrypoint = vec!["/bin/sh".into(), "/kind-routes.sh".into()];
    Ok(image)
}

fn cni_image_name() -> anyhow::Result<String> {
    Ok(format!(
        "{CNI_REPOSITORY}:{}",
        kind_tools::pinned(kind_tools::KIND_MODULE)?
    ))
}

/// Every `interval`: this node's CNI configuration from its podCIDRs, and a route to each other
/// node's podCIDRs via its InternalIP of the same family (kindnetd's routing). busybox's sh runs
/// its own applets; `ip` is iproute2's, by its full path.
const ROUTES_SCRIPT: &str = r#"#!/bin/sh
set -u
export KUBERNETES_SERVICE_HOST="${CONTROL_PLANE_ENDPOINT%:*}"
export KUBERNETES_SERVICE_PORT="${CONTROL_PLANE_ENDPOINT##*:}"
conf=/etc/cni/net.d/10-kindnet.conflist
family() { case "$1" in *:*) echo 6 ;; *) echo 4 ;; esac; }
while :; do
  if kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDRs[*]} | {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' >/tmp/nodes; then
    while read -r name rest; do
      cidrs="${rest%%|*}"
      ips="${rest#*|}"
      if [ "$name" = "$NODE_NAME" ]; then
        ranges=""
        routes=""
        for c in $cidrs; do
          if [ "$(family "$c")" = 6 ]; then r="::/0"; else r="0.0.0.0/0"; fi
          ranges="$ranges${ranges:+,}[{\"subnet\":\"$c\"}]"
          routes="$routes${routes:+,}{\"dst\":\"$r\"}"
        done
        [ -n "$ranges" ] || continue
        printf '{"cniVersion":"0.4.0","name":"kindnet","plugins":[{"type":"ptp","ipMasq":false,"mtu":1500,"ipam":{"type":"host-local","dataDir":"/run/cni-ipam-state","routes":[%s],"ranges":[%s]}},{"type":"portmap","capabilities":{"portMappings":true}}]}\n' "$routes" "$ranges" >/tmp/conf
        if ! cmp -s /tmp/conf "$conf"; then
          cp /tmp/conf "$conf.tmp" && mv "$conf.tmp" "$conf" && echo "wrote $conf: $ranges"
        fi
      else
        for c in $cidrs; do
          for ip in $ips; do
            [ "$(family "$c")" = "$(family "$ip")" ] || continue
            /usr/sbin/ip -"$(family "$c")" route replace "$c" via "$ip" || echo "route $c via $ip failed"
          done
        done
      fi
    done </tmp/nodes
  fi
  sleep 5
done
"#;

/// kind's default CNI manifest (`/kind/manifests/default-cni.yaml`): kind adds the control-plane
/// endpoint to the first container's env ("would you kindly patch this file").
fn cni_manifest(image: &str) -> String {
    format!(
        r#"# would you kindly patch this file
# The default CNI of the node image built by cargo xtask kind --local (xtask/src/kind_image.rs).
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kind-routes
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kind-routes
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["list", "get", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kind-routes
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kind-routes
subjects:
  - kind: ServiceAccount
    name: kind-routes
    namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kind-routes
  namespace: kube-system
  labels:
    app: kind-routes
spec:
  selector:
    matchLabels:
      app: kind-routes
  template:
    metadata:
      labels:
        app: kind-routes
    spec:
      hostNetwork: true
      serviceAccountName: kind-routes
      tolerations:
        - operator: Exists
      containers:
        - name: kind-routes
          image: {image}
          imagePullPolicy: Never
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
          securityContext:
            privileged: true
          volumeMounts:
            - name: cni-cfg
              mountPath: /etc/cni/net.d
      volumes:
        - name: cni-cfg
          hostPath:
            path: /etc/cni/net.d
            type: DirectoryOrCreate
"#
    )
}

/// kind's own fallback StorageClass (pkg/cluster/internal/create/actions/installstorage).
const STORAGE_MANIFEST: &str = r#"# host-path based default storage class
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  namespace: kube-system
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
"#;

const IMPORT_SCRIPT: &str = r#"#!/bin/bash
# Imports the images kubeadm and kind deploy into containerd (no registry can be reached).
set -euo pipefail
for archive in /kind/images/*.tar; do
  ctr --namespace=k8s.io images import "$archive"
done
"#;

const IMPORT_UNIT: &str = "[Unit]
Description=Import the images kubeadm and kind deploy into containerd
After=containerd.service
Requires=containerd.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/kind/bin/import-images.sh

[Install]
WantedBy=multi-user.target
";

/// The kubelet starts once the images are in, and with /sys/fs/cgroup a shared mount: the
/// entrypoint makes it private on a cgroup v1 host, and a pod mounting it (or the cgroup2
/// hierarchy under it) with HostToContainer propagation, as kpr's agent does, fails then.
const KUBELET_AFTER_IMPORT: &str = "[Unit]
After=kind-import-images.service
Wants=kind-import-images.service

[Service]
ExecStartPre=/bin/mount --make-rshared /sys/fs/cgroup
";

/// Lays kind's images/base files, the binaries and the manifests into the node root filesystem
/// and does what the base Dockerfile's RUN steps do.
fn node_files(rootfs: &Path) -> anyhow::Result<()> {
    let base = kind_tools::kind_source()?.join("images/base/files");
    ensure!(
        base.is_dir(),
        "{} is missing: `cargo xtask setup --kind` downloads kind's module",
        base.display()
    );
    copy_tree(
        &base.join("usr/local/bin"),
        &rootfs.join("usr/local/bin"),
        0o755,
    )?;
    copy_tree(&base.join("kind"), &rootfs.join("kind"), 0o644)?;
    copy_tree(&base.join("kind/bin"), &rootfs.join("kind/bin"), 0o755)?;
    copy_tree(&base.join("etc"), &rootfs.join("etc"), 0o644)?;
    // kind's containerd.service runs /usr/local/bin/containerd; Debian's is in /usr/bin.
    symlink(
        "/usr/bin/containerd",
        &rootfs.join("usr/local/bin/containerd"),
    )?;
    let cni = rootfs.join("opt/cni/bin");
    fs::create_dir_all(&cni)?;
    for plugin in CNI_PLUGINS {
        symlink(&format!("/usr/lib/cni/{plugin}"), &cni.join(plugin))?;
    }
    // The sandbox image kubeadm of this release expects.
    let config = rootfs.join("etc/containerd/config.toml");
    let text = fs::read_to_string(&config)?;
    let pause = format!("registry.k8s.io/pause:{}", images::PAUSE_TAG);
    let text = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("sandbox_image") {
                format!("  sandbox_image = \"{pause}\"")
            } else if l.trim_start().starts_with("restrict_oom_score_adj") {
                // These machines lack CAP_SYS_RESOURCE: lowering a process's oom_score_adj below
                // containerd's own (static pods ask -998) fails, and with it the pod's runc.
                "  restrict_oom_score_adj = true".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    fs::write(&config, text + "\n")?;
    cri_base_spec(rootfs)?;
    // The binaries.
    let bin = k8s::bin_dir();
    for (src, dest) in [
        (bin.join("kubelet"), "usr/bin/kubelet"),
        (bin.join("kubectl"), "usr/bin/kubectl"),
        (kind_tools::bin_dir().join("kubeadm"), "usr/bin/kubeadm"),
        (kind_tools::bin_dir().join("crictl"), "usr/local/bin/crictl"),
    ] {
        let dest = rootfs.join(dest);
        fs::copy(&src, &dest).with_context(|| format!("copying {}", src.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
    }
    fs::write(
        rootfs.join("kind/version"),
        k8s::kubernetes_version()? + "\n",
    )?;
    let manifests = rootfs.join("kind/manifests");
    fs::create_dir_all(&manifests)?;
    fs::write(
        manifests.join("default-cni.yaml"),
        cni_manifest(&cni_image_name()?),
    )?;
    fs::write(manifests.join("default-storage.yaml"), STORAGE_MANIFEST)?;
    write_mode(
        &rootfs.join("kind/bin/import-images.sh"),
        IMPORT_SCRIPT,
        0o755,
    )?;
    let units = rootfs.join("etc/systemd/system");
    write_mode(
        &units.join("kind-import-images.service"),
        IMPORT_UNIT,
        0o644,
    )?;
    write_mode(
        &units.join("kubelet.service.d/12-kind-images.conf"),
        KUBELET_AFTER_IMPORT,
        0o644,
    )?;
    fs::create_dir_all(rootfs.join("etc/kubernetes/manifests"))?;
    // The base Dockerfile's clean-up: no unit starts but those enabled below; no kmsg in journald.
    for wants in [
        "lib/systemd/system/multi-user.target.wants",
        "lib/systemd/system/local-fs.target.wants",
        "lib/systemd/system/basic.target.wants",
    ] {
        remove_entries(&rootfs.join(wants), |_| true)?;
    }
    remove_entries(
        &rootfs.join("lib/systemd/system/sockets.target.wants"),
        |n| n.contains("udev") || n.contains("initctl"),
    )?;
    remove_entries(
        &rootfs.join("lib/systemd/system/sysinit.target.wants"),
        |n| n == "systemd-tmpfiles-setup.service",
    )?;
    for dir in fs::read_dir(&units)?.flatten() {
        if dir.file_name().to_string_lossy().ends_with(".wants") {
            remove_entries(&dir.path(), |_| true)?;
        }
    }
    let journald = rootfs.join("etc/systemd/journald.conf");
    let mut text = fs::read_to_string(&journald).unwrap_or_default();
    if !text.contains("ReadKMsg=no") {
        text.push_str("ReadKMsg=no\n");
        fs::write(&journald, text)?;
    }
    let systemctl = |args: &[&str]| {
        Cmd::new("systemctl")
            .arg("--root")
            .arg(rootfs)
            .args(args)
            .run()
    };
    systemctl(&[
        "enable",
        "kubelet.service",
        "containerd.service",
        "undo-mount-hacks.service",
        "kind-import-images.service",
    ])?;
    systemctl(&["mask", "systemd-binfmt.service"])
}

/// `/etc/containerd/cri-base.json`: `ctr oci spec` with kind's createContainer hook and without
/// rlimits, as the base Dockerfile makes it.
fn cri_base_spec(rootfs: &Path) -> anyhow::Result<()> {
    let spec = Cmd::new("ctr").args(["oci", "spec"]).quiet().read()?;
    let mut spec: serde_json::Value =
        serde_json::from_str(&spec).context("parsing ctr oci spec")?;
    let hooks = spec
        .as_object_mut()
        .context("ctr oci spec is not an object")?
        .entry("hooks")
        .or_insert_with(|| serde_json::json!({}));
    let create = hooks
        .as_object_mut()
        .context("hooks is not an object")?
        .entry("createContainer")
        .or_insert_with(|| serde_json::json!([]));
    create
        .as_array_mut()
        .context("createContainer is not a list")?
        .push(serde_json::json!({"path": "/kind/bin/mount-product-files.sh"}));
    if let Some(process) = spec.get_mut("process").and_then(|p| p.as_object_mut()) {
        process.remove("rlimits");
    }
    fs::write(
        rootfs.join("etc/containerd/cri-base.json"),
        serde_json::to_string_pretty(&spec)? + "\n",
    )?;
    Ok(())
}

/// Copies the files of `src` (recursively) into `dest`, each with `mode`.
fn copy_tree(src: &Path, dest: &Path, mode: u32) -> anyhow::Result<()> {
    fs::create_dir_all(dest)?;
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let to = dest.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to, mode)?;
        } else {
            let _ = fs::remove_file(&to);
            fs::copy(entry.path(), &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

fn symlink(target: &str, link: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} to {target}", link.display()))
}

fn write_mode(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Removes the entries of `dir` whose name `matches` (a missing `dir` has none).
fn remove_entries(dir: &Path, matches: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if matches(&entry.file_name().to_string_lossy()) {
            fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cni_manifest_is_patched_by_kind_and_runs_the_routes_image() {
        let manifest = cni_manifest("docker.io/kpr-local/kind-routes:v0.30.0");
        assert!(manifest.starts_with("# would you kindly patch this file"));
        assert!(manifest.contains("image: docker.io/kpr-local/kind-routes:v0.30.0"));
        // kind appends CONTROL_PLANE_ENDPOINT to the first container's env list.
        assert!(manifest.contains("          env:\n            - name: NODE_NAME"));
    }

    #[test]
    fn the_routes_script_is_valid_sh() {
        let path = std::env::temp_dir().join(format!("kind-routes-{}.sh", std::process::id()));
        fs::write(&path, ROUTES_SCRIPT).unwrap();
        let status = std::process::Command::new("sh")
            .arg("-n")
            .arg(&path)
            .status()
            .unwrap();
        fs::remove_file(&path).unwrap();
        assert!(status.success());
    }
}
