//! A small blocking client: connect, send requests, read responses and notifications with a
//! timeout. Used by `execctl`, the integration tests and the benches.

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

/// Whether an error is a read timeout.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
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
        })
    }

    /// A second handle on the connection, for another thread to hang it up with
    /// `shutdown` (a read blocked on it then returns at once).
    pub fn handle(&self) -> io::Result<UnixStream> {
        self.writer.try_clone()
    }

    /// Sends one raw line (a newline is added).
    pub fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        self.writer.write_all(&buf)
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
        let n = self.reader.read_until(b'\n', &mut self.partial)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "execd closed the connection",
            ));
        }
        if self.partial.last() != Some(&b'\n') {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "execd closed the connection mid-line",
            ));
        }
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
