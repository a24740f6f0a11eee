//! A command on execctl's own terminal (PROTOCOL 12.4): `run -t`, `exec -t` and `attach`
//! work as `docker run -it` and `docker attach` do.
//!
//! - The command gets a PTY sized like execctl's terminal, and execctl's terminal goes to
//!   raw mode while it runs: every key is the program's, byte for byte (Ctrl-C is `\x03`,
//!   which the PTY's line discipline turns into the program's SIGINT); the output is written
//!   to stdout raw, as the program wrote it (the main thread does that, `run::follow`).
//! - The terminal's modes are put back on every way out: the end of the command, an error
//!   (the `Raw` guard), a signal (the signal thread), a detach (the input thread), a panic
//!   (a hook; release builds abort on panic, so no destructor would run). Whichever comes
//!   first restores them; raw mode is never entered again after that.
//! - Threads: the input thread reads stdin and writes it to the command on a connection of
//!   its own, watching for the detach keys; the signal thread resizes the PTY on SIGWINCH.
//!   For SIGTERM or SIGHUP it restores the terminal and then passes the signal on (`run
//!   -t`, through the `Killer`: execctl is asked to go) or detaches (`attach`: it never
//!   ends what it did not start). A SIGINT (from elsewhere: Ctrl-C is a key here) is
//!   passed on with the session going on, or detaches `attach`. A detach hangs up the main
//!   thread's connection so that it returns at once.

use std::io::{self, IsTerminal, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{self, Ctx, Target};
use super::errors::{daemon_error, exit_status, Fail, Res, EXIT_TIMEOUT};
use super::foreground::{Killer, Reason};
use super::output::{self, warn};
use super::run::{follow, stdin_chunk, write_chunk, OutputSink, RunEnd};
use crate::client::{CallError, Client};
use crate::sys::term::{self, Modes};

/// docker's default detach keys: Ctrl-P Ctrl-Q.
pub const DEFAULT_DETACH_KEYS: &str = "ctrl-p,ctrl-q";

// ---- options ---------------------------------------------------------------------------

/// What `-t` asks for.
#[derive(Debug, Clone)]
pub struct TtyOpts {
    /// The detach sequence; empty: none.
    pub keys: Vec<u8>,
    /// execctl's terminal's size (rows, cols), the PTY's at its start; `None`: the
    /// daemon's default.
    pub size: Option<(u16, u16)>,
}

impl TtyOpts {
    /// The fields `terminal/create` (`_meta.execd`) and `bash/exec` take for a PTY.
    pub fn request(&self, to: &mut Value) {
        to["tty"] = json!(true);
        if let Some((rows, cols)) = self.size {
            to["size"] = json!({"rows": rows, "cols": cols});
        }
    }
}

/// The `-t` options of `run` and `exec` (`None` without `-t`). `-t` needs a terminal on
/// stdin unless the command is detached at once.
pub fn options(p: &Args, detach: bool) -> Res<Option<TtyOpts>> {
    if !p.has("--tty") {
        if p.has("--detach-keys") {
            return Err(Fail::usage(
                "--detach-keys goes with -t (a command on your terminal)",
            ));
        }
        return Ok(None);
    }
    let keys = detach_keys(p)?;
    if !detach {
        need_terminal("-t")?;
    }
    Ok(Some(TtyOpts {
        keys,
        size: own_size(),
    }))
}

/// `-t` and `attach` put stdin in raw mode: it must be a terminal (docker's "the input
/// device is not a TTY").
fn need_terminal(what: &str) -> Res<()> {
    if io::stdin().is_terminal() {
        return Ok(());
    }
    Err(Fail::usage(format!(
        "{what} needs a terminal and stdin is not one; leave out -t to pipe input to the command"
    )))
}

/// execctl's terminal's size: stdin's, else stdout's.
pub(super) fn own_size() -> Option<(u16, u16)> {
    term::window_size(0).or_else(|| term::window_size(1))
}

/// `--detach-keys`, or the default.
fn detach_keys(p: &Args) -> Res<Vec<u8>> {
    let text = p.value("--detach-keys").unwrap_or(DEFAULT_DETACH_KEYS);
    parse_keys(text).map_err(|e| {
        Fail::usage(format!(
            "--detach-keys {text:?}: {e}; write them as docker does: ctrl-p,ctrl-q or a,ctrl-x (\"\" for none)"
        ))
    })
}

/// docker's key syntax: comma-separated keys, each one character (`a`, `Q`, `^`) or
/// `ctrl-X` with X a letter or one of `@ [ \ ] ^ _`.
pub fn parse_keys(text: &str) -> Result<Vec<u8>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|key| {
            let lower = key.to_ascii_lowercase();
            if let Some(x) = lower.strip_prefix("ctrl-") {
                return match x.as_bytes() {
                    [c @ b'a'..=b'z'] => Ok(c - b'a' + 1),
                    [b'@'] => Ok(0),
                    [c @ (b'[' | b'\\' | b']' | b'^' | b'_')] => Ok(c - b'[' + 27),
                    _ => Err(format!("{key:?} is not a control key")),
                };
            }
            match key.as_bytes() {
                [c] if c.is_ascii() && !c.is_ascii_control() => Ok(*c),
                _ => Err(format!("{key:?} is not one key")),
            }
        })
        .collect()
}

/// Finds the detach sequence in typed input. Keys that may begin it are held back until
/// the sequence completes (a detach: they are never sent) or breaks (they are sent).
#[derive(Debug)]
pub struct DetachScanner {
    keys: Vec<u8>,
    held: Vec<u8>,
}

impl DetachScanner {
    pub fn new(keys: Vec<u8>) -> DetachScanner {
        DetachScanner {
            keys,
            held: Vec::new(),
        }
    }

    /// Reads typed bytes: what to send now, and whether the sequence was typed (what
    /// follows it in `input` is dropped with it).
    pub fn feed(&mut self, input: &[u8]) -> (Vec<u8>, bool) {
        if self.keys.is_empty() {
            return (input.to_vec(), false);
        }
        let mut out = Vec::with_capacity(input.len());
        for &b in input {
            self.held.push(b);
            if self.held == self.keys {
                self.held.clear();
                return (out, true);
            }
            if self.keys.starts_with(&self.held) {
                continue;
            }
            // The longest end of what is held that may still begin the sequence.
            let keep = (1..self.held.len())
                .rev()
                .find(|&k| self.keys.starts_with(&self.held[self.held.len() - k..]))
                .unwrap_or(0);
            let send = self.held.len() - keep;
            out.extend(self.held.drain(..send));
        }
        (out, false)
    }
}

// ---- raw mode --------------------------------------------------------------------------

/// execctl's terminal's modes from before raw mode; `closed` once they were put back
/// (raw mode is not entered again).
struct Saved {
    modes: Option<Modes>,
    closed: bool,
}

static SAVED: Mutex<Saved> = Mutex::new(Saved {
    modes: None,
    closed: false,
});

fn saved() -> std::sync::MutexGuard<'static, Saved> {
    SAVED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts stdin's terminal in raw mode until the guard goes (or `restore`). `run -t`,
/// `attach` and `execctl shell` each enter it once, for their whole time on the terminal.
pub struct Raw(());

impl Raw {
    pub(super) fn enter() -> Res<Raw> {
        let mut s = saved();
        if s.closed || s.modes.is_some() {
            return Ok(Raw(()));
        }
        let modes = Modes::get(0)
            .map_err(|e| Fail::new(format!("cannot read the terminal's modes: {e}")))?;
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
        modes
            .raw()
            .set(0)
            .map_err(|e| Fail::new(format!("cannot put the terminal in raw mode: {e}")))?;
        s.modes = Some(modes);
        Ok(Raw(()))
    }

    /// After a stop and a continue (SIGCONT) the shell may have reset the terminal.
    pub(super) fn again() {
        let s = saved();
        if let (Some(m), false) = (&s.modes, s.closed) {
            let _ = m.raw().set(0);
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts execctl's terminal back as it was; from then on raw mode stays off. Any thread
/// may call it, any number of times, before it ends execctl.
pub(super) fn restore() {
    let mut s = saved();
    s.closed = true;
    if let Some(m) = s.modes.take() {
        let _ = m.set(0);
    }
}

// ---- the session -----------------------------------------------------------------------

/// A PTY command on execctl's terminal: its signals, its input, and how it ended.
pub struct Session {
    ctx: Ctx,
    keys: Vec<u8>,
    /// The PTY's size as last asked for.
    size: Mutex<Option<(u16, u16)>>,
    target: Mutex<Option<Target>>,
    /// `run -t`: signals are passed on to the command; `attach`: they detach.
    killer: Option<Killer>,
    /// The main thread's connection, hung up on a detach.
    main: Mutex<Option<UnixStream>>,
    /// Why execctl left a running command: 0 not, -1 the detach keys, else the signal.
    detached: AtomicI32,
}

impl Session {
    /// Watches execctl's signals from now on (a create may be held for approval meanwhile).
    pub fn watch(ctx: &Ctx, opts: &TtyOpts, killer: Option<&Killer>) -> Arc<Session> {
        let s = Arc::new(Session {
            ctx: ctx.clone(),
            keys: opts.keys.clone(),
            size: Mutex::new(opts.size),
            target: Mutex::new(None),
            killer: killer.cloned(),
            main: Mutex::new(None),
            detached: AtomicI32::new(0),
        });
        use signal_hook::consts::{SIGCONT, SIGHUP, SIGINT, SIGTERM, SIGWINCH};
        match signal_hook::iterator::Signals::new([SIGINT, SIGHUP, SIGTERM, SIGWINCH, SIGCONT]) {
            Ok(mut signals) => {
                let s = s.clone();
                std::thread::spawn(move || {
                    for sig in signals.forever() {
                        s.signal(sig);
                    }
                });
            }
            Err(e) => warn(&format!(
                "cannot watch for signals ({e}); the terminal will not follow resizes"
            )),
        }
        s
    }

    fn signal(&self, sig: i32) {
        match sig {
            libc::SIGWINCH => self.resize(),
            libc::SIGCONT => Raw::again(),
            // Ctrl-C is a key here: a SIGINT came from elsewhere, and the program may
            // well handle it and go on, keys and all.
            libc::SIGINT if self.killer.is_some() => self.pass_on(sig),
            _ => {
                restore();
                match &self.killer {
                    Some(_) => self.pass_on(sig),
                    None => self.detach(sig),
                }
            }
        }
    }

    fn pass_on(&self, sig: i32) {
        if let Some(k) = &self.killer {
            k.trigger(Reason::Signal(sig));
        }
    }

    /// Leaves the command running: the main thread's connection is hung up.
    fn detach(&self, why: i32) {
        restore();
        let _ = self
            .detached
            .compare_exchange(0, why, Ordering::SeqCst, Ordering::SeqCst);
        self.hang_up();
    }

    /// Makes the main thread's read of its connection return at once.
    fn hang_up(&self) {
        if let Some(conn) = lock(&self.main).as_ref() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Gives the PTY execctl's terminal's size, when it changed.
    fn resize(&self) {
        let Some(now) = own_size() else { return };
        let Some(target) = lock(&self.target).clone() else {
            return;
        };
        {
            let mut size = lock(&self.size);
            if *size == Some(now) {
                return;
            }
            *size = Some(now);
        }
        let Ok(mut c) = self.ctx.connect() else {
            return;
        };
        // A command that ended meanwhile has no size to set.
        let _ = resize(&mut c, &target, now);
    }

    /// The command exists and `main` follows its output: raw mode, and input from now on.
    pub fn begin(self: &Arc<Session>, target: &Target, main: &Client) -> Res<Raw> {
        *lock(&self.target) = Some(target.clone());
        *lock(&self.main) = main.handle().ok();
        if self.detached.load(Ordering::SeqCst) != 0 {
            // A signal came first and found no connection to hang up.
            self.hang_up();
        }
        // A resize that came while the command was being made.
        self.resize();
        let raw = Raw::enter()?;
        let s = self.clone();
        let target = target.clone();
        std::thread::spawn(move || s.forward_input(&target));
        Ok(raw)
    }

    /// Copies typed keys to the command until the detach keys, or stdin's end.
    fn forward_input(&self, target: &Target) {
        let Ok(mut c) = self.ctx.connect() else {
            warn("cannot connect to execd to forward your keys");
            return;
        };
        let mut scanner = DetachScanner::new(self.keys.clone());
        // A paste larger than the daemon's input buffer goes in pieces it takes (with
        // room for held keys that may go with a piece).
        let room = stdin_chunk(&mut c).saturating_sub(self.keys.len()).max(1);
        let mut buf = vec![0u8; room];
        let mut stdin = io::stdin().lock();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if saved().closed {
                // The terminal is back to normal: the session is over.
                return;
            }
            let (send, detach) = scanner.feed(&buf[..n]);
            if !send.is_empty() {
                if let Err(e) = write_chunk(&mut c, target, &send, false) {
                    // The command ended (or its input closed): the main thread says so.
                    if !matches!(e.code(), Some(-32000 | -32002)) {
                        restore();
                        warn(&format!(
                            "your keys no longer reach {}: {}",
                            target.id(),
                            daemon_error(e, Some(target.id())).text(self.ctx.verbose)
                        ));
                    }
                    return;
                }
            }
            if detach {
                self.detach(-1);
                return;
            }
        }
    }

    /// After the main thread returned: whether execctl detached, and its exit status
    /// then, after turning off the terminal modes the program left on (`reset`, from
    /// `OutputSink::reset_modes`) and saying how to come back.
    pub fn detached(&self, target: &Target, reset: &[u8]) -> Option<u8> {
        let why = self.detached.load(Ordering::SeqCst);
        if why == 0 {
            return None;
        }
        restore();
        let _ = output::write_stdout(reset);
        let id = target.id();
        let _ = output::write_stderr(
            format!("\r\ndetached from {id} (execctl attach {id})\n").as_bytes(),
        );
        Some(if why < 0 {
            0
        } else {
            Reason::Signal(why).exit_code()
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets the PTY's window size.
fn resize(c: &mut Client, target: &Target, (rows, cols): (u16, u16)) -> Result<Value, CallError> {
    match target {
        Target::Terminal { id, session } => c.call(
            "terminal/resize",
            json!({"sessionId": session, "terminalId": id, "rows": rows, "cols": cols}),
        ),
        Target::Bash { id, session } => c.call(
            "bash/resize",
            json!({"session_id": session, "command_id": id, "rows": rows, "cols": cols}),
        ),
        Target::Shell { session, .. } => c.call(
            "shell/resize",
            json!({"id": session, "rows": rows, "cols": cols}),
        ),
    }
}

/// execctl's exit status for a PTY command that ended while on the terminal.
pub fn exit_code(payload: &Value) -> u8 {
    if payload["status"] == "timed_out" {
        return EXIT_TIMEOUT;
    }
    exit_status(&payload["exitCode"], &payload["signal"])
}

// ---- attach ----------------------------------------------------------------------------

/// A command's screen as the daemon keeps it (PROTOCOL 12.1).
#[derive(Debug, Default, PartialEq)]
pub struct ShownScreen {
    pub lines: Vec<String>,
    pub row: u64,
    pub col: u64,
    pub alternate: bool,
}

impl ShownScreen {
    pub fn from_json(v: &Value) -> ShownScreen {
        ShownScreen {
            lines: v["lines"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|s| s.as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default(),
            row: v["cursor"]["row"].as_u64().unwrap_or(0),
            col: v["cursor"]["col"].as_u64().unwrap_or(0),
            alternate: v["alternate"] == true,
        }
    }

    /// What draws it on a terminal in raw mode: the alternate screen if the program is
    /// on it, the screen cleared, the lines, the cursor where the program left it.
    pub fn paint(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.alternate {
            out.extend_from_slice(b"\x1b[?1049h");
        }
        out.extend_from_slice(b"\x1b[H\x1b[2J");
        let last = self
            .lines
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |i| i + 1);
        for (i, line) in self.lines[..last].iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(line.as_bytes());
        }
        out.extend_from_slice(format!("\x1b[{};{}H", self.row + 1, self.col + 1).as_bytes());
        out
    }
}

/// `execctl attach [--detach-keys KEYS] ID`.
pub fn attach(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = match p.operands.as_slice() {
        [id] => id.as_str(),
        _ => {
            return Err(Fail::usage(
                "attach takes one id: execctl attach [--detach-keys KEYS] ID",
            ))
        }
    };
    if ctx.json {
        return Err(Fail::usage(
            "attach puts the command on your terminal; --json does not go with it",
        ));
    }
    let keys = detach_keys(p)?;
    need_terminal("attach")?;
    let opts = TtyOpts {
        keys,
        size: own_size(),
    };
    let mut c = ctx.connect()?;
    let (target, entry) = connect::locate(&mut c, id)?;
    let (tty, exited) = match &target {
        Target::Terminal { .. } => (
            &entry["_meta"]["execd"]["tty"],
            !entry["exitStatus"].is_null(),
        ),
        Target::Bash { .. } => (&entry["tty"], entry["status"] != "running"),
        // A shell session's shell: its session comes to this terminal, as `execctl
        // shell SESSION` brings it.
        Target::Shell { session, .. } => {
            drop(c);
            return super::shell::enter(ctx, Some(session.clone()), None, None);
        }
    };
    if !tty.is_object() {
        return Err(Fail::new(format!(
            "{id} has no terminal (it was started without -t); follow its output with: execctl logs -f {id}"
        )));
    }
    if exited {
        return Err(Fail::new(format!(
            "{id} has exited; see what it printed with: execctl logs {id}"
        )));
    }
    let session = Session::watch(ctx, &opts, None);
    if let Some(size) = opts.size {
        if (tty["rows"].as_u64(), tty["cols"].as_u64())
            != (Some(u64::from(size.0)), Some(u64::from(size.1)))
        {
            // The program redraws for this terminal (SIGWINCH) as it would for a resize.
            resize(&mut c, &target, size).map_err(connect::about(id))?;
        }
    }
    let (screen, ends) = screen(&mut c, &target).map_err(connect::about(id))?;
    let mut sub = json!({"id": id, "offset": ends[0], "stderr_offset": ends[1]});
    sub["lossless"] = json!(true);
    sub["encoding"] = json!("base64");
    c.call("events/subscribe", sub)
        .map_err(connect::about(id))?;
    let raw = session.begin(&target, &c)?;
    output::write_stdout(&screen.paint())?;
    let mut sink = OutputSink::new(id, false).starting_at(ends);
    sink.modes = Some(super::modes::Modes::new(screen.alternate));
    // Nothing ends the command from here: the killer never has a target.
    let killer = Killer::new(ctx);
    let ended = follow(&mut c, &mut sink, &killer, None);
    drop(raw);
    if let Some(code) = session.detached(&target, &sink.reset_modes()) {
        return Ok(code);
    }
    match ended? {
        RunEnd::Exit { payload, .. } => Ok(exit_code(&payload)),
        RunEnd::StillRunning => Ok(0),
    }
}

/// The command's screen now, and the output offsets it stands for (where its live output
/// continues).
fn screen(c: &mut Client, target: &Target) -> Result<(ShownScreen, [u64; 2]), CallError> {
    match target {
        Target::Terminal { id, session } => {
            let r = c.call(
                "terminal/output",
                json!({"sessionId": session, "terminalId": id,
                       "_meta": {"execd": {"screen": true, "length": 0}}}),
            )?;
            let meta = &r["_meta"]["execd"];
            let end = meta["end"].as_u64().unwrap_or(0);
            Ok((ShownScreen::from_json(&meta["screen"]), [end, 0]))
        }
        Target::Bash { id, session } => {
            // An offset past the end reads nothing and answers the end.
            let past = 1u64 << 53;
            let r = c.call(
                "bash/output",
                json!({"session_id": session, "command_id": id, "screen": true,
                       "offset": past, "stderr_offset": past}),
            )?;
            let ends = [
                r["offset"].as_u64().unwrap_or(0),
                r["stderr_offset"].as_u64().unwrap_or(0),
            ];
            Ok((ShownScreen::from_json(&r["screen"]), ends))
        }
        // `attach` hands a shell session to `execctl shell` before it would ask.
        Target::Shell { .. } => Ok((ShownScreen::from_json(&Value::Null), [0, 0])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_as_docker_writes_them() {
        assert_eq!(parse_keys("ctrl-p,ctrl-q"), Ok(vec![0x10, 0x11]));
        assert_eq!(parse_keys("CTRL-A,x"), Ok(vec![1, b'x']));
        assert_eq!(
            parse_keys("ctrl-@,ctrl-[,ctrl-\\,ctrl-],ctrl-^,ctrl-_"),
            Ok(vec![0, 27, 28, 29, 30, 31])
        );
        assert_eq!(parse_keys("a,Q,^"), Ok(vec![b'a', b'Q', b'^']));
        assert_eq!(parse_keys(""), Ok(vec![]));
        for bad in ["ctrl-", "ctrl-1", "ab", "ctrl-p,", ",", "é", "ctrl-pq"] {
            assert!(parse_keys(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_sequence_detaches_and_broken_sequences_pass_through() {
        let mut s = DetachScanner::new(vec![0x10, 0x11]);
        assert_eq!(s.feed(b"ab"), (b"ab".to_vec(), false));
        // Ctrl-P is held until the next key says what it was.
        assert_eq!(s.feed(&[0x10]), (vec![], false));
        assert_eq!(s.feed(b"x"), (vec![0x10, b'x'], false));
        assert_eq!(s.feed(&[0x10, 0x10]), (vec![0x10], false));
        assert_eq!(s.feed(&[0x11, b'z']), (vec![], true));
        // Across reads, and after other keys in the same read.
        assert_eq!(s.feed(&[b'q', 0x10]), (vec![b'q'], false));
        assert_eq!(s.feed(&[0x11]), (vec![], true));
        // A sequence whose start repeats: "a,a,b" in "aaab".
        let mut s = DetachScanner::new(b"aab".to_vec());
        assert_eq!(s.feed(b"aa"), (vec![], false));
        assert_eq!(s.feed(b"a"), (b"a".to_vec(), false));
        assert_eq!(s.feed(b"b"), (vec![], true));
        // No keys: everything goes, Ctrl-C included.
        let mut s = DetachScanner::new(vec![]);
        assert_eq!(s.feed(&[0x10, 0x11, 3]), (vec![0x10, 0x11, 3], false));
    }

    #[test]
    fn a_screen_is_painted_where_the_program_left_it() {
        let v = json!({"rows": 4, "cols": 10, "lines": [">>> 1+1", "2", ">>> ", ""],
                       "cursor": {"row": 2, "col": 4}, "alternate": false});
        let s = ShownScreen::from_json(&v);
        assert_eq!(s.lines.len(), 4);
        assert_eq!(
            String::from_utf8(s.paint()).expect("utf-8"),
            "\x1b[H\x1b[2J>>> 1+1\r\n2\r\n>>> \x1b[3;5H"
        );
        let v = json!({"lines": ["x"], "cursor": {"row": 0, "col": 1}, "alternate": true});
        assert!(ShownScreen::from_json(&v)
            .paint()
            .starts_with(b"\x1b[?1049h\x1b[H\x1b[2J"));
        assert_eq!(
            ShownScreen::from_json(&Value::Null).paint(),
            b"\x1b[H\x1b[2J\x1b[1;1H"
        );
    }
}
