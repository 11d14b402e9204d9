//! Upstream busybox, built here from its release tarball for the e2e `busybox` image.
//!
//! Debian's busybox (the `busybox-static` the other images take their applets from) reverts
//! upstream ash's keeping of environment variables whose names are not shell identifiers
//! (`revert-9c143ce5...` in its patches): `sh -c env` in it drops the `data-1=value-1` four
//! ConfigMap and Secret Conformance specs look for. Bash keeps them but words its errors its own
//! way, and a kubelet Conformance spec compares ash's ("/bin/sh: can't create /file: Read-only
//! file system"). Upstream's busybox does both as upstream's image does, so the image's busybox is
//! upstream's: the `.orig` tarball of Debian's source package (the pristine upstream release,
//! from the Debian registry, checked against the SHA-256 Debian's `.dsc` gives), `defconfig`,
//! static. Built once into `<target>/busybox/`; concurrent callers wait on a lock.
//!
//! Owns the download and the build; the image is [`crate::images::busybox`]'s.

use std::fs;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use anyhow::{ensure, Context as _};
use sha2::Digest as _;

use crate::exec::Cmd;
use crate::target_dir;

/// The upstream release (Debian bookworm's busybox source).
pub const VERSION: &str = "1.35.0";
const URL: &str = "http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.35.0.orig.tar.bz2";
/// `Checksums-Sha256` of `busybox_1.35.0-4+deb12u1.dsc`.
const SHA256: &str = "faeeb244c35a348a334f4a59e44626ee870fb07b6884d68c10ae8bc19f83a694";

/// The built binary (building it first if needed).
pub fn binary() -> anyhow::Result<PathBuf> {
    let dir = target_dir().join("busybox");
    let out = dir.join(format!("busybox-{VERSION}"));
    if out.is_file() {
        return Ok(out);
    }
    fs::create_dir_all(&dir)?;
    let lock = fs::File::create(dir.join(".lock"))?;
    // SAFETY: flock on a descriptor this function holds open until it returns.
    ensure!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0,
        "locking {}",
        dir.join(".lock").display()
    );
    if out.is_file() {
        return Ok(out);
    }
    let tarball = dir.join(format!("busybox-{VERSION}.tar.bz2"));
    if !tarball.is_file() {
        let partial = dir.join("download.partial");
        Cmd::new("curl")
            .args(["-sSfL", "--retry", "3", "-o"])
            .arg(&partial)
            .arg(URL)
            .run()
            .with_context(|| format!("downloading {URL}"))?;
        let mut hasher = sha2::Sha256::new();
        std::io::copy(&mut fs::File::open(&partial)?, &mut hasher)?;
        let got = format!("{:x}", hasher.finalize());
        ensure!(
            got == SHA256,
            "{URL}: SHA-256 {got}, Debian's .dsc says {SHA256}"
        );
        fs::rename(&partial, &tarball)?;
    }
    let src = dir.join("src");
    if src.exists() {
        fs::remove_dir_all(&src)?;
    }
    fs::create_dir_all(&src)?;
    Cmd::new("tar")
        .args(["-xjf"])
        .arg(&tarball)
        .args(["--strip-components=1", "-C"])
        .arg(&src)
        .run()?;
    Cmd::new("make").arg("defconfig").dir(&src).quiet().run()?;
    // Static, as upstream's image; without `tc`, whose 1.35 source does not build against
    // newer kernel headers (and which no spec runs).
    let config = src.join(".config");
    let text = fs::read_to_string(&config)?
        .replace("# CONFIG_STATIC is not set", "CONFIG_STATIC=y")
        .replace("CONFIG_TC=y", "# CONFIG_TC is not set");
    fs::write(&config, text)?;
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    Cmd::new("make")
        .arg(format!("-j{jobs}"))
        .arg("busybox")
        .dir(&src)
        .quiet()
        .run()
        .context("building busybox (make)")?;
    let partial = dir.join("busybox.partial");
    fs::copy(src.join("busybox"), &partial)?;
    fs::rename(&partial, &out)?;
    fs::remove_dir_all(&src)?;
    Ok(out)
}
