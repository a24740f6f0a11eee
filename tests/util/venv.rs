//! The tests' Python virtualenv: the real clients execd is tested with (the AIO sandbox's
//! SDK, the MCP SDK, a WebSocket client), pinned, installed once per run of the tests.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{skip, Reap};

/// What the tests' virtualenv holds, each pinned: the AIO sandbox's SDK (`agent_sandbox`,
/// the bash pipe API's and the shell API's own client; the newest on PyPI when it was
/// written), the official MCP SDK (`mcp`: `execctl mcp` is tested with it), and a
/// WebSocket client (`websockets`: `/v1/shell/ws` and the browser driver). One line a
/// package, `(name on PyPI, version, module to import)`.
pub const PACKAGES: &[(&str, &str, &str)] = &[
    ("agent-sandbox", "0.0.30", "agent_sandbox"),
    ("mcp", "1.26.0", "mcp"),
    ("websockets", "15.0.1", "websockets"),
];

/// Longest the virtualenv and the SDK's install may take.
const INSTALL_BOUND: Duration = Duration::from_secs(300);

/// Runs `cmd` to its end, at most `bound`; its output, with stdout and stderr written to
/// `log` as well.
#[track_caller]
pub fn run_bounded(cmd: &mut Command, bound: Duration, log: &Path) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    // Pipes are drained by threads so a chatty child never blocks on them.
    let mut child = Reap(child);
    let mut out_pipe = child.0.stdout.take().expect("stdout");
    let mut err_pipe = child.0.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(child); // kills it if it is still running, which ends the pipes
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let _ = std::fs::write(
        log,
        [&stdout[..], b"\n--- stderr ---\n", &stderr[..]].concat(),
    );
    let Some(status) = status else {
        panic!(
            "{cmd:?} did not finish within {bound:?}:\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    };
    Output {
        status,
        stdout,
        stderr,
    }
}

/// The python of the tests' virtualenv, holding every package of `PACKAGES` at its pinned
/// version, made once per run of the tests (under cargo's scratch directory for
/// integration tests, so a later run reuses it; a change of `PACKAGES` makes a new one);
/// `None` after `skip`ping when no virtualenv can be made here.
pub fn sdk_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = PYTHON.get_or_init(|| {
        let pins: Vec<String> = PACKAGES
            .iter()
            .map(|(n, v, _)| format!("{n}=={v}"))
            .collect();
        // The directory's name changes with the pins, so an older venv is never reused.
        let tag = pins.join(",").bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sdk-venv-{tag:016x}"));
        let python = venv.join("bin/python");
        let imports = PACKAGES
            .iter()
            .map(|(_, _, m)| format!("import {m}"))
            .collect::<Vec<_>>()
            .join("; ");
        let ready = |python: &Path| {
            venv.join("pins-installed").exists()
                && Command::new(python)
                    .args(["-c", &imports])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
        };
        if ready(&python) {
            return Ok(python);
        }
        let _ = std::fs::remove_dir_all(&venv);
        // `python3 -m venv` needs ensurepip (Debian: python3-venv). CI installs it; a
        // machine without it skips, saying so.
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .stdin(Stdio::null())
            .output();
        match &made {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "python3 -m venv failed: {}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ))
            }
            Err(e) => return Err(format!("python3 not runnable: {e}")),
        }
        let started = Instant::now();
        let install = run_bounded(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                ])
                .args(&pins)
                .env("PIP_NO_INPUT", "1"),
            INSTALL_BOUND,
            &venv.join("pip.log"),
        );
        assert!(
            install.status.success(),
            "pip install {} failed:\n{}\n{}",
            pins.join(" "),
            String::from_utf8_lossy(&install.stdout),
            String::from_utf8_lossy(&install.stderr)
        );
        std::fs::write(venv.join("pins-installed"), pins.join("\n")).expect("mark the venv");
        eprintln!("{} installed in {:.1?}", pins.join(" "), started.elapsed());
        Ok(python)
    });
    match made {
        Ok(python) => Some(python.clone()),
        Err(why) => {
            skip(&format!(
                "cannot make a virtualenv: {why} (install python3-venv)"
            ));
            None
        }
    }
}
