//! `execctl -H ssh://[USER@]HOST[:PORT][/SOCKET]`: the execd on another host, reached the
//! way docker reaches its daemons, through the user's own ssh (their config, keys, agent
//! and ProxyJump): `ssh -T [-p PORT] [USER@]HOST -- execctl dial-stdio [--socket SOCKET]`,
//! whose stdin and stdout are one end of a socket pair; execctl speaks its usual JSON-RPC
//! over the other end, so `Client` and everything above it are the same as locally.
//!
//! - One ssh per connection, as docker has it: a foreground `run` opens a second link for
//!   its stdin and a third to kill. An ssh `ControlMaster` the user configured shares one
//!   TCP connection among them.
//! - ssh ignores SIGINT (`sys::host::ignore_sigint_in_child`): a Ctrl-C at the terminal
//!   reaches execctl, which kills the remote command over a link of its own, while the
//!   links already open stay up to carry the command's last output and its exit.
//! - ssh's stderr is kept (its tail) and shown only when the link fails. It is never
//!   waited for to its end: a `ControlPersist` master may hold it open for minutes.
//! - A link that fails is one line naming the host and the step, exit 125 (`classify`):
//!   ssh not installed; ssh failed (exit 255, with its last line); execctl not installed
//!   there (the remote shell's 127); execd not running there (dial-stdio's own message,
//!   its 125); execd refusing the ssh user (it closes at once: dial-stdio exits 0 with
//!   nothing said).
//! - A link ends with its connection: execctl closes its end, ssh passes the EOF on, the
//!   remote dial-stdio half-closes the daemon's socket, the daemon closes once it has
//!   answered everything, and ssh exits with the remote command. It is then reaped, and
//!   killed first if it has not exited within `REAP_GRACE`.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::errors::{Fail, Res};
use super::output::shell_quote;
use crate::client::Transport;

/// How long a link may take to end on its own once its connection is closed.
const REAP_GRACE: Duration = Duration::from_secs(5);
/// How long ssh may take to exit once the stream it relays has ended, before the failure
/// is explained without its exit status.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// How long ssh's stderr may take to deliver its last bytes once ssh has exited.
const STDERR_WAIT: Duration = Duration::from_millis(200);
/// The most of ssh's stderr kept (its end: the last line says why).
const STDERR_KEEP: usize = 8 << 10;

/// An execd on another host, as an `ssh://` URL names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    /// The remote socket's absolute path; `None`: the remote execctl's default.
    pub socket: Option<String>,
}

impl Remote {
    /// Parses what follows `ssh://`: `[USER@]HOST[:PORT][/SOCKET]`, HOST an ssh name or
    /// alias, an address, or `[IPv6]`; SOCKET an absolute path (`%XX` decoded).
    pub fn parse(rest: &str) -> Result<Remote, String> {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
            let (v6, after) = inner
                .split_once(']')
                .ok_or("an IPv6 address needs its closing ]")?;
            match after {
                "" => (v6, None),
                _ => match after.strip_prefix(':') {
                    Some(p) => (v6, Some(p)),
                    None => return Err(format!("{after:?} after the address is not :PORT")),
                },
            }
        } else {
            match hostport.split_once(':') {
                Some((_, p)) if p.contains(':') => {
                    return Err("write an IPv6 address in brackets: ssh://[::1]".into())
                }
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let word = |what: &str, w: &str| -> Result<(), String> {
            if w.is_empty() {
                return Err(format!("the {what} is empty"));
            }
            if w.starts_with('-') {
                return Err(format!("a {what} cannot start with '-' ({w:?})"));
            }
            if w.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "the {what} {w:?} holds a space or a control character"
                ));
            }
            Ok(())
        };
        word("host", host)?;
        if let Some(u) = user {
            word("user", u)?;
        }
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("the port {p:?} is not a number from 1 to 65535"))
            })
            .transpose()?;
        let socket = match path {
            "" | "/" => None,
            p => {
                let decoded = percent_decode(p)?;
                if decoded.chars().any(|c| c == '\0' || c == '\n') {
                    return Err("the socket path holds a NUL or a newline".into());
                }
                Some(decoded)
            }
        };
        Ok(Remote {
            user: user.map(String::from),
            host: host.to_string(),
            port,
            socket,
        })
    }

    /// The URL, as messages name the host.
    pub fn url(&self) -> String {
        let mut s = String::from("ssh://");
        if let Some(u) = &self.user {
            s.push_str(u);
            s.push('@');
        }
        if self.host.contains(':') {
            s.push_str(&format!("[{}]", self.host));
        } else {
            s.push_str(&self.host);
        }
        if let Some(p) = self.port {
            s.push_str(&format!(":{p}"));
        }
        if let Some(sock) = &self.socket {
            s.push_str(sock);
        }
        s
    }

    /// ssh's arguments: `-T [-p PORT] [USER@]HOST -- execctl dial-stdio [--socket
    /// SOCKET]`. ssh joins the remote words with spaces for the remote shell, so each is
    /// quoted as that shell needs.
    pub fn ssh_args(&self) -> Vec<String> {
        let mut args = vec!["-T".to_string()];
        if let Some(p) = self.port {
            args.extend(["-p".to_string(), p.to_string()]);
        }
        args.push(match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        });
        args.push("--".into());
        args.extend(["execctl".into(), "dial-stdio".into()]);
        if let Some(sock) = &self.socket {
            args.extend(["--socket".into(), shell_quote(sock)]);
        }
        args
    }

    /// Starts ssh: the stream to speak over, and the link to ask when it ends.
    pub fn dial(&self) -> Res<(UnixStream, SshLink)> {
        let fail = |why: String| Fail::new(format!("cannot reach execd on {}: {why}", self.url()));
        let (ours, theirs) = UnixStream::pair()
            .map_err(|e| fail(format!("cannot make a socket pair for ssh: {e}")))?;
        let theirs_too = theirs
            .try_clone()
            .map_err(|e| fail(format!("cannot make a socket pair for ssh: {e}")))?;
        let mut cmd = Command::new("ssh");
        cmd.args(self.ssh_args())
            .stdin(Stdio::from(OwnedFd::from(theirs_too)))
            .stdout(Stdio::from(OwnedFd::from(theirs)))
            .stderr(Stdio::piped());
        crate::sys::host::ignore_sigint_in_child(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            fail(match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "ssh is not installed here (no ssh on PATH); install an OpenSSH client".into()
                }
                _ => format!("cannot start ssh: {}", crate::wire::rpc::os_error_text(&e)),
            })
        })?;
        // Our copies of ssh's ends close here, so ssh's exit shows as the stream's end.
        drop(cmd);
        let stderr = Arc::new((Mutex::new(Tail::default()), Condvar::new()));
        if let Some(pipe) = child.stderr.take() {
            let tail = stderr.clone();
            std::thread::spawn(move || keep_tail(pipe, &tail));
        }
        let link = SshLink {
            remote: self.clone(),
            child,
            stderr,
        };
        Ok((ours, link))
    }
}

/// `%XX` sequences decoded (a socket path with a space is written `%20` in a URL).
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{:?} is not a %XX escape", &s[i..(i + 3).min(s.len())]))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the socket path is not UTF-8".to_string())
}

/// The end of ssh's stderr, and whether it has ended.
#[derive(Default)]
struct Tail {
    text: Vec<u8>,
    done: bool,
}

type Shared = Arc<(Mutex<Tail>, Condvar)>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Tail> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads ssh's stderr to its end, keeping its last `STDERR_KEEP` bytes.
fn keep_tail(mut pipe: impl Read, tail: &Shared) {
    let mut buf = [0u8; 4096];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let mut t = lock(tail);
                t.text.extend_from_slice(&buf[..n]);
                let over = t.text.len().saturating_sub(STDERR_KEEP);
                t.text.drain(..over);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    lock(tail).done = true;
    tail.1.notify_all();
}

/// A running `ssh ... execctl dial-stdio`: asked why its stream ended, reaped on drop.
pub struct SshLink {
    remote: Remote,
    child: Child,
    stderr: Shared,
}

impl SshLink {
    /// ssh's exit status, waiting at most `within` for it. It usually comes within a
    /// millisecond of the stream's end, and every command pays for the wait, so the
    /// polls are short at first (a `waitpid` each) and longer once it is late.
    fn exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if start.elapsed() < within => {
                    std::thread::sleep(pause);
                    let cap = if start.elapsed() < Duration::from_millis(50) {
                        Duration::from_micros(200)
                    } else {
                        Duration::from_millis(5)
                    };
                    pause = (pause * 2).min(cap);
                }
                _ => return None,
            }
        }
    }

    /// The last non-empty line ssh wrote on stderr, once it has ended (or `within`).
    fn last_line(&self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let mut t = lock(&self.stderr);
        while !t.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            t = self
                .stderr
                .1
                .wait_timeout(t, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let text = String::from_utf8_lossy(&t.text);
        text.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .to_string()
    }
}

impl Transport for SshLink {
    fn why_closed(&mut self, fresh: bool) -> Option<String> {
        let status = self.exit(EXIT_WAIT);
        let line = self.last_line(STDERR_WAIT);
        classify(&self.remote, status.map(|s| s.code()), &line, fresh)
    }
}

impl Drop for SshLink {
    fn drop(&mut self) {
        if self.exit(REAP_GRACE).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Why a link's stream ended, in one line naming the host and the step. `status` is
/// ssh's exit (`Some(None)`: a signal ended it; `None`: it still runs), `line` the last
/// line of its stderr, `fresh` whether nothing at all came back over the link. `None`:
/// nothing to add to "the connection closed".
pub fn classify(
    remote: &Remote,
    status: Option<Option<i32>>,
    line: &str,
    fresh: bool,
) -> Option<String> {
    let url = remote.url();
    let host = &remote.host;
    let at = if fresh {
        format!("cannot reach execd on {url}")
    } else {
        format!("lost the connection to execd on {url}")
    };
    // dial-stdio's messages start with its name; the host says whose they are.
    let said = line.strip_prefix("execctl: ").unwrap_or(line);
    let with = |s: &str| {
        if s.is_empty() {
            String::new()
        } else {
            format!(": {s}")
        }
    };
    Some(match status {
        Some(Some(255)) => format!("{at}: ssh failed{}", with(said)),
        Some(Some(127)) => format!(
            "{at}: execctl is not installed on {host} (not on the PATH of its ssh sessions{}); install it there",
            with(said).replacen(": ", ": the remote shell said: ", 1)
        ),
        Some(Some(126)) => format!("{at}: execctl on {host} cannot be executed{}", with(said)),
        Some(Some(125)) if said.contains("cannot connect to execd") => {
            format!("{at}: execd is not running on {host}{}", with(said))
        }
        Some(Some(125)) if said.contains("does not let uid") => {
            format!("{at}: execd on {host} does not let the ssh user in{}", with(said))
        }
        Some(Some(125)) => format!("{at}: execctl dial-stdio failed on {host}{}", with(said)),
        Some(Some(0)) if fresh => format!(
            "execd on {url} closed the connection before answering: it runs, but does not \
             let the ssh user in (it takes its own uid, root, and those --allow-uid and \
             --allow-gid name); its owner on {host} can allow it"
        ),
        Some(code) if fresh => {
            let how = code.map_or("a signal ended it".to_string(), |c| format!("exit {c}"));
            format!("{at}: ssh ended ({how}){}", with(said))
        }
        // The daemon closed a connection that had been answered: it stopped, or
        // restarted, over there.
        Some(Some(0)) => format!(
            "execd on {url} closed the connection (it may have stopped or restarted); check it with: execctl -H {url} status"
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_ssh_arguments() {
        let r = Remote::parse("user@host:2222/run/execd.sock").expect("parses");
        assert_eq!(
            r.ssh_args(),
            [
                "-T",
                "-p",
                "2222",
                "user@host",
                "--",
                "execctl",
                "dial-stdio",
                "--socket",
                "/run/execd.sock"
            ]
        );
        assert_eq!(r.url(), "ssh://user@host:2222/run/execd.sock");
        let r = Remote::parse("box").expect("parses");
        assert_eq!(r.ssh_args(), ["-T", "box", "--", "execctl", "dial-stdio"]);
        let r = Remote::parse("[::1]:22/tmp/a%20b.sock").expect("parses");
        assert_eq!(r.host, "::1");
        assert_eq!(r.port, Some(22));
        assert_eq!(r.socket.as_deref(), Some("/tmp/a b.sock"));
        assert_eq!(
            r.ssh_args().last().map(String::as_str),
            Some("'/tmp/a b.sock'")
        );
        assert_eq!(r.url(), "ssh://[::1]:22/tmp/a b.sock");
        for bad in [
            "",
            "-oProxyCommand=x",
            "-x@host",
            "host:0",
            "host:x",
            "::1",
            "[::1",
            "a b",
            "@host",
            "host/%zz",
        ] {
            assert!(Remote::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn failures_name_the_host_and_the_step() {
        let r = Remote::parse("u@h:2222").expect("parses");
        let f = |code: Option<i32>, line: &str| classify(&r, Some(code), line, true).unwrap();
        assert_eq!(
            f(Some(255), "ssh: connect to host h port 2222: Connection refused"),
            "cannot reach execd on ssh://u@h:2222: ssh failed: ssh: connect to host h port 2222: Connection refused"
        );
        assert!(f(Some(127), "bash: line 1: execctl: command not found")
            .contains("execctl is not installed on h"));
        assert!(f(
            Some(125),
            "execctl: cannot connect to execd at /s (No such file or directory); start it with: execd --socket /s"
        )
        .starts_with("cannot reach execd on ssh://u@h:2222: execd is not running on h: cannot connect"));
        assert!(f(Some(0), "").contains("does not let the ssh user in"));
        // After answers came back: the daemon there stopped, or the link broke.
        assert!(classify(&r, Some(Some(0)), "", false)
            .unwrap()
            .contains("check it with: execctl -H ssh://u@h:2222 status"));
        assert!(classify(&r, None, "", false).is_none());
        assert!(classify(&r, Some(Some(255)), "broken pipe", false)
            .unwrap()
            .starts_with("lost the connection to execd on ssh://u@h:2222: ssh failed"));
    }
}
