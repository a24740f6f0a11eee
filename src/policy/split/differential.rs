//! The differential test of PROTOCOL 7.2: every line the splitter calls plain is run by
//! bash with every `execve` traced, and each program bash then starts must be one of the
//! simple commands the splitter reported, with exactly those arguments and from exactly
//! that file (or a `sh -c WORD` the splitter read through). Lines it calls unparsed are
//! not run: the policy asks about those.
//!
//! Inputs: the corpus `tests/data/splitter-corpus.txt` (the red team's lines, every line of
//! the unit tests, every way around found since) and 10,000 lines from a seeded generator
//! mixing the plain grammar with everything that is not. `SPLITTER_DIFF_LINES` and
//! `SPLITTER_DIFF_SEED` change the generator's count and seed, to look further by hand.
//!
//! One `strace -f` runs one driver script, which for each line execs a marker program with
//! the line's index, then `bash -c LINE`. The trace is cut at the markers; the driver's own
//! `bash -c` is dropped; what remains is what the line ran.
//!
//! Nothing a line runs is real. The scratch directory holds:
//! - `bin\x01/`, the only `PATH` entry: every program name the lines use is a symlink to
//!   `/bin/true` (refused if that is a multi-call binary, which would act on its name), and
//!   `bash`, `rbash`, `sh`, `dash` are symlinks to the real shells, so nested shells run and
//!   are traced. Its name holds a control byte, which no plain line can hold: no line can
//!   name it, so none can write through its symlinks.
//! - `work/`: the lines' cwd and `HOME`, empty.
//!
//! A line runs only if it is `confined`: no `..`, and every `/` in it follows a `.` (`./x`)
//! or starts `/dev/null`, so none of its words names anything outside `work/`, and the
//! plain builtins (`cd`, `echo`, `printf`, `pwd`, `exit`, ...) reach no further. Lines
//! setting a variable the policy says changes what runs (`PATH`, `BASH_ENV`, ...) are
//! unparsed to the policy and are not run either, nor lines through a login shell
//! (`bash -lc`): the host's `/etc/profile` runs first, and its programs cannot be told
//! from the line's.
//!
//! The shell-session mode (`session.rs`) runs sequences of lines in one interactive bash
//! each, as a session's shell runs them, approved assignments to every variable of the
//! bash manual among them, and checks what runs after each plain line.
//!
//! Tools: `bash` and `strace` (and a `/bin/true`). Without them the tests fail under
//! `CI=true` and print `SKIPPED` otherwise.
//!
//! Corpus format: one line per file line; blank lines and lines starting with `##` are
//! skipped; `␤` (U+2424) stands for a line break, the control pictures U+2400..U+241F for
//! the bytes 0x00..0x1F (`␉` a tab, `␀` NUL) and U+2421 `␡` for 0x7F. A line holding those
//! characters themselves cannot be written.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tests::{single_quoted, Case, CASES, FOUND, RED_TEAM};
use super::{split_line_traced, Reading, Split};
use crate::policy::changes_what_runs;

mod session;

const CORPUS: &str = include_str!("../../../tests/data/splitter-corpus.txt");

/// Generated lines per run, and the generator's seed.
const GENERATED: usize = 10_000;
const SEED: u64 = 0x7ac3_5eed_0072;

/// The whole traced run must end within this.
const TIMEOUT: Duration = Duration::from_secs(900);

/// The scratch `PATH` directory and the marker program: names no plain line can hold.
const BIN: &str = "bin\u{1}";
const MARK: &str = "\u{1}mark";

/// The shells symlinked to real ones.
const SHELLS: [&str; 4] = ["bash", "rbash", "sh", "dash"];

/// The corpus's lines, decoded.
fn corpus() -> Vec<String> {
    CORPUS
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("##"))
        .map(decode)
        .collect()
}

/// A corpus line as the line it stands for.
fn decode(line: &str) -> String {
    line.chars()
        .map(|c| match u32::from(c) {
            n @ 0x2400..=0x241f => char::from_u32(n - 0x2400).unwrap_or(c),
            0x2421 => '\u{7f}',
            0x2424 => '\n',
            _ => c,
        })
        .collect()
}

/// A line as the corpus writes it.
fn encode(line: &str) -> String {
    line.chars()
        .map(|c| match u32::from(c) {
            0x0a => '\u{2424}',
            n @ 0..=0x1f => char::from_u32(0x2400 + n).unwrap_or(c),
            0x7f => '\u{2421}',
            _ => c,
        })
        .collect()
}

#[test]
fn the_corpus_holds_every_unit_test_line() {
    let corpus: BTreeSet<String> = CORPUS.lines().map(str::to_owned).collect();
    let missing: Vec<String> = RED_TEAM
        .iter()
        .chain(FOUND)
        .chain(CASES)
        .map(|(line, _, _): &Case| encode(line))
        .filter(|line| !corpus.contains(line))
        .collect();
    assert!(
        missing.is_empty(),
        "add to tests/data/splitter-corpus.txt:\n{}",
        missing.join("\n")
    );
    for line in corpus.iter().filter(|l| !l.starts_with("##")) {
        assert_eq!(encode(&decode(line)), *line, "not encoded as it decodes");
    }
}

#[test]
fn the_generator_mixes_plain_and_unparsed_lines() {
    let lines = generate(SEED, GENERATED);
    assert_eq!(lines.len(), GENERATED);
    let plain = lines
        .iter()
        .filter(|l| !split_line_traced(l, Reading::default()).0.unparsed)
        .count();
    // Both halves of the splitter get exercised.
    assert!(
        plain > GENERATED * 3 / 10 && plain < GENERATED * 7 / 10,
        "{plain} plain"
    );
    let nested = lines
        .iter()
        .filter(|l| !split_line_traced(l, Reading::default()).1.is_empty())
        .count();
    assert!(nested > GENERATED / 20, "{nested} read through a shell");
}

/// The lists of builtins, reserved words and integer variables cover what the installed
/// bash has: a newer bash with a new builtin fails here first.
#[test]
fn the_lists_cover_the_installed_bash() {
    let test = "policy::split::differential::the_lists_cover_the_installed_bash";
    let Some(bash) = which("bash") else {
        missing(test, "bash is not installed");
        return;
    };
    let out = Command::new(bash)
        .args([
            "-c",
            "enable -a; echo =; compgen -k; echo =; declare -p -i; echo =; compgen -v",
        ])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout);
    let parts: Vec<&str> = text.split("=\n").collect();
    let [builtins, keywords, integers, variables] = parts[..] else {
        panic!("unexpected bash output: {text}");
    };
    for line in builtins.lines() {
        // `enable NAME`, or `enable -n NAME` for a disabled one.
        let name = line.split_whitespace().last().unwrap_or_default();
        assert!(
            super::builtin(name).is_some(),
            "builtin {name:?} is not listed"
        );
    }
    for keyword in keywords.lines() {
        assert!(super::is_reserved(keyword), "reserved word {keyword:?}");
    }
    for line in integers.lines() {
        // `declare -i NAME[=..]`; read-only ones (`-ir UID`) cannot be assigned.
        let mut fields = line.split_whitespace().skip(1);
        let (Some(flags), Some(name)) = (fields.next(), fields.next()) else {
            continue;
        };
        let name = name.split('=').next().unwrap_or(name);
        if !flags.contains('r') {
            assert!(
                !super::assignment_is_plain(name),
                "integer variable {name} is not flagged"
            );
        }
    }
    // Every variable bash sets itself is either flagged or one whose assignment only
    // sets a value (checked by hand; a new one fails here until it is looked at).
    const LOOKED_AT: &[&str] = &[
        "BASH_ENV",
        "BASHOPTS",
        "COLUMNS",
        "COMP_WORDBREAKS",
        "DIRSTACK",
        "EUID",
        "FUNCNAME",
        "GROUPS",
        "HISTFILE",
        "HISTFILESIZE",
        "HISTSIZE",
        "HOSTNAME",
        "HOSTTYPE",
        "IFS",
        "LINES",
        "MACHTYPE",
        "MAILCHECK",
        "OLDPWD",
        "OPTERR",
        "OSTYPE",
        "PATH",
        "PIPESTATUS",
        "PPID",
        "PS1",
        "PS2",
        "PS4",
        "PWD",
        "SHELL",
        "SHELLOPTS",
        "TERM",
        "UID",
        "_",
        "HOME",
        "LOGNAME",
        "USER",
        "COPROC",
        "HISTCONTROL",
        "HISTIGNORE",
    ];
    for name in variables.lines() {
        assert!(
            !super::assignment_is_plain(name) || LOOKED_AT.contains(&name),
            "bash sets {name}: is assigning it only setting a value?"
        );
    }
}

#[test]
fn plain_lines_run_only_what_the_splitter_reported() {
    let test = "policy::split::differential::plain_lines_run_only_what_the_splitter_reported";
    let count = env_number("SPLITTER_DIFF_LINES").map_or(GENERATED, |n| n as usize);
    let seed = env_number("SPLITTER_DIFF_SEED").unwrap_or(SEED);
    let mut lines = corpus();
    // Each again through `sh -c` (dash, where that is /bin/sh), which reads some of bash's
    // syntax otherwise.
    let through_sh: Vec<String> = lines
        .iter()
        .map(|l| format!("sh -c {}", single_quoted(l)))
        .collect();
    lines.extend(through_sh);
    let from_corpus = lines.len();
    lines.extend(generate(seed, count));
    let Some(tools) = Tools::find(test) else {
        return;
    };
    let started = Instant::now();
    let report = differential(&tools, &lines);
    eprintln!(
        "differential: {} lines ({from_corpus} from the corpus, as written and through sh -c; \
         {count} generated, seed {seed:#x}): \
         {} run under bash ({} execve checked, {} through nested shells), {} unparsed, \
         {} setting variables that change what runs, {} not confined, {} through a login \
         shell (not run: the host's profile runs first); {:.1} s",
        lines.len(),
        report.run,
        report.execs,
        report.nested,
        report.unparsed,
        report.env,
        report.unconfined,
        report.login,
        started.elapsed().as_secs_f64()
    );
    assert!(
        report.failures.is_empty(),
        "{} programs ran that the splitter did not report:\n{}",
        report.failures.len(),
        report
            .failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The corpus alone puts a few hundred lines through bash; a run that checked almost
    // nothing proves nothing.
    assert!(
        report.run > from_corpus / 3,
        "only {} lines ran",
        report.run
    );
    assert!(report.execs > report.run, "only {} execve", report.execs);
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => value.parse().ok(),
    }
}

/// Says why a test cannot run: a failure under CI, a note otherwise.
fn missing(test: &str, why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// A program on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// What the traced run needs.
struct Tools {
    strace: PathBuf,
    /// `--seccomp-bpf`, when this strace has it: only `execve` stops the tracees.
    seccomp: bool,
    /// The real files behind `bash`, `sh` and `dash`.
    shells: Vec<(&'static str, PathBuf)>,
    /// `/bin/true`, resolved: not a multi-call binary.
    truth: PathBuf,
}

impl Tools {
    /// The tools, or `None` after saying (failing under CI) what is missing.
    fn find(test: &str) -> Option<Tools> {
        let found = (|| {
            let bash = which("bash").ok_or("bash is not installed")?;
            let strace = which("strace").ok_or("strace is not installed")?;
            let truth = std::fs::canonicalize("/bin/true")
                .map_err(|_| "there is no /bin/true to stand in for programs")?;
            if truth.file_name().and_then(|n| n.to_str()) != Some("true") {
                // busybox or a multi-call coreutils would run `rm` as rm.
                return Err("/bin/true is a multi-call binary: it would act on its name");
            }
            let real = |p: PathBuf| std::fs::canonicalize(p).ok();
            let mut shells = vec![("bash", real(bash).ok_or("bash")?)];
            shells.push(("rbash", shells[0].1.clone()));
            for name in ["sh", "dash"] {
                if let Some(p) = which(name).and_then(real) {
                    shells.push((name, p));
                }
            }
            Ok(Tools {
                strace,
                seccomp: false,
                shells,
                truth,
            })
        })();
        let mut tools = match found {
            Ok(tools) => tools,
            Err(why) => {
                missing(test, why);
                return None;
            }
        };
        // Tracing may be forbidden here (a container without ptrace).
        let probe = |seccomp: bool| {
            let mut c = Command::new(&tools.strace);
            c.args(["-f", "-qq", "-e", "trace=execve", "-o", "/dev/null"]);
            if seccomp {
                c.arg("--seccomp-bpf");
            }
            c.arg(&tools.truth)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
        };
        match probe(false) {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let why = format!(
                    "strace cannot trace here: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                missing(test, &why);
                return None;
            }
            Err(e) => {
                missing(test, &format!("strace does not run: {e}"));
                return None;
            }
        }
        tools.seccomp = probe(true).is_ok_and(|out| out.status.success());
        Some(tools)
    }
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("execd-splitter-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(BIN)).expect("scratch bin");
        std::fs::create_dir_all(dir.join("work")).expect("scratch work");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child in its own process group, killed with the group when dropped.
struct Traced(Child);

impl Drop for Traced {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let pgid = i32::try_from(self.0.id()).unwrap_or(0);
            crate::sys::reap::signal_group(pgid, libc::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

/// A line that is run, and what the splitter read in it.
struct Run<'a> {
    line: &'a str,
    split: Split,
    /// The `sh -c WORD` argvs it read through.
    shells: Vec<Vec<String>>,
}

/// What a differential run found.
#[derive(Default)]
struct Tally {
    run: usize,
    unparsed: usize,
    env: usize,
    unconfined: usize,
    login: usize,
    execs: usize,
    nested: usize,
    failures: Vec<String>,
}

/// Whether a shell's argv makes it a login shell (`-l` among its options).
fn login_shell(argv: &[String]) -> bool {
    argv.iter()
        .skip(1)
        .take_while(|a| a.starts_with('-') && *a != "--")
        .any(|a| !a.starts_with("--") && a.contains('l'))
}

/// Whether running `line` can name nothing outside the scratch `work/` directory.
fn confined(line: &str) -> bool {
    if line.contains("..") || line.len() >= 60_000 {
        return false;
    }
    let b = line.as_bytes();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let dev_null = b
            .get(i..)
            .is_some_and(|rest| rest.starts_with(b"/dev/null"))
            && b.get(i + 9).is_none_or(|&c| super::ends_word(c));
        if dev_null {
            i += 9;
        } else if c == b'/' && (i == 0 || b[i - 1] != b'.') {
            return false;
        } else {
            i += 1;
        }
    }
    true
}

/// A program name that can be a file in `bin/`.
fn file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

fn differential(tools: &Tools, lines: &[String]) -> Tally {
    let mut report = Tally::default();
    let mut runs = Vec::new();
    for line in lines {
        let (split, shells) = split_line_traced(line, Reading::default());
        if split.unparsed {
            report.unparsed += 1;
        } else if split.assigned.iter().any(|n| changes_what_runs(n)) {
            report.env += 1;
        } else if !confined(line) {
            report.unconfined += 1;
        } else if shells.iter().any(|argv| login_shell(argv)) {
            // A login shell runs the host's /etc/profile first, which runs and puts on
            // PATH what no line names: nothing here can tell its programs from the line's.
            report.login += 1;
        } else {
            runs.push(Run {
                line,
                split,
                shells,
            });
        }
    }
    report.run = runs.len();

    let scratch = Scratch::new();
    let bin = scratch.0.join(BIN);
    let work = scratch.0.join("work");
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, bin.join(name)).expect("symlink in scratch bin");
    };
    for (name, real) in &tools.shells {
        link(real, name);
    }
    link(&tools.truth, MARK);
    let programs: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.split.commands.iter().chain(&r.shells))
        .filter_map(|argv| argv.first().map(String::as_str))
        .filter(|p| file_name(p) && !SHELLS.contains(p))
        .collect();
    for program in programs {
        link(&tools.truth, program);
    }

    let mut driver = String::new();
    for (i, run) in runs.iter().enumerate() {
        let _ = writeln!(
            driver,
            "$'\\001mark' {i}\nbash -c {}",
            single_quoted(run.line)
        );
    }
    let script = scratch.0.join("driver.sh");
    std::fs::write(&script, driver).expect("write driver");
    let trace = scratch.0.join("trace");
    let log = std::fs::File::create(scratch.0.join("stderr")).expect("stderr file");

    let mut strace = Command::new(&tools.strace);
    strace.args(["-f", "-qq", "-xx", "-s", "65536"]);
    strace.args(["-e", "trace=execve,execveat", "-e", "signal=none", "-o"]);
    strace.arg(&trace);
    if tools.seccomp {
        strace.arg("--seccomp-bpf");
    }
    strace
        .arg(bin.join("bash"))
        .arg(&script)
        .env_clear()
        .env("PATH", &bin)
        .env("HOME", &work)
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut strace, 0);
    let mut running = Traced(strace.spawn().expect("start strace"));
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match running.0.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => panic!("the traced run took over {TIMEOUT:?}"),
            Err(e) => panic!("waiting for strace: {e}"),
        }
    };
    let stderr = std::fs::read(scratch.0.join("stderr")).unwrap_or_default();
    let tail = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(2000)..]);
    assert!(status.success(), "strace failed ({status}): {tail}");

    let text = std::fs::read_to_string(&trace).expect("read trace");
    let execs = cut_at_markers(&text, &runs, &bin);
    for (run, execs) in runs.iter().zip(execs) {
        report.execs += execs.len();
        report.nested += run.shells.len();
        check(run, &execs, &bin, &mut report.failures);
    }
    report
}

/// One traced `execve`: the file and the argv.
type Exec = (String, Vec<String>);

/// The execs of each run, in order, from the trace: cut at the markers, each run's first
/// exec (the driver's `bash -c LINE`) dropped.
fn cut_at_markers(text: &str, runs: &[Run<'_>], bin: &Path) -> Vec<Vec<Exec>> {
    let mut per_run: Vec<Vec<Exec>> = runs.iter().map(|_| Vec::new()).collect();
    let mut current: Option<usize> = None;
    let mut driver_next = false;
    let mut marks = 0;
    let driver_bash = bin.join("bash");
    for record in text.lines() {
        assert!(
            !record.contains("execveat("),
            "unexpected execveat: {record}"
        );
        if !record.contains("execve(") {
            continue;
        }
        let Some((file, argv)) = parse_execve(record) else {
            panic!("cannot read trace record: {record}");
        };
        if argv.first().map(String::as_str) == Some(MARK) {
            current = argv.get(1).and_then(|i| i.parse().ok());
            driver_next = true;
            marks += 1;
            continue;
        }
        // Before the first marker: the driver starting.
        let Some(i) = current else { continue };
        let line = runs.get(i).map_or("", |r| r.line);
        if driver_next {
            driver_next = false;
            let expected = vec!["bash".to_owned(), "-c".to_owned(), line.to_owned()];
            let before = i.checked_sub(1).and_then(|b| runs.get(b)).map(|r| r.line);
            assert_eq!(
                (Path::new(&file), &argv),
                (driver_bash.as_path(), &expected),
                "the driver's bash -c was not the first exec after its marker: did line \
                 {before:?} leave a process running?"
            );
            continue;
        }
        if let Some(execs) = per_run.get_mut(i) {
            execs.push((file, argv));
        }
    }
    assert_eq!(marks, runs.len(), "the traced run stopped short");
    per_run
}

/// Checks that every exec of `run` is one of its reported commands or read-through shells,
/// each used at most once, and ran the file bash would find for it.
fn check(run: &Run<'_>, execs: &[Exec], bin: &Path, failures: &mut Vec<String>) {
    let mut allowed: Vec<&Vec<String>> = run.split.commands.iter().chain(&run.shells).collect();
    for (file, argv) in execs {
        let program = argv.first().map_or("", String::as_str);
        let expected_file = if program.contains('/') {
            PathBuf::from(program)
        } else {
            bin.join(program)
        };
        let found = allowed.iter().position(|a| *a == argv);
        match found {
            Some(k) if Path::new(file) == expected_file => {
                allowed.swap_remove(k);
            }
            _ => failures.push(format!(
                "line {:?}\n  ran   {file:?} {argv:?}\n  split {:?} through {:?}",
                run.line, run.split.commands, run.shells
            )),
        }
    }
}

/// `execve("FILE", ["ARG", ...], ...` of a trace record, strings in `-xx` hex.
fn parse_execve(record: &str) -> Option<Exec> {
    let rest = record.get(record.find("execve(")? + "execve(".len()..)?;
    let (file, rest) = hex_string(rest)?;
    let mut rest = rest.strip_prefix(", [")?;
    let mut argv = Vec::new();
    if let Some(after) = rest.strip_prefix(']') {
        rest = after;
    } else {
        loop {
            let (arg, after) = hex_string(rest)?;
            argv.push(arg);
            if let Some(after) = after.strip_prefix(", ") {
                rest = after;
            } else {
                rest = after.strip_prefix(']')?;
                break;
            }
        }
    }
    rest.starts_with(", ").then_some((file, argv))
}

/// A `"\x.."` string at the start of `s`, decoded, and what follows it.
fn hex_string(s: &str) -> Option<(String, &str)> {
    let s = s.strip_prefix('"')?;
    let end = s.find('"')?;
    let digits = s.get(..end)?;
    let bytes = digits
        .split("\\x")
        .skip(1)
        .map(|h| u8::from_str_radix(h, 16).ok().filter(|_| h.len() == 2))
        .collect::<Option<Vec<u8>>>()?;
    if !digits.is_empty() && !digits.starts_with("\\x") {
        return None;
    }
    let text = String::from_utf8(bytes).ok()?;
    Some((text, s.get(end + 1..)?))
}

#[test]
fn trace_records_parse() {
    let r = r#"123 execve("\x2f\x62", ["\x70\x31", "", "\x61\x20"], 0x7ff /* 2 vars */) = 0"#;
    assert_eq!(
        parse_execve(r),
        Some(("/b".into(), vec!["p1".into(), String::new(), "a ".into()]))
    );
    let r = r#"9 execve("\x61", [], 0x1 /* 0 vars */ <unfinished ...>"#;
    assert_eq!(parse_execve(r), Some(("a".into(), vec![])));
    // Cut short by -s: not read.
    assert_eq!(parse_execve(r#"9 execve("\x61"..., [], 0x1) = 0"#), None);
    assert_eq!(parse_execve(r#"9 execve("\x61", ["\x6"], 0x1) = 0"#), None);
    assert!(confined("p1 ./x >/dev/null 2>&1; cd d && p2"));
    assert!(!confined("p1 /etc/x"));
    assert!(!confined("p1 ../x"));
    assert!(!confined("p1 >/dev/nullx"));
    assert!(!confined("p1 >/dev/null/x"));
    assert_eq!(decode("a␤b␉c␀␡"), "a\nb\tc\0\u{7f}");
}

// ---- the generator ------------------------------------------------------------------

/// SplitMix64: small, seeded, the same everywhere.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True `percent` times in 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// `count` lines from `seed`.
fn generate(seed: u64, count: usize) -> Vec<String> {
    let mut g = Gen(seed);
    (0..count).map(|_| line(&mut g, 0)).collect()
}

/// Program names that are symlinks to `/bin/true` when run.
const PROGRAMS: &[&str] = &[
    "p1", "p2", "p3", "p4", "p5", "p6", "rm", "ls", "cat", "git", "env", "make",
];
/// Builtins the splitter reads as programs.
const PLAIN_BUILTINS: &[&str] = &["echo", "printf", "true", "false", ":", "pwd", "cd", "exit"];
/// Words the splitter must never read as plain programs.
const UNSAFE: &[&str] = &[
    "eval",
    "let",
    "declare",
    "read",
    "test",
    "source",
    ".",
    "exec",
    "command",
    "builtin",
    "hash",
    "alias",
    "shopt",
    "set",
    "trap",
    "mapfile",
    "readarray",
    "compgen",
    "typeset",
    "local",
    "readonly",
    "export",
    "unset",
    "kill",
    "type",
    "wait",
    "getopts",
    "enable",
    "if",
    "then",
    "for",
    "while",
    "time",
    "!",
    "{",
    "[[",
    "[",
    "function",
    "coproc",
    "case",
    "do",
    "done",
    "=p1",
    "%1",
    "zsh",
    "ksh",
    "busybox",
    "chdir",
    "fc",
    "bind",
    "ulimit",
    "umask",
    "shift",
    "return",
    "break",
    "in",
    "select",
    "}",
    "elif",
];
/// Ways to run code a line must not reach unseen: `p9` is never a program otherwise.
const PAYLOADS: &[&str] = &[
    "$(p9)", "`p9`", "a[$(p9)]", "; p9", "| p9", "&& p9", "\np9", "' p9 '", "\" p9 \"", "$(p9 x)",
    "${x}", "$x", "$((1))", "<(p9)", ">(p9)", "{a,b}", "*", "~", "\\", "p9 #",
];
/// Bytes for bare parts: mostly the plain ones.
const BARE: &[u8] = b"abcxyzAB0129_./+-,:@%=";
/// Bytes that mean something bare (or are not plain).
const SPECIAL: &[&str] = &[
    "*", "?", "[", "]", "{", "}", "~", "!", "#", "$", "^", "(", ")", "`", "'", "\"", "\\", "é",
    "&", ";", "|", "<", ">", "\t", "\u{7f}", "\r", "=", "\u{a0}",
];
/// Things inside single quotes.
const IN_SINGLE: &[&str] = &[
    "a", "b c", ";", "|", "&", "$", "(", ")", "`", "\"", "\\", "#", "*", "?", "{", "}", "~", "!",
    "\n", "é", " ", "=", "\t", "\\'",
];
/// Things inside double quotes.
const IN_DOUBLE: &[&str] = &[
    "a", "b c", ";", "|", "&", "(", ")", "'", "#", "*", "?", "{", "}", "~", " ", "=", "\\\"",
    "\\\\", "\\$", "\\`", "\\a", "\\\n", "\n", "\t", "\\", "%", "@",
];
/// Rare inside double quotes.
const IN_DOUBLE_RARE: &[&str] = &["$", "`", "!", "é", "$(p9)", "${x}", "\\é"];
/// After a bare backslash.
const ESCAPED: &[&str] = &[
    " ", ";", "|", "&", "$", "*", "?", "#", "'", "\"", "\\", "{", "}", "(", ")", "<", ">", "~",
    "!", "a", "n", "\t", "\n", "=", "é",
];
const REDIRECTS: &[&str] = &[
    ">", ">>", "<", "2>", "1>", "0<", "&>", "&>>", ">|", "<>", "2>>", " 2> ", "> ", "< ",
];
const REDIRECTS_BARE: &[&str] = &[
    "2>&1",
    ">&2",
    "1>&2",
    "2>&-",
    ">&-",
    "<&0",
    "2>/dev/null",
    ">/dev/null",
    "</dev/null",
    "2\\\n>o6",
    "&>/dev/null",
];
const REDIRECTS_ODD: &[&str] = &[
    "{fd}>o7",
    "10>o8",
    "<<<o",
    "<<E",
    ">(p9)",
    "<(p9)",
    ">&o9",
    "2>&1-",
    "> 2>o",
    ">$x",
    "> #o",
    ">&",
    "<<-E",
    "9>o",
    ">& 2",
    "2 >o",
    "2>&12",
    ">/dev/tcp/127.0.0.1/9",
];
const TARGETS: &[&str] = &[
    "o1",
    "o2",
    "'o 3'",
    "\"o4\"",
    "o\\5",
    "/dev/null",
    "o$",
    ".bashrc",
    ".profile",
];
const NAMES: &[&str] = &["A", "B", "FOO", "x", "_y", "a1"];
const NAMES_RARE: &[&str] = &[
    "SSH_CLIENT",
    "SHLVL",
    "LANG",
    "LC_ALL",
    "HOME",
    "CDPATH",
    "RANDOM",
    "OPTIND",
    "SECONDS",
    "BASH_CMDS",
    "BASH_ENV",
    "PATH",
    "IFS",
    "PS4",
    "POSIXLY_CORRECT",
    "EXECIGNORE",
    "GLOBIGNORE",
    "TMOUT",
    "HISTCMD",
    "LINENO",
    "BASH_ALIASES",
    "ENV",
    "SHELLOPTS",
];
const SEPARATORS: &[&str] = &[
    " && ", "&&", " || ", "||", "; ", ";", " | ", "|", " |& ", "|&", "\n", " &&\n ", " |\n ",
    "\n\n", " ; ", "\t&&\t",
];
const SEPARATORS_ODD: &[&str] = &[
    " & ", "&", ";;", " ;& ", "\n&& ", " ( ", " ) ", " && && ", "; ;", " |\n|",
];
const ENDINGS: &[&str] = &[
    " # p9 \\",
    "#x",
    " #;p9",
    ";",
    "\n",
    " &",
    " &&",
    " \\",
    " # '",
    "\n# c\np9x",
    " |",
];
const SHELL_RUNS: &[&str] = &[
    "bash -c",
    "sh -c",
    "dash -c",
    "rbash -c",
    "bash -ec",
    "bash -c -e",
    "bash -e -c",
    "sh -o pipefail -c",
    "bash -uc",
    "bash -c --",
    "dash -eu -c",
    "bash +e -c",
    "busybox sh -c",
];
const SHELL_RUNS_ODD: &[&str] = &[
    "bash -lc",
    "bash -ic",
    "bash -xc",
    "bash --norc -c",
    "bash -s",
    "bash",
    "sh",
    "zsh -c",
    "ksh -c",
    "bash -O extglob -c",
    "bash -kc",
    "bash -o posix -c",
    "bash - -c",
    "bash -cl",
];

/// A line of 1 to 4 simple commands.
fn line(g: &mut Gen, depth: u8) -> String {
    let mut s = String::new();
    if g.chance(5) {
        s.push_str(g.pick(&["\n", "  ", "# c\n", "\\\n"]));
    }
    if depth == 0 && g.chance(4) {
        // Values that run code if a builtin evaluates a name holding them.
        s.push_str("x='a[$(p9)]'; ");
    }
    for i in 0..1 + g.below(4) {
        if i > 0 {
            let sep = if g.chance(3) {
                g.pick(SEPARATORS_ODD)
            } else {
                g.pick(SEPARATORS)
            };
            s.push_str(sep);
        }
        command(g, depth, &mut s);
    }
    if g.chance(5) {
        s.push_str(g.pick(ENDINGS));
    }
    s
}

/// One simple command: assignments, a program, arguments, redirections.
fn command(g: &mut Gen, depth: u8, s: &mut String) {
    if g.chance(15) {
        for _ in 0..1 + g.below(2) {
            assignment(g, s);
            s.push(' ');
        }
        if g.chance(10) {
            return; // assignments only
        }
    }
    if g.chance(8) {
        redirect(g, s);
        s.push(' ');
    }
    let roll = g.below(100);
    let mut args = 1 + g.below(3);
    match roll {
        0..=61 => program(g, s),
        62..=73 => {
            let builtin = g.pick(PLAIN_BUILTINS);
            // `exit` ends the line: seldom.
            if builtin == "exit" && g.chance(60) {
                s.push_str("true");
            } else {
                s.push_str(builtin);
            }
            if builtin == "printf" {
                s.push(' ');
                s.push_str(g.pick(&["%s", "%d", "-v", "--", "%b", "'%(%s)T'", "-v x", "%q"]));
            }
        }
        74..=84 if depth < 2 => {
            shell(g, depth, s);
            args = g.below(2);
        }
        85..=88 => s.push_str(g.pick(&["./p1", "./p2", "./o1"])),
        _ => s.push_str(g.pick(UNSAFE)),
    }
    for _ in 0..g.below(args + 1) {
        s.push(' ');
        if g.chance(8) {
            redirect(g, s);
        } else {
            word(g, s);
        }
    }
    if g.chance(10) {
        s.push(' ');
        redirect(g, s);
    }
}

/// A program from `PROGRAMS`, in one of its spellings.
fn program(g: &mut Gen, s: &mut String) {
    let name = g.pick(PROGRAMS);
    let (head, tail) = name.split_at(1);
    match g.below(12) {
        0 => s.push_str(&format!("'{name}'")),
        1 => s.push_str(&format!("\"{name}\"")),
        2 => s.push_str(&format!("{head}\\{tail}")),
        3 => s.push_str(&format!("{head}''{tail}")),
        4 => s.push_str(&format!("{head}\\\n{tail}")),
        _ => s.push_str(name),
    }
}

/// `SHELL -c WORD` around a line one level deeper.
fn shell(g: &mut Gen, depth: u8, s: &mut String) {
    let run = if g.chance(12) {
        g.pick(SHELL_RUNS_ODD)
    } else {
        g.pick(SHELL_RUNS)
    };
    s.push_str(run);
    s.push(' ');
    let inner = line(g, depth + 1);
    match g.below(10) {
        0..=5 => s.push_str(&single_quoted(&inner)),
        6..=8 => {
            s.push('"');
            for c in inner.chars() {
                if matches!(c, '"' | '\\' | '$' | '`') {
                    s.push('\\');
                }
                s.push(c);
            }
            s.push('"');
        }
        _ => {
            for c in inner.chars() {
                if !(c.is_ascii_alphanumeric() || "_./+-,:@%=".contains(c)) {
                    s.push('\\');
                }
                s.push(c);
            }
        }
    }
    if g.chance(15) {
        s.push_str(g.pick(&[" name", " name p1", " -x", " --"]));
    }
}

/// `NAME=value` in one of its spellings.
fn assignment(g: &mut Gen, s: &mut String) {
    let name = if g.chance(15) {
        g.pick(NAMES_RARE)
    } else {
        g.pick(NAMES)
    };
    let spelled = match g.below(25) {
        0 => format!("\"{name}\"="),
        1 => format!("{name}\\="),
        2 => format!("1{name}="),
        3 => format!("{name}[1]="),
        4 => format!("{name}''="),
        5 | 6 => format!("{name}+="),
        _ => format!("{name}="),
    };
    s.push_str(&spelled);
    match g.below(10) {
        0 => {}
        1 => s.push_str("'a[$(p9)]'"),
        2 => s.push('x'),
        _ => word(g, s),
    }
}

/// A redirection.
fn redirect(g: &mut Gen, s: &mut String) {
    match g.below(30) {
        0..=17 => {
            s.push_str(g.pick(REDIRECTS));
            s.push_str(g.pick(TARGETS));
        }
        18..=27 => s.push_str(g.pick(REDIRECTS_BARE)),
        _ => s.push_str(g.pick(REDIRECTS_ODD)),
    }
}

/// A word of one to three parts: bare, quoted, escaped.
fn word(g: &mut Gen, s: &mut String) {
    for _ in 0..1 + g.below(3) {
        match g.below(20) {
            0..=9 => {
                for _ in 0..1 + g.below(4) {
                    if g.chance(2) {
                        s.push_str(g.pick(SPECIAL));
                    } else {
                        s.push(char::from(g.pick(BARE)));
                    }
                }
            }
            10..=12 => {
                s.push('\'');
                for _ in 0..g.below(5) {
                    if g.chance(10) {
                        s.push_str(g.pick(PAYLOADS));
                    } else {
                        s.push_str(g.pick(IN_SINGLE));
                    }
                }
                s.push('\'');
            }
            13..=16 => {
                s.push('"');
                for _ in 0..g.below(5) {
                    if g.chance(2) {
                        s.push_str(g.pick(IN_DOUBLE_RARE));
                    } else {
                        s.push_str(g.pick(IN_DOUBLE));
                    }
                }
                s.push('"');
            }
            17 | 18 => {
                s.push('\\');
                s.push_str(g.pick(ESCAPED));
            }
            _ if g.chance(50) => s.push_str(g.pick(PAYLOADS)),
            _ => s.push_str(g.pick(PROGRAMS)),
        }
    }
}
