//! One client connection: a line reader, a capped outgoing buffer, and the interest that
//! follows from them.
//!
//! Invariants:
//! - Reading stops (back-pressure) while the outgoing buffer is past its cap: a client that
//!   does not read its answers cannot make the daemon buffer answers without bound. A batch
//!   is one read, so the server also refuses batch elements past the cap.
//! - Responses are always queued; output events are queued only while under the cap (the
//!   caller asks `has_room`), so responses still go through for a slow subscriber.
//! - WRITABLE interest is registered only while bytes are pending.

use std::io::{self, Read, Write};

use mio::net::UnixStream;
use mio::{Interest, Registry, Token};

use crate::process::PeerCred;
use crate::rpc::{Frame, Framer};

/// What a read pass found.
#[derive(Debug, PartialEq)]
pub enum Fill {
    /// Read everything available.
    Drained,
    /// Stopped with data still available (framer full or buffer past its cap).
    More,
    /// The peer closed its sending side.
    Eof,
}

/// One client.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    pub token: Token,
    pub peer: PeerCred,
    framer: Framer,
    max_message: usize,
    out: Vec<u8>,
    out_pos: usize,
    cap: usize,
    writable_registered: bool,
    /// A readable event was left unserviced (back-pressure); read again once drained.
    pub read_pending: bool,
    /// The peer will send nothing more.
    pub eof: bool,
    /// A write failed (the peer is gone): close once the loop gets to it.
    pub broken: bool,
    /// Processes this connection subscribes to (see `events`).
    pub subs: Vec<crate::table::Key>,
    /// Requests of this connection still being worked on (parked, or open batches).
    pub waiting: usize,
    /// Who this peer's commands run as, when that is not the daemon's own user.
    pub run_as: Option<crate::process::Identity>,
}

impl Conn {
    pub fn new(
        stream: UnixStream,
        token: Token,
        peer: PeerCred,
        max_message: usize,
        cap: usize,
    ) -> Conn {
        Conn {
            stream,
            token,
            peer,
            framer: Framer::new(max_message),
            max_message,
            out: Vec::new(),
            out_pos: 0,
            cap,
            writable_registered: false,
            read_pending: false,
            eof: false,
            broken: false,
            subs: Vec::new(),
            waiting: 0,
            run_as: None,
        }
    }

    pub fn register(&mut self, registry: &Registry) -> io::Result<()> {
        registry.register(&mut self.stream, self.token, Interest::READABLE)
    }

    pub fn deregister(&mut self, registry: &Registry) {
        let _ = registry.deregister(&mut self.stream);
    }

    /// Bytes queued and not yet written.
    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Whether the outgoing buffer is under its cap (room for output events).
    pub fn has_room(&self) -> bool {
        self.pending_out() < self.cap
    }

    /// Whether the outgoing buffer drained below half its cap: lagging subscribers resume
    /// only then, so a slow reader gets one `Gap` per burst rather than one per write.
    pub fn below_half(&self) -> bool {
        self.pending_out() < self.cap / 2
    }

    /// Reads what is available into the framer, stopping early when a full message and a
    /// read's worth are buffered so one client cannot make the daemon hold more.
    pub fn fill(&mut self, scratch: &mut [u8]) -> Fill {
        loop {
            if self.framer.pending() >= self.max_message + scratch.len() {
                return Fill::More;
            }
            match self.stream.read(scratch) {
                Ok(0) => {
                    self.eof = true;
                    // A last line without its newline is still a request.
                    if self.framer.pending() > 0 {
                        self.framer.push(b"\n");
                    }
                    return Fill::Eof;
                }
                Ok(n) => self.framer.push(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fill::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.broken = true;
                    return Fill::Eof;
                }
            }
        }
    }

    /// The next buffered frame.
    pub fn next_frame(&mut self) -> Option<Frame> {
        self.framer.next_frame()
    }

    /// Queues bytes for the peer.
    pub fn queue(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        self.out.extend_from_slice(bytes);
    }

    /// The outgoing buffer, for encoders that write in place.
    pub fn out_buf(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Writes until the kernel would block or nothing is left.
    pub fn flush(&mut self) {
        while self.out_pos < self.out.len() && !self.broken {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => self.broken = true,
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => self.broken = true,
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            // Give back memory a burst needed, keeping a working size.
            if self.out.capacity() > 1 << 20 {
                self.out.shrink_to(64 << 10);
            }
        } else if self.out_pos > self.out.len() / 2 {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
    }

    /// Registers WRITABLE while bytes are pending, and only then.
    pub fn update_interest(&mut self, registry: &Registry) {
        let want = self.pending_out() > 0 && !self.broken;
        if want == self.writable_registered {
            return;
        }
        let interest = if want {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if registry
            .reregister(&mut self.stream, self.token, interest)
            .is_ok()
        {
            self.writable_registered = want;
        } else {
            self.broken = true;
        }
    }

    /// Whether the connection is finished: the peer is gone, or it sent EOF and everything
    /// it sent has been handled, answered and written.
    pub fn finished(&self) -> bool {
        self.broken
            || (self.eof && self.pending_out() == 0 && self.waiting == 0 && !self.read_pending)
    }
}
