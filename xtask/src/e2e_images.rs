//! The images upstream's end-to-end suite runs (`e2e.test --list-images` of the pinned release),
//! for the real nodes of `cargo xtask cluster up --nodes N`. [`E2E_IMAGES`] names every one the
//! suite lists, each with how it is made here: from Debian's packages laid out as the original
//! image is (httpd, nginx, jessie-dnsutils ...), from upstream's Go sources in the modules pinned
//! by `xtask/k8s/e2e-images/go.mod` (resource-consumer, sample-apiserver ...), with the node images
//! ([`Recipe::Node`]: pause, busybox, agnhost, built by `crate::cluster::nodes`), or not at all,
//! with why ([`Recipe::NotBuilt`]: the nodes' containerd refuses every pull at once, so a Pod
//! using one fails with the image's name in its event instead of waiting on a registry).
//!
//! The tags are upstream's; the content is what this machine has (Debian's apache2 answers for
//! httpd 2.4.38 and 2.4.39 alike). Owns `<target>/cluster-images/e2e-bin` (the Go-built programs).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

use crate::images::{self, Entry, Image};

/// How an image the e2e suite lists is made here.
#[derive(Clone, Copy)]
pub enum Recipe {
    /// One of the images every node needs anyway (pause, busybox, agnhost): built with them.
    Node,
    /// Assembled by this function from the image's full name and the [`Inputs`].
    Built(fn(&str, &Inputs) -> anyhow::Result<Image>),
    /// Not built, for this reason: a Pod using it fails to pull at once.
    NotBuilt(&'static str),
}

/// One image `e2e.test --list-images` prints.
pub struct E2eImage {
    pub name: &'static str,
    pub recipe: Recipe,
}

const fn built(name: &'static str, f: fn(&str, &Inputs) -> anyhow::Result<Image>) -> E2eImage {
    E2eImage {
        name,
        recipe: Recipe::Built(f),
    }
}

const fn not_built(name: &'static str, why: &'static str) -> E2eImage {
    E2eImage {
        name,
        recipe: Recipe::NotBuilt(why),
    }
}

const CSI: &str = "a kubernetes-csi sidecar or driver: its module is not pinned here, and the \
                   specs using it deploy the CSI hostpath driver, which needs all of them";
const AUTHENTICATED: &str = "the specs pull it from a private registry with credentials to test \
                             pull secrets: a preloaded copy would make them pass without testing \
                             anything, and there is no registry here";

/// Every image the pinned `e2e.test --list-images` prints (a test checks it is exactly that set).
pub const E2E_IMAGES: &[E2eImage] = &[
    E2eImage {
        name: "registry.k8s.io/pause:3.10.1",
        recipe: Recipe::Node,
    },
    E2eImage {
        name: "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
        recipe: Recipe::Node,
    },
    E2eImage {
        name: "registry.k8s.io/e2e-test-images/agnhost:2.56",
        recipe: Recipe::Node,
    },
    built(
        "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
        busybox_alias,
    ),
    built("registry.k8s.io/e2e-test-images/httpd:2.4.38-4", httpd),
    built("registry.k8s.io/e2e-test-images/httpd:2.4.39-4", httpd),
    built("registry.k8s.io/e2e-test-images/nginx:1.14-4", nginx),
    built("registry.k8s.io/e2e-test-images/nginx:1.15-4", nginx),
    built(
        "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7",
        jessie_dnsutils,
    ),
    built("registry.k8s.io/e2e-test-images/kitten:1.7", kitten),
    built("registry.k8s.io/e2e-test-images/nautilus:1.7", nautilus),
    built("registry.k8s.io/e2e-test-images/nonroot:1.4", nonroot),
    built("registry.k8s.io/e2e-test-images/nonewprivs:1.3", nonewprivs),
    built("registry.k8s.io/e2e-test-images/perl:5.26", perl),
    built("registry.k8s.io/e2e-test-images/ipc-utils:1.3", ipc_utils),
    built(
        "registry.k8s.io/e2e-test-images/resource-consumer:1.13",
        resource_consumer,
    ),
    built(
        "registry.k8s.io/e2e-test-images/regression-issue-74839:1.2",
        regression_issue_74839,
    ),
    built(
        "registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2",
        sample_apiserver,
    ),
    built("registry.k8s.io/etcd:3.6.4-0", etcd),
    built(
        "registry.k8s.io/build-image/distroless-iptables:v0.7.14",
        distroless_iptables,
    ),
    not_built("gcr.io/k8s-authenticated-test/agnhost:2.6", AUTHENTICATED),
    not_built(
        "gcr.io/authenticated-image-pulling/alpine:3.7",
        AUTHENTICATED,
    ),
    not_built(
        "invalid.registry.k8s.io/invalid/alpine:3.1",
        "must not exist: the specs check that pulling it fails",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/apparmor-loader:1.4",
        "loads AppArmor profiles: this kernel has no AppArmor (no securityfs apparmor)",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/volume/iscsi:2.6",
        "an iSCSI target (targetcli on the kernel's LIO target modules): storage specs, not \
         attempted",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/volume/nfs:1.4",
        "the kernel NFS server in a privileged container (nfsd): storage specs, not attempted",
    ),
    not_built(
        "registry.k8s.io/sig-storage/nfs-provisioner:v4.0.8",
        "nfs-ganesha with its provisioner (kubernetes-sigs/nfs-ganesha-server-and-external-\
         provisioner, not pinned here): storage specs, not attempted",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/node-perf/npb-is:1.2",
        "the NAS Parallel Benchmarks, a source tarball from nas.nasa.gov (no package registry): \
         node performance specs only",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/node-perf/npb-ep:1.2",
        "the NAS Parallel Benchmarks, a source tarball from nas.nasa.gov (no package registry): \
         node performance specs only",
    ),
    not_built(
        "registry.k8s.io/e2e-test-images/node-perf/tf-wide-deep:1.3",
        "TensorFlow with a model (hundreds of MB from PyPI): node performance specs only",
    ),
    not_built(
        "registry.k8s.io/cloud-provider-gcp/gcp-compute-persistent-disk-csi-driver:v1.4.0",
        "Google Compute Engine persistent disks: runs on GCE only",
    ),
    not_built("registry.k8s.io/sig-storage/csi-attacher:v4.8.0", CSI),
    not_built("registry.k8s.io/sig-storage/csi-provisioner:v5.1.0", CSI),
    not_built("registry.k8s.io/sig-storage/csi-resizer:v1.13.1", CSI),
    not_built("registry.k8s.io/sig-storage/csi-snapshotter:v8.3.0", CSI),
    not_built(
        "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0",
        CSI,
    ),
    not_built(
        "registry.k8s.io/sig-storage/csi-external-health-monitor-controller:v0.12.1",
        CSI,
    ),
    not_built("registry.k8s.io/sig-storage/livenessprobe:v2.15.0", CSI),
    not_built("registry.k8s.io/sig-storage/hostpathplugin:v1.16.1", CSI),
    not_built("registry.k8s.io/sig-storage/hello-populator:v1.0.1", CSI),
    not_built(
        "registry.k8s.io/sig-storage/volume-data-source-validator:v1.0.0",
        CSI,
    ),
];

/// Upstream's Go programs the images carry, as `(package, binary name)`, built from the module
/// `xtask/k8s/e2e-images/go.mod` (the reference release, as `xtask/k8s/go.mod` pins it, plus
/// what these programs import beyond it) into `<target>/cluster-images/e2e-bin`.
const GO_PROGRAMS: &[(&str, &str)] = &[
    (
        "k8s.io/kubernetes/test/images/resource-consumer",
        "consumer",
    ),
    (
        "k8s.io/kubernetes/test/images/resource-consumer/consume-cpu",
        "consume-cpu",
    ),
    (
        "k8s.io/kubernetes/test/images/regression-issue-74839",
        "regression-issue-74839",
    ),
    ("k8s.io/kubernetes/test/images/nonewprivs", "nnp"),
    ("k8s.io/sample-apiserver", "sample-apiserver"),
];

/// What the builders take their files from.
pub struct Inputs {
    /// `<target>/k8s/bin`: agnhost, coredns, etcd, etcdctl.
    pub k8s_bin: PathBuf,
    /// The [`GO_PROGRAMS`].
    pub go_bin: PathBuf,
}

/// The images to build, as `(archive file stem, image)`: every [`Recipe::Built`] one. Builds
/// the [`GO_PROGRAMS`] first unless the pinned modules are those they were built from.
pub fn images(out: &Path) -> anyhow::Result<Vec<(String, Image)>> {
    let go_bin = out.join("e2e-bin");
    build_go_programs(&go_bin)?;
    let inputs = Inputs {
        k8s_bin: crate::k8s::bin_dir(),
        go_bin,
    };
    let mut list = Vec::new();
    for image in E2E_IMAGES {
        if let Recipe::Built(build) = image.recipe {
            let built = build(image.name, &inputs)
                .with_context(|| format!("assembling the e2e image {}", image.name))?;
            list.push((file_stem(image.name), built));
        }
    }
    Ok(list)
}

/// `registry.k8s.io/e2e-test-images/httpd:2.4.38-4` -> `e2e-httpd-2.4.38-4`.
pub fn file_stem(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    format!("e2e-{}", last.replace(':', "-"))
}

fn build_go_programs(dir: &Path) -> anyhow::Result<()> {
    let module = crate::k8s::module_dir().join("e2e-images");
    let mut hasher = Sha256::new();
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        hasher.update(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    for (package, _) in GO_PROGRAMS {
        hasher.update(package.as_bytes());
    }
    let stamp = format!("{:x}\n", hasher.finalize());
    let stamp_path = dir.join(".stamp");
    let present = GO_PROGRAMS.iter().all(|(_, name)| dir.join(name).is_file());
    if present && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        return Ok(());
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    println!("[build] the e2e images' Go programs into {}", dir.display());
    for &program in GO_PROGRAMS {
        crate::k8s::go_compile_package(&module, dir, program, "-s -w")?;
    }
    fs::write(&stamp_path, stamp).with_context(|| format!("writing {}", stamp_path.display()))
}

/// Debian's apache2 binary and its modules.
const APACHE2: &str = "/usr/sbin/apache2";
const APACHE2_MODULES: &str = "/usr/lib/apache2/modules";
/// The modules httpd.conf loads (Debian compiles core, so, http, log_config, logio, version and
/// unixd in).
const HTTPD_MODULES: &[&str] = &[
    "mpm_event",
    "authn_core",
    "authz_core",
    "authz_host",
    "mime",
    "dir",
    "autoindex",
    "alias",
    "env",
    "headers",
    "setenvif",
    "filter",
    "reqtimeout",
];
const LIBGCC_S: &str = "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1";
const NGINX: &str = "/usr/sbin/nginx";
/// The MIME tables of Debian's media-types and nginx-common.
const MIME_TYPES: &str = "/etc/mime.types";
const NGINX_MIME_TYPES: &str = "/etc/nginx/mime.types";
const NSLOOKUP: &str = "/usr/bin/nslookup";
const HOST: &str = "/usr/bin/host";
const STRESS: &str = "/usr/bin/stress";
const PERL: &str = "/usr/bin/perl";
const PERL_BASE: &str = "/usr/lib/x86_64-linux-gnu/perl-base";
const IPC_TOOLS: &[&str] = &["/usr/bin/ipcmk", "/usr/bin/ipcs", "/usr/bin/ipcrm"];

/// The Debian packages the builders take files from, each with a file it installs (so
/// `cargo xtask setup` installs them: a test checks they are in [`crate::setup::APT_PACKAGES`]).
pub const HOST_PACKAGES: &[(&str, &str)] = &[
    ("apache2-bin", APACHE2),
    ("nginx", NGINX),
    ("stress", STRESS),
    ("perl-base", PERL),
    ("util-linux", "/usr/bin/ipcs"),
    ("bind9-dnsutils", NSLOOKUP),
];

const HTTPD_ROOT: &str = "/usr/local/apache2";

/// upstream's httpd image (the Docker library's `httpd:2.4.x-alpine`): the server in
/// /usr/local/apache2 serving htdocs on port 80 as user daemon, logging to the container's stdout
/// and stderr, started by `httpd-foreground`; busybox's applets for the specs that exec into it
/// (`mv /usr/local/apache2/htdocs/index.html /tmp/` breaks a readiness probe).
fn httpd(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut binaries = vec![
        (PathBuf::from(APACHE2), format!("{HTTPD_ROOT}/bin/apache2")),
        // glibc loads it when a thread exits (ldd does not list it): without it every worker
        // child dies with "libgcc_s.so.1 must be installed for pthread_exit to work".
        (PathBuf::from(LIBGCC_S), LIBGCC_S.to_string()),
    ];
    for module in HTTPD_MODULES {
        let file = format!("mod_{module}.so");
        binaries.push((
            Path::new(APACHE2_MODULES).join(&file),
            format!("{HTTPD_ROOT}/modules/{file}"),
        ));
    }
    let mut entries = images::with_libraries(&binaries)?;
    // busybox has an httpd applet: the real one must win.
    let mut taken = images::basenames(&entries);
    taken.insert("httpd".into());
    entries.push(Entry::file(images::BUSYBOX, "/bin/busybox"));
    entries.extend(images::busybox_applets(&taken)?);
    let load: String = HTTPD_MODULES
        .iter()
        .map(|m| format!("LoadModule {m}_module modules/mod_{m}.so\n"))
        .collect();
    let conf = format!(
        "ServerRoot \"{HTTPD_ROOT}\"\nListen 80\n{load}\
         <IfModule unixd_module>\nUser daemon\nGroup daemon\n</IfModule>\n\
         ServerAdmin you@example.com\n\
         PidFile logs/httpd.pid\nDefaultRuntimeDir logs\n\
         <Directory />\n    AllowOverride none\n    Require all denied\n</Directory>\n\
         DocumentRoot \"{HTTPD_ROOT}/htdocs\"\n\
         <Directory \"{HTTPD_ROOT}/htdocs\">\n    Options Indexes FollowSymLinks\n    \
         AllowOverride None\n    Require all granted\n</Directory>\n\
         DirectoryIndex index.html\n\
         <Files \".ht*\">\n    Require all denied\n</Files>\n\
         ErrorLog /proc/self/fd/2\nLogLevel warn\n\
         LogFormat \"%h %l %u %t \\\"%r\\\" %>s %b\" common\nCustomLog /proc/self/fd/1 common\n\
         TypesConfig conf/mime.types\n"
    );
    entries.extend([
        // Debian's binary has /etc/apache2 compiled in as its root: the upstream layout is
        // given on its command line.
        Entry::text(
            &format!("{HTTPD_ROOT}/bin/httpd"),
            &format!(
                "#!/bin/sh\nexec {HTTPD_ROOT}/bin/apache2 -d {HTTPD_ROOT} -f conf/httpd.conf \"$@\"\n"
            ),
            0o755,
        ),
        Entry::text(
            "/usr/local/bin/httpd-foreground",
            &format!(
                "#!/bin/sh\nset -e\n\n# Apache gets grumpy about PID files pre-existing\n\
                 rm -f {HTTPD_ROOT}/logs/httpd.pid\n\n\
                 # By its path: busybox's sh runs its own httpd applet before PATH's.\n\
                 exec {HTTPD_ROOT}/bin/httpd -DFOREGROUND \"$@\"\n"
            ),
            0o755,
        ),
        Entry::text(&format!("{HTTPD_ROOT}/conf/httpd.conf"), &conf, 0o644),
        Entry::File {
            src: MIME_TYPES.into(),
            dest: format!("{HTTPD_ROOT}/conf/mime.types"),
            mode: Some(0o644),
        },
        Entry::text(
            &format!("{HTTPD_ROOT}/htdocs/index.html"),
            "<html><body><h1>It works!</h1></body></html>\n",
            0o644,
        ),
        Entry::dir(&format!("{HTTPD_ROOT}/logs"), 0o755),
    ]);
    let passwd = format!(
        "{}daemon:x:2:2:daemon:/usr/sbin:/sbin/nologin\n",
        images::PASSWD
    );
    let group = format!("{}daemon:x:2:\n", images::GROUP);
    entries.extend(images::base_files(&passwd, &group));
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["httpd-foreground".into()],
        env: vec![format!(
            "PATH={HTTPD_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        )],
        user: None,
        entries,
    })
}

const NGINX_CONF: &str = "user  nginx;\nworker_processes  1;\n\n\
error_log  /var/log/nginx/error.log warn;\npid        /var/run/nginx.pid;\n\n\
events {\n    worker_connections  1024;\n}\n\n\
http {\n    include       /etc/nginx/mime.types;\n    default_type  application/octet-stream;\n\n    \
log_format  main  '$remote_addr - $remote_user [$time_local] \"$request\" '\n                      \
'$status $body_bytes_sent \"$http_referer\" '\n                      \
'\"$http_user_agent\" \"$http_x_forwarded_for\"';\n\n    \
access_log  /var/log/nginx/access.log  main;\n\n    sendfile        on;\n    \
keepalive_timeout  65;\n\n    include /etc/nginx/conf.d/*.conf;\n}\n";

const NGINX_DEFAULT_SERVER: &str = "server {\n    listen       80;\n    server_name  localhost;\n\n    \
location / {\n        root   /usr/share/nginx/html;\n        index  index.html index.htm;\n    }\n\n    \
error_page   500 502 503 504  /50x.html;\n    location = /50x.html {\n        \
root   /usr/share/nginx/html;\n    }\n}\n";

/// upstream's nginx image (the Docker library's `nginx:1.x-alpine`): Debian's nginx with the
/// library image's configuration (port 80, /usr/share/nginx/html, user nginx, logs to stdout
/// and stderr), `nginx -g 'daemon off;'`.
fn nginx(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut entries = images::with_libraries(&[(NGINX.into(), NGINX.into())])?;
    let taken = images::basenames(&entries);
    entries.push(Entry::file(images::BUSYBOX, "/bin/busybox"));
    entries.extend(images::busybox_applets(&taken)?);
    let page = |title: &str, body: &str| {
        format!(
            "<!DOCTYPE html>\n<html>\n<head>\n<title>{title}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
        )
    };
    entries.extend([
        Entry::text("/etc/nginx/nginx.conf", NGINX_CONF, 0o644),
        Entry::text(
            "/etc/nginx/conf.d/default.conf",
            NGINX_DEFAULT_SERVER,
            0o644,
        ),
        Entry::File {
            src: NGINX_MIME_TYPES.into(),
            dest: "/etc/nginx/mime.types".into(),
            mode: Some(0o644),
        },
        Entry::text(
            "/usr/share/nginx/html/index.html",
            &page(
                "Welcome to nginx!",
                "<h1>Welcome to nginx!</h1>\n<p>If you see this page, the nginx web server is \
                 successfully installed and working.</p>",
            ),
            0o644,
        ),
        Entry::text(
            "/usr/share/nginx/html/50x.html",
            &page(
                "Error",
                "<h1>An error occurred.</h1>\n<p>Sorry, the page you are looking for is \
                 currently unavailable.</p>",
            ),
            0o644,
        ),
        Entry::symlink("/var/log/nginx/access.log", "/dev/stdout"),
        Entry::symlink("/var/log/nginx/error.log", "/dev/stderr"),
        // Debian's build keeps its temporary files there.
        Entry::dir("/var/lib/nginx", 0o755),
        Entry::dir("/var/cache/nginx", 0o755),
        Entry::dir("/run", 0o755),
        Entry::symlink("/var/run", "../run"),
    ]);
    let passwd = format!(
        "{}nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin\n",
        images::PASSWD
    );
    let group = format!("{}nginx:x:101:nginx\n", images::GROUP);
    entries.extend(images::base_files(&passwd, &group));
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// `tools` (`(host path, path in the image)`) with their libraries, busybox's applets for
/// everything else (none shadowing a tool), bash as /bin/bash, and `passwd`/`group`.
fn tool_image(
    name: &str,
    tools: &[(PathBuf, String)],
    passwd: &str,
    group: &str,
    sh_is_bash: bool,
) -> anyhow::Result<Vec<Entry>> {
    let mut tools = tools.to_vec();
    tools.push((images::BASH.into(), "/bin/bash".into()));
    let mut entries =
        images::with_libraries(&tools).with_context(|| format!("the tools of {name}"))?;
    let mut taken = images::basenames(&entries);
    if sh_is_bash {
        taken.insert("sh".into());
        entries.push(Entry::symlink("/bin/sh", "bash"));
    }
    entries.push(Entry::file(images::BUSYBOX, "/bin/busybox"));
    entries.extend(images::busybox_applets(&taken)?);
    entries.extend(images::base_files(passwd, group));
    Ok(entries)
}

/// upstream's jessie-dnsutils (Debian with dnsutils and CoreDNS at /coredns): dig, nslookup and
/// host from Debian's bind9-dnsutils, the cluster's CoreDNS build, bash as sh as on Debian.
fn jessie_dnsutils(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    let tools: Vec<(PathBuf, String)> = vec![
        (images::DIG.into(), "/usr/bin/dig".into()),
        (NSLOOKUP.into(), "/usr/bin/nslookup".into()),
        (HOST.into(), "/usr/bin/host".into()),
        (images::GETENT.into(), "/usr/bin/getent".into()),
        (inputs.k8s_bin.join("coredns"), "/coredns".into()),
    ];
    let entries = tool_image(name, &tools, images::PASSWD, images::GROUP, true)?;
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["bash".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// The same busybox image under the older tag some specs still name.
fn busybox_alias(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut image = images::busybox()?;
    image.name = name.into();
    Ok(image)
}

/// upstream's nonroot: a base image whose default user is 1234.
fn nonroot(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut image = images::busybox()?;
    image.name = name.into();
    image.user = Some("1234".into());
    Ok(image)
}

/// kitten and nautilus: agnhost's test-webserver serving the picture and data.json of the
/// image's own directory in the Kubernetes module.
fn agnhost_webserver(
    name: &str,
    inputs: &Inputs,
    dir: &str,
    picture: &str,
) -> anyhow::Result<Image> {
    let html = images::kubernetes_source()?
        .join("test/images")
        .join(dir)
        .join("html");
    let mut image = images::agnhost(&inputs.k8s_bin.join("agnhost"))?;
    image.name = name.into();
    image.cmd = vec!["test-webserver".into()];
    image.entries.extend([
        Entry::File {
            src: html.join(picture),
            dest: format!("/{picture}"),
            mode: Some(0o644),
        },
        Entry::File {
            src: html.join("data.json"),
            dest: "/data.json".into(),
            mode: Some(0o644),
        },
    ]);
    Ok(image)
}

fn kitten(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    agnhost_webserver(name, inputs, "kitten", "kitten.jpg")
}

fn nautilus(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    agnhost_webserver(name, inputs, "nautilus", "nautilus.jpg")
}

/// upstream's nonewprivs: its nnp program setuid root, run as the command.
fn nonewprivs(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    let mut entries = tool_image(name, &[], images::PASSWD, images::GROUP, false)?;
    entries.push(Entry::File {
        src: inputs.go_bin.join("nnp"),
        dest: "/usr/local/bin/nnp".into(),
        mode: Some(0o4755),
    });
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["nnp".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// The Docker library's perl: Debian's perl-base (the interpreter and its core modules).
fn perl(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut entries = tool_image(
        name,
        &[(PERL.into(), PERL.into())],
        images::PASSWD,
        images::GROUP,
        false,
    )?;
    entries.extend(images::host_tree(Path::new(PERL_BASE))?);
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["perl".into(), "-de0".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// upstream's ipc-utils: util-linux's ipcmk, ipcs and ipcrm.
fn ipc_utils(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let tools: Vec<(PathBuf, String)> = IPC_TOOLS
        .iter()
        .map(|t| (PathBuf::from(t), t.to_string()))
        .collect();
    let entries = tool_image(name, &tools, images::PASSWD, images::GROUP, false)?;
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["/bin/sh".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// upstream's resource-consumer: /consumer serving on 8080, its CPU burner at
/// ./consume-cpu/consume-cpu (it runs it relative to /) and Debian's stress for memory.
fn resource_consumer(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    let tools: Vec<(PathBuf, String)> = vec![
        (inputs.go_bin.join("consumer"), "/consumer".into()),
        (
            inputs.go_bin.join("consume-cpu"),
            "/consume-cpu/consume-cpu".into(),
        ),
        (STRESS.into(), STRESS.into()),
    ];
    let entries = tool_image(name, &tools, images::PASSWD, images::GROUP, false)?;
    Ok(Image {
        name: name.into(),
        entrypoint: vec!["/consumer".into()],
        cmd: Vec::new(),
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// One Go program as the entrypoint, with busybox's applets beside it.
fn go_entrypoint(name: &str, binary: &Path, dest: &str) -> anyhow::Result<Image> {
    let mut entries = tool_image(name, &[], images::PASSWD, images::GROUP, false)?;
    entries.push(Entry::File {
        src: binary.to_owned(),
        dest: dest.into(),
        mode: Some(0o755),
    });
    Ok(Image {
        name: name.into(),
        entrypoint: vec![dest.into()],
        cmd: Vec::new(),
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

fn regression_issue_74839(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    go_entrypoint(
        name,
        &inputs.go_bin.join("regression-issue-74839"),
        "/regression-issue-74839",
    )
}

/// k8s.io/sample-apiserver of the pinned release (upstream's image is an older tag of it).
fn sample_apiserver(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    go_entrypoint(
        name,
        &inputs.go_bin.join("sample-apiserver"),
        "/sample-apiserver",
    )
}

/// upstream's etcd image: etcd and etcdctl in /usr/local/bin (the cluster's own build of the
/// same etcd release).
fn etcd(name: &str, inputs: &Inputs) -> anyhow::Result<Image> {
    let tools: Vec<(PathBuf, String)> = ["etcd", "etcdctl"]
        .iter()
        .map(|b| (inputs.k8s_bin.join(b), format!("/usr/local/bin/{b}")))
        .collect();
    let entries = tool_image(name, &tools, images::PASSWD, images::GROUP, false)?;
    Ok(Image {
        name: name.into(),
        entrypoint: Vec::new(),
        cmd: vec!["/usr/local/bin/etcd".into()],
        env: vec![images::PATH_ENV.into()],
        user: None,
        entries,
    })
}

/// upstream's distroless-iptables: the iptables family, nft and conntrack (the node agents' own
/// tool set).
fn distroless_iptables(name: &str, _: &Inputs) -> anyhow::Result<Image> {
    let mut image = images::node_agent(name, &[])?;
    // `[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout` keeps its privileged Pod of this
    // image alive with `sleep 600`: upstream's image carries coreutils' sleep.
    image.entries.push(Entry::symlink("/bin/sleep", "busybox"));
    Ok(image)
}

/// The registries the listed images name (the nodes' containerd sends each to a closed port).
pub fn registries() -> BTreeSet<&'static str> {
    E2E_IMAGES
        .iter()
        .filter_map(|i| i.name.split_once('/').map(|(domain, _)| domain))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pinned suite's list, from the binary `cargo xtask setup --k8s` builds (the setup step
    /// of `cargo xtask test` runs first).
    fn listed() -> BTreeSet<String> {
        let e2e = crate::k8s::bin_dir().join("e2e.test");
        let out = std::process::Command::new(&e2e)
            .arg("--list-images")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} --list-images: {e} (`cargo xtask setup --k8s` builds it)",
                    e2e.display()
                )
            });
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_image_the_suite_lists_is_built_or_explained_and_no_other() {
        let ours: BTreeSet<String> = E2E_IMAGES.iter().map(|i| i.name.to_string()).collect();
        assert_eq!(ours.len(), E2E_IMAGES.len(), "an image is named twice");
        let listed = listed();
        let missing: Vec<_> = listed.difference(&ours).collect();
        let extra: Vec<_> = ours.difference(&listed).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "e2e.test lists {missing:?} which E2E_IMAGES does not; E2E_IMAGES has {extra:?} \
             which e2e.test does not list"
        );
    }

    #[test]
    fn the_node_images_are_the_ones_the_table_leaves_to_them() {
        let node: BTreeSet<&str> = E2E_IMAGES
            .iter()
            .filter(|i| matches!(i.recipe, Recipe::Node))
            .map(|i| i.name)
            .collect();
        let agnhost = images::agnhost(Path::new("/agnhost")).unwrap();
        let built: BTreeSet<String> = [
            images::pause(Path::new("/pause")).name,
            images::busybox().unwrap().name,
            agnhost.name,
        ]
        .into();
        assert_eq!(
            node,
            built.iter().map(String::as_str).collect::<BTreeSet<&str>>()
        );
    }

    #[test]
    fn the_programs_module_pins_the_reference_release() {
        let go_mod = crate::k8s::module_dir().join("e2e-images/go.mod");
        let text = fs::read_to_string(&go_mod).unwrap();
        let version = crate::k8s::kubernetes_version().unwrap();
        assert_eq!(
            crate::k8s::pinned(&text, "k8s.io/kubernetes").as_deref(),
            Some(version.as_str()),
            "{} must require k8s.io/kubernetes {version}, as xtask/k8s/go.mod does",
            go_mod.display()
        );
    }

    #[test]
    fn archive_names_are_distinct() {
        let stems: BTreeSet<String> = E2E_IMAGES.iter().map(|i| file_stem(i.name)).collect();
        assert_eq!(stems.len(), E2E_IMAGES.len());
        assert_eq!(
            file_stem("registry.k8s.io/e2e-test-images/httpd:2.4.38-4"),
            "e2e-httpd-2.4.38-4"
        );
    }

    #[test]
    fn setup_installs_every_package_the_images_take_files_from() {
        for (package, _) in HOST_PACKAGES {
            assert!(
                crate::setup::APT_PACKAGES.contains(package),
                "{package} is missing from setup::APT_PACKAGES"
            );
        }
    }

    #[test]
    fn the_nodes_refuse_every_registry_the_suite_names() {
        for registry in registries() {
            assert!(
                controlplane::nodes::CLOSED_REGISTRIES.contains(&registry),
                "{registry} is missing from controlplane::nodes::CLOSED_REGISTRIES: the nodes' \
                 containerd would look it up and try to pull from it"
            );
        }
    }
}
