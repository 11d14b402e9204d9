//! The one way xtask runs a program: [`Cmd`] prints the command line (`$ cargo build ...`) before
//! running it, never gives the child a standard input, and fails with the command line in the error.
//! Nothing else in xtask spawns processes.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};

/// A command line to run, built up with the methods below.
#[derive(Debug, Clone)]
pub struct Cmd {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    dir: Option<PathBuf>,
    dry_run: bool,
    quiet: bool,
}

/// Whether [`exec`] hands the child's standard output back, lets it through to the terminal, or
/// both (printed as it comes and kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Inherit,
    Capture,
    Tee,
}

impl Cmd {
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Cmd {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            dir: None,
            dry_run: false,
            quiet: false,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.dir = Some(dir.as_ref().to_owned());
        self
    }

    /// With `true`, [`Cmd::run`] and [`Cmd::read`] only print the command line (marked as a dry
    /// run) and return success with empty output.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Does not print the command line (for queries whose lines would drown the log, like `ldd`
    /// of a hundred files); a failure still names it.
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Runs the command with its output going to the terminal.
    pub fn run(&self) -> anyhow::Result<()> {
        exec(self, Output::Inherit).map(drop)
    }

    /// Runs the command and returns its standard output (standard error still goes to the terminal).
    pub fn read(&self) -> anyhow::Result<String> {
        exec(self, Output::Capture)
    }

    /// Runs the command with its standard output and error going to the terminal and also
    /// kept: the result and the output, which a caller reads even when the command failed (to
    /// name the failing tests in a summary, say).
    pub fn run_tee(&self) -> (anyhow::Result<()>, String) {
        let mut kept = String::new();
        let result = exec_into(self, Output::Tee, &mut kept);
        (result, kept)
    }

    /// Starts the command in a process group of its own (its id is the child's pid, so a watchdog
    /// can end the child and everything it started) with standard output and error piped, and
    /// returns without waiting. Used by `cargo xtask vm` to stream and time a guest.
    pub fn spawn_piped(&self) -> anyhow::Result<std::process::Child> {
        use std::os::unix::process::CommandExt as _;
        println!("$ {self}");
        let mut command = Command::new(&self.program);
        command.args(&self.args).stdin(Stdio::null());
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        command.spawn().with_context(|| {
            format!(
                "could not start `{self}` (is {} installed and on PATH?)",
                quote(&self.program)
            )
        })
    }
}

/// The shell-like rendering printed before the command runs: `$ KEY=value program arg 'two words'`
/// (`(in DIR)` when it runs elsewhere than the current directory).
impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words = self
            .env
            .iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), quote(v)))
            .chain(std::iter::once(quote(&self.program)))
            .chain(self.args.iter().map(|a| quote(a)));
        let line: Vec<String> = words.collect();
        write!(f, "{}", line.join(" "))?;
        if let Some(dir) = &self.dir {
            write!(f, "  (in {})", dir.display())?;
        }
        Ok(())
    }
}

fn quote(word: &OsStr) -> String {
    let s = word.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The single place a child process is started.
fn exec(cmd: &Cmd, output: Output) -> anyhow::Result<String> {
    let mut out = String::new();
    exec_into(cmd, output, &mut out)?;
    Ok(out)
}

/// [`exec`], with the child's standard output (when captured or teed) written into `out` as it
/// arrives, so it is there even when the command fails.
fn exec_into(cmd: &Cmd, output: Output, out: &mut String) -> anyhow::Result<()> {
    use std::io::Read as _;
    if cmd.dry_run {
        println!("$ {cmd}    # dry run: not executed");
        return Ok(());
    }
    if !cmd.quiet {
        println!("$ {cmd}");
    }
    let mut command = Command::new(&cmd.program);
    command.args(&cmd.args).stdin(Stdio::null());
    command.envs(cmd.env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = &cmd.dir {
        command.current_dir(dir);
    }
    if output != Output::Inherit {
        command.stdout(Stdio::piped());
    }
    if output == Output::Tee {
        command.stderr(Stdio::piped());
    }
    let mut child = command.spawn().with_context(|| {
        format!(
            "could not start `{cmd}` (is {} installed and on PATH?)",
            quote(&cmd.program)
        )
    })?;
    // Standard error of a teed command goes through and is kept too, after standard output
    // (cargo reports a test binary that crashed there).
    let stderr = child
        .stderr
        .take()
        .map(|stderr| std::thread::spawn(move || tee(stderr, std::io::stderr())));
    let mut bytes = Vec::new();
    if let Some(mut stdout) = child.stdout.take() {
        if output == Output::Tee {
            bytes = tee(stdout, std::io::stdout());
        } else {
            stdout
                .read_to_end(&mut bytes)
                .with_context(|| format!("reading the output of `{cmd}`"))?;
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{cmd}`"))?;
    if let Some(stderr) = stderr {
        bytes.extend(stderr.join().unwrap_or_default());
    }
    match output {
        // Test logs may carry any bytes a test printed; keep what is readable.
        Output::Tee => out.push_str(&String::from_utf8_lossy(&bytes)),
        _ => out.push_str(
            std::str::from_utf8(&bytes)
                .with_context(|| format!("`{cmd}` printed output that is not UTF-8"))?,
        ),
    }
    if !status.success() {
        bail!("`{cmd}` failed: {status}");
    }
    Ok(())
}

/// Copies `from` to `terminal` as it arrives and returns all of it. The terminal is a
/// convenience: a closed one does not stop the copy (nor the child that writes into `from`).
fn tee(mut from: impl std::io::Read, mut terminal: impl std::io::Write) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 8192];
    while let Ok(n) = from.read(&mut chunk) {
        if n == 0 {
            break;
        }
        let _ = terminal
            .write_all(&chunk[..n])
            .and_then(|()| terminal.flush());
        kept.extend_from_slice(&chunk[..n]);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_is_printed_shell_quoted_with_env() {
        let cmd = Cmd::new("cargo")
            .args(["test", "--", "two words", "it's"])
            .env("KPR_PROXY_BIN", "/t/debug/proxy");
        assert_eq!(
            cmd.to_string(),
            r"KPR_PROXY_BIN=/t/debug/proxy cargo test -- 'two words' 'it'\''s'"
        );
    }

    #[test]
    fn failure_names_the_command_and_status() {
        let err = Cmd::new("sh")
            .args(["-c", "exit 3"])
            .run()
            .unwrap_err()
            .to_string();
        assert!(err.contains("`sh -c 'exit 3'` failed"), "{err}");
        assert!(err.contains("exit status: 3"), "{err}");
    }

    #[test]
    fn run_tee_keeps_both_streams_of_a_failed_command() {
        let (result, kept) = Cmd::new("sh")
            .args(["-c", "echo out; echo err >&2; exit 1"])
            .run_tee();
        assert!(result.is_err());
        assert_eq!(kept, "out\nerr\n");
    }

    #[test]
    fn missing_program_says_so() {
        let err = Cmd::new("kpr-no-such-program")
            .run()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("could not start `kpr-no-such-program`"),
            "{err}"
        );
    }

    #[test]
    fn read_returns_stdout_and_has_no_stdin() {
        let out = Cmd::new("sh")
            .args(["-c", "cat; echo done"])
            .read()
            .unwrap();
        assert_eq!(out, "done\n");
    }

    #[test]
    fn dry_run_executes_nothing() {
        let out = Cmd::new("sh")
            .args(["-c", "echo ran"])
            .dry_run(true)
            .read()
            .unwrap();
        assert_eq!(out, "");
    }
}
