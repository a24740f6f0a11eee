//! One client connection: its socket (Unix, or TCP for the HTTP front end), its codec, and
//! a capped outgoing buffer. The loop reads into it (`fill`), takes what the peer asked for
//! one at a time (`ready`), and answers by request number (`answer`); everything about
//! ids, batches, HTTP framing and response order stays in the codec.
//!
//! On the Unix socket the first byte decides the codec (section 11): a connection that
//! starts with an ASCII letter speaks HTTP, anything else JSON-RPC lines. A TCP listener
//! speaks HTTP only. An HTTP connection whose handshake the loop accepts becomes a
//! WebSocket (`become_ws`, PROTOCOL 12.5): its frames are read by `wire::ws`, and the
//! loop (`server::ws`) acts on them.
//!
//! Invariants:
//! - Reading stops (back-pressure) while the outgoing buffer is past its cap: a client that
//!   does not read its answers cannot make the daemon buffer answers without bound.
//! - Responses are always queued; output events are queued only while under the cap (the
//!   pump asks `has_room`), so responses still go through for a slow subscriber.
//! - WRITABLE interest is registered only while bytes are pending.
//! - A connection has at most `REQUESTS_PER_TURN` messages taken per turn of the loop:
//!   one client pipelining thousands of requests does not hold the others' for longer
//!   than that. Not counted: WebSocket frames, and the last pass of a peer that left.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::time::Instant;

use mio::event::Source;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use serde_json::Value;

use std::os::fd::{AsRawFd, OwnedFd};

use crate::core::carry::{carry_wait, resume_wait};
use crate::core::table::Key;
use crate::core::tie::{Tie, TieSource};
use crate::core::vocab::Via;
use crate::core::Wait;
use crate::server::ws::WsConn;
use crate::sys::ids::PeerCred;
use crate::wire::http;
use crate::wire::rpc::{self, Incoming, ReqNo, Room, RpcError};
use crate::wire::state::{
    BlobsIn, BlobsOut, Clock, CodecImage, ConnImage, PeerImage, StateError, TieImage,
};

/// Messages (requests, notifications, responses to the daemon's requests) one connection
/// has taken per turn of the loop; what it has buffered beyond that waits for the next
/// turn, which polls without sleeping. The cheapest request, pipelined, costs the loop
/// about a microsecond and a turn some 13 us (`benches/README.md`, row 2c), so 64 of them
/// are under a tenth of a millisecond, and 64 costly ones (a listing, an output read of
/// a full ring) a few milliseconds; a spawn is one per connection in flight anyway. A
/// WebSocket's frames (a person's keys and resizes) are not counted, and neither is the
/// last pass of a peer that hung up (`leaving`).
pub const REQUESTS_PER_TURN: u32 = 64;

/// What a read pass found.
#[derive(Debug, PartialEq)]
pub enum Fill {
    /// Read everything available.
    Drained,
    /// Stopped with data still available (the codec holds enough).
    More,
    /// The peer closed its sending side.
    Eof,
}

/// A connection's socket.
#[derive(Debug)]
pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sock {
    fn source(&mut self) -> &mut dyn Source {
        match self {
            Sock::Unix(s) => s,
            Sock::Tcp(s) => s,
        }
    }
}

/// The protocol a connection speaks.
#[derive(Debug)]
enum Dialect {
    /// Nothing read yet on the Unix socket: the first byte decides.
    Undecided,
    Rpc(rpc::RpcSession),
    Http(http::HttpSession),
    /// An HTTP connection upgraded to a WebSocket.
    Ws(Box<WsConn>),
}

/// The bounds a connection's codecs take.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub max_message: usize,
    pub max_batch: usize,
    pub cap: usize,
    /// The `--http-host` names a browser's request may give (PROTOCOL 11).
    pub hosts: http::Hosts,
}

/// One client.
#[derive(Debug)]
pub struct Conn {
    stream: Sock,
    pub token: Token,
    /// Who the peer is (for TCP: the identity its requests run as).
    pub peer: PeerCred,
    codec: Dialect,
    bounds: Bounds,
    out: Vec<u8>,
    out_pos: usize,
    writable_registered: bool,
    /// A readable event was left unserviced (back-pressure, or this turn's
    /// `REQUESTS_PER_TURN` taken); read again once drained, or in the next turn.
    pub read_pending: bool,
    /// The peer hung up: this pass, after which the connection closes, is not held to
    /// the budget (what else holds a request back, a spawn in flight or a full buffer,
    /// still does, as it did before the budget).
    pub leaving: bool,
    /// The loop's turn in which `taken` was counted.
    turn: u64,
    /// Requests, notifications and responses handed out in that turn.
    taken: u32,
    /// The peer will send nothing more.
    pub eof: bool,
    /// An event said the peer closed its sending side (or hung up): reads go on to the
    /// end of the stream, not only to a short read (`fill`).
    pub peer_closed: bool,
    /// The socket may hold what was not read yet: a readiness event came, or the last
    /// `fill` stopped with data left. False after a short read or the end: the socket
    /// was empty then, and anything sent since comes with an event of its own.
    pub unread: bool,
    /// A write failed or the peer hung up: close once the loop gets to it.
    pub broken: bool,
    /// The peer's supplementary groups: those it held when it connected (Unix socket), or
    /// `--http-run-as`'s (TCP).
    pub groups: Vec<u32>,
    /// When it connected, last read a whole HTTP request, or last had something in flight
    /// (an idle TCP connection closes).
    pub last_request: Instant,
    /// Parked requests answered while the outgoing buffer was full, oldest first: each is
    /// rendered once there is room (PROTOCOL 8). Until then it is a reference to the
    /// process, which the core keeps (`Core::hold`), not bytes.
    pub deferred: VecDeque<(ReqNo, Wait)>,
    /// Commands this connection asked for whose child has not exec'd yet: requests
    /// after them wait, so what a client sends next sees them started (or failed), as if
    /// the spawn had been instant.
    pub launching: usize,
    /// Whether the peer descends from the daemon, and from which command (PROTOCOL 7.3),
    /// found at accept; a descendant of no known command until then.
    pub tie: Tie,
    /// A descendant tied to no command, whose `EXECD_TREE` cookie the off-loop reader is
    /// reading (the start time of the peer it asked about): its requests are not taken
    /// until the answer comes (which may tie it to its command) or the wait is up (it
    /// stays as it is). Not carried by an upgrade: the new image serves it as it is.
    pub cookie_wait: Option<u64>,
}

impl Conn {
    /// A connection on the Unix socket: JSON-RPC or HTTP, as its first byte says.
    pub fn unix(stream: UnixStream, token: Token, peer: PeerCred, bounds: Bounds) -> Conn {
        Conn::with(Sock::Unix(stream), Dialect::Undecided, token, peer, bounds)
    }

    /// A connection on an HTTP listener.
    pub fn http(
        stream: TcpStream,
        token: Token,
        peer: PeerCred,
        bounds: Bounds,
        auth: http::Auth,
    ) -> Conn {
        let mut session = http::HttpSession::new(http::Limits::new(bounds.max_message), auth);
        session.set_hosts(bounds.hosts.clone());
        let codec = Dialect::Http(session);
        Conn::with(Sock::Tcp(stream), codec, token, peer, bounds)
    }

    fn with(stream: Sock, codec: Dialect, token: Token, peer: PeerCred, bounds: Bounds) -> Conn {
        Conn {
            stream,
            token,
            peer,
            codec,
            bounds,
            out: Vec::new(),
            out_pos: 0,
            writable_registered: false,
            read_pending: false,
            leaving: false,
            turn: 0,
            taken: 0,
            eof: false,
            peer_closed: false,
            unread: true,
            broken: false,
            groups: Vec::new(),
            last_request: Instant::now(),
            deferred: VecDeque::new(),
            launching: 0,
            tie: Tie::unknown(),
            cookie_wait: None,
        }
    }

    pub fn register(&mut self, registry: &Registry) -> io::Result<()> {
        let token = self.token;
        registry.register(self.stream.source(), token, Interest::READABLE)
    }

    pub fn deregister(&mut self, registry: &Registry) {
        let _ = registry.deregister(self.stream.source());
    }

    /// Whether it came through a TCP listener (its peer is `--http-run-as`).
    pub fn is_tcp(&self) -> bool {
        matches!(self.stream, Sock::Tcp(_))
    }

    /// Whether it speaks HTTP.
    pub fn is_http(&self) -> bool {
        matches!(self.codec, Dialect::Http(_))
    }

    /// Whether it is a WebSocket.
    pub fn is_ws(&self) -> bool {
        matches!(self.codec, Dialect::Ws(_))
    }

    /// The WebSocket state and the outgoing buffer, together.
    pub fn ws_mut(&mut self) -> Option<(&mut WsConn, &mut Vec<u8>)> {
        match &mut self.codec {
            Dialect::Ws(w) if !self.broken => Some((w, &mut self.out)),
            _ => None,
        }
    }

    /// The front door its requests come through, for the audit.
    pub fn via(&self) -> Via {
        match self.codec {
            Dialect::Http(_) => Via::Http,
            Dialect::Ws(_) => Via::Ws,
            Dialect::Undecided | Dialect::Rpc(_) => Via::Rpc,
        }
    }

    /// The WebSocket handshake `req` was, if this HTTP connection made it.
    pub fn take_upgrade(&mut self, req: ReqNo) -> Option<crate::wire::ws::Opening> {
        match &mut self.codec {
            Dialect::Http(s) => s.take_upgrade(req),
            _ => None,
        }
    }

    /// Answers the handshake with `101` and becomes the WebSocket `ws`; what the client
    /// sent after its handshake is its first frames.
    pub fn become_ws(&mut self, opening: &crate::wire::ws::Opening, mut ws: Box<WsConn>) {
        let Dialect::Http(s) = &mut self.codec else {
            return;
        };
        let rest = s.take_rest();
        ws.codec.push(&rest);
        self.out
            .extend_from_slice(&crate::wire::ws::switching(opening));
        self.codec = Dialect::Ws(ws);
        self.read_pending = false;
    }

    /// Whether request `req` of this HTTP connection answers with server-sent events.
    pub fn streams(&self, req: ReqNo) -> bool {
        matches!(&self.codec, Dialect::Http(s) if s.streams(req))
    }

    /// One server-sent event for request `req` (see `HttpSession::event`).
    pub fn event(&mut self, req: ReqNo, name: &str, data: &[u8]) {
        if self.broken {
            return;
        }
        if let Dialect::Http(s) = &mut self.codec {
            s.event(req, name, data, &mut self.out);
        }
    }

    /// Bytes queued and not yet written.
    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Bytes owed to the peer: queued, and (HTTP) answers held behind an earlier request.
    pub fn owed(&self) -> usize {
        let held = match &self.codec {
            Dialect::Http(s) => s.held(),
            _ => 0,
        };
        self.pending_out() + held
    }

    /// Whether a connection held back from reading may take requests again: it owes less
    /// than its buffer (answers held behind an earlier one included) and, over HTTP, has
    /// room in its pipeline. Only then is it worth reading again.
    pub fn can_take(&self) -> bool {
        let pipeline_full = match &self.codec {
            Dialect::Http(s) => s.pipeline_full(),
            _ => false,
        };
        !self.owes_past_cap() && !pipeline_full && self.launching == 0 && self.cookie_wait.is_none()
    }

    /// Whether more than `--client-buffer` is owed: the peer is not reading.
    pub fn owes_past_cap(&self) -> bool {
        self.owed() >= self.bounds.cap
    }

    /// Whether the outgoing buffer is under its cap (room for output events).
    pub fn has_room(&self) -> bool {
        self.pending_out() < self.bounds.cap
    }

    /// Whether the outgoing buffer drained below half its cap: lagging subscribers resume
    /// only then, so a slow reader gets one `Gap` per burst rather than one per write.
    pub fn below_half(&self) -> bool {
        self.pending_out() < self.bounds.cap / 2
    }

    /// Requests handed out and not answered yet.
    pub fn waiting(&self) -> usize {
        match &self.codec {
            Dialect::Undecided | Dialect::Ws(_) => 0,
            Dialect::Rpc(s) => s.waiting(),
            Dialect::Http(s) => s.waiting(),
        }
    }

    fn pending_input(&self) -> usize {
        match &self.codec {
            Dialect::Undecided => 0,
            Dialect::Rpc(s) => s.pending_input(),
            Dialect::Http(s) => s.pending_input(),
            // A WebSocket that is closing reads nothing more: what comes is dropped.
            Dialect::Ws(w) if w.closing => 0,
            Dialect::Ws(w) => w.codec.pending(),
        }
    }

    /// Hands bytes to the codec, choosing it on the first byte of the Unix socket.
    fn push(&mut self, bytes: &[u8]) {
        if let Dialect::Undecided = self.codec {
            let b = &self.bounds;
            self.codec = if bytes.first().is_some_and(u8::is_ascii_alphabetic) {
                let mut s =
                    http::HttpSession::new(http::Limits::new(b.max_message), http::Auth::Peer);
                s.set_hosts(b.hosts.clone());
                Dialect::Http(s)
            } else {
                Dialect::Rpc(rpc::RpcSession::new(b.max_message, b.max_batch))
            };
        }
        match &mut self.codec {
            Dialect::Undecided => {}
            Dialect::Rpc(s) => s.push(bytes),
            Dialect::Http(s) => s.push(bytes),
            Dialect::Ws(w) if w.closing => {}
            Dialect::Ws(w) => w.codec.push(bytes),
        }
    }

    /// Reads what is available into the codec, stopping early when a full message and a
    /// read's worth are buffered so one client cannot make the daemon hold more.
    ///
    /// A read shorter than `scratch` emptied the socket's queue when it was made (a stream
    /// socket's read takes all that is queued, up to its size): anything sent later is a
    /// new edge of readiness, so the read that would only say `EAGAIN` is not made (two of
    /// every request's system calls). Unless an event said the peer closed: its end of
    /// stream may wait behind the data, and only a read finds it.
    pub fn fill(&mut self, scratch: &mut [u8]) -> Fill {
        let fill = self.fill_from_socket(scratch);
        self.unread = fill == Fill::More;
        fill
    }

    fn fill_from_socket(&mut self, scratch: &mut [u8]) -> Fill {
        if self.eof {
            return Fill::Eof;
        }
        if !self.unread {
            return Fill::Drained;
        }
        loop {
            if self.pending_input() >= self.bounds.max_message + scratch.len() {
                return Fill::More;
            }
            match self.stream.read(scratch) {
                Ok(0) => {
                    self.eof = true;
                    if let Dialect::Rpc(s) = &mut self.codec {
                        s.end_of_input();
                    }
                    return Fill::Eof;
                }
                Ok(n) => {
                    self.push(&scratch[..n]);
                    if n < scratch.len() && !self.peer_closed {
                        return Fill::Drained;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fill::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.broken = true;
                    return Fill::Eof;
                }
            }
        }
    }

    /// The next request, notification or client response, if a whole one is buffered.
    /// Malformed input, limits and framing errors are answered by the codec and never
    /// surface. Returns `None` (with `read_pending` set) while the outgoing buffer is full,
    /// a command it asked for is being started, or it had its `REQUESTS_PER_TURN` in the
    /// loop's turn `turn`.
    pub fn ready(&mut self, turn: u64) -> Option<Incoming> {
        if self.broken {
            return None;
        }
        if self.launching > 0 || self.cookie_wait.is_some() {
            self.read_pending = true;
            return None;
        }
        if self.turn != turn {
            self.turn = turn;
            self.taken = 0;
        }
        if self.taken >= REQUESTS_PER_TURN && !self.leaving {
            self.read_pending = true;
            return None;
        }
        let room = Room {
            owed: self.pending_out(),
            cap: self.bounds.cap,
        };
        let (next, held, pipeline_full) = match &mut self.codec {
            Dialect::Undecided | Dialect::Ws(_) => (None, 0, false),
            Dialect::Rpc(s) => (s.next(&mut self.out, room), 0, false),
            Dialect::Http(s) => {
                let before = s.requests();
                let next = s.next(&mut self.out, room);
                if s.requests() != before {
                    self.last_request = Instant::now();
                }
                (next, s.held(), s.pipeline_full())
            }
        };
        // Answers are not being read (queued, or held behind an earlier one), or as many
        // requests are in flight as may be: take no more until that changes.
        let full = self.pending_out() + held >= self.bounds.cap;
        self.read_pending = next.is_none() && (full || pipeline_full);
        self.taken += u32::from(next.is_some());
        next
    }

    /// Answers request `req`. An unknown number (answered already) is ignored.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>) {
        if self.broken {
            return;
        }
        match &mut self.codec {
            // Its lines' answers are the loop's to show (`server::ws`).
            Dialect::Undecided | Dialect::Ws(_) => {}
            Dialect::Rpc(s) => s.answer(req, result, &mut self.out),
            Dialect::Http(s) => s.answer(req, result, &mut self.out),
        }
    }

    /// Queues the notification `method` about request `req`, still unanswered: `params`
    /// with the request's own JSON-RPC id as `requestId`. HTTP peers get none, nor a
    /// request already answered.
    pub fn notify_about(&mut self, req: ReqNo, method: &str, mut params: Value) {
        let Dialect::Rpc(s) = &self.codec else {
            return;
        };
        let Some(id) = s.id_of(req) else {
            return;
        };
        params["requestId"] = id.to_value();
        let msg = serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params});
        let mut line = Vec::with_capacity(160);
        crate::wire::encode::write_json(&mut line, &msg);
        line.push(b'\n');
        self.queue_bytes(&line);
    }

    /// Queues bytes for the peer (a notification, an event). HTTP peers get none: they
    /// asked for answers only.
    pub fn queue_bytes(&mut self, bytes: &[u8]) {
        if self.broken || self.is_http() || self.is_ws() {
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
            if self.is_tcp() && !self.out.is_empty() {
                self.last_request = Instant::now(); // idle from the end of an answer
            }
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
        let token = self.token;
        if registry
            .reregister(self.stream.source(), token, interest)
            .is_ok()
        {
            self.writable_registered = want;
        } else {
            self.broken = true;
        }
    }

    /// Whether an HTTP client closed its side while a request of its waits (a long poll,
    /// an approval). HTTP clients do not half-close to await an answer, and over TCP a
    /// closed socket shows only as EOF, so this is the client leaving: what waits for it
    /// is withdrawn now rather than when the wait ends.
    pub fn left_waiting(&self) -> bool {
        self.eof && self.is_http() && self.waiting() > 0
    }

    /// Whether the connection is finished: the peer is gone; or it sent EOF and
    /// everything it sent has been handled, answered and written; or (HTTP) a response
    /// that closes the connection has been written.
    pub fn finished(&self) -> bool {
        if self.broken {
            return true;
        }
        let written = self.pending_out() == 0;
        let idle = match &self.codec {
            Dialect::Undecided => true,
            // A WebSocket ends when its close frame is written, or its peer is gone.
            Dialect::Ws(w) if w.closing && written => return true,
            Dialect::Ws(_) => true,
            Dialect::Rpc(s) => s.idle(),
            Dialect::Http(s) => {
                if s.done() && written {
                    return true;
                }
                s.idle()
            }
        };
        self.eof && written && idle && !self.read_pending
    }
}

impl Conn {
    /// What an upgrade in place carries of this connection: its socket by number, who the
    /// peer is, the codec's state, what is queued and not written, and the answers
    /// waiting for room. Nothing may be being started for it (the upgrade waits for
    /// spawns in flight).
    pub fn carry(&self, blobs: &mut BlobsOut, clock: &Clock) -> ConnImage {
        ConnImage {
            token: self.token.0,
            fd: match &self.stream {
                Sock::Unix(s) => s.as_raw_fd(),
                Sock::Tcp(s) => s.as_raw_fd(),
            },
            tcp: self.is_tcp(),
            peer: PeerImage {
                uid: self.peer.uid,
                gid: self.peer.gid,
                pid: self.peer.pid,
            },
            codec: match &self.codec {
                // WebSockets are closed before an upgrade's swap (`server::ws`); one left
                // is carried as a connection that has said all it will.
                Dialect::Undecided | Dialect::Ws(_) => CodecImage::Undecided,
                Dialect::Rpc(s) => CodecImage::Rpc(s.carry(blobs)),
                Dialect::Http(s) => CodecImage::Http(s.carry(blobs)),
            },
            out: blobs.put(&self.out[self.out_pos..]),
            read_pending: self.read_pending,
            eof: self.eof,
            broken: self.broken,
            groups: self.groups.clone(),
            last_request: clock.rel(self.last_request),
            deferred: self
                .deferred
                .iter()
                .map(|(req, wait)| (req.0, carry_wait(wait, blobs)))
                .collect(),
            tie: Some(TieImage {
                descends: self.tie.descends,
                command: self.tie.command.map(|k| k.0),
                by: self.tie.by.as_str().to_string(),
            }),
        }
    }

    /// The connection `carry` described, on `socket` (the one it carried; its
    /// non-blocking mode is the open file's, which the `execve` kept). Not registered yet.
    pub fn resume(
        img: &ConnImage,
        socket: OwnedFd,
        blobs: &BlobsIn,
        clock: &Clock,
        bounds: Bounds,
    ) -> Result<Conn, StateError> {
        let stream = if img.tcp {
            Sock::Tcp(TcpStream::from_std(socket.into()))
        } else {
            Sock::Unix(UnixStream::from_std(socket.into()))
        };
        let codec = match &img.codec {
            CodecImage::Undecided => Dialect::Undecided,
            CodecImage::Rpc(r) => Dialect::Rpc(rpc::RpcSession::resume(
                r,
                blobs,
                bounds.max_message,
                bounds.max_batch,
            )?),
            CodecImage::Http(h) => {
                let mut s = http::HttpSession::resume(h, blobs)?;
                s.set_hosts(bounds.hosts.clone());
                Dialect::Http(s)
            }
        };
        let mut conn = Conn::with(
            stream,
            codec,
            Token(img.token),
            PeerCred {
                uid: img.peer.uid,
                gid: img.peer.gid,
                pid: img.peer.pid,
            },
            bounds,
        );
        conn.out = blobs.get(img.out)?.to_vec();
        conn.read_pending = img.read_pending;
        conn.eof = img.eof;
        conn.broken = img.broken;
        conn.groups = img.groups.clone();
        conn.last_request = clock.at(img.last_request);
        if let Some(t) = &img.tie {
            let by = TieSource::parse(&t.by)
                .ok_or_else(|| StateError::new(format!("a tie found by {:?}", t.by)))?;
            conn.tie = Tie {
                descends: t.descends,
                command: t.command.map(Key),
                by,
            };
        }
        for (req, wait) in &img.deferred {
            conn.deferred
                .push_back((ReqNo(*req), resume_wait(wait, blobs)?));
        }
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::table::Key;
    use crate::wire::state::ConnImage;
    use std::time::Duration;

    fn bounds() -> Bounds {
        Bounds {
            max_message: 1 << 16,
            max_batch: 8,
            cap: 1 << 12,
            hosts: http::Hosts::default(),
        }
    }
    const PEER: PeerCred = PeerCred {
        pid: 4242,
        uid: 1000,
        gid: 1000,
    };

    /// Carries `c` the way an upgrade does: to its image, through the encoded document and
    /// the blob area, and back on a duplicate of its socket; carried again, the same.
    fn through_upgrade(c: &Conn, clock: &Clock) -> (Conn, ConnImage) {
        let mut blobs = BlobsOut::default();
        let img = c.carry(&mut blobs, clock);
        let json = serde_json::to_vec(&img).expect("encode");
        let read: ConnImage = serde_json::from_slice(&json).expect("decode");
        assert_eq!(read, img);
        let area = blobs.bytes().to_vec();
        // The new image's clock: the same instants, read later.
        let later = Clock {
            base: clock.base + Duration::from_millis(40),
        };
        let fd = unsafe_dup(img.fd);
        let back = Conn::resume(&read, fd, &BlobsIn(&area), &later, bounds()).expect("resume");
        let mut again = BlobsOut::default();
        let mut img2 = back.carry(&mut again, &later);
        // Its socket is the duplicate; everything else is what was carried.
        assert_ne!(img2.fd, img.fd);
        img2.fd = img.fd;
        assert_eq!(img2, img, "carried again, it is the same");
        assert_eq!(again.bytes(), blobs.bytes());
        (back, img)
    }

    fn unsafe_dup(fd: i32) -> OwnedFd {
        use std::os::fd::BorrowedFd;
        // SAFETY: `fd` is the test's own open socket for the whole test.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        b.try_clone_to_owned().expect("dup")
    }

    /// A client that pipelines more than a turn's worth has `REQUESTS_PER_TURN` taken in
    /// a turn, is marked to be read again, and has the next ones taken in the next turn,
    /// in order and none lost.
    #[test]
    fn a_connection_has_a_turns_worth_of_requests_taken_per_turn() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let mut c = Conn::unix(UnixStream::from_std(ours), Token(7), PEER, bounds());
        let n = REQUESTS_PER_TURN as u64 * 2 + 5;
        for id in 0..n {
            c.push(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n").as_bytes());
        }
        let mut taken = Vec::new();
        for turn in 1..=3u64 {
            let mut this_turn = 0;
            while let Some(incoming) = c.ready(turn) {
                let Incoming::Request { req: Some(req), .. } = incoming else {
                    panic!("a request");
                };
                c.answer(req, &Ok(Value::Null));
                c.flush(); // to the peer's socket, which holds them all
                taken.push(req);
                this_turn += 1;
            }
            let want = if turn < 3 { REQUESTS_PER_TURN } else { 5 };
            assert_eq!(this_turn, want, "turn {turn}");
            assert_eq!(
                c.read_pending,
                turn < 3,
                "read again next turn: turn {turn}"
            );
            // Within the same turn nothing more is taken.
            assert!(c.ready(turn).is_none());
        }
        assert_eq!(taken.len() as u64, n, "every request");
        assert!(
            taken.windows(2).all(|w| w[0].0 < w[1].0),
            "in order, once each"
        );
    }

    /// A JSON-RPC connection with half a line read, an answer queued and not written, and
    /// an answer deferred for room goes on after an upgrade exactly as before: the rest of
    /// the line makes the same request, the queued bytes reach the peer first.
    #[test]
    fn a_json_rpc_connection_carried_by_an_upgrade_goes_on_the_same() {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let mut c = Conn::unix(UnixStream::from_std(ours), Token(77), PEER, bounds());
        c.push(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\n");
        let Some(Incoming::Request { req: Some(req), .. }) = c.ready(1) else {
            panic!("the first request");
        };
        c.answer(req, &Ok(serde_json::json!({"n": 1})));
        c.push(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"meth");
        c.deferred.push_back((ReqNo(5), Wait::Exit(Key(9))));
        c.groups = vec![10, 20];
        c.tie = Tie::descendant(Some(Key(3)), TieSource::Cgroup);
        let clock = Clock {
            base: Instant::now(),
        };
        let (mut back, img) = through_upgrade(&c, &clock);
        assert_eq!(back.tie, c.tie, "what it descends from is carried");
        // A state of an older writer, without it: a descendant until told otherwise.
        let mut blobs = BlobsOut::default();
        let mut old = c.carry(&mut blobs, &clock);
        old.tie = None;
        let area = BlobsIn(blobs.bytes());
        let r = Conn::resume(&old, unsafe_dup(img.fd), &area, &clock, bounds()).expect("resume");
        assert_eq!(r.tie, Tie::unknown());
        let mut bad = c.carry(&mut BlobsOut::default(), &clock);
        if let Some(t) = bad.tie.as_mut() {
            t.by = "guess".into();
        }
        let e = Conn::resume(&bad, unsafe_dup(img.fd), &area, &clock, bounds()).unwrap_err();
        assert!(e.0.contains("a tie found by"), "{}", e.0);
        assert!(matches!(img.codec, CodecImage::Rpc(_)));
        assert_eq!(
            (back.token, back.peer.pid, back.peer.uid),
            (Token(77), 4242, 1000)
        );
        assert_eq!(back.deferred.len(), 1);
        // Both go on alike: the rest of the line is the same request.
        for conn in [&mut c, &mut back] {
            conn.push(b"od\":\"b\"}\n");
            match conn.ready(1) {
                Some(Incoming::Request { method, .. }) => assert_eq!(method, "b"),
                other => panic!("not the request: {other:?}"),
            }
        }
        // The bytes queued before the upgrade reach the peer from the new image.
        back.flush();
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut got = vec![0u8; 256];
        let n = theirs.read(&mut got).expect("read");
        let line: Value = serde_json::from_slice(got[..n].trim_ascii_end()).expect("json");
        assert_eq!(line["id"], 1);
        assert_eq!(line["result"]["n"], 1);
    }
}
