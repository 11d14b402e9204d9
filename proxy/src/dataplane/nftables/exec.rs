//! Runs an `nft -f -` transaction: the only place this backend executes `nft`.
//!
//! One call is one netlink batch, so a sync is applied atomically or not at all. `nft` runs in
//! the network namespace of the calling thread. Small transactions (incremental syncs) go through
//! the thread's long-lived libnftables context ([`super::libnft`]); large ones (full syncs) and
//! hosts without libnftables run `nft -f -`, whose memory is returned when it exits.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::error::DataplaneError;

/// Lines of the failing script quoted in an error, around the line nft complains about.
const CONTEXT_LINES: usize = 2;

/// Transactions up to this size use the long-lived libnftables context.
const SMALL_SCRIPT: usize = 64 * 1024;

static DUMPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Applies `script` as one transaction (set `KPR_NFT_DUMP_DIR` to keep each script as a file,
/// `tx-<pid>-<n>.nft`: the bench's worker and the agents it starts share the directory).
pub fn apply(script: &str) -> Result<(), DataplaneError> {
    if let Some(dir) = std::env::var_os("KPR_NFT_DUMP_DIR") {
        // Debugging aid: keep every transaction as a file.
        let n = DUMPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("tx-{}-{n}.nft", std::process::id())),
            script,
        );
    }
    if script.len() <= SMALL_SCRIPT {
        match super::libnft::run(script) {
            Some(Ok(())) => return Ok(()),
            // The long-lived context is only a shortcut: a transaction is atomic, so one it
            // refused is retried by the nft binary, whose answer is the one reported (seen on
            // Debian's 6.12 kernel: "Operation not supported" from the context only).
            Some(Err(stderr)) => tracing::warn!(
                "libnftables refused a transaction, retrying with nft -f -: {}",
                stderr.trim()
            ),
            None => {}
        }
    }
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DataplaneError::io("running nft -f - (is nftables installed?)", e))?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let write = stdin.write_all(script.as_bytes());
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| DataplaneError::io("waiting for nft -f -", e))?;
    write.map_err(|e| DataplaneError::io("writing the transaction to nft -f -", e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(failed(
        "nft -f -",
        script,
        &String::from_utf8_lossy(&out.stderr),
    ))
}

fn failed(command: &str, script: &str, stderr: &str) -> DataplaneError {
    DataplaneError::Command {
        command: command.into(),
        detail: format!("{}{}", first_lines(stderr, 12), quote(script, stderr)),
    }
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n")
}

/// Quotes the script lines nft's first `/dev/stdin:LINE:` (`<cmdline>:LINE:` from libnftables)
/// reference points at.
fn quote(script: &str, stderr: &str) -> String {
    let Some(line) = stderr
        .split(|c: char| c.is_whitespace())
        .find_map(|w| {
            w.strip_prefix("/dev/stdin:")
                .or_else(|| w.strip_prefix("<cmdline>:"))
        })
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return String::new();
    };
    let lines: Vec<&str> = script.lines().collect();
    let from = line.saturating_sub(1 + CONTEXT_LINES);
    let to = (line + CONTEXT_LINES).min(lines.len());
    let mut out = format!("\ntransaction lines {}..{}:", from + 1, to);
    for (i, l) in lines[from..to].iter().enumerate() {
        let l: String = l.chars().take(300).collect();
        out.push_str(&format!("\n{:>6}: {l}", from + i + 1));
    }
    out
}

/// Runs `nft` with arguments and returns its standard output (small queries only).
pub fn query(args: &[&str]) -> Result<String, DataplaneError> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| DataplaneError::io(format!("running nft {}", args.join(" ")), e))?;
    if !out.status.success() {
        return Err(DataplaneError::Command {
            command: format!("nft {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
