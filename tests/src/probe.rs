//! Running the `probe` binary as a client *process* inside a namespace (and optionally a cgroup),
//! and reading its output back as [`Reply`]s. The eBPF backend's socket programs only see
//! processes inside their cgroup, so its tests need clients that are processes, not threads.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::cgroup::Cgroup;
use crate::client::{parse_reply, Reply};
use crate::netns::Netns;
use crate::HarnessError;

/// The `probe` binary: `$KPR_PROBE_BIN`, else `probe` in [`crate::agent::debug_dir`].
pub fn probe_binary() -> Result<PathBuf, HarnessError> {
    let path = match std::env::var_os("KPR_PROBE_BIN") {
        Some(p) => PathBuf::from(p),
        None => crate::agent::debug_dir().join("probe"),
    };
    if !path.is_file() {
        return Err(HarnessError::Agent(format!(
            "no probe binary at {}: build it: cargo build -p kpr-tests --bins",
            path.display()
        )));
    }
    Ok(path)
}

/// A `probe ARGS...` command that runs in `ns` and, when given, inside `cgroup` from its start.
pub fn probe_command(
    ns: &Netns,
    cgroup: Option<&Cgroup>,
    args: &[&str],
) -> Result<Command, HarnessError> {
    let mut cmd = ns.exec(probe_binary()?)?;
    cmd.args(args).stdin(Stdio::null());
    if let Some(cg) = cgroup {
        cg.add_on_exec(&mut cmd)?;
    }
    Ok(cmd)
}

/// One line of probe output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeLine {
    Reply(Reply),
    /// `error <kind>`: refused, reset, unreachable, timeout, closed, other: ...
    Error(String),
    /// `alive <pod>` / `dead <pod>` after `--hold`.
    Alive(String),
    Dead(String),
    /// `http <status> <body>`.
    Http {
        status: u16,
        body: String,
    },
}

/// What a probe run printed.
#[derive(Debug, Clone)]
pub struct ProbeOutput {
    pub lines: Vec<ProbeLine>,
    pub success: bool,
    pub stderr: String,
}

impl ProbeOutput {
    /// The successful replies, in order.
    pub fn replies(&self) -> Vec<&Reply> {
        self.lines
            .iter()
            .filter_map(|l| {
                if let ProbeLine::Reply(r) = l {
                    Some(r)
                } else {
                    None
                }
            })
            .collect()
    }

    /// The error kinds, in order.
    pub fn errors(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| {
                if let ProbeLine::Error(e) = l {
                    Some(e.as_str())
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Parses probe's standard output.
pub fn parse_probe_output(text: &str) -> Result<Vec<ProbeLine>, HarnessError> {
    text.lines()
        .map(|line| {
            if let Some(kind) = line.strip_prefix("error ") {
                Ok(ProbeLine::Error(kind.to_string()))
            } else if let Some(pod) = line.strip_prefix("alive ") {
                Ok(ProbeLine::Alive(pod.to_string()))
            } else if let Some(pod) = line.strip_prefix("dead ") {
                Ok(ProbeLine::Dead(pod.to_string()))
            } else if let Some(rest) = line.strip_prefix("http ") {
                let (status, body) = rest.split_once(' ').unwrap_or((rest, ""));
                let status = status.parse().map_err(|_| {
                    HarnessError::Agent(format!("probe printed {line:?}: bad HTTP status"))
                })?;
                Ok(ProbeLine::Http {
                    status,
                    body: body.to_string(),
                })
            } else {
                parse_reply(line)
                    .map(ProbeLine::Reply)
                    .map_err(|e| HarnessError::Agent(format!("probe printed {line:?}: {e}")))
            }
        })
        .collect()
}

/// Runs probe to completion in `ns` (and `cgroup`) and parses what it printed.
pub fn run_probe(
    ns: &Netns,
    cgroup: Option<&Cgroup>,
    args: &[&str],
) -> Result<ProbeOutput, HarnessError> {
    let out = probe_command(ns, cgroup, args)?
        .output()
        .map_err(|e| HarnessError::Io {
            what: format!("running probe {args:?}"),
            source: e,
        })?;
    Ok(ProbeOutput {
        lines: parse_probe_output(&String::from_utf8_lossy(&out.stdout))?,
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_output_lines_parse() {
        let lines = parse_probe_output(
            "pod0 10.244.200.2:1234\nerror refused\nalive pod0\ndead pod1\nhttp 503 {\"a\": 1}\n",
        )
        .unwrap();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[4],
            ProbeLine::Http {
                status: 503,
                body: "{\"a\": 1}".into()
            }
        );
        assert!(matches!(&lines[0], ProbeLine::Reply(r) if r.pod == "pod0"));
        assert_eq!(lines[1], ProbeLine::Error("refused".into()));
        assert_eq!(lines[2], ProbeLine::Alive("pod0".into()));
        assert_eq!(lines[3], ProbeLine::Dead("pod1".into()));
        assert!(parse_probe_output("nonsense").is_err());
    }
}
