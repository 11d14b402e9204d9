//! Running the iptables tools in the mode this node uses (legacy or nft).
//!
//! Owns: mode detection and the only calls to `iptables`, `iptables-save` and
//! `iptables-restore` (`save` for `proxy trace`). All run in the calling thread's network namespace and wait for the xtables
//! lock (`-w`).

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::error::DataplaneError;
use crate::model::IpFamily;

/// Which iptables implementation programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Legacy,
    Nft,
}

impl Mode {
    /// Parses `--iptables-mode` (`legacy` or `nft`).
    pub fn parse(s: &str) -> Result<Mode, DataplaneError> {
        match s {
            "legacy" => Ok(Mode::Legacy),
            "nft" => Ok(Mode::Nft),
            other => Err(DataplaneError::InvalidFlag {
                flag: "--iptables-mode",
                detail: format!("expected `legacy` or `nft`, found `{other}`"),
            }),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Nft => "nft",
        }
    }

    /// The binary `iptables-<mode>[-save|-restore]`.
    pub fn binary(self, tool: &str) -> String {
        if tool.is_empty() {
            format!("iptables-{}", self.suffix())
        } else {
            format!("iptables-{}-{tool}", self.suffix())
        }
    }

    /// Picks the mode whose tables already hold rules (as kube-proxy's iptables-wrapper does);
    /// with no rules anywhere, nft (the Debian default).
    /// The tools of this mode for `family` (`ip6tables-<mode>` for IPv6).
    pub fn tool(self, family: IpFamily) -> Tool {
        Tool { mode: self, family }
    }

    pub fn detect() -> Mode {
        let count = |m: Mode| -> usize {
            Command::new(m.binary("save"))
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter(|l| l.starts_with("-A "))
                        .count()
                })
                .unwrap_or(0)
        };
        if count(Mode::Legacy) > count(Mode::Nft) {
            Mode::Legacy
        } else {
            Mode::Nft
        }
    }
}

fn command_error(
    command: String,
    status: std::process::ExitStatus,
    stderr: &[u8],
    script: Option<&str>,
) -> DataplaneError {
    let stderr = String::from_utf8_lossy(stderr);
    // The exit status always, so that a tool killed by a signal or failing silently still says
    // how it ended.
    let mut detail = format!("{status}");
    for l in stderr.lines().take(8) {
        detail.push('\n');
        detail.push_str(l);
    }
    if stderr.trim().is_empty() {
        detail.push_str(" (no stderr output)");
    }
    // iptables-restore names the failing line: "line 12 failed".
    let line = stderr
        .split("line ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok());
    if let (Some(script), Some(n)) = (script, line) {
        if let Some(l) = script.lines().nth(n.saturating_sub(1)) {
            detail.push_str(&format!("\nrestore line {n}: {l}"));
        }
    }
    DataplaneError::Command { command, detail }
}

/// Applies `script` with `iptables-restore --noflush` (one atomic commit per table).
/// One family's tools of one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub mode: Mode,
    pub family: IpFamily,
}

impl Tool {
    /// `iptables-<mode>[-tool]`, or `ip6tables-...` for IPv6.
    pub fn binary(self, tool: &str) -> String {
        let v4 = self.mode.binary(tool);
        match self.family {
            IpFamily::V4 => v4,
            IpFamily::V6 => format!("ip6{}", v4.trim_start_matches("ip")),
        }
    }
}

pub fn restore(tool: Tool, script: &str) -> Result<(), DataplaneError> {
    let bin = tool.binary("restore");
    let mut child = Command::new(&bin)
        .args(["-w", "5", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DataplaneError::io(format!("running {bin}"), e))?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let write = stdin.write_all(script.as_bytes());
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| DataplaneError::io(format!("waiting for {bin}"), e))?;
    write.map_err(|e| DataplaneError::io(format!("writing the restore input to {bin}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(command_error(
            format!("{bin} -w 5 --noflush"),
            out.status,
            &out.stderr,
            Some(script),
        ))
    }
}

/// Runs `iptables-<mode> args`; returns whether it succeeded (for `-C` checks) or an error when
/// the tool could not run at all.
pub fn iptables(tool: Tool, args: &[&str]) -> Result<bool, DataplaneError> {
    let bin = tool.binary("");
    let out = Command::new(&bin)
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| DataplaneError::io(format!("running {bin}"), e))?;
    Ok(out.status.success())
}

/// Every table `iptables-save` prints for `tool` (`proxy trace` reads the nat and filter rules).
pub fn save(tool: Tool) -> Result<String, DataplaneError> {
    let bin = tool.binary("save");
    let out = Command::new(&bin)
        .output()
        .map_err(|e| DataplaneError::io(format!("running {bin}"), e))?;
    if !out.status.success() {
        return Err(command_error(bin, out.status, &out.stderr, None));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chains of `table` whose names start with `prefix` (one `iptables-save`; only the first
/// full sync, the first after a failed restore, and cleanup: later syncs use the chains the
/// backend knows it wrote).
pub fn chains(tool: Tool, table: &str, prefix: &str) -> Result<Vec<String>, DataplaneError> {
    let bin = tool.binary("save");
    let out = Command::new(&bin)
        .args(["-t", table])
        .output()
        .map_err(|e| DataplaneError::io(format!("running {bin}"), e))?;
    if !out.status.success() {
        return Err(command_error(
            format!("{bin} -t {table}"),
            out.status,
            &out.stderr,
            None,
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with(prefix))
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_has_its_own_tools() {
        assert_eq!(
            Mode::Nft.tool(IpFamily::V4).binary("restore"),
            "iptables-nft-restore"
        );
        assert_eq!(
            Mode::Nft.tool(IpFamily::V6).binary("restore"),
            "ip6tables-nft-restore"
        );
        assert_eq!(
            Mode::Legacy.tool(IpFamily::V6).binary(""),
            "ip6tables-legacy"
        );
    }
}
