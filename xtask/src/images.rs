//! Container images built from files of this machine, without Docker or a registry: the test
//! cluster's nodes run containerd, which takes them with `ctr -n k8s.io images import <archive>`.
//!
//! An [`Image`] is a name, the runtime config (entrypoint, cmd, env, user) and a list of
//! [`Entry`]s; [`write_archive`] turns it into one uncompressed, reproducible layer (sorted entries,
//! mtime 0, owner 0:0, parent directories added) inside an OCI image layout tar whose index
//! carries the full name in `io.containerd.image.name`, which `ctr images import` keeps as it is.
//! [`with_libraries`] copies host binaries with the shared libraries they load (the `ldd` closure,
//! with the host's symlinks mirrored), so the images run the tools Debian installed here.
//!
//! The definitions (pause, busybox, agnhost, the node agents) live here too, as do the Debian
//! packages they take their tools from ([`HOST_PACKAGES`]). Owns `<target>/k8s/bin/pause`.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, ensure, Context as _};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::exec::Cmd;

/// An image to write with [`write_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The full reference, registry and tag included (`registry.k8s.io/pause:3.10.1`,
    /// `docker.io/library/kpr:dev`): exactly what `ctr images ls` and the kubelet will see.
    pub name: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `KEY=value` pairs.
    pub env: Vec<String>,
    pub user: Option<String>,
    /// The layer's content. The same path may appear more than once only with the same entry.
    pub entries: Vec<Entry>,
}

/// One path of the layer. `dest` is absolute inside the image (`/usr/bin/curl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A host file's content (symlinks followed); `mode` defaults to the host file's permissions.
    File {
        src: PathBuf,
        dest: String,
        mode: Option<u32>,
    },
    Bytes {
        dest: String,
        data: Vec<u8>,
        mode: u32,
    },
    /// `target` is stored as given: relative to the link's directory, or absolute inside the image.
    Symlink {
        dest: String,
        target: String,
    },
    Dir {
        dest: String,
        mode: u32,
    },
}

impl Entry {
    pub fn dest(&self) -> &str {
        match self {
            Entry::File { dest, .. }
            | Entry::Bytes { dest, .. }
            | Entry::Symlink { dest, .. }
            | Entry::Dir { dest, .. } => dest,
        }
    }

    /// A host file with its own permissions.
    pub fn file(src: impl Into<PathBuf>, dest: impl Into<String>) -> Entry {
        Entry::File {
            src: src.into(),
            dest: dest.into(),
            mode: None,
        }
    }

    pub fn text(dest: &str, text: &str, mode: u32) -> Entry {
        Entry::Bytes {
            dest: dest.to_string(),
            data: text.as_bytes().to_vec(),
            mode,
        }
    }

    pub fn symlink(dest: impl Into<String>, target: impl Into<String>) -> Entry {
        Entry::Symlink {
            dest: dest.into(),
            target: target.into(),
        }
    }

    pub fn dir(dest: &str, mode: u32) -> Entry {
        Entry::Dir {
            dest: dest.to_string(),
            mode,
        }
    }
}

/// The Debian packages the image definitions take their tools from, each with a file it installs.
/// gcc and libc6-dev build the static pause binary (and, with make and bzip2, upstream's busybox). `cargo xtask setup` installs them (every one is
/// in [`crate::setup::APT_PACKAGES`], a test checks).
pub const HOST_PACKAGES: &[(&str, &str)] = &[
    ("busybox-static", BUSYBOX),
    ("bash", BASH),
    ("curl", CURL),
    ("wget", WGET),
    ("netcat-openbsd", NC),
    ("bind9-dnsutils", DIG),
    ("iproute2", IP),
    ("nftables", NFT),
    ("iptables", XTABLES_NFT),
    ("conntrack", CONNTRACK),
    ("gcc", "/usr/bin/gcc"),
    ("libc6-dev", "/usr/lib/x86_64-linux-gnu/libc.a"),
    // Upstream's busybox built for the busybox image (crate::busybox_build).
    ("make", "/usr/bin/make"),
    ("bzip2", "/usr/bin/bzip2"),
];

pub(crate) const BUSYBOX: &str = "/bin/busybox";
pub(crate) const BASH: &str = "/bin/bash";
const CURL: &str = "/usr/bin/curl";
/// GNU wget: Debian's static busybox `wget -T <seconds>` dies of SIGSEGV (e2e specs run
/// `wget -q -O - -T 1`).
const WGET: &str = "/usr/bin/wget";
/// Not /bin/nc: that is an alternatives symlink which may point at another netcat.
const NC: &str = "/bin/nc.openbsd";
pub(crate) const DIG: &str = "/usr/bin/dig";
/// glibc's getent (its `files` and `dns` NSS modules are in libc.so.6 since 2.34): the DNS
/// Conformance specs check /etc/hosts entries with `getent hosts NAME` in agnhost and
/// jessie-dnsutils, which upstream's images have (Alpine's musl-utils, Debian's libc-bin).
pub(crate) const GETENT: &str = "/usr/bin/getent";
const IP: &str = "/bin/ip";
const SS: &str = "/bin/ss";
const NFT: &str = "/usr/sbin/nft";
const XTABLES_NFT: &str = "/usr/sbin/xtables-nft-multi";
const XTABLES_LEGACY: &str = "/usr/sbin/xtables-legacy-multi";
const XTABLES_MODULES: &str = "/usr/lib/x86_64-linux-gnu/xtables";
const CONNTRACK: &str = "/usr/sbin/conntrack";
const CA_CERTS: &str = "/etc/ssl/certs";
/// Where Debian's /etc/ssl/certs symlinks point.
const CA_CERTS_SOURCES: &str = "/usr/share/ca-certificates";

pub(crate) const PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Without it glibc asks DNS before /etc/hosts.
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";
pub(crate) const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
pub(crate) const GROUP: &str = "root:x:0:\nnobody:x:65534:\n";

/// The tag of upstream's pause image, which this one stands in for (build/pause/Makefile's TAG).
pub(crate) const PAUSE_TAG: &str = "3.10.1";

/// Where [`build_pause`] puts the pause binary: `<target>/k8s/bin/pause`.
pub fn pause_binary() -> PathBuf {
    crate::k8s::bin_dir().join("pause")
}

/// Compiles Kubernetes' own pause container (`build/pause/linux/pause.c` of the pinned release, from
/// Go's module cache, where `cargo xtask setup --k8s` put it) statically into `out`, with the
/// flags of upstream's Makefile.
pub fn build_pause(out: &Path) -> anyhow::Result<()> {
    let version = crate::k8s::kubernetes_version()?;
    let source = kubernetes_source()?.join("build/pause/linux/pause.c");
    ensure!(
        source.is_file(),
        "{} is missing: `cargo xtask setup --k8s` downloads the Kubernetes module",
        source.display()
    );
    let dir = out
        .parent()
        .with_context(|| format!("{} has no parent directory", out.display()))?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = dir.join(".pause.partial");
    Cmd::new("gcc")
        .args(["-Os", "-Wall", "-Werror", "-static"])
        .arg(format!("-DVERSION=v{PAUSE_TAG}-{version}"))
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .run()
        .context("compiling pause.c (gcc and libc6-dev are in HOST_PACKAGES)")?;
    fs::rename(&partial, out)
        .with_context(|| format!("moving {} to {}", partial.display(), out.display()))
}

/// The pinned `k8s.io/kubernetes` module in Go's module cache.
pub(crate) fn kubernetes_source() -> anyhow::Result<PathBuf> {
    Ok(go_mod_cache()?.join(format!(
        "k8s.io/kubernetes@{}",
        crate::k8s::kubernetes_version()?
    )))
}

/// Go's module cache: GOMODCACHE, else GOPATH's or `~/go`'s `pkg/mod` (Go's own defaults).
pub(crate) fn go_mod_cache() -> anyhow::Result<PathBuf> {
    Ok(match env::var_os("GOMODCACHE").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let gopath = env::var_os("GOPATH")
                .and_then(|p| env::split_paths(&p).next())
                .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join("go")))
                .context("neither GOMODCACHE, GOPATH nor HOME is set")?;
            gopath.join("pkg/mod")
        }
    })
}

/// `registry.k8s.io/pause:3.10.1`: the sandbox every Pod's containers join.
pub fn pause(pause_binary: &Path) -> Image {
    Image {
        name: format!("registry.k8s.io/pause:{PAUSE_TAG}"),
        entrypoint: vec!["/pause".into()],
        cmd: Vec::new(),
        env: vec![PATH_ENV.into()],
        user: None,
        entries: vec![Entry::File {
            src: pause_binary.to_owned(),
            dest: "/pause".into(),
            mode: Some(0o755),
        }],
    }
}

/// `registry.k8s.io/e2e-test-images/busybox:1.37.0-1`: upstream's busybox, built here
/// ([`crate::busybox_build`], static, every applet in /bin, `sh` its ash), as upstream's image is
/// the official busybox. Not Debian's: its ash drops environment variables whose names are not
/// shell identifiers, which four ConfigMap/Secret Conformance specs read through `sh -c env`; and
/// not bash as sh: a kubelet Conformance spec compares ash's wording of an error. (1.35, older than
/// the tag says; e2e specs use common applets.)
pub fn busybox() -> anyhow::Result<Image> {
    let built = crate::busybox_build::binary()?;
    let list = Cmd::new(&built).arg("--list").quiet().read()?;
    let mut entries = vec![Entry::File {
        src: built,
        dest: "/bin/busybox".into(),
        mode: Some(0o755),
    }];
    entries.extend(applet_links(&list, &BTreeSet::new()));
    entries.extend(base_files(PASSWD, GROUP));
    Ok(Image {
        name: "registry.k8s.io/e2e-test-images/busybox:1.37.0-1".into(),
        entrypoint: Vec::new(),
        cmd: vec!["sh".into()],
        env: vec![PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// `registry.k8s.io/e2e-test-images/agnhost:2.56`: what upstream's test/images/agnhost/Dockerfile
/// installs, with Debian's builds of the tools e2e tests exec inside it (curl, nc, dig, ip, ss,
/// bash as sh, busybox's applets for the rest). Busybox applets that run other programs
/// (`timeout`, `env`, `xargs`) still prefer their own applets over a real nc or ip.
pub fn agnhost(agnhost_binary: &Path) -> anyhow::Result<Image> {
    let porter = kubernetes_source()?.join("test/images/agnhost/porter");
    let tools: Vec<(PathBuf, String)> = [
        (BUSYBOX, "/bin/busybox"),
        (BASH, "/bin/bash"),
        (CURL, "/usr/bin/curl"),
        (WGET, "/usr/bin/wget"),
        (NC, "/usr/bin/nc"),
        (DIG, "/usr/bin/dig"),
        (IP, "/sbin/ip"),
        (SS, "/usr/sbin/ss"),
        (GETENT, "/usr/bin/getent"),
    ]
    .into_iter()
    .map(|(src, dest)| (PathBuf::from(src), dest.to_string()))
    .collect();
    let mut entries = with_libraries(&tools)?;
    // Debian's busybox-static is built with FEATURE_SH_STANDALONE and FEATURE_PREFER_APPLETS: its
    // sh runs its own nc and ip applets before looking at PATH, so `sh -c 'nc ...'` would never
    // reach netcat-openbsd. bash (POSIX mode when called as sh) looks PATH up like Alpine's sh.
    let mut taken = basenames(&entries);
    taken.insert("sh".into());
    entries.extend(busybox_applets(&taken)?);
    entries.push(Entry::symlink("/bin/sh", "bash"));
    entries.extend([
        Entry::File {
            src: agnhost_binary.to_owned(),
            dest: "/agnhost".into(),
            mode: Some(0o755),
        },
        // Entrypoint tests run the image with agnhost-2 as the entrypoint and check which ran.
        Entry::symlink("/agnhost-2", "agnhost"),
        Entry::dir("/uploads", 0o755),
        Entry::File {
            src: porter.join("localhost.crt"),
            dest: "/localhost.crt".into(),
            mode: Some(0o644),
        },
        Entry::File {
            src: porter.join("localhost.key"),
            dest: "/localhost.key".into(),
            mode: Some(0o644),
        },
        Entry::dir("/home/user-defined-in-image", 0o755),
        // One try per call, as busybox's wget (GNU wget retries a timeout 20 times).
        Entry::text("/etc/wgetrc", "tries = 1\n", 0o644),
    ]);
    // The Dockerfile's `adduser -u 1000 -D user-defined-in-image` (which also makes its group 1000)
    // and `addgroup -g 50000 group-defined-in-image`: the SupplementalGroups e2e tests expect them.
    let passwd =
        format!("{PASSWD}user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n");
    let group = format!(
        "{GROUP}user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
    );
    entries.extend(base_files(&passwd, &group));
    if Path::new(CA_CERTS).is_dir() {
        entries.extend(host_tree(Path::new(CA_CERTS))?);
        if Path::new(CA_CERTS_SOURCES).is_dir() {
            entries.extend(host_tree(Path::new(CA_CERTS_SOURCES))?);
        }
    }
    Ok(Image {
        name: "registry.k8s.io/e2e-test-images/agnhost:2.56".into(),
        entrypoint: vec!["/agnhost".into()],
        cmd: vec!["pause".into()],
        env: vec![PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// The image of a node's service proxy: `binaries` (`(host path, path in the image)`) with the
/// tools the rule backends drive (nft, the iptables family in both its nft and legacy variants
/// with their extension modules, conntrack, ip) and sh, stat and mount from busybox (for
/// debugging: the agents run none of them; this sh runs busybox's `ip` applet, not /usr/sbin/ip,
/// unless given the full path). No entrypoint: see [`kpr_agent`] and [`kube_proxy`].
pub fn node_agent(name: &str, binaries: &[(PathBuf, String)]) -> anyhow::Result<Image> {
    let mut files: Vec<(PathBuf, String)> = binaries.to_vec();
    for tool in [NFT, XTABLES_NFT, XTABLES_LEGACY, CONNTRACK] {
        files.push((tool.into(), tool.into()));
    }
    files.push((IP.into(), "/usr/sbin/ip".into()));
    files.push((BUSYBOX.into(), "/bin/busybox".into()));
    let modules = host_tree(Path::new(XTABLES_MODULES))?;
    files.extend(modules.iter().filter_map(|e| match e {
        Entry::File { src, dest, .. } => Some((src.clone(), dest.clone())),
        _ => None,
    }));
    let mut entries = with_libraries(&files)?;
    entries.extend(modules);
    for applet in ["sh", "stat", "mount"] {
        entries.push(Entry::symlink(format!("/bin/{applet}"), "busybox"));
    }
    for (multi, variant) in [
        ("xtables-nft-multi", "nft"),
        ("xtables-legacy-multi", "legacy"),
    ] {
        for family in ["iptables", "ip6tables"] {
            for tool in ["", "-save", "-restore"] {
                entries.push(Entry::symlink(
                    format!("/usr/sbin/{family}-{variant}{tool}"),
                    multi,
                ));
                if variant == "nft" {
                    entries.push(Entry::symlink(format!("/usr/sbin/{family}{tool}"), multi));
                }
            }
        }
    }
    // iptables takes its lock at /run/xtables.lock.
    entries.push(Entry::dir("/run", 0o755));
    entries.extend(base_files(PASSWD, GROUP));
    for file in ["/etc/protocols", "/etc/services"] {
        if Path::new(file).is_file() {
            entries.push(Entry::file(file, file));
        }
    }
    Ok(Image {
        name: name.to_string(),
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        env: vec![PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// kpr's image ([`crate::deploy::IMAGE`], fully qualified): the agent and the controller-manager.
pub fn kpr_agent(proxy: &Path, controller_manager: &Path) -> anyhow::Result<Image> {
    let mut image = node_agent(
        &format!("docker.io/library/{}", crate::deploy::IMAGE),
        &[
            (proxy.to_owned(), "/usr/local/bin/proxy".into()),
            (
                controller_manager.to_owned(),
                "/usr/local/bin/controller-manager".into(),
            ),
        ],
    )?;
    image.entrypoint = vec!["/usr/local/bin/proxy".into()];
    Ok(image)
}

/// `registry.k8s.io/kube-proxy:<pinned version>`, as kubeadm's DaemonSet runs it (its command is
/// `/usr/local/bin/kube-proxy --config=...`).
pub fn kube_proxy(kube_proxy_binary: &Path) -> anyhow::Result<Image> {
    node_agent(
        &format!(
            "registry.k8s.io/kube-proxy:{}",
            crate::k8s::kubernetes_version()?
        ),
        &[(
            kube_proxy_binary.to_owned(),
            "/usr/local/bin/kube-proxy".into(),
        )],
    )
}

/// /etc/passwd, /etc/group, /etc/nsswitch.conf, /tmp and /root.
pub(crate) fn base_files(passwd: &str, group: &str) -> Vec<Entry> {
    vec![
        Entry::text("/etc/passwd", passwd, 0o644),
        Entry::text("/etc/group", group, 0o644),
        Entry::text("/etc/nsswitch.conf", NSSWITCH, 0o644),
        Entry::dir("/tmp", 0o1777),
        Entry::dir("/root", 0o700),
    ]
}

/// A symlink `/bin/<applet>` -> busybox for every applet of the host's busybox whose name is not
/// in `taken` (the image's real tools, which must not be shadowed).
pub(crate) fn busybox_applets(taken: &BTreeSet<String>) -> anyhow::Result<Vec<Entry>> {
    let list = Cmd::new(BUSYBOX).arg("--list").quiet().read()?;
    Ok(applet_links(&list, taken))
}

fn applet_links(list: &str, taken: &BTreeSet<String>) -> Vec<Entry> {
    list.lines()
        .map(str::trim)
        .filter(|applet| !applet.is_empty() && *applet != "busybox")
        .filter(|applet| !applet.contains('/') && !taken.contains(*applet))
        .map(|applet| Entry::symlink(format!("/bin/{applet}"), "busybox"))
        .collect()
}

/// The file names of the image's regular files.
pub(crate) fn basenames(entries: &[Entry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| matches!(e, Entry::File { .. }))
        .filter_map(|e| e.dest().rsplit('/').next().map(str::to_string))
        .collect()
}

/// `dir` as it is on the host, at the same path in the image: directories, regular files and
/// symlinks (kept as links). `dir` itself must have no symlink in its path.
pub fn host_tree(dir: &Path) -> anyhow::Result<Vec<Entry>> {
    let real = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    ensure!(
        real == dir,
        "{} goes through a symlink (it is {}): give the resolved path",
        dir.display(),
        real.display()
    );
    let mut entries = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let mode = fs::metadata(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .permissions()
            .mode()
            & 0o7777;
        entries.push(Entry::Dir {
            dest: utf8(&dir)?.to_string(),
            mode,
        });
        for item in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = item?.path();
            let kind = fs::symlink_metadata(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .file_type();
            let dest = utf8(&path)?.to_string();
            if kind.is_symlink() {
                let target = fs::read_link(&path)?;
                entries.push(Entry::symlink(dest, utf8(&target)?));
            } else if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                entries.push(Entry::file(path, dest));
            } else {
                bail!(
                    "{} is neither a file, a directory nor a symlink",
                    path.display()
                );
            }
        }
    }
    Ok(entries)
}

fn utf8(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// `binaries` (`(host path, path in the image)`) and every shared library they load: `ldd`'s
/// closure plus the dynamic loader named by each program's PT_INTERP, at the paths the host has
/// them, with each symlink on the way (`/lib` -> `usr/lib`, `libfoo.so.1` -> `libfoo.so.1.2.3`)
/// kept as a link, so the loader finds them where it looks on the host. Files that are not ELF
/// (scripts, data) and static programs come alone. Deduplicated and sorted by path.
pub fn with_libraries(binaries: &[(PathBuf, String)]) -> anyhow::Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = binaries
        .iter()
        .map(|(src, dest)| Entry::file(src, dest))
        .collect();
    let mut libraries = BTreeSet::new();
    let mut dynamic = Vec::new();
    for (src, _) in binaries {
        let Some(elf) = elf_info(src)? else { continue };
        if let Some(interp) = elf.interp {
            libraries.insert(PathBuf::from(interp));
        }
        if elf.dynamic {
            dynamic.push(src.clone());
        }
    }
    if !dynamic.is_empty() {
        let out = Cmd::new("ldd").args(&dynamic).quiet().read()?;
        libraries.extend(ldd_paths(&out)?);
    }
    for library in &libraries {
        mirror_host_path(library, &mut entries)?;
    }
    dedup(entries)
}

/// The absolute paths in `ldd` output (one or several programs): `name => /path (0x...)` and the
/// loader's `/path (0x...)`; the vDSO has no path. A library ldd could not find is an error.
fn ldd_paths(out: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    // Library lines are indented; with several programs, unindented `program:` lines head them.
    for line in out.lines().filter(|l| l.starts_with(char::is_whitespace)) {
        let line = line.trim();
        let found = match line.split_once(" => ") {
            Some((name, rest)) => {
                ensure!(!rest.starts_with("not found"), "ldd: {name} not found");
                rest
            }
            None => line,
        };
        if found.starts_with('/') {
            let path = found.split(" (").next().unwrap_or(found);
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

/// Adds the host file at `path` at the same place in the image, and every symlink met while
/// resolving it (a symlinked directory such as `/lib`, then the link chain of the file itself) as
/// a link, so that each name under which the host reaches the file also works in the image.
fn mirror_host_path(path: &Path, entries: &mut Vec<Entry>) -> anyhow::Result<()> {
    let mut path = normalize(path)?;
    // The kernel's own limit on links followed in one lookup.
    'restart: for _ in 0..40 {
        let mut resolved = PathBuf::from("/");
        let components: Vec<_> = path.components().skip(1).collect();
        for (i, component) in components.iter().enumerate() {
            let next = resolved.join(component);
            let meta = fs::symlink_metadata(&next)
                .with_context(|| format!("reading {}", next.display()))?;
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&next)?;
                entries.push(Entry::symlink(utf8(&next)?, utf8(&target)?));
                let mut rest = resolved.join(target);
                rest.extend(&components[i + 1..]);
                path = normalize(&rest)?;
                continue 'restart;
            }
            resolved = next;
        }
        ensure!(
            fs::metadata(&resolved)?.is_file(),
            "{} is not a regular file",
            resolved.display()
        );
        entries.push(Entry::file(&resolved, utf8(&resolved)?));
        return Ok(());
    }
    bail!("too many levels of symlinks resolving {}", path.display())
}

/// `path` without `.` and `..` (lexically: only called on paths whose prefix before a `..` has no
/// symlinks left).
fn normalize(path: &Path) -> anyhow::Result<PathBuf> {
    ensure!(path.is_absolute(), "{} is not absolute", path.display());
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

/// What [`with_libraries`] needs to know of an ELF file.
struct ElfInfo {
    /// PT_INTERP: the dynamic loader the kernel starts for a dynamically linked program.
    interp: Option<String>,
    /// PT_DYNAMIC: it has shared libraries for ldd to list (programs and libraries both).
    dynamic: bool,
}

/// Reads the program headers of a 64-bit little-endian ELF file; `None` for a file that is not ELF.
fn elf_info(path: &Path) -> anyhow::Result<Option<ElfInfo>> {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    let context = || format!("reading the ELF headers of {}", path.display());
    let mut file = fs::File::open(path).with_context(context)?;
    let mut header = [0u8; 64];
    match file.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e).with_context(context),
    }
    if &header[..4] != b"\x7fELF" {
        return Ok(None);
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian: the only kind an amd64 image holds.
    ensure!(
        header[4] == 2 && header[5] == 1,
        "{} is not a 64-bit little-endian ELF file",
        path.display()
    );
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let phoff = u64_at(&header, 0x20);
    let phentsize = usize::from(u16_at(&header, 0x36));
    let phnum = usize::from(u16_at(&header, 0x38));
    ensure!(
        phentsize >= 56,
        "{}: bad program header size",
        path.display()
    );
    let mut table = vec![0u8; phentsize * phnum];
    file.seek(SeekFrom::Start(phoff)).with_context(context)?;
    file.read_exact(&mut table).with_context(context)?;
    let mut info = ElfInfo {
        interp: None,
        dynamic: false,
    };
    for ph in table.chunks_exact(phentsize) {
        match u32_at(ph, 0) {
            PT_DYNAMIC => info.dynamic = true,
            PT_INTERP => {
                let mut name = vec![0u8; usize::try_from(u64_at(ph, 32))?];
                file.seek(SeekFrom::Start(u64_at(ph, 8)))
                    .with_context(context)?;
                file.read_exact(&mut name).with_context(context)?;
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                info.interp = Some(
                    String::from_utf8(name.to_vec())
                        .with_context(|| format!("{}: PT_INTERP is not UTF-8", path.display()))?,
                );
            }
            _ => {}
        }
    }
    Ok(Some(info))
}

/// One entry per path, sorted; the same path twice is an error unless both entries are equal.
fn dedup(entries: Vec<Entry>) -> anyhow::Result<Vec<Entry>> {
    let mut by_path: BTreeMap<String, Entry> = BTreeMap::new();
    for entry in entries {
        match by_path.get(entry.dest()) {
            Some(existing) if *existing != entry => {
                bail!(
                    "two different entries for {}: {existing:?} and {entry:?}",
                    entry.dest()
                )
            }
            Some(_) => {}
            None => {
                by_path.insert(entry.dest().to_string(), entry);
            }
        }
    }
    Ok(by_path.into_values().collect())
}

/// Writes `image` to `out` as an OCI image layout tar (`oci-layout`, `index.json`, `blobs/sha256/`)
/// holding one uncompressed layer, the config and the manifest, for `ctr -n k8s.io images import`.
/// The index entry carries the platform (linux/amd64) and the name both as
/// `io.containerd.image.name` (which ctr keeps verbatim) and as `org.opencontainers.image.ref.name`
/// (the tag, as containerd's own exporter writes it). The same image gives the same bytes.
/// Returns the image id (`sha256:` of the config), what the kubelet and `crictl images` show.
pub fn write_archive(image: &Image, out: &Path) -> anyhow::Result<String> {
    check_reference(&image.name)?;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = out
        .file_name()
        .with_context(|| format!("{} has no file name", out.display()))?
        .to_string_lossy();
    let layer_path = dir.join(format!(".{file_name}.layer.partial"));
    let archive_path = dir.join(format!(".{file_name}.partial"));
    let _cleanup = RemoveOnDrop(vec![layer_path.clone(), archive_path.clone()]);

    // The layer goes to a file first: its digest names it and must be known before it is written.
    let layer_file = fs::File::create(&layer_path)
        .with_context(|| format!("creating {}", layer_path.display()))?;
    let mut hashed = HashWriter::new(io::BufWriter::new(layer_file));
    write_layer(&image.entries, &mut hashed)
        .with_context(|| format!("writing the layer of {}", image.name))?;
    let (layer_digest, layer_size) = hashed.finish()?;

    let config = serde_json::to_vec(&config_json(image, &layer_digest))?;
    let config_digest = sha256(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    }))?;
    let manifest_digest = sha256(&manifest);
    let tag = image
        .name
        .rsplit_once(':')
        .map_or(image.name.as_str(), |(_, tag)| tag);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;

    let archive_file = fs::File::create(&archive_path)
        .with_context(|| format!("creating {}", archive_path.display()))?;
    let mut archive = tar::Builder::new(io::BufWriter::new(archive_file));
    let blob = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    append_bytes(
        &mut archive,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    append_dir(&mut archive, "blobs", 0o755)?;
    append_dir(&mut archive, "blobs/sha256", 0o755)?;
    append_bytes(&mut archive, &blob(&config_digest), &config, 0o644)?;
    append_bytes(&mut archive, &blob(&manifest_digest), &manifest, 0o644)?;
    let mut header = file_header(layer_size, 0o644);
    let layer = fs::File::open(&layer_path)?;
    archive.append_data(&mut header, blob(&layer_digest), layer)?;
    append_bytes(&mut archive, "index.json", &index, 0o644)?;
    archive
        .into_inner()?
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    fs::rename(&archive_path, out)
        .with_context(|| format!("moving {} to {}", archive_path.display(), out.display()))?;
    Ok(config_digest)
}

/// [`write_archive`] unless `out` was written from the same inputs: the image's definition and,
/// for every host file it takes, its size and modification time (kept in `.<file name>.inputs`
/// beside the archive). Returns whether it wrote. Rebuilding an unchanged image costs reading
/// every file it holds; asking this costs a `stat` of each.
pub fn write_archive_cached(image: &Image, out: &Path) -> anyhow::Result<bool> {
    let key = inputs_key(image)?;
    let file_name = out
        .file_name()
        .with_context(|| format!("{} has no file name", out.display()))?
        .to_string_lossy();
    let key_path = out.with_file_name(format!(".{file_name}.inputs"));
    if out.is_file() && fs::read_to_string(&key_path).ok().as_deref() == Some(key.as_str()) {
        return Ok(false);
    }
    let _ = fs::remove_file(&key_path);
    write_archive(image, out)?;
    fs::write(&key_path, key).with_context(|| format!("writing {}", key_path.display()))?;
    Ok(true)
}

/// The digest of what [`write_archive`] makes `image` from.
fn inputs_key(image: &Image) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(format!("{image:?}"));
    for entry in &image.entries {
        if let Entry::File { src, .. } = entry {
            let meta = fs::metadata(src).with_context(|| format!("reading {}", src.display()))?;
            let mtime = meta
                .modified()?
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            hasher.update(format!(
                "{}:{}:{}\n",
                meta.len(),
                mtime.as_secs(),
                mtime.subsec_nanos()
            ));
        }
    }
    Ok(format!("{:x}\n", hasher.finalize()))
}

/// A name with a registry and a tag (`registry.k8s.io/pause:3.10.1`): containerd would store a
/// short name such as `kpr:dev` as it is, and the kubelet would never find it.
fn check_reference(name: &str) -> anyhow::Result<()> {
    let (domain, rest) = name.split_once('/').unwrap_or(("", name));
    let fully_qualified = domain.contains('.') || domain.contains(':') || domain == "localhost";
    let tagged = rest
        .rsplit_once(':')
        .is_some_and(|(_, tag)| !tag.is_empty());
    ensure!(
        fully_qualified && tagged && !rest.contains('@'),
        "image name {name:?} must be a full reference with a registry and a tag \
         (docker.io/library/{name} rather than {name})"
    );
    Ok(())
}

/// The OCI image config: platform, runtime defaults and the one layer's diff id.
fn config_json(image: &Image, layer_digest: &str) -> serde_json::Value {
    let mut config = serde_json::Map::new();
    if !image.entrypoint.is_empty() {
        config.insert("Entrypoint".into(), json!(image.entrypoint));
    }
    if !image.cmd.is_empty() {
        config.insert("Cmd".into(), json!(image.cmd));
    }
    if !image.env.is_empty() {
        config.insert("Env".into(), json!(image.env));
    }
    if let Some(user) = &image.user {
        config.insert("User".into(), json!(user));
    }
    json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": "cargo xtask (xtask/src/images.rs)" }],
    })
}

/// The layer tar of `entries`: one header per path in path order (so every directory precedes
/// what it holds), parent directories added as 0755, every owner 0:0 and mtime 0. A path under a
/// symlink or a file of the image is an error: extracting it would write through the link.
fn write_layer(entries: &[Entry], out: impl Write) -> anyhow::Result<()> {
    let mut by_path: BTreeMap<Vec<String>, Entry> = BTreeMap::new();
    for entry in dedup(entries.to_vec())? {
        by_path.insert(layer_components(entry.dest())?, entry);
    }
    let mut parents = BTreeMap::new();
    for (components, entry) in &by_path {
        for len in 1..components.len() {
            let parent = &components[..len];
            match by_path.get(parent) {
                Some(Entry::Dir { .. }) => {}
                Some(other) => bail!(
                    "{} is inside {}, which is not a directory in the image: {other:?}",
                    entry.dest(),
                    other.dest()
                ),
                None => {
                    parents.insert(
                        parent.to_vec(),
                        Entry::dir(&format!("/{}", parent.join("/")), 0o755),
                    );
                }
            }
        }
    }
    by_path.extend(parents);

    let mut tar = tar::Builder::new(out);
    for (components, entry) in &by_path {
        let path = components.join("/");
        match entry {
            Entry::Dir { mode, .. } => append_dir(&mut tar, &path, *mode)?,
            Entry::Bytes { data, mode, .. } => append_bytes(&mut tar, &path, data, *mode)?,
            Entry::Symlink { target, .. } => {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Symlink);
                set_common(&mut header, 0, 0o777);
                tar.append_link(&mut header, &path, target)?;
            }
            Entry::File { src, mode, .. } => {
                let file =
                    fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
                let meta = file.metadata()?;
                ensure!(meta.is_file(), "{} is not a regular file", src.display());
                let mode = mode.unwrap_or(meta.permissions().mode() & 0o7777);
                let mut header = file_header(meta.len(), mode);
                // Exactly the size the header announces, even if the file grows meanwhile.
                let mut data = file.take(meta.len());
                tar.append_data(&mut header, &path, &mut data)
                    .with_context(|| format!("adding {}", src.display()))?;
                ensure!(
                    data.limit() == 0,
                    "{} shrank while being read",
                    src.display()
                );
            }
        }
    }
    tar.into_inner()?.flush()?;
    Ok(())
}

/// `/usr/bin/curl` -> `["usr", "bin", "curl"]`; refuses relative paths, `.`, `..` and `/`.
fn layer_components(dest: &str) -> anyhow::Result<Vec<String>> {
    let rest = dest
        .strip_prefix('/')
        .with_context(|| format!("image path {dest:?} is not absolute"))?;
    let components: Vec<String> = rest
        .trim_end_matches('/')
        .split('/')
        .map(str::to_string)
        .collect();
    ensure!(
        components
            .iter()
            .all(|c| !c.is_empty() && c != "." && c != ".."),
        "image path {dest:?} is not a plain absolute path"
    );
    Ok(components)
}

fn set_common(header: &mut tar::Header, size: u64, mode: u32) {
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
}

fn file_header(size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    set_common(&mut header, size, mode);
    header
}

fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str, mode: u32) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    set_common(&mut header, 0, mode);
    tar.append_data(&mut header, format!("{path}/"), io::empty())?;
    Ok(())
}

fn append_bytes<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> anyhow::Result<()> {
    let mut header = file_header(data.len() as u64, mode);
    tar.append_data(&mut header, path, data)?;
    Ok(())
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// A writer that hashes and counts what goes through it.
struct HashWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Flushes and returns `("sha256:<hex>", length)`.
    fn finish(mut self) -> io::Result<(String, u64)> {
        self.inner.flush()?;
        Ok((format!("sha256:{:x}", self.hasher.finalize()), self.len))
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Removes the files (if they exist) when dropped: the partial layer and archive, also on errors.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_installs_every_package_the_images_take_files_from() {
        for (package, _) in HOST_PACKAGES {
            assert!(
                crate::setup::APT_PACKAGES.contains(package),
                "{package} is missing from setup::APT_PACKAGES"
            );
        }
    }
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A directory of its own under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = env::temp_dir().join(format!(
                "xtask-images-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sample(dir: &Path) -> Vec<Entry> {
        let src = dir.join("tool");
        fs::write(&src, b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o750)).unwrap();
        vec![
            Entry::symlink("/usr/bin/hi-link", "hi"),
            Entry::file(&src, "/usr/bin/hi"),
            Entry::text("/etc/app/config", "x = 1\n", 0o600),
            Entry::dir("/tmp", 0o1777),
            // Twice, equal: kept once.
            Entry::symlink("/usr/bin/hi-link", "hi"),
        ]
    }

    /// `(path, type, mode, uid, gid, mtime, link target)` of each layer entry, in order.
    type Row = (String, tar::EntryType, u32, u64, u64, u64, Option<String>);

    fn listing(tar_bytes: &[u8]) -> Vec<Row> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    h.mtime().unwrap(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.to_string_lossy().into_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn layer_is_deterministic_with_parents_and_symlinks() {
        let dir = TempDir::new();
        let mut first = Vec::new();
        write_layer(&sample(&dir.0), &mut first).unwrap();
        let mut reversed = sample(&dir.0);
        reversed.reverse();
        let mut second = Vec::new();
        write_layer(&reversed, &mut second).unwrap();
        assert_eq!(sha256(&first), sha256(&second), "same entries, same layer");

        use tar::EntryType::{Directory, Regular, Symlink};
        let rows = listing(&first);
        let expected: Vec<Row> = vec![
            ("etc/".into(), Directory, 0o755, 0, 0, 0, None),
            ("etc/app/".into(), Directory, 0o755, 0, 0, 0, None),
            ("etc/app/config".into(), Regular, 0o600, 0, 0, 0, None),
            ("tmp/".into(), Directory, 0o1777, 0, 0, 0, None),
            ("usr/".into(), Directory, 0o755, 0, 0, 0, None),
            ("usr/bin/".into(), Directory, 0o755, 0, 0, 0, None),
            ("usr/bin/hi".into(), Regular, 0o750, 0, 0, 0, None),
            (
                "usr/bin/hi-link".into(),
                Symlink,
                0o777,
                0,
                0,
                0,
                Some("hi".into()),
            ),
        ];
        assert_eq!(rows, expected);
    }

    #[test]
    fn conflicting_entries_and_paths_through_links_are_refused() {
        let err = write_layer(
            &[
                Entry::symlink("/bin/sh", "busybox"),
                Entry::symlink("/bin/sh", "bash"),
            ],
            io::sink(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("two different entries for /bin/sh"));
        let err = write_layer(
            &[
                Entry::symlink("/lib", "usr/lib"),
                Entry::text("/lib/x", "", 0o644),
            ],
            io::sink(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("not a directory in the image"));
        assert!(write_layer(&[Entry::text("/a/../b", "", 0o644)], io::sink()).is_err());
    }

    #[test]
    fn archive_is_an_oci_layout_naming_the_image() {
        let dir = TempDir::new();
        let image = Image {
            name: "registry.example/kpr/test:1".into(),
            entrypoint: vec!["/usr/bin/hi".into()],
            cmd: vec!["x".into()],
            env: vec![PATH_ENV.into()],
            user: Some("65534".into()),
            entries: sample(&dir.0),
        };
        let out = dir.0.join("image.tar");
        let id = write_archive(&image, &out).unwrap();
        let bytes = fs::read(&out).unwrap();
        let again = write_archive(&image, &out).unwrap();
        assert_eq!(id, again);
        assert_eq!(sha256(&bytes), sha256(&fs::read(&out).unwrap()));
        // Only the archive is left behind.
        assert_eq!(fs::read_dir(&dir.0).unwrap().count(), 2);

        let mut files = BTreeMap::new();
        for e in tar::Archive::new(&bytes[..]).entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            files.insert(path, data);
        }
        let blob = |digest: &str| {
            let data = &files[&format!("blobs/sha256/{}", &digest["sha256:".len()..])];
            assert_eq!(sha256(data), digest, "blob named by its digest");
            data.clone()
        };
        let json = |data: &[u8]| serde_json::from_slice::<serde_json::Value>(data).unwrap();
        let index = json(&files["index.json"]);
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "registry.example/kpr/test:1"
        );
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
        assert_eq!(entry["platform"]["architecture"], "amd64");
        let manifest = json(&blob(entry["digest"].as_str().unwrap()));
        assert_eq!(manifest["config"]["digest"], id.as_str());
        let config = json(&blob(&id));
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/hi");
        assert_eq!(config["config"]["User"], "65534");
        assert_eq!(config["os"], "linux");
        assert_eq!(listing(&blob(layer_digest)).len(), 8);
    }

    #[test]
    fn short_names_are_refused() {
        assert!(check_reference("kpr:dev").is_err());
        assert!(check_reference("docker.io/library/kpr").is_err());
        assert!(check_reference("docker.io/library/kpr:dev").is_ok());
        assert!(check_reference("localhost:5000/kpr:dev").is_ok());
        assert!(check_reference("registry.k8s.io/e2e-test-images/agnhost:2.56").is_ok());
    }

    /// Follows the image's own symlinks from `path` to a regular file entry.
    fn resolve<'a>(entries: &'a [Entry], path: &str) -> Option<&'a Entry> {
        let by_dest: BTreeMap<&str, &Entry> = entries.iter().map(|e| (e.dest(), e)).collect();
        let mut path = PathBuf::from(path);
        'restart: for _ in 0..40 {
            let mut resolved = PathBuf::from("/");
            let components: Vec<_> = path.components().skip(1).collect();
            for (i, component) in components.iter().enumerate() {
                let next = resolved.join(component);
                if let Some(Entry::Symlink { target, .. }) = by_dest.get(next.to_str()?) {
                    let mut rest = resolved.join(target);
                    rest.extend(&components[i + 1..]);
                    path = normalize(&rest).ok()?;
                    continue 'restart;
                }
                resolved = next;
            }
            return by_dest
                .get(resolved.to_str()?)
                .copied()
                .filter(|e| matches!(e, Entry::File { .. }));
        }
        None
    }

    #[test]
    fn with_libraries_finds_libc_and_the_loader_of_ls() {
        let ls = PathBuf::from("/bin/ls");
        let entries = with_libraries(&[(ls.clone(), "/bin/ls".into())]).unwrap();
        let interp = elf_info(&ls).unwrap().unwrap().interp.unwrap();
        assert!(
            resolve(&entries, &interp).is_some(),
            "the loader {interp} is in the image: {entries:#?}"
        );
        let libc = entries
            .iter()
            .find(|e| e.dest().ends_with("/libc.so.6"))
            .expect("libc.so.6 is in the image");
        assert!(resolve(&entries, libc.dest()).is_some(), "{libc:?}");
        assert_eq!(entries.iter().filter(|e| e.dest() == "/bin/ls").count(), 1);
        assert!(
            resolve(&entries, "/bin/ls").is_some(),
            "the program is a file"
        );
    }

    #[test]
    fn non_elf_files_come_alone() {
        let dir = TempDir::new();
        let script = dir.0.join("script");
        fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(elf_info(&script).unwrap().is_none());
        let entries = with_libraries(&[(script.clone(), "/script".into())]).unwrap();
        assert_eq!(entries, vec![Entry::file(&script, "/script")]);
    }

    #[test]
    fn ldd_output_is_parsed_and_missing_libraries_fail() {
        let out = "/bin/a:\n\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            ldd_paths(out).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        let err = ldd_paths("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(err.to_string().contains("libfoo.so.1 not found"));
    }

    /// The busybox image's sh passes environment variables that are not shell identifiers on
    /// to the programs it runs, as upstream's image does (the ConfigMap and Secret "via the
    /// environment" Conformance specs run `sh -c env` and look for `data-1=value-1`).
    #[test]
    fn busybox_image_sh_keeps_variables_with_any_name() {
        let image = busybox().unwrap();
        let mut layer = Vec::new();
        write_layer(&image.entries, &mut layer).unwrap();
        let root = TempDir::new();
        tar::Archive::new(&layer[..]).unpack(&root.0).unwrap();
        let out = std::process::Command::new("/usr/sbin/chroot")
            .arg(&root.0)
            .args(["/bin/sh", "-c", "env"])
            .env_clear()
            .env("data-1", "value-1")
            .env("p-data-1", "value-1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            text.lines().any(|l| l == "data-1=value-1")
                && text.lines().any(|l| l == "p-data-1=value-1"),
            "the image's sh dropped them: {text}"
        );
        // And its sh is ash, wording a failed redirection as the kubelet Conformance spec of a
        // read-only root filesystem expects ("/bin/sh: can't create /file: ...").
        let out = std::process::Command::new("/usr/sbin/chroot")
            .arg(&root.0)
            .args(["/bin/sh", "-c", "echo test > /no/such/dir/file"])
            .env_clear()
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("/bin/sh: can't create /no/such/dir/file: "),
            "not ash's wording: {err}"
        );
    }

    /// agnhost resolves a name of /etc/hosts with `getent hosts`, as the DNS Conformance specs'
    /// probes do (`test -n "$(getent hosts NAME)" && echo OK > /results/...`).
    #[test]
    fn agnhost_image_has_getent_reading_etc_hosts() {
        let image = agnhost(Path::new("/bin/true")).unwrap();
        let mut layer = Vec::new();
        write_layer(&image.entries, &mut layer).unwrap();
        let root = TempDir::new();
        tar::Archive::new(&layer[..]).unpack(&root.0).unwrap();
        fs::write(
            root.0.join("etc/hosts"),
            "10.244.1.5\tdns-querier-2.dns-test-service-2.ns.svc.cluster.local\tdns-querier-2\n",
        )
        .unwrap();
        let out = std::process::Command::new("/usr/sbin/chroot")
            .arg(&root.0)
            .args(["/bin/sh", "-c", "getent hosts dns-querier-2"])
            .env_clear()
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.starts_with("10.244.1.5 "),
            "{out:?}"
        );
    }

    #[test]
    fn busybox_applets_do_not_shadow_real_tools() {
        let taken = BTreeSet::from(["nc".to_string(), "ip".to_string()]);
        let links = applet_links("sh\nnc\nip\nbusybox\nls\n", &taken);
        assert_eq!(
            links,
            vec![
                Entry::symlink("/bin/sh", "busybox"),
                Entry::symlink("/bin/ls", "busybox"),
            ]
        );
    }
}
