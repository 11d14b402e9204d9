//! Rust panics in the logs of the processes a test ran: kpr's controller-manager and scheduler
//! (and whatever else logs to a control plane's log directory). A panic is a test failure even
//! when the process survives it: the controllers' workers catch a sync's panic and retry, and
//! the scheduler's cycle does too, but the default panic hook has already printed
//! `thread '...' panicked at <file>:<line>:<col>:` to stderr, which [`crate::process`] sends to
//! the process's log file. No component of the reference release prints that phrase (Go's
//! runtime says `panic:`), so scanning every log of the directory is safe.
//!
//! [`PanicGuard`] is the check: made when a test starts (it records how long each log is, so a
//! shared control plane's earlier panics are not charged to it), checked when it ends (Drop, or
//! [`PanicGuard::check`]), failing the test with the panics' lines.
//!
//! Owns: the reading of log files for the panic line; nothing else.

use std::collections::HashMap;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

/// What the default panic hook prints: `thread 'main' panicked at src/x.rs:3:5:`.
pub const MARK: &str = "panicked at";

/// How many panics an excerpt shows, and how many lines after each panic line.
const SHOWN: usize = 3;
const LINES_AFTER: usize = 4;

/// The panics in `text`: each panic line with the message lines after it (up to the hook's
/// `note:` line), the first [`SHOWN`] of them, and how many there were; `None` without any.
pub fn excerpt(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let hits: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(MARK))
        .collect();
    hits.first()?;
    let mut out = format!("{} panic(s)", hits.len());
    for &i in hits.iter().take(SHOWN) {
        out.push_str("\n  ");
        out.push_str(lines[i].trim_end());
        for l in lines[i + 1..].iter().take(LINES_AFTER) {
            if l.starts_with("note: ") || l.contains(MARK) {
                break;
            }
            out.push_str("\n    ");
            out.push_str(l.trim_end());
        }
    }
    Some(out)
}

/// The panics in `path` after its first `from` bytes (all of it if it is shorter now: the file
/// was written anew).
pub fn scan(path: &Path, from: u64) -> Option<String> {
    let mut file = fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let from = if len < from { 0 } else { from };
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    excerpt(&String::from_utf8_lossy(&bytes))
}

/// The `*.log` files of `dir` and their lengths now.
fn logs_in(dir: &Path) -> HashMap<PathBuf, u64> {
    let Ok(entries) = fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            let len = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            (p, len)
        })
        .collect()
}

/// Fails the test (a panic, unless it is panicking already) when a log of its directory got a
/// panic line while the guard lived. Logs that appear later (a restarted controller manager's)
/// are read from their start.
#[derive(Debug)]
pub struct PanicGuard {
    dir: PathBuf,
    /// Each log's length when the guard was made.
    from: HashMap<PathBuf, u64>,
    /// What the guard covers, for the failure message ("namespace x-3").
    what: String,
    checked: bool,
}

impl PanicGuard {
    /// Covers what the logs of `dir` gain from now on.
    pub fn new(dir: &Path, what: &str) -> PanicGuard {
        PanicGuard {
            dir: dir.to_path_buf(),
            from: logs_in(dir),
            what: what.to_string(),
            checked: false,
        }
    }

    /// Covers the logs of `dir` from their start.
    pub fn from_start(dir: &Path, what: &str) -> PanicGuard {
        PanicGuard {
            dir: dir.to_path_buf(),
            from: HashMap::new(),
            what: what.to_string(),
            checked: false,
        }
    }

    /// `Err` naming every log with a panic line since the guard was made, with the lines (the
    /// guard still checks again when dropped).
    pub fn check(&self) -> Result<(), String> {
        let mut found: Vec<(PathBuf, String)> = logs_in(&self.dir)
            .into_keys()
            .filter_map(|path| {
                let from = self.from.get(&path).copied().unwrap_or(0);
                scan(&path, from).map(|e| (path, e))
            })
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        found.sort();
        let mut msg = format!("a process panicked during {}:", self.what);
        for (path, e) in found {
            msg.push_str(&format!("\n{}: {e}", path.display()));
        }
        Err(msg)
    }

    /// Checks now (and not again on drop), panicking with the panics' lines.
    pub fn finish(self) {
        if let Err(e) = self.into_result() {
            panic!("{e}");
        }
    }

    /// Checks now (and not again on drop), handing the result to the caller (a report that
    /// lists the panics beside other failures).
    pub fn into_result(mut self) -> Result<(), String> {
        self.checked = true;
        self.check()
    }
}

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if self.checked || std::thread::panicking() {
            return;
        }
        if let Err(e) = self.check() {
            panic!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOOK_OUTPUT: &str = "2025-01-01T00:00:00Z  INFO deployment: synced\n\
        thread 'tokio-runtime-worker' panicked at controllers/src/deployment/plan.rs:614:30:\n\
        index out of bounds: the len is 0 but the index is 0\n\
        note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\
        2025-01-01T00:00:01Z ERROR worker: sync panicked; retrying\n";

    #[test]
    fn the_hooks_line_and_message_are_found() {
        let e = excerpt(HOOK_OUTPUT).expect("a panic");
        assert!(e.starts_with("1 panic(s)"), "{e}");
        assert!(e.contains("plan.rs:614:30"), "{e}");
        assert!(e.contains("index out of bounds"), "{e}");
        assert!(!e.contains("RUST_BACKTRACE"), "{e}");
        assert_eq!(
            excerpt("INFO all fine\nERROR a failed request (not a panic)\n"),
            None
        );
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kpr-panics-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_guard_fails_on_a_panic_written_while_it_lived_only() {
        let d = dir("guard");
        let log = d.join("kpr-scheduler.log");
        // Before the guard: not its business.
        fs::write(&log, HOOK_OUTPUT).unwrap();
        let guard = PanicGuard::new(&d, "the test");
        assert_eq!(guard.check(), Ok(()));
        fs::write(d.join("kube-apiserver.log"), "I0101 serving\n").unwrap();
        assert_eq!(guard.check(), Ok(()));
        // A new process's log, and then a panic in it.
        let restarted = d.join("controller-manager-restart-1.log");
        fs::write(&restarted, HOOK_OUTPUT).unwrap();
        let err = guard.check().unwrap_err();
        assert!(err.contains("controller-manager-restart-1.log"), "{err}");
        assert!(!err.contains("kpr-scheduler.log"), "{err}");
        // Dropping the guard fails the test.
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(guard)));
        let message = dropped.expect_err("the guard panics on drop");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("index out of bounds"), "{text}");
        // From the start, the earlier panic counts too.
        let err = PanicGuard::from_start(&d, "x").into_result().unwrap_err();
        assert!(err.contains("kpr-scheduler.log"), "{err}");
        // A clean directory passes, through finish and drop alike.
        let clean = dir("clean");
        fs::write(clean.join("a.log"), "fine\n").unwrap();
        PanicGuard::from_start(&clean, "x").finish();
        drop(PanicGuard::from_start(&clean, "x"));
        let _ = fs::remove_dir_all(&d);
        let _ = fs::remove_dir_all(&clean);
    }
}
