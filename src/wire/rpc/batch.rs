//! One connection's JSON-RPC exchange: the requests it handed out and the answers they
//! are owed, single lines or a batch's array once every element is answered, bounded by
//! the connection's cap and `MAX_WAITING`.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

use super::error::RpcError;
use super::framer::{Frame, Framer};
use super::message::{
    parse_line, write_response, Id, Incoming, Message, ParsedLine, ReqNo, RpcRequest,
};

/// Requests one connection may have unanswered (parked, or in open batches) before
/// further requests on it are refused with -32003: waits cost memory and timers, not
/// output, so back-pressure on the outgoing buffer does not bound them.
pub const MAX_WAITING: usize = 4096;

/// The ACP notification that cancels a request still waiting for its answer.
const CANCEL: &str = "$/cancel_request";

/// How full a connection's outgoing buffer is, as a session sees it.
#[derive(Debug, Clone, Copy)]
pub struct Room {
    /// Bytes queued and not yet written.
    pub owed: usize,
    /// `--client-buffer`.
    pub cap: usize,
}

/// Where the answer to a request goes.
#[derive(Debug)]
enum ReplyTo {
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

/// ParsedLine messages not yet handed out (a batch's elements), and batch ends.
#[derive(Debug)]
enum Queued {
    Message { msg: Message, batch: Option<u64> },
    BatchEnd(u64),
}

/// One connection's JSON-RPC: its framing, the requests it handed out and the answers
/// they are owed (single lines, or a batch's array once every element is answered).
/// Sans-I/O: bytes in, `Incoming` out, answers appended to the caller's buffer.
///
/// Invariants:
/// - A batch's reply counts against the connection's cap as it is built: elements past it
///   are answered `-32003` without being carried out.
/// - At most `MAX_WAITING` requests are unanswered at once; more are refused with
///   `-32003` (notifications are still carried out).
#[derive(Debug)]
pub struct RpcSession {
    framer: Framer,
    max_message: usize,
    max_batch: usize,
    queue: VecDeque<Queued>,
    open: HashMap<ReqNo, ReplyTo>,
    next_req: u64,
    batches: HashMap<u64, Batch>,
    next_batch: u64,
}

impl RpcSession {
    pub fn new(max_message: usize, max_batch: usize) -> RpcSession {
        RpcSession {
            framer: Framer::new(max_message),
            max_message,
            max_batch,
            queue: VecDeque::new(),
            open: HashMap::new(),
            next_req: 0,
            batches: HashMap::new(),
            next_batch: 0,
        }
    }

    /// Bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.framer.push(bytes);
    }

    /// The peer will send nothing more: a last line without its newline still counts.
    pub fn end_of_input(&mut self) {
        if self.framer.pending() > 0 {
            self.framer.push(b"\n");
        }
    }

    /// Bytes buffered and not yet framed.
    pub fn pending_input(&self) -> usize {
        self.framer.pending()
    }

    /// Requests handed out and not answered yet.
    pub fn waiting(&self) -> usize {
        self.open.len()
    }

    /// Nothing buffered, handed out or owed.
    pub fn idle(&self) -> bool {
        self.open.is_empty() && self.batches.is_empty() && self.queue.is_empty()
    }

    /// The next request, notification or client response, if a whole one is buffered.
    /// Malformed input, limits and framing errors are answered into `out` here and never
    /// surface. `None` also while the outgoing buffer is full (`room`): a batch already
    /// read is still handed out, a new line is not.
    pub fn next(&mut self, out: &mut Vec<u8>, room: Room) -> Option<Incoming> {
        // Answers written here while looping count as owed too.
        let base = out.len();
        loop {
            let owed = room.owed + (out.len() - base);
            if let Some(q) = self.queue.pop_front() {
                match q {
                    Queued::BatchEnd(b) => {
                        if let Some(batch) = self.batches.get_mut(&b) {
                            batch.open = false;
                        }
                        self.finish_batch(b, out);
                    }
                    Queued::Message { msg, batch } => {
                        if let Some(incoming) = self.admit(msg, batch, owed, room.cap, out) {
                            return Some(incoming);
                        }
                    }
                }
                continue;
            }
            if owed >= room.cap {
                return None;
            }
            let line = match self.framer.next_frame()? {
                Frame::TooLong => {
                    let e = RpcError::too_long(self.max_message);
                    self.answer_to(ReplyTo::Single(Id::null()), &Err(e), out);
                    continue;
                }
                Frame::Line(line) => line,
            };
            match parse_line(&line, self.max_batch) {
                ParsedLine::Error(e) => self.answer_to(ReplyTo::Single(Id::null()), &Err(e), out),
                ParsedLine::Single(msg) => {
                    if let Some(incoming) = self.admit(msg, None, owed, room.cap, out) {
                        return Some(incoming);
                    }
                }
                ParsedLine::Batch(msgs) => {
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
    fn admit(
        &mut self,
        msg: Message,
        batch: Option<u64>,
        owed: usize,
        cap: usize,
        out: &mut Vec<u8>,
    ) -> Option<Incoming> {
        match msg {
            Message::Invalid { id, error } => {
                let to = self.reply_slot(id, batch);
                self.answer_to(to, &Err(error), out);
                None
            }
            Message::Response { id, result } => Some(Incoming::Response { id, result }),
            Message::Request(RpcRequest {
                id: None,
                method,
                params,
            }) if method == CANCEL => {
                // ACP's cancellation: a notification naming one of our open requests.
                let target = params.get("requestId")?;
                self.open.iter().find_map(|(req, to)| {
                    let id = match to {
                        ReplyTo::Single(id) | ReplyTo::Batch { id, .. } => id,
                    };
                    (id.to_value() == *target).then_some(Incoming::Cancel(*req))
                })
            }
            Message::Request(RpcRequest {
                id: None,
                method,
                params,
            }) => Some(Incoming::Request {
                req: None,
                method,
                params,
            }),
            Message::Request(RpcRequest {
                id: Some(id),
                method,
                params,
            }) => {
                let full = batch
                    .and_then(|b| self.batches.get(&b))
                    .is_some_and(|b| b.bytes + owed >= cap);
                let refusal = if full {
                    // The answers so far already fill what this client may be owed.
                    Some(RpcError::limit("client-buffer", cap))
                } else if self.open.len() >= MAX_WAITING {
                    Some(RpcError::limit("waiting-requests", MAX_WAITING))
                } else {
                    None
                };
                let to = self.reply_slot(id, batch);
                if let Some(e) = refusal {
                    self.answer_to(to, &Err(e), out);
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

    fn reply_slot(&mut self, id: Id, batch: Option<u64>) -> ReplyTo {
        match batch.and_then(|b| self.batches.get_mut(&b).map(|s| (b, s))) {
            Some((b, state)) => {
                state.slots.push(None);
                state.pending += 1;
                ReplyTo::Batch {
                    batch: b,
                    slot: state.slots.len() - 1,
                    id,
                }
            }
            None => ReplyTo::Single(id),
        }
    }

    /// Answers request `req` into `out`. An unknown number (answered already) is ignored.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        if let Some(to) = self.open.remove(&req) {
            self.answer_to(to, result, out);
        }
    }

    fn answer_to(&mut self, to: ReplyTo, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        match to {
            ReplyTo::Single(id) => {
                write_response(out, &id, result);
                out.push(b'\n');
            }
            ReplyTo::Batch { batch, slot, id } => {
                let Some(b) = self.batches.get_mut(&batch) else {
                    return;
                };
                let mut one = Vec::new();
                write_response(&mut one, &id, result);
                if let Some(s) = b.slots.get_mut(slot) {
                    b.bytes += one.len();
                    *s = Some(one);
                    b.pending -= 1;
                }
                self.finish_batch(batch, out);
            }
        }
    }

    /// Sends a batch's reply once every element was seen and answered.
    fn finish_batch(&mut self, id: u64, out: &mut Vec<u8>) {
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
        out.reserve(b.bytes + b.slots.len() + 3);
        out.push(b'[');
        for (i, s) in b.slots.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend(s.unwrap_or_default());
        }
        out.extend_from_slice(b"]\n");
    }
}
