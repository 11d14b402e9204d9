//! The guest kernels: Debian kernel packages downloaded and extracted under `target/vm/`, and the
//! KVM probe.

use super::*;

pub(super) fn vm_dir() -> PathBuf {
    target_dir().join("vm")
}

/// Downloads `linux-image-<version>-amd64` (once) and extracts it (once) under target/vm/;
/// returns the vmlinuz path. The modules sit next to it in `lib/modules/`, where virtme-ng looks.
pub(super) fn fetch_kernel(version: &str) -> anyhow::Result<PathBuf> {
    let package = format!("linux-image-{version}-amd64");
    let dir = vm_dir().join("kernels").join(version);
    let image = dir.join(format!("boot/vmlinuz-{version}-amd64"));
    if image.is_file() {
        println!("[ok] kernel {version} cached at {}", dir.display());
        return Ok(image);
    }
    let debs = vm_dir().join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let deb = match find_deb(&debs, &package)? {
        Some(deb) => deb,
        None => {
            let download = || {
                Cmd::new("apt-get")
                    .args(["download", "-q", &package])
                    .dir(&debs)
                    .run()
            };
            download()
                .or_else(|_| {
                    // A fresh machine's package lists may predate this kernel package.
                    Cmd::new("apt-get").args(["update", "-q"]).run()?;
                    download()
                })
                .with_context(|| {
                    format!("downloading {package} (`apt-cache search linux-image | grep amd64` lists what exists)")
                })?;
            find_deb(&debs, &package)?.with_context(|| {
                format!(
                    "apt-get download left no {package}_*.deb in {}",
                    debs.display()
                )
            })?
        }
    };
    // Not with_extension: versions hold dots. Extracted beside, renamed when complete.
    let kernels = vm_dir().join("kernels");
    fs::create_dir_all(&kernels).with_context(|| format!("creating {}", kernels.display()))?;
    let partial = kernels.join(format!("{version}.partial"));
    if partial.exists() {
        fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    Cmd::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&partial)
        .run()?;
    if !partial
        .join(format!("boot/vmlinuz-{version}-amd64"))
        .is_file()
    {
        bail!("{} holds no boot/vmlinuz-{version}-amd64", deb.display());
    }
    fs::rename(&partial, &dir)
        .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
    Ok(image)
}

pub(super) fn find_deb(dir: &Path, package: &str) -> anyhow::Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Whether KVM really runs a guest: boots `image` with no root filesystem under KVM, which ends
/// in a kernel panic within seconds when KVM works. On this project's machine /dev/kvm exists but
/// the guest hangs after an emulation failure, hence the hard timeout.
pub(super) fn probe_kvm(image: &Path) -> bool {
    if !Path::new("/dev/kvm").exists() {
        println!("KVM probe: no /dev/kvm, using TCG");
        return false;
    }
    let output = Cmd::new("sh")
        .args([
            "-c",
            "exec 2>&1; exec timeout -s KILL 20 qemu-system-x86_64 \"$@\"",
            "kvm-probe",
        ])
        .args([
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
        ])
        .args([
            "-no-reboot",
            "-serial",
            "stdio",
            "-append",
            "console=ttyS0 panic=-1",
            "-kernel",
        ])
        .arg(image)
        .read();
    let works = matches!(&output, Ok(text) if text.contains("Kernel panic"));
    if works {
        println!("KVM probe: a guest booted under KVM, using KVM");
    } else {
        println!("KVM probe: no guest kernel ran to its end under KVM within 20 s, using TCG");
    }
    works
}
