//! One client connection: its socket, its codec (JSON-RPC lines, batches and the replies
//! they are owed), and a capped outgoing buffer. The loop reads into it (`fill`), takes
//! what the peer asked for one at a time (`ready`), and answers by request number
//! (`answer`); everything about ids, batches and framing stays in here.
//!
//! Invariants:
//! - Reading stops (back-pressure) while the outgoing buffer is past its cap: a client that
//!   does not read its answers cannot make the daemon buffer answers without bound. A
//!   batch's reply counts against the same cap as it is built: elements past it are
//!   answered `-32003` without being carried out.
//! - Responses are always queued; output events are queued only while under the cap (the
//!   pump asks `has_room`), so responses still go through for a slow subscriber.
//! - At most `MAX_WAITING` requests of one connection are unanswered at once; more are
//!   refused with `-32003` (notifications are still carried out).
//! - WRITABLE interest is registered only while bytes are pending.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};

use mio::net::UnixStream;
use mio::{Interest, Registry, Token};
use serde_json::{Map, Value};

use crate::process::PeerCred;
use crate::rpc::{self, Frame, Framer, Id, Message, Parsed, ReqNo, Request, RpcError};

/// Requests one connection may have unanswered (parked, or in open batches) before
/// further requests on it are refused with -32003: waits cost memory and timers, not
/// output, so back-pressure on the outgoing buffer does not bound them.
pub const MAX_WAITING: usize = 4096;

/// The ACP notification that cancels a request still waiting for its answer.
const CANCEL: &str = "$/cancel_request";

/// What the peer sent that the loop must act on.
#[derive(Debug)]
pub enum Incoming {
    /// A request (`req` set: answer it with `answer`) or a notification (`req` None).
    Request {
        req: Option<ReqNo>,
        method: String,
        params: Map<String, Value>,
    },
    /// An answer to a request execd sent (an approval).
    Response {
        id: Id,
        result: Result<Value, Value>,
    },
    /// `$/cancel_request {requestId}` named this still-unanswered request.
    Cancel(ReqNo),
}

/// What a read pass found.
#[derive(Debug, PartialEq)]
pub enum Fill {
    /// Read everything available.
    Drained,
    /// Stopped with data still available (framer full).
    More,
    /// The peer closed its sending side.
    Eof,
}

/// Where the answer to a request goes.
#[derive(Debug)]
enum Pending {
    Single(Id),
    Batch { batch: u64, slot: usize, id: Id },
}

/// A batch whose reply is being gathered.
#[derive(Debug)]
struct Batch {
    slots: Vec<Option<Vec<u8>>>,
    /// Slots still unanswered.
    pending: usize,
    /// Bytes of the answers gathered so far.
    bytes: usize,
    /// Elements are still being handed out: the reply waits until all were seen.
    open: bool,
}

/// Parsed messages not yet handed out (a batch's elements), and batch ends.
#[derive(Debug)]
enum Queued {
    Message { msg: Message, batch: Option<u64> },
    BatchEnd(u64),
}

/// One client.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    pub token: Token,
    pub peer: PeerCred,
    framer: Framer,
    max_message: usize,
    max_batch: usize,
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
    queue: VecDeque<Queued>,
    open: HashMap<ReqNo, Pending>,
    next_req: u64,
    batches: HashMap<u64, Batch>,
    next_batch: u64,
}

impl Conn {
    pub fn new(
        stream: UnixStream,
        token: Token,
        peer: PeerCred,
        max_message: usize,
        max_batch: usize,
        cap: usize,
    ) -> Conn {
        Conn {
            stream,
            token,
            peer,
            framer: Framer::new(max_message),
            max_message,
            max_batch,
            out: Vec::new(),
            out_pos: 0,
            cap,
            writable_registered: false,
            read_pending: false,
            eof: false,
            broken: false,
            queue: VecDeque::new(),
            open: HashMap::new(),
            next_req: 0,
            batches: HashMap::new(),
            next_batch: 0,
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

    /// Requests handed out and not answered yet.
    pub fn waiting(&self) -> usize {
        self.open.len()
    }

    /// Reads what is available into the framer, stopping early when a full message and a
    /// read's worth are buffered so one client cannot make the daemon hold more.
    pub fn fill(&mut self, scratch: &mut [u8]) -> Fill {
        if self.eof {
            return Fill::Eof;
        }
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

    /// The next request, notification or client response, if a whole one is buffered.
    /// Malformed input, limits and framing errors are answered here and never surface.
    /// Returns `None` (with `read_pending` set) while the outgoing buffer is full.
    pub fn ready(&mut self) -> Option<Incoming> {
        loop {
            if self.broken {
                return None;
            }
            if let Some(q) = self.queue.pop_front() {
                match q {
                    Queued::BatchEnd(b) => {
                        if let Some(batch) = self.batches.get_mut(&b) {
                            batch.open = false;
                        }
                        self.finish_batch(b);
                    }
                    Queued::Message { msg, batch } => {
                        if let Some(incoming) = self.admit(msg, batch) {
                            return Some(incoming);
                        }
                    }
                }
                continue;
            }
            if !self.has_room() {
                // Answers are not being read: take no more requests until they drain.
                self.read_pending = true;
                return None;
            }
            self.read_pending = false;
            let line = match self.framer.next_frame()? {
                Frame::TooLong => {
                    let e = RpcError::too_long(self.max_message);
                    self.answer_to(Pending::Single(Id::null()), &Err(e));
                    continue;
                }
                Frame::Line(line) => line,
            };
            match rpc::parse_line(&line, self.max_batch) {
                Parsed::Error(e) => self.answer_to(Pending::Single(Id::null()), &Err(e)),
                Parsed::Single(msg) => {
                    if let Some(incoming) = self.admit(msg, None) {
                        return Some(incoming);
                    }
                }
                Parsed::Batch(msgs) => {
                    let b = self.next_batch;
                    self.next_batch += 1;
                    self.batches.insert(
                        b,
                        Batch {
                            slots: Vec::new(),
                            pending: 0,
                            bytes: 0,
                            open: true,
                        },
                    );
                    self.queue
                        .extend(msgs.into_iter().map(|msg| Queued::Message {
                            msg,
                            batch: Some(b),
                        }));
                    self.queue.push_back(Queued::BatchEnd(b));
                }
            }
        }
    }

    /// Turns one parsed message into what the loop sees, answering here what needs no loop.
    fn admit(&mut self, msg: Message, batch: Option<u64>) -> Option<Incoming> {
        match msg {
            Message::Invalid { id, error } => {
                let to = self.reply_slot(id, batch);
                self.answer_to(to, &Err(error));
                None
            }
            Message::Response { id, result } => Some(Incoming::Response { id, result }),
            Message::Request(Request {
                id: None,
                method,
                params,
            }) if method == CANCEL => {
                // ACP's cancellation: a notification naming one of our open requests.
                let target = params.get("requestId")?;
                self.open.iter().find_map(|(req, to)| {
                    let id = match to {
                        Pending::Single(id) | Pending::Batch { id, .. } => id,
                    };
                    (id.to_value() == *target).then_some(Incoming::Cancel(*req))
                })
            }
            Message::Request(Request {
                id: None,
                method,
                params,
            }) => Some(Incoming::Request {
                req: None,
                method,
                params,
            }),
            Message::Request(Request {
                id: Some(id),
                method,
                params,
            }) => {
                let full = batch
                    .and_then(|b| self.batches.get(&b))
                    .is_some_and(|b| b.bytes + self.pending_out() >= self.cap);
                let refusal = if full {
                    // The answers so far already fill what this client may be owed.
                    Some(RpcError::limit("client-buffer", self.cap))
                } else if self.open.len() >= MAX_WAITING {
                    Some(RpcError::limit("waiting-requests", MAX_WAITING))
                } else {
                    None
                };
                let to = self.reply_slot(id, batch);
                if let Some(e) = refusal {
                    self.answer_to(to, &Err(e));
                    return None;
                }
                let req = ReqNo(self.next_req);
                self.next_req += 1;
                self.open.insert(req, to);
                Some(Incoming::Request {
                    req: Some(req),
                    method,
                    params,
                })
            }
        }
    }

    fn reply_slot(&mut self, id: Id, batch: Option<u64>) -> Pending {
        match batch.and_then(|b| self.batches.get_mut(&b).map(|s| (b, s))) {
            Some((b, state)) => {
                state.slots.push(None);
                state.pending += 1;
                Pending::Batch {
                    batch: b,
                    slot: state.slots.len() - 1,
                    id,
                }
            }
            None => Pending::Single(id),
        }
    }

    /// Answers request `req`. An unknown number (answered already) is ignored.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>) {
        if let Some(to) = self.open.remove(&req) {
            self.answer_to(to, result);
        }
    }

    fn answer_to(&mut self, to: Pending, result: &Result<Value, RpcError>) {
        match to {
            Pending::Single(id) => {
                let line = rpc::encode_response(&id, result);
                self.queue_bytes(&line);
            }
            Pending::Batch { batch, slot, id } => {
                let Some(b) = self.batches.get_mut(&batch) else {
                    return;
                };
                let mut one = Vec::new();
                rpc::write_response(&mut one, &id, result);
                if let Some(s) = b.slots.get_mut(slot) {
                    b.bytes += one.len();
                    *s = Some(one);
                    b.pending -= 1;
                }
                self.finish_batch(batch);
            }
        }
    }

    /// Sends a batch's reply once every element was seen and answered.
    fn finish_batch(&mut self, id: u64) {
        let done = self
            .batches
            .get(&id)
            .is_some_and(|b| !b.open && b.pending == 0);
        if !done {
            return;
        }
        let Some(b) = self.batches.remove(&id) else {
            return;
        };
        if b.slots.is_empty() {
            return; // only notifications
        }
        let mut line = Vec::with_capacity(b.bytes + b.slots.len() + 3);
        line.push(b'[');
        for (i, s) in b.slots.into_iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            line.extend(s.unwrap_or_default());
        }
        line.extend_from_slice(b"]\n");
        self.queue_bytes(&line);
    }

    /// Queues bytes for the peer (a notification, an event).
    pub fn queue_bytes(&mut self, bytes: &[u8]) {
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
            || (self.eof
                && self.pending_out() == 0
                && self.open.is_empty()
                && self.batches.is_empty()
                && self.queue.is_empty()
                && !self.read_pending)
    }
}
