//! Running `nft`: one script per transaction, fed on standard input, and the version check that
//! tells a user clearly when the installed nft is too old.

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

/// Applies a script as one atomic transaction (`nft -f -`).
pub fn apply(script: &str) -> Result<(), DataplaneError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DataplaneError::io("running nft -f -", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| DataplaneError::io("writing to nft", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| DataplaneError::io("waiting for nft", e))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first_lines: String = stderr.lines().take(6).collect::<Vec<_>>().join("\n");
    Err(DataplaneError::Command {
        command: "nft -f -".into(),
        detail: first_lines,
    })
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
