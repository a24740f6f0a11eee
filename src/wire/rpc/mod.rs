//! JSON-RPC 2.0 over newline-delimited JSON: framing, message parsing, error codes, typed
//! access to params, and response encoding. Pure: no I/O, no clock.
//!
//! Framing (`Framer`): one message per line, `\r\n` accepted, blank lines ignored. A line
//! longer than the limit is discarded up to its newline and reported once as `TooLong`, so
//! the connection stays usable and the buffer never holds more than the limit plus one read.

use std::collections::{HashMap, VecDeque};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// Parse error: the line is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a JSON-RPC 2.0 request, message too large, or an empty batch.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Wrong type or missing required field; `data` names the field.
pub const INVALID_PARAMS: i64 = -32602;
/// A bug in execd: logged with context.
pub const INTERNAL_ERROR: i64 = -32603;
/// The target is in the wrong state for this request.
pub const INVALID_STATE: i64 = -32000;
/// Unknown or foreign terminal, session or command id.
pub const NOT_FOUND: i64 = -32002;
/// A configured limit was reached; `data` names it and its value.
pub const LIMIT_REACHED: i64 = -32003;
/// The command could not be started; the message carries the OS error.
pub const SPAWN_FAILED: i64 = -32004;
/// The policy denies the command; `data` names the rule.
pub const DENIED: i64 = -32005;
/// An approver rejected the command, or none answered; `data` says which.
pub const NOT_APPROVED: i64 = -32006;
/// The daemon is shutting down.
pub const SHUTTING_DOWN: i64 = -32007;
/// The client cancelled the request (`$/cancel_request`).
pub const REQUEST_CANCELLED: i64 = -32800;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    pub fn parse_error(detail: &str) -> RpcError {
        RpcError::new(PARSE_ERROR, format!("parse error: {detail}"))
    }

    pub fn invalid_request(why: &str) -> RpcError {
        RpcError::new(INVALID_REQUEST, format!("invalid request: {why}"))
    }

    pub fn too_long(limit: usize) -> RpcError {
        RpcError::new(INVALID_REQUEST, "message too large").with_data(json!({ "limit": limit }))
    }

    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(METHOD_NOT_FOUND, format!("method not found: {method}"))
    }

    pub fn invalid_params(field: &str, reason: impl Into<String>) -> RpcError {
        let reason = reason.into();
        RpcError::new(INVALID_PARAMS, format!("invalid params: {field}: {reason}"))
            .with_data(json!({ "field": field, "reason": reason }))
    }

    pub fn internal(what: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, format!("internal error: {}", what.into()))
    }

    pub fn invalid_state(what: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_STATE, what)
    }

    pub fn not_found(kind: &str, id: &str) -> RpcError {
        RpcError::new(NOT_FOUND, format!("{kind} not found: {id}"))
    }

    pub fn limit(name: &str, value: impl Into<Value>) -> RpcError {
        RpcError::new(LIMIT_REACHED, format!("limit reached: {name}"))
            .with_data(json!({ "limit": name, "value": value.into() }))
    }

    /// A command that could not be started: the OS error's text, and in `data` the
    /// program and the errno's name (`ENOENT` is "not found", `EACCES` "not executable").
    pub fn spawn_failed(program: &str, err: &std::io::Error) -> RpcError {
        let errno = err
            .raw_os_error()
            .map_or_else(|| "EINVAL".to_string(), crate::types::errno_name);
        RpcError::new(SPAWN_FAILED, os_error_text(err))
            .with_data(json!({ "program": program, "errno": errno }))
    }

    pub fn shutting_down() -> RpcError {
        RpcError::new(SHUTTING_DOWN, "server shutting down")
    }

    pub fn denied(rule: &str, justification: Option<&str>) -> RpcError {
        let mut data = json!({ "rule": rule });
        if let Some(j) = justification {
            data["justification"] = j.into();
        }
        let why = justification.map_or(String::new(), |j| format!(": {j}"));
        RpcError::new(DENIED, format!("denied by policy rule {rule}{why}")).with_data(data)
    }

    pub fn not_approved(rule: &str, reason: &str, feedback: Option<String>) -> RpcError {
        let mut data = json!({ "rule": rule, "reason": reason });
        let mut message = format!("not approved ({reason}; rule {rule})");
        if let Some(f) = feedback {
            message.push_str(&format!(": {f}"));
            data["feedback"] = f.into();
        }
        RpcError::new(NOT_APPROVED, message).with_data(data)
    }

    pub fn cancelled() -> RpcError {
        RpcError::new(REQUEST_CANCELLED, "request cancelled")
    }

    fn to_value(&self) -> Value {
        let mut e = Map::new();
        e.insert("code".into(), self.code.into());
        e.insert("message".into(), self.message.clone().into());
        if let Some(d) = &self.data {
            e.insert("data".into(), d.clone());
        }
        Value::Object(e)
    }
}

/// The OS error text alone ("No such file or directory"), without Rust's "(os error N)".
pub fn os_error_text(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// A request id exactly as the client wrote it: the JSON text of a string, a number or
/// `null`. Kept as text so that it is echoed byte for byte (a 30-digit number stays those
/// digits; parsing it would round it to a float).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id(String);

impl Id {
    pub fn null() -> Id {
        Id("null".into())
    }

    /// An id of our own making (a number or string value).
    pub fn from_value(v: &Value) -> Id {
        Id(v.to_string())
    }

    /// The id as JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// The id parsed (for display and matching; a huge number loses digits here).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// A usable id from raw JSON text: a string, a number, or null. `None` for any other
    /// JSON value (an object, an array, a boolean).
    fn from_raw(raw: &RawValue) -> Option<Id> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"' | b'-' | b'0'..=b'9') => Some(Id(text.to_string())),
            Some(b'n') => Some(Id::null()),
            _ => None,
        }
    }
}

/// The number a connection gave a request it handed to the loop, to be answered by: the
/// core carries it back untouched, and the connection turns it into an id, a batch slot
/// or an HTTP response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqNo(pub u64);

/// One parsed element of what a client sent.
#[derive(Debug, PartialEq)]
pub enum Message {
    /// A request (with `id`) or a notification (`id` absent).
    Request(Request),
    /// A response from the client to a request the server sent (approvals).
    Response {
        id: Id,
        result: Result<Value, Value>,
    },
    /// Well-formed JSON that is not a valid message; answered with `error` under `id`.
    Invalid { id: Id, error: RpcError },
}

/// A request or notification.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// `None` for a notification, which is never answered.
    pub id: Option<Id>,
    pub method: String,
    /// Always an object (absent and `null` params become `{}`).
    pub params: Map<String, Value>,
}

/// What one line holds.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Single(Message),
    Batch(Vec<Message>),
    /// Not JSON, an empty batch, or one over the limit: answered once with `id: null`.
    Error(RpcError),
}

/// Collects a batch's elements without parsing them, refusing more than `max` as soon as
/// the element after the last allowed one is seen (so a huge batch costs nothing more).
struct BatchSeed<'a> {
    max: usize,
    too_many: &'a std::cell::Cell<bool>,
}

impl<'de> serde::de::DeserializeSeed<'de> for BatchSeed<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for BatchSeed<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a batch of requests")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&RawValue>()? {
            if items.len() == self.max {
                self.too_many.set(true);
                return Err(serde::de::Error::custom("batch too large"));
            }
            items.push(item);
        }
        Ok(items)
    }
}

/// Parses one line (without its terminator). A batch of more than `max_batch` elements
/// is refused whole.
pub fn parse_line(line: &[u8], max_batch: usize) -> Parsed {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => return Parsed::Error(RpcError::parse_error(&e.to_string())),
    };
    if !text.trim_start().starts_with('[') {
        return match serde_json::from_str::<&RawValue>(text) {
            Ok(raw) => Parsed::Single(parse_message(raw)),
            Err(e) => Parsed::Error(RpcError::parse_error(&e.to_string())),
        };
    }
    use serde::de::DeserializeSeed;
    let too_many = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(text);
    let items = BatchSeed {
        max: max_batch,
        too_many: &too_many,
    }
    .deserialize(&mut de)
    .and_then(|items| de.end().map(|()| items));
    match items {
        Ok(items) if items.is_empty() => Parsed::Error(RpcError::invalid_request("empty batch")),
        Ok(items) => Parsed::Batch(items.into_iter().map(parse_message).collect()),
        Err(_) if too_many.get() => Parsed::Error(
            RpcError::new(
                INVALID_REQUEST,
                format!("invalid request: a batch may hold at most {max_batch} messages"),
            )
            .with_data(json!({ "limit": "max-batch", "value": max_batch })),
        ),
        Err(e) => Parsed::Error(RpcError::parse_error(&e.to_string())),
    }
}

fn parse_message(raw: &RawValue) -> Message {
    use std::collections::BTreeMap;
    let Ok(mut obj) = serde_json::from_str::<BTreeMap<String, &RawValue>>(raw.get()) else {
        return Message::Invalid {
            id: Id::null(),
            error: RpcError::invalid_request("a message must be a JSON object"),
        };
    };
    let value = |r: &RawValue| serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null);
    let id = obj.remove("id");
    let usable_id = id.and_then(Id::from_raw);
    let echo_id = usable_id.clone().unwrap_or_else(Id::null);
    let invalid = |why: &str| Message::Invalid {
        id: echo_id.clone(),
        error: RpcError::invalid_request(why),
    };
    if obj.get("jsonrpc").map(|r| r.get()) != Some("\"2.0\"") {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    if id.is_some() && usable_id.is_none() {
        return invalid("\"id\" must be a string, a number or null");
    }
    match obj.remove("method").map(value) {
        Some(Value::String(method)) => {
            let params = match obj.remove("params").map(value) {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m,
                Some(Value::Array(_)) => {
                    return Message::Invalid {
                        id: echo_id,
                        error: RpcError::invalid_params(
                            "params",
                            "by-position params (an array) are not supported; pass an object",
                        ),
                    };
                }
                Some(_) => return invalid("\"params\" must be an object"),
            };
            Message::Request(Request {
                id: usable_id,
                method,
                params,
            })
        }
        Some(_) => invalid("\"method\" must be a string"),
        None => {
            let result = match (obj.remove("result"), obj.remove("error")) {
                (Some(r), None) => Ok(value(r)),
                (None, Some(e)) => Err(value(e)),
                _ => return invalid("missing \"method\""),
            };
            Message::Response {
                id: echo_id,
                result,
            }
        }
    }
}

/// What a peer sent that the loop must act on, whatever its protocol.
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
pub struct Session {
    framer: Framer,
    max_message: usize,
    max_batch: usize,
    queue: VecDeque<Queued>,
    open: HashMap<ReqNo, Pending>,
    next_req: u64,
    batches: HashMap<u64, Batch>,
    next_batch: u64,
}

impl Session {
    pub fn new(max_message: usize, max_batch: usize) -> Session {
        Session {
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
                    self.answer_to(Pending::Single(Id::null()), &Err(e), out);
                    continue;
                }
                Frame::Line(line) => line,
            };
            match parse_line(&line, self.max_batch) {
                Parsed::Error(e) => self.answer_to(Pending::Single(Id::null()), &Err(e), out),
                Parsed::Single(msg) => {
                    if let Some(incoming) = self.admit(msg, None, owed, room.cap, out) {
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

    /// Whether a read-ahead batch is still being handed out (the caller keeps asking even
    /// while its buffer is full).
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
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

    /// Answers request `req` into `out`. An unknown number (answered already) is ignored.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        if let Some(to) = self.open.remove(&req) {
            self.answer_to(to, result, out);
        }
    }

    fn answer_to(&mut self, to: Pending, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        match to {
            Pending::Single(id) => {
                write_response(out, &id, result);
                out.push(b'\n');
            }
            Pending::Batch { batch, slot, id } => {
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

/// Encodes a response line (with its `\n`) for `id`.
pub fn encode_response(id: &Id, result: &Result<Value, RpcError>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_response(&mut out, id, result);
    out.push(b'\n');
    out
}

/// Appends one response object (no newline) to `out`.
pub fn write_response(out: &mut Vec<u8>, id: &Id, result: &Result<Value, RpcError>) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_json().as_bytes());
    match result {
        Ok(v) => {
            out.extend_from_slice(b",\"result\":");
            write_json(out, v);
        }
        Err(e) => {
            out.extend_from_slice(b",\"error\":");
            write_json(out, &e.to_value());
        }
    }
    out.push(b'}');
}

/// Appends `value` as compact JSON. Writing to a `Vec` cannot fail and a `Value` always
/// serializes, so there is no error to report.
pub fn write_json(out: &mut Vec<u8>, value: &Value) {
    let _ = serde_json::to_writer(out, value);
}

/// Appends the start of a Wire `event` notification of type `kind`, up to its payload.
pub fn write_event_head(out: &mut Vec<u8>, kind: &str) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"payload\":");
}

/// Appends a whole Wire `event` notification with a JSON payload.
pub fn write_event(out: &mut Vec<u8>, kind: &str, payload: &Value) {
    write_event_head(out, kind);
    write_json(out, payload);
    out.extend_from_slice(b"}}\n");
}

/// Appends `s` as a JSON string literal, with the same escapes serde_json writes.
///
/// This is the hot path of output events (every byte a command prints passes here), so
/// it skips eight bytes at a time over runs that need no escape and copies each run whole.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0; // start of the bytes not yet copied
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            if !needs_escape(word) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[run..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
                i += 1;
                run = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(escape);
        i += 1;
        run = i;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether any of the eight bytes in `w` is a control character, a quote or a backslash
/// (the classic "has a byte less than n" and "has a zero byte" bit tricks).
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    below_space | zero_byte(w ^ (ONES * u64::from(b'"'))) | zero_byte(w ^ (ONES * u64::from(b'\\')))
        != 0
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends the standard base64 (with padding) of `bytes`. Output events of base64
/// subscriptions are encoded here, so it works on whole groups of three at a time.
/// (Written here rather than taken from a crate: encoding and decoding are the whole
/// need, a few dozen lines, tested against the RFC 4648 vectors below.)
pub fn base64_encode(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len().div_ceil(3) * 4);
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        out.extend_from_slice(&[
            BASE64[(n >> 18) as usize & 63],
            BASE64[(n >> 12) as usize & 63],
            BASE64[(n >> 6) as usize & 63],
            BASE64[n as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[
                BASE64[(n >> 18) as usize & 63],
                BASE64[(n >> 12) as usize & 63],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[
                BASE64[(n >> 18) as usize & 63],
                BASE64[(n >> 12) as usize & 63],
                BASE64[(n >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

/// The value of each base64 digit, 255 for bytes that are not one.
const BASE64_VALUES: [u8; 256] = {
    let mut t = [255u8; 256];
    let mut i = 0;
    while i < 64 {
        t[BASE64[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Decodes standard base64; the padding may be left out. `None` for anything else. A
/// client of a base64 subscription decodes every byte of output here, so whole groups of
/// four go through a table with one check per group.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let body = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(bytes);
    if bytes.len() % 4 != 0 && body.len() != bytes.len() {
        return None; // padding on input whose length is not a multiple of four
    }
    if body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    let mut groups = body.chunks_exact(4);
    for g in &mut groups {
        let (a, b, c, d) = (
            BASE64_VALUES[g[0] as usize],
            BASE64_VALUES[g[1] as usize],
            BASE64_VALUES[g[2] as usize],
            BASE64_VALUES[g[3] as usize],
        );
        if (a | b | c | d) & 0xc0 != 0 {
            return None;
        }
        let n = u32::from(a) << 18 | u32::from(b) << 12 | u32::from(c) << 6 | u32::from(d);
        out.extend_from_slice(&n.to_be_bytes()[1..]);
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        let mut n = 0u32;
        for (i, &ch) in rest.iter().enumerate() {
            let v = BASE64_VALUES[ch as usize];
            if v & 0xc0 != 0 {
                return None;
            }
            n |= u32::from(v) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..rest.len()]);
    }
    Some(out)
}

/// Formats a time as RFC 3339 in UTC with millisecond precision, e.g.
/// `2026-11-21T22:23:51.123Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Typed, field-naming access to a request's params. `null` means absent everywhere.
pub struct Params<'a>(pub &'a Map<String, Value>);

impl<'a> Params<'a> {
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    pub fn str(&self, field: &str) -> Result<&'a str, RpcError> {
        self.opt_str(field)?
            .ok_or_else(|| RpcError::invalid_params(field, "required"))
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(RpcError::invalid_params(field, "expected a string")),
        }
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(RpcError::invalid_params(field, "expected a boolean")),
        }
    }

    pub fn opt_u64(&self, field: &str) -> Result<Option<u64>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| RpcError::invalid_params(field, "expected a non-negative integer")),
        }
    }

    /// A non-negative number of seconds (integer or fraction).
    pub fn opt_seconds(&self, field: &str) -> Result<Option<f64>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(s) if s >= 0.0 && s.is_finite() && s <= 1e9 => Ok(Some(s)),
                _ => Err(RpcError::invalid_params(
                    field,
                    "expected a non-negative number of seconds",
                )),
            },
        }
    }

    pub fn opt_str_array(&self, field: &str) -> Result<Option<Vec<&'a str>>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| RpcError::invalid_params(field, "expected strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(RpcError::invalid_params(field, "expected an array")),
        }
    }

    pub fn opt_object(&self, field: &str) -> Result<Option<&'a Map<String, Value>>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(RpcError::invalid_params(field, "expected an object")),
        }
    }

    pub fn opt_value(&self, field: &str) -> Option<&'a Value> {
        self.get(field)
    }
}

/// One frame cut from a connection's byte stream.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A complete, non-blank line without its terminator.
    Line(Vec<u8>),
    /// A line longer than the limit was discarded.
    TooLong,
}

/// Cuts a byte stream into lines, bounded by `max` bytes a line.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as frames.
    consumed: usize,
    /// Bytes of `buf` after `consumed` already searched for `\n` without finding one.
    scanned: usize,
    max: usize,
    /// Discarding an overlong line until its newline.
    discarding: bool,
}

impl Framer {
    pub fn new(max: usize) -> Framer {
        Framer {
            buf: Vec::new(),
            consumed: 0,
            scanned: 0,
            max,
            discarding: false,
        }
    }

    /// Bytes buffered and not yet framed.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.consumed
    }

    /// Appends bytes read from the peer.
    pub fn push(&mut self, data: &[u8]) {
        if self.consumed > 0 && self.consumed == self.buf.len() {
            self.buf.clear();
            self.consumed = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next frame, if a whole one is buffered (or an overlong line was detected).
    pub fn next_frame(&mut self) -> Option<Frame> {
        loop {
            let unread = &self.buf[self.consumed..];
            let newline = unread[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| i + self.scanned);
            match newline {
                None => {
                    self.scanned = unread.len();
                    if self.discarding {
                        self.drop_consumed_all();
                        return None;
                    }
                    if unread.len() > self.max {
                        self.discarding = true;
                        self.drop_consumed_all();
                        return Some(Frame::TooLong);
                    }
                    self.compact();
                    return None;
                }
                Some(nl) => {
                    let start = self.consumed;
                    self.consumed += nl + 1;
                    self.scanned = 0;
                    if self.discarding {
                        self.discarding = false;
                        continue;
                    }
                    let mut line = &self.buf[start..start + nl];
                    if line.last() == Some(&b'\r') {
                        line = &line[..line.len() - 1];
                    }
                    if line.len() > self.max {
                        return Some(Frame::TooLong);
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Some(Frame::Line(line.to_vec()));
                }
            }
        }
    }

    fn drop_consumed_all(&mut self) {
        self.buf.clear();
        self.consumed = 0;
        self.scanned = 0;
        self.release_memory();
    }

    /// Moves the unframed tail to the front so the buffer does not creep.
    fn compact(&mut self) {
        if self.consumed > 0 {
            self.buf.drain(..self.consumed);
            self.consumed = 0;
        }
        self.release_memory();
    }

    /// Gives back what a burst (a huge line, many lines at once) needed once the buffer is
    /// empty again: an idle connection keeps only a small buffer.
    fn release_memory(&mut self) {
        const KEEP: usize = 64 << 10;
        if self.buf.is_empty() && self.buf.capacity() > KEEP {
            self.buf.shrink_to(KEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(f: &mut Framer) -> Vec<Frame> {
        std::iter::from_fn(|| f.next_frame()).collect()
    }

    #[test]
    fn lines_split_across_reads() {
        let mut f = Framer::new(100);
        f.push(b"{\"a\"");
        assert_eq!(frames(&mut f), vec![]);
        f.push(b":1}\n{\"b\":2}\n{\"c\"");
        assert_eq!(
            frames(&mut f),
            vec![
                Frame::Line(b"{\"a\":1}".to_vec()),
                Frame::Line(b"{\"b\":2}".to_vec())
            ]
        );
        f.push(b":3}\r\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"{\"c\":3}".to_vec())]);
        assert_eq!(f.pending(), 0);
    }

    #[test]
    fn crlf_and_blank_lines() {
        let mut f = Framer::new(100);
        f.push(b"\n\r\n   \nx\r\n\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"x".to_vec())]);
    }

    #[test]
    fn huge_line_is_discarded_and_the_next_one_works() {
        let mut f = Framer::new(10);
        f.push(b"0123456789ABCDEF");
        assert_eq!(frames(&mut f), vec![Frame::TooLong]);
        assert!(f.pending() == 0, "an overlong line is not kept");
        f.push(&[b'z'; 1000]);
        assert_eq!(frames(&mut f), vec![]);
        assert_eq!(f.pending(), 0);
        f.push(b"tail\nok\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"ok".to_vec())]);
    }

    #[test]
    fn huge_line_arriving_whole_is_reported_once() {
        let mut f = Framer::new(4);
        f.push(b"123456\nab\n");
        assert_eq!(
            frames(&mut f),
            vec![Frame::TooLong, Frame::Line(b"ab".to_vec())]
        );
        // Exactly at the limit is fine.
        f.push(b"1234\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"1234".to_vec())]);
    }

    #[test]
    fn parses_requests_and_notifications() {
        let p = parse_line(
            br#"{"jsonrpc":"2.0","id":7,"method":"m","params":{"x":1}}"#,
            10,
        );
        let Parsed::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id, Some(Id("7".into())));
        assert_eq!(r.method, "m");
        assert_eq!(r.params["x"], 1);
        let p = parse_line(br#"{"jsonrpc":"2.0","method":"n"}"#, 10);
        let Parsed::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id, None);
        assert!(r.params.is_empty());
        let p = parse_line(
            br#"{"jsonrpc":"2.0","id":"s","method":"m","params":null}"#,
            10,
        );
        let Parsed::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id.unwrap().to_value(), json!("s"));
    }

    #[test]
    fn rejects_what_is_not_a_request() {
        assert!(matches!(
            parse_line(b"{nope", 10),
            Parsed::Error(RpcError {
                code: PARSE_ERROR,
                ..
            })
        ));
        assert!(matches!(
            parse_line(b"[]", 10),
            Parsed::Error(RpcError {
                code: INVALID_REQUEST,
                ..
            })
        ));
        for bad in [
            &br#"{"id":1,"method":"m"}"#[..],
            br#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
            b"42",
        ] {
            let Parsed::Single(Message::Invalid { error, .. }) = parse_line(bad, 10) else {
                panic!("{}", String::from_utf8_lossy(bad))
            };
            assert_eq!(error.code, INVALID_REQUEST);
        }
        // The id is echoed when it is usable.
        let Parsed::Single(Message::Invalid { id, .. }) =
            parse_line(br#"{"jsonrpc":"1.0","id":"k","method":"m"}"#, 10)
        else {
            panic!()
        };
        assert_eq!(id.as_json(), "\"k\"");
        let Parsed::Single(Message::Invalid { id, .. }) =
            parse_line(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"m"}"#, 10)
        else {
            panic!()
        };
        assert_eq!(id, Id::null());
    }

    #[test]
    fn ids_are_echoed_exactly_as_sent() {
        let line = br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}"#;
        let Parsed::Single(Message::Request(r)) = parse_line(line, 10) else {
            panic!()
        };
        let id = r.id.unwrap();
        let out = encode_response(&id, &Ok(json!({})));
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains(r#""id":123456789012345678901234567890,"#),
            "the id keeps its digits"
        );
        let line = br#"{"jsonrpc":"2.0","id":"a\u00e9b","method":"m"}"#;
        let Parsed::Single(Message::Request(r)) = parse_line(line, 10) else {
            panic!()
        };
        assert_eq!(r.id.unwrap().as_json(), r#""a\u00e9b""#);
    }

    #[test]
    fn params_by_position_are_invalid_params() {
        let line = br#"{"jsonrpc":"2.0","id":4,"method":"m","params":[1,2]}"#;
        let Parsed::Single(Message::Invalid { id, error }) = parse_line(line, 10) else {
            panic!()
        };
        assert_eq!(id.as_json(), "4");
        assert_eq!(error.code, INVALID_PARAMS);
        assert_eq!(error.data.unwrap()["field"], "params");
    }

    #[test]
    fn a_batch_over_the_limit_is_refused_whole() {
        let big = format!("[{}1]", "1,".repeat(1000));
        let Parsed::Error(e) = parse_line(big.as_bytes(), 1000) else {
            panic!()
        };
        assert_eq!(e.code, INVALID_REQUEST);
        assert_eq!(e.data.unwrap()["value"], 1000);
        let ok = format!("[{}1]", "1,".repeat(999));
        let Parsed::Batch(items) = parse_line(ok.as_bytes(), 1000) else {
            panic!()
        };
        assert_eq!(items.len(), 1000);
        // Broken JSON after the limit is still "too large", not a parse error.
        let Parsed::Error(e) = parse_line(b"[1,1,1,{", 2) else {
            panic!()
        };
        assert_eq!(e.code, INVALID_REQUEST);
        let Parsed::Error(e) = parse_line(b"[1,{", 5) else {
            panic!()
        };
        assert_eq!(e.code, PARSE_ERROR);
    }

    #[test]
    fn batches_keep_order_and_mark_bad_elements() {
        let Parsed::Batch(items) = parse_line(
            br#"[{"jsonrpc":"2.0","id":1,"method":"a"},5,{"jsonrpc":"2.0","method":"n"}]"#,
            10,
        ) else {
            panic!()
        };
        assert_eq!(items.len(), 3);
        assert!(matches!(&items[0], Message::Request(r) if r.method == "a"));
        assert!(matches!(&items[1], Message::Invalid { .. }));
        assert!(matches!(&items[2], Message::Request(r) if r.id.is_none()));
    }

    #[test]
    fn parses_client_responses() {
        let p = parse_line(br#"{"jsonrpc":"2.0","id":"r1","result":{"ok":true}}"#, 10);
        assert!(matches!(
            p,
            Parsed::Single(Message::Response { result: Ok(_), .. })
        ));
    }

    #[test]
    fn encodes_responses_compactly() {
        let line = encode_response(&Id::from_value(&json!("a")), &Ok(json!({"x": 1})));
        assert_eq!(
            line,
            b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{\"x\":1}}\n"
        );
        let line = encode_response(
            &Id::from_value(&json!(3)),
            &Err(RpcError::invalid_params("cwd", "not absolute")),
        );
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["error"]["code"], INVALID_PARAMS);
        assert_eq!(
            v["error"]["data"],
            json!({"field": "cwd", "reason": "not absolute"})
        );
        assert_eq!(v["id"], 3);
    }

    #[test]
    fn params_name_the_bad_field() {
        let m = json!({"s": "x", "n": -1, "b": "yes", "a": ["x", 1], "z": null});
        let p = Params(m.as_object().unwrap());
        assert_eq!(p.str("s").unwrap(), "x");
        assert_eq!(
            p.str("missing").unwrap_err().data,
            Some(json!({"field": "missing", "reason": "required"}))
        );
        assert_eq!(p.opt_str("z").unwrap(), None);
        assert_eq!(p.opt_u64("n").unwrap_err().code, INVALID_PARAMS);
        assert_eq!(p.opt_bool("b").unwrap_err().data.unwrap()["field"], "b");
        assert!(p.opt_str_array("a").is_err());
        assert_eq!(p.opt_seconds("n").unwrap_err().code, INVALID_PARAMS);
    }

    /// The fast escaper writes exactly what serde_json writes, for every byte value in
    /// every position of a word, and for mixed text.
    #[test]
    fn json_strings_match_serde_json() {
        let mut cases: Vec<String> = (0u8..0x80)
            .flat_map(|b| {
                (0..10).map(move |pos| {
                    let mut s = "abcdefghijklmnopq".to_string().into_bytes();
                    s.insert(pos, b);
                    String::from_utf8(s).unwrap_or_default()
                })
            })
            .collect();
        cases.push(String::new());
        cases.push("\u{e9}\u{20ac}\u{1f600} \"quoted\" \\ back\tslash\r\n\u{7f}\u{1}".repeat(5));
        cases.push("the quick brown fox jumps over the lazy dog\n".repeat(100));
        for c in cases {
            let mut ours = Vec::new();
            write_json_str(&mut ours, &c);
            assert_eq!(ours, serde_json::to_vec(&c).unwrap(), "{c:?}");
        }
    }

    #[test]
    fn base64_matches_rfc_4648_and_round_trips() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, coded) in vectors {
            let mut out = Vec::new();
            base64_encode(&mut out, plain.as_bytes());
            assert_eq!(out, coded.as_bytes(), "{plain}");
            assert_eq!(base64_decode(coded).as_deref(), Some(plain.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        for n in 0..all.len() {
            let mut out = Vec::new();
            base64_encode(&mut out, &all[..n]);
            let text = String::from_utf8(out).unwrap();
            assert_eq!(base64_decode(&text).unwrap(), &all[..n]);
            assert_eq!(
                base64_decode(text.trim_end_matches('=')).unwrap(),
                &all[..n],
                "unpadded"
            );
        }
        for bad in ["Z", "Zg=", "Z===", "Zm9v!", "Zm 9v", "=Zm9"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_dates() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_782_400_250); // leap day 2000
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.250Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_299_831);
        assert_eq!(rfc3339(t), "2026-11-21T22:23:51.000Z");
    }

    #[test]
    fn spawn_errors_carry_the_os_text() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        let err = RpcError::spawn_failed("nosuch", &e);
        assert_eq!(err.message, "No such file or directory");
        assert_eq!(
            err.data,
            Some(json!({"program": "nosuch", "errno": "ENOENT"}))
        );
    }
}
