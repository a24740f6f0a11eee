//! Living under systemd without libsystemd: the socket it may pass (`LISTEN_PID`,
//! `LISTEN_FDS`), readiness and watchdog notifications (`NOTIFY_SOCKET`, one datagram
//! each), and the variables of that protocol, which no command may inherit.

use std::ffi::OsString;
use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::time::{Duration, Instant};

/// Variables systemd sets for the daemon alone: a command that saw them could notify or
/// take sockets in the daemon's name.
pub const PRIVATE_VARS: [&str; 6] = [
    "NOTIFY_SOCKET",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
];

/// The first descriptor systemd passes.
const LISTEN_FDS_START: i32 = 3;

/// The listening socket systemd passed, when `LISTEN_PID` is this process and
/// `LISTEN_FDS` is 1. Fd 3 is checked to be a listening Unix stream socket before it is
/// trusted: anything else is an error, not a silent fallback to a path.
pub fn listener(
    listen_pid: Option<OsString>,
    listen_fds: Option<OsString>,
) -> io::Result<Option<UnixListener>> {
    let parse = |v: Option<OsString>| v.and_then(|v| v.to_str()?.trim().parse::<i64>().ok());
    let (Some(pid), Some(fds)) = (parse(listen_pid), parse(listen_fds)) else {
        return Ok(None);
    };
    if pid != i64::from(std::process::id()) {
        return Ok(None);
    }
    if fds != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("systemd passed {fds} sockets (LISTEN_FDS); execd takes exactly one"),
        ));
    }
    crate::sys::socket::check_listening_unix_socket(LISTEN_FDS_START).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("fd 3 from systemd is not a listening Unix stream socket: {e}"),
        )
    })?;
    Ok(Some(crate::sys::socket::take_listener(LISTEN_FDS_START)))
}

/// The most often systemd hears a new `STATUS=`.
pub const STATUS_EVERY: Duration = Duration::from_secs(1);

/// `sd_notify` without libsystemd: one datagram per message to `NOTIFY_SOCKET`.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// Half of `WATCHDOG_USEC`, when the watchdog is on for this process.
    pub watchdog: Option<Duration>,
    /// The last counts sent in `STATUS=`, and when.
    status_sent: Option<((usize, usize), Instant)>,
}

/// What `status` did.
#[derive(Debug, PartialEq)]
pub enum Status {
    /// Sent, or nothing changed.
    Done,
    /// Changed, but one was sent less than `STATUS_EVERY` ago: ask again at this time.
    Later(Instant),
}

impl Notifier {
    /// A notifier when `NOTIFY_SOCKET` names a path or an abstract (`@`) socket.
    pub fn from_env(
        notify_socket: Option<OsString>,
        watchdog_usec: Option<OsString>,
        watchdog_pid: Option<OsString>,
    ) -> io::Result<Option<Notifier>> {
        let Some(target) = notify_socket.filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let addr = socket_addr(&target)?;
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        let ours = watchdog_pid
            .and_then(|p| p.to_str()?.trim().parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = watchdog_usec
            .and_then(|v| v.to_str()?.trim().parse::<u64>().ok())
            .filter(|&us| us > 0 && ours)
            // Half the interval, as sd_watchdog_enabled(3) advises; never zero, which
            // would re-arm a timer that is always due.
            .map(|us| Duration::from_micros(us / 2).max(Duration::from_millis(1)));
        Ok(Some(Notifier {
            sock,
            addr,
            watchdog,
            status_sent: None,
        }))
    }

    /// `READY=1` with the first `STATUS=` in the same datagram; the status counts as sent,
    /// so the next one waits for a change and for `STATUS_EVERY`.
    pub fn ready(&mut self, counts: (usize, usize), text: &str, now: Instant) {
        self.send(&format!("READY=1\nSTATUS={text}"));
        self.status_sent = Some((counts, now));
    }

    /// Sends `STATUS=` with `text` when the `counts` it describes changed, at most once
    /// per `STATUS_EVERY` (the text is made only then: this is asked every turn).
    pub fn status(
        &mut self,
        counts: (usize, usize),
        text: impl FnOnce() -> String,
        now: Instant,
    ) -> Status {
        match self.status_sent {
            Some((last, _)) if last == counts => Status::Done,
            Some((_, at)) if now < at + STATUS_EVERY => Status::Later(at + STATUS_EVERY),
            _ => {
                self.send(&format!("STATUS={}", text()));
                self.status_sent = Some((counts, now));
                Status::Done
            }
        }
    }

    /// Sends one notification. A full or absent receiver loses it: never worth blocking.
    pub fn send(&self, msg: &str) {
        let _ = self.sock.send_to_addr(msg.as_bytes(), &self.addr);
    }
}

fn socket_addr(target: &OsString) -> io::Result<SocketAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = target.as_bytes();
    match bytes.split_first() {
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        Some((b'/', _)) => SocketAddr::from_pathname(std::path::Path::new(target)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET {target:?} is neither a path nor an @name"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("execd-sd-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::from_env(Some(path.clone().into()), Some("4000000".into()), None)
            .unwrap()
            .unwrap();
        assert_eq!(n.watchdog, Some(Duration::from_secs(2)));
        n.send("READY=1");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        let _ = std::fs::remove_dir_all(&dir);

        let name = format!("execd-sd-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let n = Notifier::from_env(Some(format!("@{name}").into()), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(n.watchdog, None);
        n.send("STOPPING=1");
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
    }

    /// The status READY carries is the first: the same counts are not sent again, and
    /// changed ones wait for their second.
    #[test]
    fn ready_carries_the_first_status() {
        let name = format!("execd-sd-ready-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut n = Notifier::from_env(Some(format!("@{name}").into()), None, None)
            .unwrap()
            .unwrap();
        let t0 = Instant::now();
        n.ready((0, 0), "0 client(s)", t0);
        assert_eq!(n.status((0, 0), || "0 client(s)".into(), t0), Status::Done);
        assert_eq!(
            n.status(
                (1, 0),
                || "1 client(s)".into(),
                t0 + Duration::from_millis(10)
            ),
            Status::Later(t0 + STATUS_EVERY)
        );
        let mut buf = [0u8; 128];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=0 client(s)");
        assert!(rx.recv(&mut buf).is_err(), "nothing else was sent");
        assert_eq!(
            n.status((1, 0), || "1 client(s)".into(), t0 + STATUS_EVERY),
            Status::Done
        );
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STATUS=1 client(s)");
    }

    #[test]
    fn the_watchdog_pings_at_half_its_interval_and_never_at_zero() {
        let every = |usec: &str| {
            Notifier::from_env(Some("@x".into()), Some(usec.into()), None)
                .unwrap()
                .unwrap()
                .watchdog
        };
        assert_eq!(every("10000000"), Some(Duration::from_secs(5)));
        assert_eq!(every("1"), Some(Duration::from_millis(1)));
        assert_eq!(every("0"), None);
    }

    #[test]
    fn the_watchdog_is_for_the_named_pid_only() {
        let n = Notifier::from_env(
            Some("@x".into()),
            Some("1000".into()),
            Some("1".into()), // not us
        )
        .unwrap()
        .unwrap();
        assert_eq!(n.watchdog, None);
        assert!(Notifier::from_env(None, None, None).unwrap().is_none());
        assert!(Notifier::from_env(Some("relative".into()), None, None).is_err());
    }

    #[test]
    fn a_listener_is_taken_only_for_this_pid_and_one_socket() {
        assert!(listener(None, None).unwrap().is_none());
        assert!(listener(Some("1".into()), Some("1".into()))
            .unwrap()
            .is_none());
        let me = std::process::id().to_string();
        assert!(listener(Some(me.into()), Some("2".into())).is_err());
    }
}
