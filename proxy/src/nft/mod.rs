//! Running `nft`, the one place the agent executes it: a script is one transaction (one netlink
//! batch, applied atomically or not at all), the version check that tells a user clearly when the
//! installed nft is too old, small queries, and deleting a table. `nft` runs in the network
//! namespace of the calling thread. Small transactions (incremental syncs) go through the thread's
//! long-lived libnftables context ([`libnft`]); large ones (full syncs) and hosts without
//! libnftables run `nft -f -`, whose memory is returned when it exits. [`netlink`] writes the
//! elements of a new table without nft's parser; [`snapshot`] reads a table back (`nft -j`).

mod libnft;
pub mod netlink;
pub mod snapshot;

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::DataplaneError;

/// The oldest nft whose syntax every backend's scripts use (concatenations with `th dport`, map
/// lookups in `redirect to`).
pub const MIN_NFT_VERSION: (u32, u32, u32) = (0, 9, 6);

/// Parses `nftables v1.0.6 (Lester Gooch #5)` into (1, 0, 6).
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let v = s
        .split_whitespace()
        .find(|w| w.starts_with('v'))?
        .trim_start_matches('v');
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// Checks that `nft` exists and is new enough; says what is needed when it is not.
pub fn check_version() -> Result<(u32, u32, u32), DataplaneError> {
    let out =
        Command::new("nft")
            .arg("--version")
            .output()
            .map_err(|e| DataplaneError::Command {
                command: "nft --version".into(),
                detail: format!(
                    "{e}: install the nftables package (nft {}.{}.{} or newer)",
                    MIN_NFT_VERSION.0, MIN_NFT_VERSION.1, MIN_NFT_VERSION.2
                ),
            })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = parse_version(&text).ok_or_else(|| DataplaneError::Command {
        command: "nft --version".into(),
        detail: format!("unrecognised output {text:?}"),
    })?;
    if v < MIN_NFT_VERSION {
        return Err(DataplaneError::Command {
            command: "nft --version".into(),
            detail: format!(
                "nft {}.{}.{} is too old: {}.{}.{} or newer is needed",
                v.0, v.1, v.2, MIN_NFT_VERSION.0, MIN_NFT_VERSION.1, MIN_NFT_VERSION.2
            ),
        });
    }
    Ok(v)
}

/// Lines of the failing script quoted in an error, around the line nft complains about.
const CONTEXT_LINES: usize = 2;

/// Transactions up to this size use the long-lived libnftables context.
const SMALL_SCRIPT: usize = 64 * 1024;

static DUMPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Applies `script` as one transaction (set `KPR_NFT_DUMP_DIR` to keep each script as a file,
/// `tx-<pid>-<n>.nft`: the bench's worker and the agents it starts share the directory).
pub fn apply(script: &str) -> Result<(), DataplaneError> {
    apply_parts(&[script])
}

/// Applies the concatenation of `parts` as one transaction, without building it: a full load
/// at 100,000 Services is a 20 MB script, written to `nft -f -` part by part.
pub fn apply_parts<S: AsRef<str>>(parts: &[S]) -> Result<(), DataplaneError> {
    if let Some(dir) = std::env::var_os("KPR_NFT_DUMP_DIR") {
        let n = DUMPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("tx-{}-{n}.nft", std::process::id())),
            &*joined(parts),
        );
    }
    let len: usize = parts.iter().map(|p| p.as_ref().len()).sum();
    if len <= SMALL_SCRIPT {
        match libnft::run(&joined(parts)) {
            Some(Ok(())) => return Ok(()),
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
    let write = parts
        .iter()
        .try_for_each(|p| stdin.write_all(p.as_ref().as_bytes()));
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
        &joined(parts),
        &String::from_utf8_lossy(&out.stderr),
    ))
}

/// The script the parts make up; a single part (every `apply`) is not copied.
fn joined<S: AsRef<str>>(parts: &[S]) -> std::borrow::Cow<'_, str> {
    match parts {
        [one] => std::borrow::Cow::Borrowed(one.as_ref()),
        _ => parts.iter().map(AsRef::as_ref).collect::<String>().into(),
    }
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

/// Deletes a table if it exists (`destroy` needs nft 1.0.8; emulate it with add-then-delete).
pub fn delete_table(family: &str, name: &str) -> Result<(), DataplaneError> {
    apply(&format!(
        "add table {family} {name}\ndelete table {family} {name}\n"
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_strings() {
        assert_eq!(
            super::parse_version("nftables v1.0.6 (Lester Gooch #5)"),
            Some((1, 0, 6))
        );
        assert_eq!(super::parse_version("nftables v0.9"), Some((0, 9, 0)));
        assert_eq!(super::parse_version("garbage"), None);
    }
}
