//! `execctl dial-stdio`: standard input to the daemon's socket, the socket to standard
//! output, byte for byte, as it comes. It is the transport `execctl -H ssh://HOST` (and
//! any JSON-RPC or HTTP client) uses to reach a daemon on another host through the user's
//! own ssh, as `docker system dial-stdio` is for docker.
//!
//! Each direction runs on its own thread with blocking I/O and ends at its source's end:
//! stdin's end half-closes the socket for writing (the daemon still answers what it got),
//! the socket's end closes standard output. execctl exits once both have ended.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;

use super::args::Args;
use super::connect::Ctx;
use super::errors::{Fail, Res};

/// Bytes copied per read: what one request or one event usually is, and more.
const CHUNK: usize = 64 << 10;

/// Copies `from` to `to` until `from` ends; returns the error that ended it, if any.
fn copy(mut from: impl Read, mut to: impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return to.flush(),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

/// `execctl dial-stdio`.
pub fn dial_stdio(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        return Err(Fail::usage(format!(
            "dial-stdio takes no operand, got {a:?}"
        )));
    }
    let socket = UnixStream::connect(&ctx.socket).map_err(|e| ctx.unreachable(&e))?;
    let to_daemon = socket.try_clone()?;
    let upstream = std::thread::spawn(move || {
        let done = copy(io::stdin().lock(), &to_daemon);
        // The daemon answers what it was sent, then sees the end.
        let _ = to_daemon.shutdown(Shutdown::Write);
        done
    });
    let down = copy(&socket, io::stdout().lock());
    // The daemon closed (or stdout did): stop reading stdin for it too.
    let _ = socket.shutdown(Shutdown::Both);
    let up = if down.is_ok() {
        upstream
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the stdin thread failed")))
    } else {
        Ok(())
    };
    match (down, up) {
        (Ok(()), Ok(())) => Ok(0),
        (Err(e), _) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        (Err(e), _) | (_, Err(e)) => Err(Fail::new(format!("dial-stdio: {e}"))),
    }
}
