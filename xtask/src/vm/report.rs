//! The verdict read from a guest's output: per suite, which tests passed and failed, and the
//! summary over every kernel.

use super::*;

/// What the guest reported, read from its output markers (tests/vm/guest.sh) and libtest's lines.
#[derive(Debug, Default)]
pub(super) struct GuestReport {
    pub(super) suites: Vec<SuiteReport>,
    pub(super) done: bool,
}

#[derive(Debug, Default)]
pub(super) struct SuiteReport {
    pub(super) name: String,
    pub(super) exit: Option<i32>,
    pub(super) passed: u64,
    pub(super) failed_tests: Vec<String>,
}

impl GuestReport {
    pub(super) fn feed(&mut self, line: &str) {
        let plain = strip_ansi(line);
        let line = plain.trim();
        if let Some(name) = line.strip_prefix("KPR-VM-SUITE-BEGIN ") {
            self.suites.push(SuiteReport {
                name: name.to_owned(),
                ..SuiteReport::default()
            });
        } else if let Some(rest) = line.strip_prefix("KPR-VM-SUITE-END ") {
            let code = rest.rsplit_once(" exit=").and_then(|(_, c)| c.parse().ok());
            if let Some(suite) = self.suites.last_mut() {
                suite.exit = code.or(Some(-1));
            }
        } else if line == "KPR-VM-DONE" {
            self.done = true;
        } else if let Some(suite) = self.suites.last_mut().filter(|s| s.exit.is_none()) {
            suite.feed_libtest(line);
        }
    }

    /// Every failure, each naming the kernel-independent thing that failed.
    pub(super) fn failures(&self, plan: &[PlanEntry]) -> Vec<String> {
        let mut failures = Vec::new();
        for entry in plan {
            let name = &entry.suite.name;
            let Some(suite) = self.suites.iter().find(|s| &s.name == name) else {
                failures.push(format!("suite {name} never ran"));
                continue;
            };
            for test in &suite.failed_tests {
                failures.push(format!("test {name}::{test} failed"));
            }
            match suite.exit {
                None => failures.push(format!("suite {name} did not finish")),
                Some(0) if entry.must_match && suite.passed == 0 => failures.push(format!(
                    "suite {name}: the filter {:?} matched no test",
                    entry.args
                )),
                Some(0) => {}
                Some(code) if suite.failed_tests.is_empty() => {
                    failures.push(format!("suite {name} exited with status {code} (crashed?)"))
                }
                Some(_) => {}
            }
        }
        if !self.done {
            failures.push("the guest did not report the end of its run (KPR-VM-DONE)".into());
        }
        failures
    }
}

/// The line without terminal colour sequences (`ESC [ ... m`) and other control characters:
/// libtest colours `ok`/`FAILED` when it thinks it writes to a terminal, and the guest's console
/// is one whose terminfo ends each colour with `ESC [ m` and a shift-in (0x0f); the serial
/// console may also end lines with a carriage return.
pub(super) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

impl SuiteReport {
    pub(super) fn feed_libtest(&mut self, line: &str) {
        if let Some(test) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            self.failed_tests.push(test.to_owned());
        } else if let Some(rest) = line.strip_prefix("test result: ") {
            let passed = rest
                .split(". ")
                .nth(1)
                .and_then(|counts| counts.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok());
            self.passed += passed.unwrap_or(0);
        }
    }
}

pub(super) fn summarize(results: &[(String, Duration, Vec<String>)]) -> anyhow::Result<()> {
    println!("\nkernel               time     result");
    let mut failed = Vec::new();
    for (version, elapsed, failures) in results {
        let verdict = if failures.is_empty() {
            "passed"
        } else {
            "FAILED"
        };
        println!("{version:<20} {:>5.0} s  {verdict}", elapsed.as_secs_f64());
        for failure in failures {
            println!("    {failure}");
            failed.push(format!("[{version}] {failure}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} failure(s) in the VMs:\n  {}",
            failed.len(),
            failed.join("\n  ")
        )
    }
}
