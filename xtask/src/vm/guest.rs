//! One guest run: virtme-ng over the host's root filesystem, its output streamed and watched
//! (timeout, idle watchdog), kernel messages told apart from test output.

use super::*;

/// Boots one kernel, streams the guest's output with a `[version]` prefix, and returns the
/// failures (empty when every planned suite passed).
pub(super) fn run_guest(
    args: &VmArgs,
    version: &str,
    image: &Path,
    plan: &[PlanEntry],
    kvm: bool,
    agent: crate::Profile,
) -> anyhow::Result<Vec<String>> {
    let run_dir = vm_dir().join("run").join(version);
    fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    // One plan per run: two runs on the same kernel (two engineers, one machine) must not
    // rewrite each other's plan while a guest reads it.
    let plan_file = run_dir.join(format!("plan-{}.tsv", std::process::id()));
    fs::write(&plan_file, render_plan(plan))
        .with_context(|| format!("writing {}", plan_file.display()))?;
    let root = workspace_root();
    let mut guest_env = format!(
        // Emulated guests are slow: the agents the tests start get 180 s to become healthy.
        "env RUST_BACKTRACE=1 KPR_TEST_READY_TIMEOUT=180 KPR_PROXY_BIN={} KPR_PROBE_BIN={}",
        agent.dir().join("proxy").display(),
        agent.dir().join("probe").display()
    );
    if args.selftest_fail {
        write!(guest_env, " {SELFTEST_ENV}=1").expect("writing to a String");
    }
    let script = format!(
        "{guest_env} bash {} {}",
        root.join(GUEST_SCRIPT).display(),
        plan_file.display()
    );
    let mut cmd = Cmd::new("vng")
        .arg("--run")
        .arg(image)
        .args([
            "--force-9p",
            "--cpus",
            &args.cpus.to_string(),
            "--memory",
            &args.memory,
        ])
        .args(["--name", "kpr-vm", "--exec", &script])
        .dir(&root);
    if !kvm {
        cmd = cmd.arg("--disable-kvm");
    }
    // The guest's script output reaches the host only on the serial console: virtme-ng-init
    // finds no virtio-serial script ports without udev (Debian kernels) and falls back to the
    // console, which vng shows only with --verbose. loglevel=1 keeps the kernel's own messages
    // off it (after the early boot lines) unless the user asked to see them.
    cmd = cmd.arg("--verbose");
    if !args.verbose {
        cmd = cmd.args(["--append", "loglevel=1"]);
    }
    let timeout = Duration::from_secs(args.timeout.unwrap_or(if args.smoke { 900 } else { 3600 }));
    let mut report = GuestReport::default();
    let ended = stream(
        cmd.spawn_piped()?,
        version,
        timeout,
        Duration::from_secs(args.idle_timeout),
        &mut report,
    )?;
    let mut failures = report.failures(plan);
    if let Some(reason) = ended {
        failures.push(reason);
    }
    Ok(failures)
}

/// Prints every line the guest prints, prefixed, feeding `report`; ends the guest (its whole
/// process group) when it runs past `timeout` or prints nothing but kernel messages for `idle`
/// (a guest stuck in a soft lockup keeps printing the kernel's lockup warnings, and those must
/// not keep it alive). Returns why it was ended, if it was.
pub(super) fn stream(
    mut child: Child,
    version: &str,
    timeout: Duration,
    idle: Duration,
    report: &mut GuestReport,
) -> anyhow::Result<Option<String>> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().context("guest stdout was not piped")?;
    let stderr = child.stderr.take().context("guest stderr was not piped")?;
    let readers = [forward_lines(stdout, tx.clone()), forward_lines(stderr, tx)];
    let started = Instant::now();
    let mut progress = Instant::now();
    let mut ended = None;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let quiet_left = idle.saturating_sub(progress.elapsed());
        if left.is_zero() || quiet_left.is_zero() {
            ended = Some(watchdog_reason(left.is_zero(), timeout, idle));
            break;
        }
        match rx.recv_timeout(left.min(quiet_left)) {
            Ok(line) => {
                println!("[{version}] {line}");
                report.feed(&line);
                if !is_kernel_message(&line) {
                    progress = Instant::now();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    if let Some(reason) = &ended {
        println!("[{version}] {reason}");
        // The group holds vng, qemu and virtiofsd/9p helpers.
        let group = format!("-{}", child.id());
        if let Err(e) = Cmd::new("kill").args(["-KILL", "--", &group]).run() {
            println!("[{version}] ending the guest: {e:#}");
        }
    }
    child.wait().context("waiting for vng")?;
    for reader in readers {
        let _ = reader.join();
    }
    Ok(ended)
}

pub(super) fn watchdog_reason(past_timeout: bool, timeout: Duration, idle: Duration) -> String {
    if past_timeout {
        format!(
            "guest ran past --timeout {} s and was ended",
            timeout.as_secs()
        )
    } else {
        format!(
            "watchdog: guest printed nothing but kernel messages for {} s (--idle-timeout) and was ended",
            idle.as_secs()
        )
    }
}

/// A line of the guest kernel's log on the console (`[ 1044.829629] watchdog: BUG: ...`), as
/// opposed to output of the tests.
pub(super) fn is_kernel_message(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix('[') else {
        return false;
    };
    let Some((stamp, _)) = rest.split_once(']') else {
        return false;
    };
    let stamp = stamp.trim();
    stamp.split_once('.').is_some_and(|(secs, frac)| {
        !secs.is_empty()
            && !frac.is_empty()
            && secs.bytes().all(|b| b.is_ascii_digit())
            && frac.bytes().all(|b| b.is_ascii_digit())
    })
}

/// A thread sending each line read from `pipe` (lossily decoded, without `\r`) to `tx`.
pub(super) fn forward_lines(
    pipe: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    })
}
