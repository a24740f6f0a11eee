//! The README's examples, run as written, so that the documentation cannot drift.
//!
//! Every ```console block is a transcript: `$ ` lines are commands (a trailing `\` or a
//! here-document continues them), the lines after a command are what it prints. A line
//! `...` stands for any number of lines, and `...` inside a line for any text (pids,
//! times). The blocks run in order in one shell, as a reader would type them, with a
//! daemon already started on a private socket (`$EXECD_SOCKET`) and `target/release`
//! holding the binaries under test. A `socat` command is driven as a person would: one
//! typed request, then its answer. An HTML comment `<!-- readme-test: background, stdin
//! "y" -->` before a block runs it in a second terminal (a second shell, with the first
//! one's environment), fed the given input, while the next block runs.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::util::*;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md")
}

/// The fenced block of `README.md` whose first line is `first`.
pub(crate) fn block(first: &str) -> String {
    let text = readme();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            if body.first() == Some(&first) {
                return body.join("\n") + "\n";
            }
        }
    }
    panic!("no block starting with {first:?} in README.md");
}

/// The README shows the units `execd --print-unit` prints, as they are (so it cannot
/// drift from what ships; `systemd::the_printed_units_pass_systemd_analyze_verify` checks
/// them).
#[test]
fn the_readme_shows_the_units_execd_prints() {
    for (unit, first) in [
        ("service", "# /etc/systemd/system/execd.service"),
        ("socket", "# /etc/systemd/system/execd.socket"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_execd"))
            .args(["--print-unit", unit])
            .output()
            .expect("run execd --print-unit");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            block(first),
            String::from_utf8_lossy(&out.stdout),
            "README.md's {unit} unit"
        );
    }
}

/// One command of a transcript and what it prints.
#[derive(Debug, Clone)]
struct Step {
    command: String,
    /// For `socat`: the lines typed, each followed by the lines expected.
    typed: Vec<(String, Vec<String>)>,
    expected: Vec<String>,
}

/// A console block and how to run it.
#[derive(Debug)]
struct Transcript {
    steps: Vec<Step>,
    background: bool,
    /// Input typed in a background terminal...
    stdin: String,
    /// ...once it has printed a line holding this.
    after: String,
}

/// Every ```console block of the README, in order.
fn transcripts() -> Vec<Transcript> {
    let text = readme();
    let mut out = Vec::new();
    let mut directive: Option<String> = None;
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if let Some(d) = l
            .strip_prefix("<!-- readme-test:")
            .and_then(|d| d.strip_suffix("-->"))
        {
            directive = Some(d.trim().to_string());
            continue;
        }
        if l != "```console" {
            continue;
        }
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let d = directive.take().unwrap_or_default();
        let quoted = |key: &str| {
            d.split_once(&format!("{key} \""))
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(s, _)| s.to_string())
        };
        out.push(Transcript {
            steps: steps(&body),
            background: d.contains("background"),
            stdin: quoted("stdin").map(|s| s + "\n").unwrap_or_default(),
            after: quoted("after").unwrap_or_default(),
        });
    }
    out
}

fn steps(body: &[&str]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let Some(first) = body[i].strip_prefix("$ ") else {
            let s = steps.last_mut().expect("output before any command");
            let line = body[i].to_string();
            if s.command.starts_with("socat ") && line.contains("\"method\"") {
                s.typed.push((line, Vec::new()));
            } else if let Some(t) = s.typed.last_mut() {
                t.1.push(line);
            } else {
                s.expected.push(line);
            }
            i += 1;
            continue;
        };
        let mut command = first.to_string();
        i += 1;
        while command.ends_with('\\') && i < body.len() {
            command.push('\n');
            command.push_str(body[i]);
            i += 1;
        }
        if let Some(pos) = command.find("<<'EOF'") {
            let _ = pos;
            while i < body.len() {
                command.push('\n');
                command.push_str(body[i]);
                i += 1;
                if body[i - 1] == "EOF" {
                    break;
                }
            }
        }
        steps.push(Step {
            command,
            typed: Vec::new(),
            expected: Vec::new(),
        });
    }
    steps
}

/// Whether `actual` matches `pattern`: a JSON line by its value (key order is the JSON
/// library's business; a string holding `...` matches any string it fits, and `"..."`
/// alone any value: a duration, an id), else as text where `...` stands for any text.
fn line_matches(pattern: &str, actual: &str) -> bool {
    if let (Ok(e), Ok(a)) = (
        serde_json::from_str::<Value>(pattern),
        serde_json::from_str::<Value>(actual),
    ) {
        if e.is_object() || e.is_array() {
            return json_matches(&e, &a);
        }
    }
    text_matches(pattern, actual)
}

fn json_matches(e: &Value, a: &Value) -> bool {
    match (e, a) {
        (Value::String(p), _) if p == "..." => true,
        (Value::String(p), Value::String(s)) => text_matches(p, s),
        (Value::Object(p), Value::Object(o)) => {
            p.len() == o.len()
                && p.iter()
                    .all(|(k, v)| o.get(k).is_some_and(|w| json_matches(v, w)))
        }
        (Value::Array(p), Value::Array(o)) => {
            p.len() == o.len() && p.iter().zip(o).all(|(v, w)| json_matches(v, w))
        }
        _ => e == a,
    }
}

/// Whether `actual` matches `pattern`, where `...` stands for any text.
fn text_matches(pattern: &str, actual: &str) -> bool {
    let parts: Vec<&str> = pattern.split("...").collect();
    if parts.len() == 1 {
        return pattern == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || !actual[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `actual` lines match `expected`, where a line `...` stands for any lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => {
            (0..=actual.len()).any(|k| lines_match(rest, &actual[k..]))
        }
        Some((e, rest)) => {
            !actual.is_empty() && line_matches(e, &actual[0]) && lines_match(rest, &actual[1..])
        }
    }
}

/// A shell that reads commands from a FIFO (so that commands get a stdin of their own,
/// as in a terminal) and prints their output (stderr merged).
struct Shell {
    child: Child,
    /// Where commands are written.
    script: Option<std::fs::File>,
    /// The commands' stdin, when the transcript types input.
    input: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    marker: usize,
}

impl Shell {
    fn start(dir: &std::path::Path, env: &[(&str, String)], name: &str, input: bool) -> Shell {
        let fifo = dir.join(format!(".readme-{name}"));
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid NUL-terminated path for mkfifo(3).
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let mut cmd = Command::new("bash");
        cmd.arg("--noprofile")
            .arg("--norc")
            .arg(&fifo)
            .current_dir(dir)
            .stdin(if input { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            // Only what the transcript sets says where the daemon is.
            .env_remove("EXECD_SOCKET")
            .env_remove("XDG_RUNTIME_DIR");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("bash");
        let input = child.stdin.take();
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let rx = lines_of(stdout);
        // Opening the FIFO waits for bash to open it to read its script.
        let script = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("open the script FIFO");
        let mut sh = Shell {
            child,
            script: Some(script),
            input,
            lines: rx,
            marker: 0,
        };
        sh.send("exec 2>&1");
        sh
    }

    fn send(&mut self, text: &str) {
        if let Some(script) = self.script.as_mut() {
            script
                .write_all(format!("{text}\n").as_bytes())
                .expect("write to bash");
        }
    }

    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no output in {WAIT:?} from: {what}"))
    }

    /// Runs one command to its end; returns what it printed.
    fn run(&mut self, command: &str) -> Vec<String> {
        self.marker += 1;
        let end = format!("__readme_step_{}__", self.marker);
        // `$?` of the command survives the marker, for a following `echo $?`.
        self.send(&format!(
            "{command}\n__readme_status=$?; echo {end}; (exit $__readme_status)"
        ));
        let mut got = Vec::new();
        loop {
            let l = self.line(command);
            // Output without a final newline (curl's) runs into the marker.
            if let Some(rest) = l.strip_suffix(&end) {
                if !rest.is_empty() {
                    got.push(rest.to_string());
                }
                return got;
            }
            got.push(l);
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The shell and whatever the README started in the background from it.
        let pgid = self.child.id() as i32;
        unsafe_kill(-pgid, libc::SIGTERM);
        std::thread::sleep(Duration::from_millis(300));
        unsafe_kill(-pgid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Drives a `socat` step: each typed line, then its answer, as a person would.
fn run_socat(dir: &std::path::Path, env: &[(&str, String)], step: &Step) {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &step.command])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env_remove("EXECD_SOCKET")
        .env_remove("XDG_RUNTIME_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("socat");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let rx = lines_of(stdout);
    for (typed, expected) in &step.typed {
        stdin
            .write_all(format!("{typed}\n").as_bytes())
            .expect("type a request");
        let got: Vec<String> = expected
            .iter()
            .map(|_| {
                rx.recv_timeout(WAIT)
                    .unwrap_or_else(|_| panic!("no answer to {typed}"))
            })
            .collect();
        assert!(
            lines_match(expected, &got),
            "README: after typing {typed}\nexpected:\n{}\ngot:\n{}",
            expected.join("\n"),
            got.join("\n")
        );
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}

/// Every console transcript of the README runs as written and prints what it shows.
#[test]
fn the_readme_transcripts_run_as_written() {
    run_transcripts(Found::EnvSocket);
}

/// The same transcripts for a user who has `XDG_RUNTIME_DIR` set and no `EXECD_SOCKET`:
/// execd and execctl both find `$XDG_RUNTIME_DIR/execd.sock` (and the socat lines take
/// it from `execctl status --path`).
#[test]
fn the_readme_transcripts_run_as_written_with_xdg_runtime_dir() {
    run_transcripts(Found::XdgRuntimeDir);
}

/// How the shell's execctl finds the daemon the README's first block started.
#[derive(Clone, Copy, PartialEq)]
enum Found {
    /// `EXECD_SOCKET` names it.
    EnvSocket,
    /// Only `XDG_RUNTIME_DIR` is set; the daemon was started without `--socket`.
    XdgRuntimeDir,
}

fn run_transcripts(found: Found) {
    if !have(&["socat", "curl"]) {
        return;
    }
    // Its HTTP transcript listens on 127.0.0.1:8080, as does the http area's run of the
    // README's Python block; this hold outlives the shells and what they started.
    let _address = ReadmeAddress::hold();
    let xdg = TempDir::new();
    let d = match found {
        Found::EnvSocket => Daemon::start(&[]),
        Found::XdgRuntimeDir => {
            let daemon_dir = TempDir::new();
            let socket = xdg.path().join("execd.sock");
            let log = std::fs::File::create(daemon_dir.path().join("execd.log")).expect("log");
            // As a user starts it: no --socket, no EXECD_SOCKET.
            let child = Command::new(env!("CARGO_BIN_EXE_execd"))
                .args(["--kill-grace", "1s"])
                .env_remove("EXECD_SOCKET")
                .env("XDG_RUNTIME_DIR", xdg.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .expect("spawn execd");
            Daemon::adopt(Some(child), socket, daemon_dir)
        }
    };
    let dir = TempDir::new();
    // `export PATH=$PWD/target/release:$PATH` finds the binaries under test.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_execctl"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    std::fs::create_dir_all(dir.path().join("target")).expect("mkdir");
    std::os::unix::fs::symlink(&bin, dir.path().join("target/release")).expect("symlink");
    let first = match found {
        Found::EnvSocket => ("EXECD_SOCKET", d.socket.display().to_string()),
        Found::XdgRuntimeDir => ("XDG_RUNTIME_DIR", xdg.path().display().to_string()),
    };
    let env = vec![
        first,
        // The binaries under test, then this process's PATH, where `have` found socat
        // and curl.
        (
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("HOME", dir.path().display().to_string()),
    ];
    let mut shell = Shell::start(dir.path(), &env, "first", false);
    let mut background: Option<(Shell, Watcher, Vec<Step>)> = None;
    for t in transcripts() {
        if t.background {
            // A second terminal with the first one's environment; a person types the
            // input once the prompt it answers is there.
            let exported = shell.run("export -p");
            let mut second = Shell::start(dir.path(), &env, "second", true);
            for e in exported {
                second.send(&e);
            }
            for s in &t.steps {
                second.send(&s.command);
            }
            let watcher = second.watch(t.after.clone(), t.stdin.clone());
            watcher.wait_started();
            background = Some((second, watcher, t.steps));
            continue;
        }
        for s in &t.steps {
            if s.command.starts_with("socat ") {
                // What the shell exported so far (the guarded daemon's EXECD_SOCKET).
                let mut now = env.clone();
                let exported = shell.run("echo $EXECD_SOCKET");
                if let Some(socket) = exported.first().filter(|s| !s.is_empty()) {
                    now.push(("EXECD_SOCKET", socket.clone()));
                }
                run_socat(dir.path(), &now, s);
                continue;
            }
            let got = shell.run(&s.command);
            assert!(
                lines_match(&s.expected, &got),
                "README: $ {}\nexpected:\n{}\ngot:\n{}",
                s.command,
                s.expected.join("\n"),
                got.join("\n")
            );
        }
        if let Some((second, watcher, steps)) = background.take() {
            let got = watcher.finish(second);
            let expected: Vec<String> = steps.iter().flat_map(|s| s.expected.clone()).collect();
            assert!(
                lines_match(&expected, &got),
                "README: the second terminal ({})\nexpected:\n{}\ngot:\n{}",
                steps[0].command,
                expected.join("\n"),
                got.join("\n")
            );
        }
    }
}

/// The line a background terminal prints once everything before it has ended: bash
/// runs its script one command at a time, so it comes after the last line of the last
/// command.
const BACKGROUND_END: &str = "__readme_background_end__";

/// What a background terminal printed, collected on a thread that types its input when
/// the awaited line shows up.
struct Watcher {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How many lines it has printed so far.
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The lines before `BACKGROUND_END`, and whether it came.
    thread: std::thread::JoinHandle<(Vec<String>, bool)>,
}

impl Watcher {
    /// Waits until the terminal printed something: the program in it is up.
    fn wait_started(&self) {
        wait_until("the second terminal starts", || {
            self.seen.load(std::sync::atomic::Ordering::SeqCst) > 0
        });
    }

    /// Closes the terminal (its script and its input end, as when a person closes it),
    /// waits at most `WAIT` until its commands have ended, and returns what they printed.
    #[track_caller]
    fn finish(self, mut shell: Shell) -> Vec<String> {
        shell.script = None;
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        let (got, ended) = self.thread.join().expect("watcher");
        drop(shell);
        assert!(
            ended,
            "the second terminal's commands did not end within {WAIT:?}; it printed:\n{}",
            got.join("\n")
        );
        got
    }
}

impl Shell {
    /// Collects what the commands already sent to this shell print, typing `input` once a
    /// line holds `after`, until `BACKGROUND_END` (sent here, after them).
    fn watch(&mut self, after: String, input: String) -> Watcher {
        self.send(&format!("echo {BACKGROUND_END}"));
        let lines = std::mem::replace(&mut self.lines, mpsc::channel().1);
        let mut stdin = self.input.take();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = seen.clone();
        let thread = std::thread::spawn(move || {
            let mut got = Vec::new();
            // Until `finish`, the terminal may rightly wait for the first one; from then
            // on its commands have `WAIT` to end.
            let mut deadline: Option<Instant> = None;
            loop {
                match lines.recv_timeout(Duration::from_millis(100)) {
                    Ok(l) => {
                        // Output without a final newline runs into the end line.
                        if let Some(rest) = l.strip_suffix(BACKGROUND_END) {
                            if !rest.is_empty() {
                                got.push(rest.to_string());
                            }
                            return (got, true);
                        }
                        if !after.is_empty() && l.contains(&after) {
                            if let Some(mut s) = stdin.take() {
                                let _ = s.write_all(input.as_bytes());
                                drop(s); // the person is done typing
                            }
                        }
                        got.push(l);
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return (got, false),
                    Err(mpsc::RecvTimeoutError::Timeout)
                        if stop.load(std::sync::atomic::Ordering::SeqCst) =>
                    {
                        // Closing the terminal ends its input too, typed or not.
                        stdin = None;
                        let end = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
                        if Instant::now() > end {
                            return (got, false);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
        });
        Watcher { done, seen, thread }
    }
}

#[test]
fn the_line_matcher_understands_ellipses() {
    assert!(line_matches("a...c", "abbbc"));
    assert!(line_matches(
        r#"{"b":"x...","a":1}"#,
        r#"{"a":1,"b":"xyz"}"#
    ));
    assert!(!line_matches(r#"{"a":1}"#, r#"{"a":1,"b":2}"#));
    // "..." alone stands for any value, a number or null included.
    assert!(line_matches(
        r#"{"a":"...","b":"..."}"#,
        r#"{"a":17,"b":null}"#
    ));
    assert!(!line_matches(r#"{"a":"x..."}"#, r#"{"a":17}"#));
    assert!(line_matches("pid ... on ...", "pid 42 on /x"));
    assert!(!line_matches("a...c", "abd"));
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(lines_match(
        &s(&["a", "...", "z"]),
        &s(&["a", "b", "c", "z"])
    ));
    assert!(lines_match(&s(&["...", "z"]), &s(&["z"])));
    assert!(!lines_match(&s(&["a", "z"]), &s(&["a", "b", "z"])));
}
