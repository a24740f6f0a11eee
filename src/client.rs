//! A small blocking client: connect, send requests, read responses and notifications with a
//! timeout. Used by `execctl`, the integration tests and the benches.
//!
//! A connection is a Unix stream: the daemon's socket, or one end of a socket pair whose
//! other end is a relay's stdin and stdout (`ssh HOST execctl dial-stdio`). A relay knows
//! more than the stream about why a connection ended (ssh's exit status and stderr), so a
//! client may carry a `Transport` that is asked when the stream ends; its words travel in
//! the `io::Error` as a `Closed`. The transport is dropped after the stream, so a relay
//! sees the end before whoever owns it waits for it.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// An error from a call: transport trouble, or a JSON-RPC error object.
#[derive(Debug)]
pub enum CallError {
    Io(io::Error),
    Rpc {
        code: i64,
        message: String,
        data: Option<Value>,
    },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Io(e) => write!(f, "{e}"),
            CallError::Rpc {
                code,
                message,
                data,
            } => {
                write!(f, "{message} ({code})")?;
                if let Some(d) = data {
                    write!(f, " {d}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CallError {}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> Self {
        CallError::Io(e)
    }
}

/// Why a connection ended, said by its transport for a person (an ssh that failed, a
/// daemon that refused the peer). It is the inner error of the `io::Error` a read or
/// write returns once the stream has ended.
#[derive(Debug)]
pub struct Closed(pub String);

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Closed {}

/// The words of a `Closed` inside an error, if it carries one.
pub fn closed_reason(e: &io::Error) -> Option<&str> {
    e.get_ref()?.downcast_ref::<Closed>().map(|c| c.0.as_str())
}

/// What carries a connection besides its stream.
pub trait Transport: Send {
    /// Why the connection ended, once its stream has: `fresh` when nothing at all was
    /// received on it. `None` when there is nothing to add to "the connection closed".
    fn why_closed(&mut self, fresh: bool) -> Option<String>;
}

/// Whether an error is a read timeout.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Whether a read or write failed because the other end is gone.
fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

impl CallError {
    /// The JSON-RPC error code, if this is one.
    pub fn code(&self) -> Option<i64> {
        match self {
            CallError::Rpc { code, .. } => Some(*code),
            CallError::Io(_) => None,
        }
    }
}

/// One connection to execd.
pub struct Client {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    /// Notifications read while waiting for a response.
    pub notifications: VecDeque<Value>,
    /// Responses read while waiting for another id.
    responses: Vec<Value>,
    /// How long one read may block; `None` waits forever.
    pub timeout: Option<Duration>,
    /// The start of a line whose end has not arrived yet (kept across read timeouts).
    partial: Vec<u8>,
    /// A whole message has been received on this connection.
    received: bool,
    /// What relays the stream, if anything does; last, so it drops after the stream.
    transport: Option<Box<dyn Transport>>,
}

impl Client {
    pub fn connect(path: &Path) -> io::Result<Client> {
        Client::from_stream(UnixStream::connect(path)?)
    }

    /// A client over a stream already connected to execd, or to something that relays
    /// to it (`execctl dial-stdio` at the other end of a socket pair).
    pub fn from_stream(s: UnixStream) -> io::Result<Client> {
        let reader = BufReader::with_capacity(256 << 10, s.try_clone()?);
        Ok(Client {
            writer: s,
            reader,
            next_id: 0,
            notifications: VecDeque::new(),
            responses: Vec::new(),
            timeout: Some(Duration::from_secs(60)),
            partial: Vec::new(),
            received: false,
            transport: None,
        })
    }

    /// A second handle on the connection, for another thread to hang it up with
    /// `shutdown` (a read blocked on it then returns at once).
    pub fn handle(&self) -> io::Result<UnixStream> {
        self.writer.try_clone()
    }

    /// The same client, with `t` asked why the connection ended when it does.
    pub fn with_transport(mut self, t: Box<dyn Transport>) -> Client {
        self.transport = Some(t);
        self
    }

    /// `e`, the error the stream ended with, or the transport's account of it.
    fn ended(&mut self, e: io::Error) -> io::Error {
        let fresh = !self.received && self.partial.is_empty();
        match self.transport.as_mut().and_then(|t| t.why_closed(fresh)) {
            Some(why) => io::Error::new(io::ErrorKind::ConnectionAborted, Closed(why)),
            None => e,
        }
    }

    /// Sends one raw line (a newline is added).
    pub fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        match self.writer.write_all(&buf) {
            Err(e) if is_gone(&e) => Err(self.ended(e)),
            done => done,
        }
    }

    /// Sends a request and returns its id without waiting.
    pub fn send(&mut self, method: &str, params: Value) -> io::Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_line(msg.to_string().as_bytes())?;
        Ok(id)
    }

    /// Reads one message (a line of JSON), waiting at most `timeout`. A timeout is
    /// `WouldBlock` or `TimedOut`; a line cut by it is kept for the next call.
    pub fn read_message(&mut self, timeout: Option<Duration>) -> io::Result<Value> {
        self.reader.get_ref().set_read_timeout(timeout)?;
        let n = match self.reader.read_until(b'\n', &mut self.partial) {
            Err(e) if is_gone(&e) => return Err(self.ended(e)),
            read => read?,
        };
        if n == 0 {
            let e = io::Error::new(io::ErrorKind::UnexpectedEof, "execd closed the connection");
            return Err(self.ended(e));
        }
        if self.partial.last() != Some(&b'\n') {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "execd closed the connection mid-line",
            );
            return Err(self.ended(e));
        }
        self.received = true;
        let line = std::mem::take(&mut self.partial);
        serde_json::from_slice(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad JSON from execd: {e}"),
            )
        })
    }

    /// Waits for the response to `id`, queueing notifications and other responses.
    pub fn wait_response(&mut self, id: u64) -> Result<Value, CallError> {
        self.wait_response_watching(id, &mut |_| {})
    }

    /// `wait_response`, showing `seen` each notification as it arrives (it is queued
    /// all the same), so a caller can act on one while its request still waits.
    pub fn wait_response_watching(
        &mut self,
        id: u64,
        seen: &mut dyn FnMut(&Value),
    ) -> Result<Value, CallError> {
        let want = json!(id);
        if let Some(i) = self.responses.iter().position(|r| r["id"] == want) {
            return Self::unwrap(self.responses.swap_remove(i));
        }
        let deadline = self.timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| {
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            });
            let msg = self.read_message(left)?;
            if msg.get("method").is_some() && msg.get("id").is_none() {
                seen(&msg);
                self.notifications.push_back(msg);
            } else if msg["id"] == want {
                return Self::unwrap(msg);
            } else {
                self.responses.push(msg);
            }
        }
    }

    fn unwrap(msg: Value) -> Result<Value, CallError> {
        if let Some(e) = msg.get("error") {
            return Err(CallError::Rpc {
                code: e["code"].as_i64().unwrap_or(0),
                message: e["message"].as_str().unwrap_or("").to_string(),
                data: e.get("data").cloned(),
            });
        }
        Ok(msg.get("result").cloned().unwrap_or(Value::Null))
    }

    /// The buffered reader itself, for a client that parses event lines on its own (a
    /// streaming consumer that wants no `Value` per line). Use it only between calls,
    /// when no line is half read.
    pub fn raw_reader(&mut self) -> &mut BufReader<UnixStream> {
        let _ = self.reader.get_ref().set_read_timeout(self.timeout);
        &mut self.reader
    }

    /// Calls `method` and waits for its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, CallError> {
        let id = self.send(method, params)?;
        self.wait_response(id)
    }

    /// The next notification, waiting at most `timeout`.
    pub fn next_notification(&mut self, timeout: Option<Duration>) -> Result<Value, CallError> {
        if let Some(n) = self.notifications.pop_front() {
            return Ok(n);
        }
        loop {
            let msg = self.read_message(timeout)?;
            if msg.get("method").is_some() && msg.get("id").is_none() {
                return Ok(msg);
            }
            self.responses.push(msg);
        }
    }
}
