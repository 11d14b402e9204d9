//! `cargo xtask docker image`: kpr's image built from `deploy/Dockerfile` (the Rust build stage
//! included) on the engine of [`crate::docker`], where no registry can be reached. The Dockerfile's
//! two bases are made here and passed as its arguments:
//!
//! - `BUILD_BASE` = [`BUILD_BASE`]: a Debian bookworm root filesystem (debootstrap: the C
//!   toolchain the crates' build scripts use and the libraries bpf-linker links) with this
//!   machine's Rust toolchains as `cargo xtask setup` installed them: rustup, the stable release
//!   the Dockerfile names (`rust:X.Y-bookworm`) without its documentation, the nightly pinned in
//!   `proxy-ebpf/rust-toolchain.toml`, bpf-linker and the LLVM 22 library it links
//!   (`libLLVM.so.22.1`, from bookworm-security's llvm-22 packages), and the crates of the lock
//!   files: `$CARGO_HOME/registry/{cache,index}` as `/usr/local/cargo/registry-seed`, with
//!   `CARGO_NET_OFFLINE=true` (the Dockerfile seeds its registry cache mount from it).
//! - `RUNTIME_BASE` = [`crate::kind_image::RUNTIME_BASE`] (bookworm with nft, iptables, ...).
//!
//! On a machine that can pull, `docker build -f deploy/Dockerfile .` uses `rust:1.95-bookworm` and
//! installs the same with apt, rustup and `cargo install`.
//!
//! Owns `<target>/kind/rootfs-rust-build` (through [`crate::kind_image::debootstrap`]) and the
//! build base's name.

use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context as _};

use crate::docker::Engine;
use crate::exec::Cmd;
use crate::{deploy, kind_image, setup, workspace_root};

/// The build stage's base when no `rust:X.Y-bookworm` can be pulled.
pub const BUILD_BASE: &str = "kpr-local/rust-build:bookworm";
/// The image `cargo xtask docker image` builds (not `kpr:dev`, the one `kind --local` loads).
pub const IMAGE: &str = "kpr:dockerfile";

/// The C toolchain for build scripts (ring's `cc`) and what bpf-linker and libLLVM.so.22.1 link.
const PACKAGES: &[&str] = &[
    "gcc",
    "libc6-dev",
    "make",
    "pkg-config",
    "ca-certificates",
    "libffi8",
    "libedit2",
    "libz3-4",
    "zlib1g",
    "libzstd1",
    "libxml2",
    "libstdc++6",
    "libtinfo6",
    "libbsd0",
    "libicu72",
    "liblzma5",
];

/// The LLVM library bpf-linker links, where llvm-22-dev installs it (the Dockerfile's test for it).
const LIBLLVM: &str = "usr/lib/x86_64-linux-gnu/libLLVM.so.22.1";
const LIBLLVM_LINK: &str = "usr/lib/llvm-22/lib/libLLVM.so.22.1";

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// The stable release the Dockerfile's default build base names (`ARG BUILD_BASE=rust:X.Y-...`).
pub fn dockerfile_rust_release(dockerfile: &str) -> anyhow::Result<String> {
    dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG BUILD_BASE=rust:"))
        .and_then(|rest| rest.split('-').next())
        .map(str::to_owned)
        .context("deploy/Dockerfile has no `ARG BUILD_BASE=rust:X.Y-bookworm`")
}

/// Makes [`BUILD_BASE`] unless the engine has it from the same toolchains.
pub fn build_base(engine: &Engine) -> anyhow::Result<()> {
    let dockerfile = fs::read_to_string(deploy::deploy_dir().join(deploy::DOCKERFILE))?;
    let release = dockerfile_rust_release(&dockerfile)?;
    let rustup_home = setup::rustup_home()?;
    let cargo_home = setup::cargo_home();
    let stable = format!("stable-{TRIPLE}");
    let nightly = format!("{}-{TRIPLE}", setup::pinned_nightly()?);
    let rustc = |toolchain: &str| {
        Cmd::new(
            rustup_home
                .join("toolchains")
                .join(toolchain)
                .join("bin/rustc"),
        )
        .arg("-V")
        .quiet()
        .read()
    };
    let stable_version = rustc(&stable)?;
    ensure!(
        stable_version.starts_with(&format!("rustc {release}.")),
        "deploy/Dockerfile builds with Rust {release}, this machine's stable is {}",
        stable_version.trim()
    );
    let bpf_linker = cargo_home.join("bin/bpf-linker");
    ensure!(
        bpf_linker.is_file() && Path::new("/").join(LIBLLVM).is_file(),
        "bpf-linker or {LIBLLVM} is missing: `cargo xtask setup` installs them"
    );
    let stamp = format!(
        "{}{}{}",
        stable_version,
        rustc(&nightly)?,
        Cmd::new(&bpf_linker).arg("--version").quiet().read()?
    );
    let stamp_path = crate::target_dir().join("kind/rust-build.stamp");
    if kind_image::has_image(engine, BUILD_BASE)?
        && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str())
    {
        println!("[ok] {BUILD_BASE} already built");
        return Ok(());
    }
    let started = Instant::now();
    let rootfs = kind_image::debootstrap("rootfs-rust-build", PACKAGES)?;
    // rustup's proxies and settings (the toolchains, rustup itself and the rest come through tar).
    let bin = rootfs.join("usr/local/cargo/bin");
    fs::create_dir_all(&bin)?;
    for proxy in ["cargo", "rustc", "rustdoc"] {
        let link = bin.join(proxy);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink("rustup", &link)?;
    }
    let home = rootfs.join("usr/local/rustup");
    fs::create_dir_all(home.join("toolchains"))?;
    fs::write(
        home.join("settings.toml"),
        format!("version = \"12\"\ndefault_toolchain = \"{stable}\"\nprofile = \"minimal\"\nauto_self_update = \"disable\"\n"),
    )?;
    fs::create_dir_all(rootfs.join("usr/lib/llvm-22/lib"))?;
    // One tar stream: the root filesystem, then the host's files renamed into it (`S`: symlink
    // targets are left as they are).
    let script = r#"set -euo pipefail
rootfs="$1" rustup="$2" cargo="$3" stable="$4" nightly="$5"; shift 5
tar --numeric-owner -c \
  -C "$rootfs" . \
  -C "$rustup" --exclude="toolchains/$stable/share/doc" \
     --transform='s,^toolchains/,usr/local/rustup/toolchains/,S' \
     "toolchains/$stable" "toolchains/$nightly" \
  -C "$cargo" --transform='s,^registry/,usr/local/cargo/registry-seed/,S' \
     --transform='s,^bin/,usr/local/cargo/bin/,S' \
     registry/cache registry/index bin/rustup bin/bpf-linker \
  -C / "$LIBLLVM" "$LIBLLVM_LINK" | "$@""#;
    let mut import = Cmd::new("bash")
        .args(["-c", script, "import"])
        .arg(&rootfs)
        .arg(&rustup_home)
        .arg(&cargo_home)
        .args([&stable, &nightly])
        .env("LIBLLVM", LIBLLVM)
        .env("LIBLLVM_LINK", LIBLLVM_LINK)
        .arg(crate::docker::client())
        .args(["--host", &engine.host(), "import"]);
    for change in [
        "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV RUSTUP_HOME=/usr/local/rustup",
        "ENV CARGO_HOME=/usr/local/cargo",
        "ENV CARGO_NET_OFFLINE=true",
    ] {
        import = import.args(["--change", change]);
    }
    println!(
        "[import] {} with the toolchains as {BUILD_BASE}",
        rootfs.display()
    );
    import
        .args(["-", BUILD_BASE])
        .run()
        .with_context(|| format!("importing {BUILD_BASE}"))?;
    fs::write(&stamp_path, stamp)?;
    println!(
        "[ok] {BUILD_BASE} made in {:.0} s, {}",
        started.elapsed().as_secs_f64(),
        image_size(engine, BUILD_BASE)?
    );
    Ok(())
}

/// `docker build -f deploy/Dockerfile .` with the bases made here; reports its time and size.
pub fn build(engine: &Engine) -> anyhow::Result<()> {
    build_base(engine)?;
    kind_image::runtime_base(engine)?;
    let started = Instant::now();
    engine
        .docker()
        .args(["build", "-t", IMAGE, "-f"])
        .arg(deploy::deploy_dir().join(deploy::DOCKERFILE))
        .args(["--build-arg", &format!("BUILD_BASE={BUILD_BASE}")])
        .args([
            "--build-arg",
            &format!("RUNTIME_BASE={}", kind_image::RUNTIME_BASE),
        ])
        .arg(workspace_root())
        .env("DOCKER_BUILDKIT", "1")
        .run()?;
    println!(
        "[ok] {IMAGE} built from deploy/Dockerfile in {:.0} s, {}",
        started.elapsed().as_secs_f64(),
        image_size(engine, IMAGE)?
    );
    // The image runs: its agent answers.
    let version = engine
        .docker()
        .args(["run", "--rm", "--network", "none", IMAGE, "--version"])
        .read()?;
    println!("[ok] {IMAGE}: `proxy --version` says {}", version.trim());
    Ok(())
}

fn image_size(engine: &Engine, image: &str) -> anyhow::Result<String> {
    let size = engine
        .docker()
        .args(["image", "inspect", "-f", "{{.Size}}", image])
        .quiet()
        .read()?;
    let size: f64 = size.trim().parse().unwrap_or(0.0);
    Ok(format!("{:.0} MiB", size / (1u64 << 20) as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dockerfile_names_the_stable_release() {
        let text = fs::read_to_string(deploy::deploy_dir().join(deploy::DOCKERFILE)).unwrap();
        let release = dockerfile_rust_release(&text).unwrap();
        assert!(release.starts_with("1."), "{release}");
    }
}
