//! `execctl dial-stdio`: standard input to the daemon's socket, the socket to standard
//! output, byte for byte, as it comes. It is the transport `execctl -H ssh://HOST` (and
//! any JSON-RPC or HTTP client) uses to reach a daemon on another host through the user's
//! own ssh, as `docker system dial-stdio` is for docker.
//!
//! Each direction runs on its own thread with blocking I/O and ends at its source's end.
//! stdin's end half-closes the socket for writing: the daemon still answers what it got,
//! then closes. The socket's end is the end of both directions (nothing can reach the
//! daemon any more), so execctl exits then without waiting for its stdin, which a
//! terminal or an idle ssh session may hold open for ever; docker's dial-stdio does the
//! same.
//!
//! A daemon that closes the connection before a single byte while stdin is still open is
//! refusing this peer (`SO_PEERCRED`): dial-stdio says so on stderr and exits 125, so a
//! client on another host learns it too. It honours `-H` (a relay through ssh to a third
//! host) but never `EXECD_HOST` (see `connect`).

use std::io::{self, Read, Write};
use std::net::Shutdown;

use super::args::Args;
use super::connect::{Ctx, Link};
use super::errors::{Fail, Res};

/// Bytes copied per read: what one request or one event usually is, and more.
const CHUNK: usize = 64 << 10;

/// Copies `from` to `to` until `from` ends; returns the bytes copied and the error that
/// ended it, if any.
fn copy(mut from: impl Read, mut to: impl Write) -> (u64, io::Result<()>) {
    let mut buf = vec![0u8; CHUNK];
    let mut moved = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return (moved, to.flush()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return (moved, Err(e)),
        };
        if let Err(e) = to.write_all(&buf[..n]).and_then(|()| to.flush()) {
            return (moved, Err(e));
        }
        moved += n as u64;
    }
}

/// `execctl dial-stdio`.
pub fn dial_stdio(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        return Err(Fail::usage(format!(
            "dial-stdio takes no operand, got {a:?}"
        )));
    }
    let Link {
        stream,
        mut transport,
    } = ctx.open()?;
    let to_daemon = stream.try_clone()?;
    let upstream = std::thread::spawn(move || {
        let (_, done) = copy(io::stdin().lock(), &to_daemon);
        // The daemon answers what it was sent, then sees the end.
        let _ = to_daemon.shutdown(Shutdown::Write);
        done
    });
    let (received, down) = copy(&stream, io::stdout().lock());
    let _ = stream.shutdown(Shutdown::Both);
    let stdin_done = upstream.is_finished();
    let up = if stdin_done {
        upstream
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the stdin thread failed")))
    } else {
        Ok(())
    };
    // A daemon refusing the peer closes at once; if what the client sent had already
    // reached it, the close shows here as a reset rather than an end.
    let ended = match &down {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
    };
    // What was sent may have met the close first (a write that found it gone).
    let cut = |r: &io::Result<()>| {
        r.as_ref().is_err_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            )
        })
    };
    if ended && received == 0 && (!stdin_done || cut(&up)) {
        if let Some(why) = transport.why_closed(true) {
            return Err(Fail::new(why));
        }
    }
    drop(transport);
    match (down, up) {
        (Ok(()), Ok(())) => Ok(0),
        (Err(e), _) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        (Ok(()), up) if cut(&up) => Ok(0),
        (Err(e), _) | (_, Err(e)) => Err(Fail::new(format!("dial-stdio: {e}"))),
    }
}
