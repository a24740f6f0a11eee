//! Reaching the daemon: where it is (`Host`: a local socket, or `ssh://` another host),
//! the global options (`Ctx`), the one way every subcommand opens a connection (`open`),
//! reading paged listings to their end, and finding which family and session an id
//! belongs to.
//!
//! Where, in order: `-H URL`; else `--socket PATH`; else `$EXECD_HOST`; else
//! `$EXECD_SOCKET`; else the places section 1 names, tried in order until one has a
//! daemon: `$XDG_RUNTIME_DIR/execd.sock`, `/run/user/UID/execd.sock` (a runtime directory
//! of the user's own), `/run/execd.sock` (root), `/tmp/execd-UID/execd.sock`. A flag on
//! the command line beats the environment, as docker's `--context` beats `DOCKER_HOST`: a
//! `--socket` typed now is not overridden by an `EXECD_HOST` exported long ago.
//! `dial-stdio` never reads `EXECD_HOST`: it is what an ssh login runs on the host
//! itself, and must reach that host's daemon.
//!
//! Whoever serves a local socket is checked on connect (`SO_PEERCRED` of the listener):
//! a daemon of another uid than execctl's own or root is refused, so no other user can
//! stand in for the daemon and read every command sent to it.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::errors::{daemon_error, Fail, Res};
use super::ssh::Remote;
use crate::client::{Client, Transport};

/// Where the daemon is.
#[derive(Debug, Clone, PartialEq)]
pub enum Host {
    /// A Unix socket on this host.
    Local(PathBuf),
    /// The execd on another host, through ssh.
    Ssh(Remote),
}

impl Host {
    /// Parses `-H`/`EXECD_HOST`: `ssh://[USER@]HOST[:PORT][/SOCKET]` or `unix:///PATH`.
    pub fn parse(url: &str) -> Res<Host> {
        let bad = |why: String| {
            Fail::usage(format!(
                "-H {url:?}: {why}; give ssh://[USER@]HOST[:PORT][/SOCKET] or unix:///PATH"
            ))
        };
        if let Some(rest) = url.strip_prefix("ssh://") {
            return Remote::parse(rest).map(Host::Ssh).map_err(bad);
        }
        if let Some(path) = url.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(bad(
                    "a unix:// socket path is absolute (three slashes)".into()
                ));
            }
            return Ok(Host::Local(PathBuf::from(path)));
        }
        Err(bad(match url.split_once("://") {
            Some(("tcp" | "http" | "https", _)) => "execd is not reached over TCP by execctl: \
                 use ssh:// (or its HTTP listener from programs that speak HTTP)"
                .into(),
            Some((scheme, _)) => format!("unknown scheme {scheme}://"),
            None => "not a URL".into(),
        }))
    }

    /// Picks the daemon as the module header says. `env` reads an environment variable;
    /// `host_env` is false for `dial-stdio`. With the daemon named nowhere, also the
    /// places section 1 lists (`candidates`), for `Ctx::open` to try in turn; the host is
    /// the first of them that holds a socket.
    pub fn resolve(
        flag_host: Option<&str>,
        flag_socket: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
        host_env: bool,
        candidates: &dyn Fn() -> Vec<PathBuf>,
    ) -> Res<(Host, Vec<PathBuf>)> {
        match (flag_host, flag_socket) {
            (Some(_), Some(_)) => {
                return Err(Fail::usage(
                    "-H and --socket both name the daemon; give one (a remote socket goes in the URL: ssh://HOST/PATH)",
                ))
            }
            (Some(h), None) => return Ok((Host::parse(h)?, Vec::new())),
            (None, Some(s)) => return Ok((Host::Local(PathBuf::from(s)), Vec::new())),
            (None, None) => {}
        }
        if host_env {
            if let Some(h) = env("EXECD_HOST").filter(|h| !h.is_empty()) {
                return Host::parse(&h)
                    .map(|h| (h, Vec::new()))
                    .map_err(|f| Fail::usage(format!("$EXECD_HOST: {}", f.message)));
            }
        }
        if let Some(s) = env("EXECD_SOCKET").filter(|s| !s.is_empty()) {
            return Ok((Host::Local(PathBuf::from(s)), Vec::new()));
        }
        let all = candidates();
        let first = all
            .iter()
            .find(|p| is_socket(p))
            .or(all.first())
            .cloned()
            .unwrap_or_default();
        Ok((Host::Local(first), all))
    }

    /// How messages name the daemon: `execd at PATH` or `execd on ssh://HOST`.
    pub fn describe(&self) -> String {
        match self {
            Host::Local(p) => format!("execd at {}", p.display()),
            Host::Ssh(r) => format!("execd on {}", r.url()),
        }
    }
}

/// Whether `path` is a socket file (not following a symlink).
fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// The global options every subcommand sees.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Where the daemon is.
    pub host: Host,
    /// Where else it may be, in order, when nothing named it (section 1's places; the
    /// host is one of them): tried in turn when the host has no daemon.
    pub tried: Vec<PathBuf>,
    /// `--json`: results and errors as JSON.
    pub json: bool,
    /// `--verbose`: errors carry the daemon's code and data.
    pub verbose: bool,
}

/// An open connection before it becomes a `Client`: the stream, and what relays it.
pub struct Link {
    pub stream: UnixStream,
    pub transport: Box<dyn Transport>,
}

/// A local socket's transport: nothing relays it, but a daemon that accepts and closes
/// at once is one refusing the peer by its credentials, and says nothing itself.
struct LocalSocket(PathBuf);

impl Transport for LocalSocket {
    fn why_closed(&mut self, fresh: bool) -> Option<String> {
        // A daemon that stopped closes too; one that closes a new connection at once,
        // unasked, is refusing this peer.
        (fresh && refuses(&self.0)).then(|| refused_peer(&self.0))
    }
}

/// How long a probe waits for a daemon to close a new connection at once.
const PROBE: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the daemon at `socket` accepts a connection and closes it before a word. The
/// probe sends nothing, so a refusal reads as a plain end; a reset is a connection still
/// waiting to be accepted when the listener closed (a daemon stopping), not a refusal.
fn refuses(socket: &Path) -> bool {
    use std::io::Read;
    let Ok(mut s) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE));
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(0) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
}

/// What a person is told when the daemon accepted the connection and closed it before
/// answering anything: it runs, and refuses this uid (`SO_PEERCRED`).
fn refused_peer(socket: &Path) -> String {
    let uid = crate::sys::ids::current_uid();
    format!(
        "execd at {} closed the connection before answering: it runs, but does not let uid \
         {uid} in (it takes its own uid, root, and those --allow-uid and --allow-gid name); \
         its owner can allow it: execd --allow-uid {uid}, or --allow-gid GROUP",
        socket.display()
    )
}

impl Ctx {
    /// Opens a connection to the daemon, wherever it is: the one place that knows a
    /// local socket from an ssh link.
    pub fn open(&self) -> Res<Link> {
        match &self.host {
            Host::Local(path) => {
                let (path, stream) = self.local(path)?;
                served_by_us(&path, &stream)?;
                Ok(Link {
                    stream,
                    transport: Box::new(LocalSocket(path)),
                })
            }
            Host::Ssh(remote) => {
                let (stream, link) = remote.dial()?;
                Ok(Link {
                    stream,
                    transport: Box::new(link),
                })
            }
        }
    }

    /// A connection to the local socket `path`, else (when nothing named the daemon and
    /// there is none at `path`) to the first of the other places that has one.
    fn local(&self, path: &Path) -> Res<(PathBuf, UnixStream)> {
        let first = match UnixStream::connect(path) {
            Ok(s) => return Ok((path.to_path_buf(), s)),
            Err(e) => e,
        };
        let absent = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            )
        };
        if self.tried.len() < 2 || !absent(&first) {
            return Err(self.unreachable(path, &first));
        }
        for other in self.tried.iter().filter(|p| p.as_path() != path) {
            match UnixStream::connect(other) {
                Ok(s) => return Ok((other.clone(), s)),
                Err(e) if absent(&e) => {}
                Err(e) => return Err(self.unreachable(other, &e)),
            }
        }
        let tried: Vec<String> = self.tried.iter().map(|p| p.display().to_string()).collect();
        Err(Fail::new(format!(
            "no execd is listening (tried {}); start one with: execd",
            tried.join(", ")
        )))
    }

    /// A connection with no read timeout (execctl waits as long as its command runs).
    pub fn connect(&self) -> Res<Client> {
        let link = self.open()?;
        let mut c = Client::from_stream(link.stream)
            .map_err(Fail::from)?
            .with_transport(link.transport);
        c.timeout = None;
        Ok(c)
    }

    /// Why connecting to the local socket `path` failed, said so a person knows what to
    /// do: no daemon there (start one), or a daemon that does not let this user in (who
    /// may).
    pub fn unreachable(&self, path: &Path, e: &std::io::Error) -> Fail {
        let shown = path.display();
        let why = crate::wire::rpc::os_error_text(e);
        if e.kind() != std::io::ErrorKind::PermissionDenied {
            return Fail::new(format!(
                "cannot connect to execd at {shown} ({why}); start it with: execd --socket {shown}"
            ));
        }
        use std::os::unix::fs::MetadataExt;
        let uid = crate::sys::ids::current_uid();
        let owner = std::fs::metadata(path)
            .map(|m| {
                format!(
                    " (mode {:04o}, owner uid {}, group {})",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                )
            })
            .unwrap_or_default();
        Fail::new(format!(
            "execd's socket at {shown}{owner} does not let uid {uid} in ({why}); its owner can \
             allow it: execd --allow-uid {uid}, or --socket-mode 0660 with --socket-group GROUP"
        ))
    }
}

/// Refuses a daemon that runs as another uid than execctl's own or root (`SO_PEERCRED`
/// of the listening socket): it could be anyone's program reading the commands sent.
fn served_by_us(path: &Path, stream: &UnixStream) -> Res<()> {
    use std::os::fd::AsRawFd;
    let own = crate::sys::ids::current_uid();
    let server = crate::sys::ids::peer_cred(stream.as_raw_fd())
        .map_err(|e| Fail::new(format!("cannot tell who serves {}: {e}", path.display())))?
        .uid;
    if server == own || server == 0 {
        return Ok(());
    }
    Err(Fail::new(format!(
        "{} is served by uid {server}, not by uid {own} or root; execctl sends no command to          another user's daemon (name yours with --socket PATH)",
        path.display()
    )))
}

/// Which family a process belongs to, with the session its methods need.
#[derive(Debug, Clone)]
pub enum Target {
    Terminal {
        id: String,
        session: String,
    },
    Bash {
        id: String,
        session: String,
    },
    /// The shell of shell session `session` (`sh_N`, as `ps` lists it): what is done to
    /// it is done to its session (its running command, its terminal's output).
    Shell {
        id: String,
        session: String,
    },
}

impl Target {
    pub fn id(&self) -> &str {
        match self {
            Target::Terminal { id, .. } | Target::Bash { id, .. } | Target::Shell { id, .. } => id,
        }
    }

    /// Its session's id.
    pub fn session(&self) -> &str {
        match self {
            Target::Terminal { session, .. }
            | Target::Bash { session, .. }
            | Target::Shell { session, .. } => session,
        }
    }

    /// `terminal`, `bash` or `shell`.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Terminal { .. } => "terminal",
            Target::Bash { .. } => "bash",
            Target::Shell { .. } => "shell",
        }
    }
}

/// Every entry of a paged listing (`terminal/list` under `terminals`, `bash/commands`
/// under `commands`), following its cursor to the end. `filter` adds params (a session).
pub fn list_all(c: &mut Client, method: &str, key: &str, filter: Value) -> Res<Vec<Value>> {
    let next_field = if method == "terminal/list" {
        "nextCursor"
    } else {
        "next_cursor"
    };
    let mut all = Vec::new();
    let mut cursor: Option<Value> = None;
    loop {
        let mut params = filter.clone();
        params["limit"] = json!(4096);
        if let Some(c) = cursor.take() {
            params["cursor"] = c;
        }
        let page = c.call(method, params)?;
        all.extend(page[key].as_array().cloned().unwrap_or_default());
        match page.get(next_field) {
            Some(Value::String(next)) => cursor = Some(json!(next)),
            _ => break,
        }
    }
    Ok(all)
}

/// Every terminal of the caller.
pub fn terminals(c: &mut Client) -> Res<Vec<Value>> {
    list_all(c, "terminal/list", "terminals", json!({}))
}

/// Every bash command of the caller.
pub fn commands(c: &mut Client) -> Res<Vec<Value>> {
    list_all(c, "bash/commands", "commands", json!({}))
}

/// A process as a listing shows it, with the family it came from.
pub fn locate_in(terms: &[Value], cmds: &[Value], id: &str) -> Option<(Target, Value)> {
    if let Some(t) = terms.iter().find(|t| t["terminalId"] == id) {
        let target = Target::Terminal {
            id: id.to_string(),
            session: t["sessionId"].as_str().unwrap_or_default().to_string(),
        };
        return Some((target, t.clone()));
    }
    let b = cmds.iter().find(|b| b["command_id"] == id)?;
    let target = Target::Bash {
        id: id.to_string(),
        session: b["session_id"].as_str().unwrap_or_default().to_string(),
    };
    Some((target, b.clone()))
}

/// The shell session whose shell is `id` (as `shell/sessions` lists it, `process_id`).
pub fn locate_shell(c: &mut Client, id: &str) -> Res<Option<(Target, Value)>> {
    let shells = c.call("shell/sessions", json!({}))?;
    let found = shells["sessions"]
        .as_object()
        .and_then(|m| m.iter().find(|(_, s)| s["process_id"] == id));
    Ok(found.map(|(session, s)| {
        let target = Target::Shell {
            id: id.to_string(),
            session: session.clone(),
        };
        (target, s.clone())
    }))
}

/// Finds the process `id`: its family, session and listing entry. Every id `ps` shows
/// is found: terminals, bash commands, and shell sessions' shells.
pub fn locate(c: &mut Client, id: &str) -> Res<(Target, Value)> {
    // Ids name their family (`term_`, `cmd_`, `sh_`); list only that one when they do.
    if id.starts_with("sh_") {
        return locate_shell(c, id)?.ok_or_else(|| not_found(id));
    }
    let terms = if id.starts_with("cmd_") {
        Vec::new()
    } else {
        terminals(c)?
    };
    let cmds = if id.starts_with("term_") {
        Vec::new()
    } else {
        commands(c)?
    };
    match locate_in(&terms, &cmds, id) {
        Some(found) => Ok(found),
        None => locate_shell(c, id)?.ok_or_else(|| not_found(id)),
    }
}

/// The failure for an id that names nothing of the caller's.
pub fn not_found(id: &str) -> Fail {
    Fail::new(format!(
        "no process {id:?} of yours; list them with: execctl ps"
    ))
}

/// A daemon error about `id`, in one sentence.
pub fn about(id: &str) -> impl Fn(crate::client::CallError) -> Fail + '_ {
    move |e| daemon_error(e, Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_is_picked_flags_first_then_the_environment() {
        let env = |k: &str| match k {
            "EXECD_HOST" => Some("ssh://box/run/execd.sock".to_string()),
            _ => None,
        };
        let none = |_: &str| None;
        let places = || {
            vec![
                PathBuf::from("/nowhere/a.sock"),
                PathBuf::from("/nowhere/b.sock"),
            ]
        };
        let resolve = |h, s, env: &dyn Fn(&str) -> Option<String>, host_env| {
            Host::resolve(h, s, env, host_env, &places)
        };
        let box_host = Host::Ssh(Remote {
            user: None,
            host: "box".into(),
            port: None,
            socket: Some("/run/execd.sock".into()),
        });
        assert_eq!(
            resolve(None, None, &env, true).ok(),
            Some((box_host, vec![]))
        );
        assert_eq!(
            resolve(None, Some("/s"), &env, true).ok(),
            Some((Host::Local("/s".into()), vec![])),
            "--socket beats EXECD_HOST"
        );
        assert_eq!(
            resolve(Some("unix:///u"), None, &env, true).ok(),
            Some((Host::Local("/u".into()), vec![])),
            "-H beats EXECD_HOST"
        );
        // dial-stdio never follows EXECD_HOST: it is what ssh runs on the daemon's host.
        assert!(matches!(
            resolve(None, None, &env, false),
            Ok((Host::Local(_), _))
        ));
        // Named nowhere: the first place, with every place to try.
        assert_eq!(
            resolve(None, None, &none, true).ok(),
            Some((Host::Local("/nowhere/a.sock".into()), places()))
        );
        let sock = |k: &str| (k == "EXECD_SOCKET").then(|| "/e.sock".to_string());
        assert_eq!(
            resolve(None, None, &sock, true).ok(),
            Some((Host::Local("/e.sock".into()), vec![]))
        );
        assert!(resolve(Some("ssh://box"), Some("/s"), &none, true).is_err());
        for bad in ["tcp://box:1", "unix://relative", "box", "ssh://"] {
            assert!(Host::parse(bad).is_err(), "{bad}");
        }
        let empty = |k: &str| (k == "EXECD_HOST").then(String::new);
        assert!(matches!(
            resolve(None, None, &empty, true),
            Ok((Host::Local(_), _))
        ));
    }
}
