//! One connection's JSON-RPC exchange: the requests it handed out and the answers they
//! are owed, single lines or a batch's array once every element is answered, bounded by
//! the connection's cap and `MAX_WAITING`.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

use crate::wire::state::{
    BatchImage, BlobsIn, BlobsOut, QueuedImage, ReplyToImage, RpcImage, StateError,
};

use super::error::RpcError;
use super::framer::{Frame, Framer};
use super::message::{
    carry_message, parse_line, resume_message, write_response, Id, Incoming, Message, ParsedLine,
    ReqNo, RpcRequest,
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

    /// The JSON-RPC id the peer gave request `req`, while it is unanswered.
    pub fn id_of(&self, req: ReqNo) -> Option<&Id> {
        match self.open.get(&req)? {
            ReplyTo::Single(id) | ReplyTo::Batch { id, .. } => Some(id),
        }
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

impl RpcSession {
    /// What an upgrade in place carries of this exchange (`wire::state::RpcImage`): the
    /// unframed input, the batch elements not handed out, the requests owed an answer and
    /// the batches being gathered, with the numbers they go by.
    pub fn carry(&self, blobs: &mut BlobsOut) -> RpcImage {
        let (unframed, scanned, discarding) = self.framer.carry();
        let reply = |to: &ReplyTo| match to {
            ReplyTo::Single(id) => ReplyToImage::Single {
                id: id.as_json().to_string(),
            },
            ReplyTo::Batch { batch, slot, id } => ReplyToImage::Batch {
                batch: *batch,
                slot: *slot,
                id: id.as_json().to_string(),
            },
        };
        let mut open: Vec<(u64, ReplyToImage)> =
            self.open.iter().map(|(r, to)| (r.0, reply(to))).collect();
        open.sort_by_key(|(r, _)| *r);
        let mut batches: Vec<BatchImage> = self
            .batches
            .iter()
            .map(|(id, b)| BatchImage {
                id: *id,
                slots: b
                    .slots
                    .iter()
                    .map(|s| s.as_ref().map(|bytes| blobs.put(bytes)))
                    .collect(),
                pending: b.pending,
                bytes: b.bytes,
                open: b.open,
            })
            .collect();
        batches.sort_by_key(|b| b.id);
        RpcImage {
            unframed: blobs.put(unframed),
            scanned,
            discarding,
            queue: self
                .queue
                .iter()
                .map(|q| match q {
                    Queued::Message { msg, batch } => QueuedImage::Message {
                        msg: carry_message(msg),
                        batch: *batch,
                    },
                    Queued::BatchEnd(b) => QueuedImage::BatchEnd(*b),
                })
                .collect(),
            open,
            next_req: self.next_req,
            batches,
            next_batch: self.next_batch,
        }
    }

    /// The exchange `carry` described, with the bounds of the daemon that resumes it.
    pub fn resume(
        img: &RpcImage,
        blobs: &BlobsIn,
        max_message: usize,
        max_batch: usize,
    ) -> Result<RpcSession, StateError> {
        let id = |text: &str| {
            Id::carried(text).ok_or_else(|| StateError::new(format!("a request id {text:?}")))
        };
        let mut open = HashMap::new();
        for (req, to) in &img.open {
            let to = match to {
                ReplyToImage::Single { id: i } => ReplyTo::Single(id(i)?),
                ReplyToImage::Batch { batch, slot, id: i } => ReplyTo::Batch {
                    batch: *batch,
                    slot: *slot,
                    id: id(i)?,
                },
            };
            open.insert(ReqNo(*req), to);
        }
        let mut batches = HashMap::new();
        for b in &img.batches {
            let slots = b
                .slots
                .iter()
                .map(|s| {
                    s.map(|blob| blobs.get(blob).map(<[u8]>::to_vec))
                        .transpose()
                })
                .collect::<Result<Vec<_>, _>>()?;
            batches.insert(
                b.id,
                Batch {
                    slots,
                    pending: b.pending,
                    bytes: b.bytes,
                    open: b.open,
                },
            );
        }
        let queue = img
            .queue
            .iter()
            .map(|q| {
                Ok(match q {
                    QueuedImage::Message { msg, batch } => Queued::Message {
                        msg: resume_message(msg)?,
                        batch: *batch,
                    },
                    QueuedImage::BatchEnd(b) => Queued::BatchEnd(*b),
                })
            })
            .collect::<Result<VecDeque<_>, StateError>>()?;
        Ok(RpcSession {
            framer: Framer::resume(
                max_message,
                blobs.get(img.unframed)?,
                img.scanned,
                img.discarding,
            ),
            max_message,
            max_batch,
            queue,
            open,
            next_req: img.next_req,
            batches,
            next_batch: img.next_batch,
        })
    }
}

#[cfg(test)]
mod tests {
    //! One connection's exchange as a client sees it, with no daemon behind it: lines in,
    //! answers out. A stand-in for the methods answers `nope` with `-32601` and any other
    //! method with `{"method": NAME}`; `park` stays unanswered until told.
    use super::*;
    use serde_json::json;

    const ROOM: Room = Room {
        owed: 0,
        cap: 1 << 20,
    };

    struct StandIn {
        s: RpcSession,
        out: Vec<u8>,
        /// Requests the stand-in left parked, oldest first.
        parked: Vec<ReqNo>,
        /// Notifications carried out, by method.
        notified: Vec<String>,
    }

    impl StandIn {
        fn new(max_batch: usize) -> StandIn {
            StandIn {
                s: RpcSession::new(512, max_batch),
                out: Vec::new(),
                parked: Vec::new(),
                notified: Vec::new(),
            }
        }

        /// Sends `text` and carries out what it asks; returns every message answered.
        fn send(&mut self, text: &str) -> Vec<Value> {
            self.s.push(text.as_bytes());
            while let Some(incoming) = self.s.next(&mut self.out, ROOM) {
                match incoming {
                    Incoming::Request {
                        req: Some(req),
                        method,
                        ..
                    } => match method.as_str() {
                        "park" => self.parked.push(req),
                        "nope" | "" => self.s.answer(
                            req,
                            &Err(RpcError::method_not_found(&method)),
                            &mut self.out,
                        ),
                        _ => self
                            .s
                            .answer(req, &Ok(json!({ "method": method })), &mut self.out),
                    },
                    Incoming::Request {
                        req: None, method, ..
                    } => self.notified.push(method),
                    Incoming::Cancel(req) => {
                        self.parked.retain(|r| *r != req);
                        self.s
                            .answer(req, &Err(RpcError::cancelled()), &mut self.out);
                    }
                    Incoming::Response { .. } => {}
                }
            }
            self.answers()
        }

        /// Answers the oldest parked request.
        fn unpark(&mut self) -> Vec<Value> {
            let req = self.parked.remove(0);
            self.s.answer(req, &Ok(json!("late")), &mut self.out);
            self.answers()
        }

        fn answers(&mut self) -> Vec<Value> {
            let text = String::from_utf8(std::mem::take(&mut self.out)).unwrap();
            assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
            text.lines()
                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                .collect()
        }
    }

    fn error(m: &Value) -> (i64, &Value) {
        assert_eq!(m["jsonrpc"], "2.0", "{m}");
        (m["error"]["code"].as_i64().unwrap(), &m["id"])
    }

    #[test]
    fn bad_messages_get_their_error_codes_and_the_connection_goes_on() {
        let mut p = StandIn::new(10);
        for bad in [
            "{nope\n",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\n",
            "]\n",
            "\u{7f}\n",
        ] {
            let a = p.send(bad);
            assert_eq!(a.len(), 1, "{bad:?}");
            assert_eq!(error(&a[0]), (-32700, &Value::Null), "{bad:?}");
        }
        for (line, id) in [
            (r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#, json!(1)),
            (r#"{"id":2,"method":"m"}"#, json!(2)),
            (r#"{"jsonrpc":2.0,"id":3,"method":"m"}"#, json!(3)),
            (r#"{"jsonrpc":"2.0","id":4,"method":7}"#, json!(4)),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"m","params":"x"}"#,
                json!(5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"m","params":5}"#,
                json!(5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"m","params":true}"#,
                json!(5),
            ),
            ("42", Value::Null),
        ] {
            let a = p.send(&format!("{line}\n"));
            assert_eq!(error(&a[0]), (-32600, &id), "{line}");
        }
        // By position (an array): invalid params, naming them.
        for params in ["[]", "[1,2]"] {
            let a = p.send(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"m\",\"params\":{params}}}\n"
            ));
            assert_eq!(error(&a[0]), (-32602, &json!(5)));
            assert_eq!(a[0]["error"]["data"]["field"], "params");
        }
        // Too long (the session's limit is 512 bytes): refused once, then usable.
        let long = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"{}\"}}\n",
            "m".repeat(600)
        );
        let a = p.send(&long);
        assert_eq!(error(&a[0]), (-32600, &Value::Null));
        assert_eq!(a[0]["error"]["data"], json!({ "limit": 512 }));
        let a = p.send("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"m\"}\n");
        assert_eq!(a[0]["result"], json!({"method": "m"}));
        assert!(p.s.idle());
    }

    #[test]
    fn ids_are_echoed_exactly_with_their_type() {
        let mut p = StandIn::new(10);
        for id in [
            r#""abc""#,
            r#""7""#,
            "7",
            "0",
            "-3",
            r#""""#,
            "9007199254740993",
            "123456789012345678901234567890",
            r#""ü €""#,
            "null",
        ] {
            p.s.push(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"m\"}}\n").as_bytes());
            let Some(Incoming::Request { req: Some(req), .. }) = p.s.next(&mut p.out, ROOM) else {
                panic!("{id}: not a request");
            };
            p.s.answer(req, &Ok(json!(1)), &mut p.out);
            let text = String::from_utf8(std::mem::take(&mut p.out)).unwrap();
            assert_eq!(
                text,
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":1}}\n")
            );
        }
        // The id of a failed request is echoed the same way.
        let a = p.send("{\"jsonrpc\":\"2.0\",\"id\":\"e1\",\"method\":\"nope\"}\n");
        assert_eq!(error(&a[0]), (-32601, &json!("e1")));
    }

    #[test]
    fn notifications_are_carried_out_and_never_answered() {
        let mut p = StandIn::new(10);
        assert!(p
            .send("{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n")
            .is_empty());
        assert!(p
            .send("{\"jsonrpc\":\"2.0\",\"method\":\"nope\"}\n")
            .is_empty());
        assert_eq!(p.notified, ["m", "nope"]);
    }

    #[test]
    fn batches_answer_once_in_one_array_with_bad_elements_in_place() {
        let mut p = StandIn::new(10);
        let a = p.send("[]\n");
        assert_eq!(error(&a[0]), (-32600, &Value::Null));
        let batch = json!([
            {"jsonrpc": "2.0", "id": "a", "method": "m"},
            {"jsonrpc": "2.0", "method": "told"},
            {"jsonrpc": "2.0", "id": 2, "method": "nope"},
            1,
        ]);
        let a = p.send(&format!("{batch}\n"));
        assert_eq!(a.len(), 1, "one reply");
        let items = a[0].as_array().expect("an array");
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(items[0]["result"], json!({"method": "m"}));
        assert_eq!(error(&items[1]), (-32601, &json!(2)));
        assert_eq!(error(&items[2]), (-32600, &Value::Null));
        assert_eq!(p.notified, ["told"]);
        // Notifications only: no reply at all.
        assert!(p
            .send("[{\"jsonrpc\":\"2.0\",\"method\":\"m\"}]\n")
            .is_empty());
        // Over --max-batch: refused whole, nothing in it runs.
        let big: Vec<Value> = (0..11)
            .map(|i| json!({"jsonrpc": "2.0", "method": "counted", "id": i}))
            .collect();
        let a = p.send(&format!("{}\n", json!(big)));
        assert_eq!(error(&a[0]), (-32600, &Value::Null));
        assert_eq!(p.notified.len(), 2);
    }

    #[test]
    fn a_batch_with_a_parked_element_waits_for_it_and_single_requests_do_not() {
        let mut p = StandIn::new(10);
        let a = p.send(
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"park\"},{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"m\"}]\n",
        );
        assert!(a.is_empty(), "the batch waits for its parked element");
        // A later single request is answered at once, ahead of the batch.
        let a = p.send("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"m\"}\n");
        assert_eq!(a[0]["id"], 3);
        let a = p.unpark();
        let items = a[0].as_array().expect("an array");
        assert_eq!(
            (items[0]["id"].clone(), items[0]["result"].clone()),
            (json!(1), json!("late"))
        );
        assert_eq!(items[1]["id"], 2);
        assert!(p.s.idle());
    }

    #[test]
    fn cancel_request_ends_a_parked_request_of_the_same_connection() {
        let mut p = StandIn::new(10);
        assert!(p
            .send("{\"jsonrpc\":\"2.0\",\"id\":\"w\",\"method\":\"park\"}\n")
            .is_empty());
        // A cancel naming an id nobody has is ignored.
        assert!(p
            .send("{\"jsonrpc\":\"2.0\",\"method\":\"$/cancel_request\",\"params\":{\"requestId\":\"x\"}}\n")
            .is_empty());
        let a = p.send(
            "{\"jsonrpc\":\"2.0\",\"method\":\"$/cancel_request\",\"params\":{\"requestId\":\"w\"}}\n",
        );
        assert_eq!(error(&a[0]), (-32800, &json!("w")));
        assert!(p.parked.is_empty() && p.s.idle());
    }

    #[test]
    fn crlf_blank_lines_and_a_last_line_without_newline_are_taken() {
        let mut p = StandIn::new(10);
        let a = p.send("\r\n\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"}\r\n  \n");
        assert_eq!(a.len(), 1);
        assert_eq!(a[0]["id"], 1);
        p.s.push(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"m\"}");
        assert!(p.s.next(&mut p.out, ROOM).is_none(), "not a whole line yet");
        p.s.end_of_input();
        assert!(p.send("").iter().any(|m| m["id"] == 2));
    }

    #[test]
    fn a_full_outgoing_buffer_holds_back_new_lines() {
        let mut s = RpcSession::new(1 << 10, 10);
        let mut out = Vec::new();
        s.push(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"}\n");
        let full = Room {
            owed: 100,
            cap: 100,
        };
        assert!(s.next(&mut out, full).is_none());
        assert!(s.next(&mut out, ROOM).is_some(), "read once there is room");
    }

    /// Carries `s` the way an upgrade does: to its image, through the encoded document and
    /// the blob area, and back.
    fn through_upgrade(s: &RpcSession) -> RpcSession {
        let mut blobs = BlobsOut::default();
        let img = s.carry(&mut blobs);
        let json = serde_json::to_vec(&img).unwrap();
        let read: RpcImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, img);
        let area = blobs.bytes().to_vec();
        let back = RpcSession::resume(&read, &BlobsIn(&area), 512, 10).unwrap();
        let mut again = BlobsOut::default();
        assert_eq!(back.carry(&mut again), img, "carried again, it is the same");
        assert_eq!(again.bytes(), blobs.bytes());
        back
    }

    #[test]
    fn an_exchange_carried_by_an_upgrade_goes_on_as_if_nothing_happened() {
        let mut p = StandIn::new(10);
        // One request parked, a batch with one element answered and one parked, half a
        // line, and a batch read but not handed out (the room is full).
        p.send(r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"park"}"#);
        p.send("\n");
        p.send(r#"[{"jsonrpc":"2.0","id":"a","method":"x"},{"jsonrpc":"2.0","id":"b","method":"park"}]"#);
        p.send("\n");
        assert_eq!(p.parked.len(), 2);
        p.s.push(br#"[{"jsonrpc":"2.0","id":1,"method":"y"},{"jsonrpc":"2.0","method":"n"}]"#);
        p.s.push(b"\n");
        let full = Room { owed: 10, cap: 10 };
        // The line is framed, its elements wait in the queue for room.
        assert!(p.s.next(&mut p.out, full).is_none());
        p.s.push(br#"{"jsonrpc":"2.0","id":"half","meth"#);
        assert!(p.answers().is_empty());
        let mut q = StandIn {
            s: through_upgrade(&p.s),
            out: Vec::new(),
            parked: p.parked.clone(),
            notified: Vec::new(),
        };
        // Both go on alike: the rest of the half line, the queued batch, the parked ones.
        for peer in [&mut p, &mut q] {
            let mut seen = peer.send("od\":\"z\"}\n");
            seen.extend(peer.unpark());
            seen.extend(peer.unpark());
            assert_eq!(
                seen,
                vec![
                    json!([{"jsonrpc":"2.0","id":1,"result":{"method":"y"}}]),
                    json!({"jsonrpc":"2.0","id":"half","result":{"method":"z"}}),
                    serde_json::from_str::<Value>(
                        r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"result":"late"}"#
                    )
                    .unwrap(),
                    json!([{"jsonrpc":"2.0","id":"a","result":{"method":"x"}},
                           {"jsonrpc":"2.0","id":"b","result":"late"}]),
                ]
            );
            assert_eq!(peer.notified, vec!["n"]);
            assert!(peer.s.idle());
        }
    }
}
