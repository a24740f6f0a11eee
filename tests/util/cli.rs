//! Running `execctl` as a user would in tests: spawn it against a test daemon, feed its
//! stdin, read its stdout slowly or at once, signal it, and give it a pseudo-terminal.
//! Every wait is bounded (`WAIT`); a child still running on drop is killed and reaped.
//! Used by the execctl and cli_* areas.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

pub const CTL: &str = env!("CARGO_BIN_EXE_execctl");

/// What one execctl run produced.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A spawned execctl, killed and reaped on drop if still running.
pub struct Ctl {
    pub child: Child,
}

impl Ctl {
    /// Waits for exit, at most `WAIT`.
    #[track_caller]
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("execctl did not exit within {WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An execctl command with a clean environment for what it reads: no `EXECD_SOCKET`,
/// `EXECD_HOST` or `NO_COLOR`; stdin is /dev/null unless the caller sets it.
pub fn command(socket: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(CTL);
    cmd.env_remove("EXECD_SOCKET")
        .env_remove("EXECD_HOST")
        .env_remove("NO_COLOR");
    if let Some(s) = socket {
        cmd.arg("--socket").arg(s);
    }
    cmd.args(args).stdin(Stdio::null());
    cmd
}

/// Reads a pipe to its end on a thread.
pub fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Reads a pipe to its end on a thread, as bytes.
pub fn drain_bytes(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// Reads a pipe to its end slowly: 8 KiB reads, and a 20 ms pause after every 512 KiB, so
/// the writer keeps finding the pipe full (execctl's output back-pressure is exercised).
pub fn drain_slowly(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        let mut since_pause = 0;
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    all.extend_from_slice(&buf[..n]);
                    since_pause += n;
                    if since_pause >= 512 << 10 {
                        since_pause = 0;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
        all
    })
}

/// Runs `cmd` to completion (bounded) and collects its output.
#[track_caller]
pub fn run_cmd(mut cmd: Command) -> Out {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let out = drain(ctl.child.stdout.take().expect("stdout"));
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    let st = ctl.wait();
    Out {
        code: st.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Runs `cmd` with `input` on its stdin (a pipe, closed after it) and collects its output.
#[track_caller]
pub fn run_with_input(mut cmd: Command, input: &[u8]) -> Out {
    cmd.stdin(Stdio::piped());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let mut stdin = ctl.child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = drain(ctl.child.stdout.take().expect("stdout"));
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    let st = ctl.wait();
    let _ = writer.join();
    Out {
        code: st.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// `execctl --socket <daemon> args...`.
#[track_caller]
pub fn ctl(d: &Daemon, args: &[&str]) -> Out {
    run_cmd(command(Some(&d.socket), args))
}

/// Like `ctl`, but the exit status must be `code`.
#[track_caller]
pub fn ctl_code(d: &Daemon, args: &[&str], code: i32) -> Out {
    let o = ctl(d, args);
    assert_eq!(o.code, Some(code), "execctl {args:?}: {o:?}");
    o
}

/// Spawns execctl with stdout as a line channel (stderr discarded).
pub fn spawn_lines(cmd: &mut Command) -> (Ctl, mpsc::Receiver<String>) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let stdout = ctl.child.stdout.take().expect("stdout");
    let rx = lines_of(stdout);
    (ctl, rx)
}

#[track_caller]
pub fn next_line(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("no line from execctl within {WAIT:?}: {e}"))
}

/// The bash command `id` as `bash/commands` lists it.
#[track_caller]
pub fn bash_command(c: &mut Client, id: &str) -> Value {
    let r = ok(c, "bash/commands", json!({}));
    r["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .find(|b| b["command_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not in bash/commands: {r}"))
}

/// `execctl exec --detach LINE`; returns the command id it printed.
#[track_caller]
pub fn exec_detached(d: &Daemon, line: &str) -> String {
    let o = ctl_code(d, &["exec", "--detach", line], 0);
    let id = o.stdout.trim().to_string();
    assert!(id.starts_with("cmd_"), "no command id printed: {o:?}");
    id
}

pub fn has_ansi(s: &str) -> bool {
    s.contains('\x1b')
}

/// Parses JSON that execctl printed.
#[track_caller]
pub fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// A pseudo-terminal pair: (master, slave), both close-on-exec like every descriptor std
/// opens, so that no child another test spawns meanwhile holds the master.
pub fn open_pty() -> (File, File) {
    // SAFETY: posix_openpt/grantpt/unlockpt take and return plain integers; ptsname_r
    // writes a NUL-terminated name of at most `buf.len()` bytes into the live buffer; the
    // master fd is owned by the File from here on.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = File::from_raw_fd(m);
        assert_eq!(libc::grantpt(m), 0, "grantpt");
        assert_eq!(libc::unlockpt(m), 0, "unlockpt");
        let mut buf = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, buf.as_mut_ptr(), buf.len()), 0);
        let name = CStr::from_ptr(buf.as_ptr())
            .to_str()
            .expect("pty name")
            .to_owned();
        let slave = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&name)
            .expect("open pty slave");
        (master, slave)
    }
}

/// What a pseudo-terminal's master has read so far, shared with a reader thread.
pub struct Screen {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    /// The reader met EIO: every slave is closed and all they wrote was read.
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Screen {
    /// Reads `master` on a thread until it reports EIO (every slave closed).
    pub fn watch(master: File) -> Screen {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, c) = (text.clone(), closed.clone());
        let mut master = master;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let s = String::from_utf8_lossy(&buf[..n]).into_owned();
                t.lock().unwrap_or_else(|p| p.into_inner()).push_str(&s);
            }
            c.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        Screen { text, closed }
    }

    /// Waits until every slave is closed and what they wrote has been read.
    #[track_caller]
    pub fn wait_closed(&self) {
        wait_until("the terminal's last output", || {
            self.closed.load(std::sync::atomic::Ordering::SeqCst)
        });
    }

    pub fn text(&self) -> String {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the screen holds `needle` `times` times; returns the screen.
    #[track_caller]
    pub fn wait_for(&self, needle: &str, times: usize) -> String {
        let mut screen = String::new();
        wait_until(&format!("{needle:?} x{times} on the terminal"), || {
            screen = self.text();
            screen.matches(needle).count() >= times
        });
        screen
    }
}

/// Pseudo-random bytes (xorshift64*), the same for the same seed.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Waits until bash command `id` is no longer running.
#[track_caller]
pub fn wait_bash_done(c: &mut Client, id: &str) -> Value {
    let mut info = Value::Null;
    wait_until(&format!("{id} ended"), || {
        info = bash_command(c, id);
        info["status"] != "running"
    });
    info
}

/// A terminal's modes, the fields a program sees (`tcgetattr`).
pub type Modes = (u32, u32, u32, u32, Vec<u8>);

/// The modes of the terminal `f` is open on.
#[track_caller]
pub fn modes_of(f: &File) -> Modes {
    use std::os::fd::AsRawFd;
    // SAFETY: termios is plain old data; tcgetattr fills it from a live descriptor.
    let t = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(f.as_raw_fd(), &mut t), 0, "tcgetattr");
        t
    };
    (t.c_iflag, t.c_oflag, t.c_cflag, t.c_lflag, t.c_cc.to_vec())
}

/// Sets the window size of the pseudo-terminal whose master is `m`; the kernel sends
/// SIGWINCH to the foreground group of the terminal's session.
pub fn set_window_size(m: &File, rows: u16, cols: u16) {
    use std::os::fd::AsRawFd;
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a live winsize.
    assert_eq!(
        unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &ws) },
        0,
        "TIOCSWINSZ"
    );
}

/// execctl as a person runs it in a terminal window: a pseudo-terminal of its own is its
/// stdin, stdout, stderr and controlling terminal (it leads a new session, so the keys
/// that raise signals and window-size changes reach it as the foreground group would).
/// The test types on the master and reads the screen; it holds no slave, so the screen
/// ends when execctl has gone (the master reads a pseudo-terminal's modes as well).
pub struct OnTty {
    pub ctl: Ctl,
    pub master: File,
    pub screen: Screen,
    /// The terminal's modes before execctl started.
    pub before: Modes,
}

impl OnTty {
    /// Spawns `execctl --socket SOCKET ARGS` on a fresh `rows` x `cols` terminal.
    #[track_caller]
    pub fn spawn(socket: &Path, args: &[&str], (rows, cols): (u16, u16)) -> OnTty {
        let (master, slave) = open_pty();
        set_window_size(&master, rows, cols);
        let before = modes_of(&slave);
        let mut cmd = command(Some(socket), args);
        cmd.stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave));
        // SAFETY: between fork and exec, only async-signal-safe calls: setsid and ioctl.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let ctl = Ctl {
            child: cmd.spawn().expect("spawn execctl"),
        };
        drop(cmd); // our copies of the slave
        let screen = Screen::watch(master.try_clone().expect("dup"));
        OnTty {
            ctl,
            master,
            screen,
            before,
        }
    }

    /// Types bytes on the terminal.
    #[track_caller]
    pub fn type_keys(&mut self, keys: &[u8]) {
        self.master.write_all(keys).expect("type on the terminal");
    }

    /// The terminal's modes now.
    #[track_caller]
    pub fn modes(&self) -> Modes {
        modes_of(&self.master)
    }

    /// Waits until execctl has put the terminal in raw mode (no echo, no signals).
    #[track_caller]
    pub fn wait_raw(&self) {
        wait_until("execctl's terminal in raw mode", || {
            self.modes().3 & (libc::ECHO | libc::ICANON | libc::ISIG) == 0
        });
    }

    /// Waits for execctl's exit; returns its status code and all it wrote.
    #[track_caller]
    pub fn wait(&mut self) -> (Option<i32>, String) {
        let st = self.ctl.wait();
        self.screen.wait_closed();
        (st.code(), self.screen.text())
    }

    /// Waits for execctl's exit with `code`, and checks that it left the terminal's
    /// modes as they were before it started; returns the screen.
    #[track_caller]
    pub fn exits(&mut self, code: i32) -> String {
        let (got, screen) = self.wait();
        assert_eq!(got, Some(code), "execctl's exit; the screen: {screen:?}");
        assert_eq!(
            self.modes(),
            self.before,
            "the terminal's modes after execctl; the screen: {screen:?}"
        );
        screen
    }
}
