//! The listening sockets: the Unix socket (bound here, or passed by systemd) and the HTTP
//! front end's TCP listeners (`--http-listen`), with the checks they need at start, and
//! `accept` on each.
//!
//! Invariants:
//! - A live daemon's socket is never replaced, nor any file that is not a socket; a stale
//!   socket file is.
//! - TCP requests carry no credentials: they run as `--http-run-as` (required for a root
//!   daemon) and prove themselves with the bearer token, which is never logged.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Interest, Poll, Token};

use crate::config::Config;
use crate::core::log::Log;
use crate::sys::ids::Identity;
use crate::sys::ids::PeerCred;
use crate::sys::systemd;
use crate::wire::http;
use crate::wire::state::{AuthImage, Bytes, ListenersImage, PeerImage};
use std::os::fd::AsRawFd;

/// What one `accept` found.
pub enum Accepted {
    /// A peer on the Unix socket, with its credentials.
    Unix(UnixStream, PeerCred, Vec<u32>),
    /// A peer on an HTTP listener.
    Http(TcpStream),
    /// Nothing waits.
    Nothing,
    /// A connection without readable credentials (refused, told nothing).
    NoCredentials(UnixStream, io::Error),
    /// `accept` failed (out of descriptors or memory): pause before trying again.
    Failed(io::Error),
}

/// Every listening socket.
pub struct Listeners {
    unix: Option<UnixListener>,
    unix_token: Token,
    /// The socket file bound (none when systemd passed the socket).
    pub socket_file: Option<PathBuf>,
    http: HashMap<Token, TcpListener>,
    /// What HTTP requests on TCP must carry.
    pub http_auth: http::Auth,
    /// Whom HTTP requests on TCP run as and are owned by.
    pub http_peer: PeerCred,
    /// The supplementary groups they run and are judged with.
    pub http_groups: Vec<u32>,
}

impl Listeners {
    /// Opens the HTTP listeners, then the Unix socket (last, so that a refusal leaves no
    /// socket file behind); registers them all. `cfg.socket` becomes the path systemd
    /// bound, when it passed the socket.
    pub fn open(
        cfg: &mut Config,
        poll: &Poll,
        unix_token: Token,
        next: &mut usize,
        log: &mut Log,
    ) -> io::Result<Listeners> {
        let front = HttpFront::open(cfg, poll, next, log)?;
        let activated = systemd::listener(
            std::env::var_os("LISTEN_PID"),
            std::env::var_os("LISTEN_FDS"),
        )?;
        let (mut listener, socket_file) = match activated {
            Some(std_listener) => {
                std_listener.set_nonblocking(true)?;
                // Report the socket systemd bound, not the path flags would have chosen.
                if let Some(path) = std_listener.local_addr()?.as_pathname() {
                    cfg.socket = path.to_path_buf();
                }
                (UnixListener::from_std(std_listener), None)
            }
            None => (bind(cfg)?, Some(cfg.socket.clone())),
        };
        if let Err(e) = poll
            .registry()
            .register(&mut listener, unix_token, Interest::READABLE)
        {
            if let Some(path) = &socket_file {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        if socket_file.is_some() {
            for warning in access_warnings(cfg) {
                log.warn(format_args!("warning: {warning}"));
            }
        }
        Ok(Listeners {
            unix: Some(listener),
            unix_token,
            socket_file,
            http: front.listeners,
            http_auth: front.auth,
            http_peer: front.peer,
            http_groups: front.groups,
        })
    }

    /// The path the Unix socket listens at, as the socket says (systemd's, when it passed
    /// the socket).
    pub fn bound_path(&self) -> Option<PathBuf> {
        let addr = self.unix.as_ref()?.local_addr().ok()?;
        addr.as_pathname().map(std::path::Path::to_path_buf)
    }

    /// Whether `token` is one of the listeners.
    pub fn owns(&self, token: Token) -> bool {
        token == self.unix_token || self.http.contains_key(&token)
    }

    /// Every listener's token.
    pub fn tokens(&self) -> Vec<Token> {
        std::iter::once(self.unix_token)
            .chain(self.http.keys().copied())
            .collect()
    }

    /// Accepts one connection waiting on listener `token`.
    pub fn accept(&self, token: Token) -> Accepted {
        loop {
            let result = if token == self.unix_token {
                let Some(l) = &self.unix else {
                    return Accepted::Nothing;
                };
                l.accept().map(|(s, _)| {
                    use std::os::fd::AsRawFd;
                    match crate::sys::ids::peer_cred(s.as_raw_fd()) {
                        // Without its groups a peer is judged and run with none.
                        Ok(peer) => {
                            let groups =
                                crate::sys::ids::peer_groups(s.as_raw_fd()).unwrap_or_default();
                            Accepted::Unix(s, peer, groups)
                        }
                        Err(e) => Accepted::NoCredentials(s, e),
                    }
                })
            } else {
                let Some(l) = self.http.get(&token) else {
                    return Accepted::Nothing;
                };
                l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Accepted::Http(s)
                })
            };
            return match result {
                Ok(a) => a,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Accepted::Nothing,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Accepted::Failed(e),
            };
        }
    }

    /// Stops listening (shutdown) and removes the socket file.
    pub fn close(&mut self, poll: &Poll) {
        if let Some(mut l) = self.unix.take() {
            let _ = poll.registry().deregister(&mut l);
        }
        for (_, mut l) in self.http.drain() {
            let _ = poll.registry().deregister(&mut l);
        }
        self.remove_socket_file();
    }

    pub fn remove_socket_file(&mut self) {
        if let Some(path) = self.socket_file.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Listeners {
    /// What an upgrade in place carries: the sockets by number with their tokens, the
    /// socket file (kept: the same socket goes on listening), and who TCP requests are.
    pub fn carry(&self) -> ListenersImage {
        let mut http: Vec<(usize, i32)> = self
            .http
            .iter()
            .map(|(t, l)| (t.0, l.as_raw_fd()))
            .collect();
        http.sort_unstable();
        ListenersImage {
            unix: self
                .unix
                .as_ref()
                .map(|l| (self.unix_token.0, l.as_raw_fd())),
            socket_file: self
                .socket_file
                .as_ref()
                .map(|p| Bytes::of_os(p.as_os_str())),
            http,
            http_auth: match &self.http_auth {
                http::Auth::Peer => AuthImage::Peer,
                http::Auth::Open => AuthImage::Open,
                http::Auth::Token(t) => AuthImage::Token(Bytes(t.to_vec())),
            },
            http_peer: PeerImage {
                uid: self.http_peer.uid,
                gid: self.http_peer.gid,
                pid: self.http_peer.pid,
            },
            http_groups: self.http_groups.clone(),
        }
    }

    /// The listeners `carry` described, their sockets from `take`, registered under their
    /// tokens: connections that queued up during the swap are accepted at once.
    pub fn resume(
        img: &ListenersImage,
        poll: &Poll,
        take: &mut dyn FnMut(std::os::fd::RawFd) -> Result<std::os::fd::OwnedFd, String>,
    ) -> Result<Listeners, String> {
        let registering = |e: io::Error| format!("registering a listener: {e}");
        let mut unix = None;
        let mut unix_token = Token(usize::MAX);
        if let Some((token, fd)) = img.unix {
            let mut l = UnixListener::from_std(take(fd)?.into());
            poll.registry()
                .register(&mut l, Token(token), Interest::READABLE)
                .map_err(registering)?;
            unix = Some(l);
            unix_token = Token(token);
        }
        let mut http = HashMap::new();
        for (token, fd) in &img.http {
            let mut l = TcpListener::from_std(take(*fd)?.into());
            poll.registry()
                .register(&mut l, Token(*token), Interest::READABLE)
                .map_err(registering)?;
            http.insert(Token(*token), l);
        }
        Ok(Listeners {
            unix,
            unix_token,
            socket_file: img.socket_file.as_ref().map(|b| PathBuf::from(b.to_os())),
            http,
            http_auth: match &img.http_auth {
                AuthImage::Peer => http::Auth::Peer,
                AuthImage::Open => http::Auth::Open,
                AuthImage::Token(t) => http::Auth::Token(t.0.clone().into()),
            },
            http_peer: PeerCred {
                uid: img.http_peer.uid,
                gid: img.http_peer.gid,
                pid: img.http_peer.pid,
            },
            http_groups: img.http_groups.clone(),
        })
    }
}

/// The HTTP front end's TCP side, set up at start (section 11).
struct HttpFront {
    listeners: HashMap<Token, TcpListener>,
    auth: http::Auth,
    /// Whom TCP requests run as and are owned by.
    peer: PeerCred,
    /// Its supplementary groups: its user entry's, looked up once at start.
    groups: Vec<u32>,
}

impl HttpFront {
    /// Binds every `--http-listen` address, reads the token (refusing a file that others
    /// may read, or an empty one), and resolves `--http-run-as` (required for a root
    /// daemon: requests over TCP carry no credentials of their own). The token never
    /// reaches a log line.
    fn open(cfg: &Config, poll: &Poll, next: &mut usize, log: &mut Log) -> io::Result<HttpFront> {
        let me = crate::sys::ids::current_uid();
        let refuse = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
        let (peer, groups) = match (&cfg.http_run_as, me) {
            (Some(user), _) => {
                let id = Identity::of_user(user)?;
                // Only root can run commands as someone else; naming oneself is fine.
                if me != 0 && id.uid != me {
                    return Err(refuse(format!(
                        "--http-run-as {user} needs a daemon running as root"
                    )));
                }
                let peer = PeerCred {
                    pid: 0,
                    uid: id.uid,
                    gid: id.gid,
                };
                (peer, id.groups)
            }
            (None, 0) if !cfg.http_listen.is_empty() => {
                return Err(refuse(
                    "--http-listen on a root daemon needs --http-run-as USER: requests over \
                     TCP carry no credentials to run as"
                        .into(),
                ))
            }
            (None, _) => {
                let peer = PeerCred {
                    pid: 0,
                    uid: me,
                    gid: crate::sys::ids::current_gid(),
                };
                (peer, crate::sys::ids::current_groups())
            }
        };
        let auth = match (&cfg.http_token_file, cfg.http_no_auth) {
            (Some(path), _) => http::Auth::Token(read_token(path)?.into()),
            (None, true) => http::Auth::Open,
            (None, false) => http::Auth::Peer,
        };
        let mut listeners = HashMap::new();
        for addr in &cfg.http_listen {
            let std = std::net::TcpListener::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("--http-listen {addr}: {e}")))?;
            std.set_nonblocking(true)?;
            let mut l = TcpListener::from_std(std);
            let token = Token(*next);
            *next += 1;
            poll.registry()
                .register(&mut l, token, Interest::READABLE)?;
            listeners.insert(token, l);
            log.line(format_args!(
                "HTTP on {addr} ({}), requests run as uid {}",
                match &auth {
                    http::Auth::Token(_) => "bearer token required",
                    _ => "no authentication",
                },
                peer.uid
            ));
            if matches!(auth, http::Auth::Open) {
                log.warn(format_args!(
                    "warning: --http-no-auth: any local process that reaches {addr} runs \
                     commands as uid {}",
                    peer.uid
                ));
            }
        }
        Ok(HttpFront {
            listeners,
            auth,
            peer,
            groups,
        })
    }
}

/// The bearer token in `path`: the file must exist, hold a token, and not be readable by
/// others.
fn read_token(path: &std::path::Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let what = |m: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--http-token-file {}: {m}", path.display()),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| what(&e.to_string()))?;
    if meta.mode() & 0o004 != 0 {
        return Err(what("readable by others; chmod o-r it"));
    }
    let text = std::fs::read(path).map_err(|e| what(&e.to_string()))?;
    let token: Vec<u8> = text.trim_ascii().to_vec();
    if token.is_empty() {
        return Err(what("empty"));
    }
    Ok(token)
}

/// Makes `/tmp/execd-UID` (mode 0700) if it is not there, and refuses it unless it is a
/// directory (not a symlink) owned by `uid` that no one else may write: anyone may make
/// that name in /tmp first, and a socket in their directory is theirs to replace.
fn private_dir(dir: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let why = if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != uid {
        Some(format!("is owned by uid {}", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "may be written by others (mode {:04o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}; execd keeps its socket only in a directory of its own: remove it, or give --socket PATH",
                dir.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Binds the socket as section 1 says: refuse beside a live daemon, replace a stale file.
fn bind(cfg: &Config) -> io::Result<UnixListener> {
    let path = &cfg.socket;
    let uid = crate::sys::ids::current_uid();
    if let Some(dir) = path
        .parent()
        .filter(|d| *d == crate::config::private_socket_dir(uid))
    {
        private_dir(dir, uid)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another execd is listening on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ));
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode))?;
    if let Some(gid) = cfg.socket_group {
        crate::sys::host::chown_group(path, gid)?;
    }
    Ok(listener)
}

/// What keeps a peer that `--allow-uid`/`--allow-gid` admits from connecting at all: the
/// socket file's mode (and group), or a directory on its path it may not search. The
/// daemon checks credentials only of peers that got through the file system.
fn access_warnings(cfg: &Config) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut warnings = Vec::new();
    let mode = cfg.socket_mode;
    for uid in &cfg.allow_uids {
        if mode & 0o002 == 0 && (cfg.socket_group.is_none() || mode & 0o020 == 0) {
            warnings.push(format!(
                "--allow-uid {uid}: the socket's mode {mode:04o} lets only its owner{} connect; \
                 widen it with --socket-mode 0666, or 0660 with a --socket-group uid {uid} is in",
                if mode & 0o020 != 0 { " and group" } else { "" }
            ));
        }
    }
    for gid in &cfg.allow_gids {
        let group_ok = cfg.socket_group == Some(*gid) && mode & 0o020 != 0;
        if !group_ok && mode & 0o002 == 0 {
            warnings.push(format!(
                "--allow-gid {gid}: the socket's mode {mode:04o} and group keep group {gid} out; \
                 use --socket-group {gid} --socket-mode 0660"
            ));
        }
    }
    if !cfg.allow_uids.is_empty() || !cfg.allow_gids.is_empty() {
        let mut dir = cfg.socket.parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(meta) = std::fs::metadata(d) {
                if meta.mode() & 0o001 == 0 {
                    warnings.push(format!(
                        "{} (mode {:04o}) is not searchable by other users: peers admitted by \
                         --allow-uid/--allow-gid cannot reach the socket inside it",
                        d.display(),
                        meta.mode() & 0o7777
                    ));
                    break;
                }
            }
            dir = d.parent();
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

    /// The new image's `take`: a duplicate of each descriptor named, noting which became
    /// which.
    fn taking(map: &mut Vec<(RawFd, RawFd)>) -> impl FnMut(RawFd) -> Result<OwnedFd, String> + '_ {
        move |fd| {
            // SAFETY: every descriptor an image names here is one the test holds open.
            let b = unsafe { BorrowedFd::borrow_raw(fd) };
            let dup = b.try_clone_to_owned().map_err(|e| e.to_string())?;
            map.push((fd, dup.as_raw_fd()));
            Ok(dup)
        }
    }

    /// The listeners an upgrade carries come back the same: both kinds of socket under
    /// their tokens, the socket file, and who TCP requests run as with which token; the
    /// state document reads back as written.
    #[test]
    fn listeners_carried_by_an_upgrade_come_back_the_same() {
        let dir = std::env::temp_dir().join(format!("execd-listen-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let unix = std::os::unix::net::UnixListener::bind(&dir).expect("bind");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
        let img = ListenersImage {
            unix: Some((3, unix.as_raw_fd())),
            socket_file: Some(Bytes::of_os(dir.as_os_str())),
            http: vec![(9, tcp.as_raw_fd())],
            http_auth: AuthImage::Token(Bytes(b"s3cret".to_vec())),
            http_peer: PeerImage {
                uid: 65534,
                gid: 65534,
                pid: 0,
            },
            http_groups: vec![65534, 27],
        };
        let json = serde_json::to_vec(&img).expect("encode");
        let read: ListenersImage = serde_json::from_slice(&json).expect("decode");
        assert_eq!(read, img);
        let poll = Poll::new().expect("poll");
        let mut map = Vec::new();
        let back = Listeners::resume(&read, &poll, &mut taking(&mut map)).expect("resume");
        assert_eq!(back.tokens().len(), 2);
        assert!(back.owns(Token(3)) && back.owns(Token(9)));
        let mut again = back.carry();
        // Its sockets are the duplicates; everything else is what was carried.
        let old = |fd: RawFd| map.iter().find(|(_, d)| *d == fd).map_or(-1, |(o, _)| *o);
        again.unix = again.unix.map(|(t, fd)| (t, old(fd)));
        again.http = again.http.iter().map(|&(t, fd)| (t, old(fd))).collect();
        assert_eq!(again, img, "carried again, it is the same");
        drop(back);
        let _ = std::fs::remove_file(&dir);
    }
}
