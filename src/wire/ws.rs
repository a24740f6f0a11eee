//! WebSocket (RFC 6455) for the server side, sans I/O: the opening handshake's checks and
//! answer (the request itself is read by the HTTP codec, whose router, token and browser
//! checks it rides on), client frames in (unmasked, fragments reassembled, control frames
//! between fragments, limits), server frames out (never masked), and the JSON messages of
//! the AIO sandbox's terminal socket (PROTOCOL 12.5).
//!
//! Invariants of a `WsCodec`:
//! - Messages come out whole and in order however the bytes were split across reads:
//!   splitting a stream at any byte boundary yields the same events.
//! - Nothing a peer sends makes it panic or hold unbounded memory: a frame or message over
//!   `max_message` is refused (1009) when its header says so, before its payload is
//!   buffered; the buffer holds at most one frame's header and payload beyond what has
//!   been consumed, plus the message being reassembled (at most `max_message`).
//! - After a close frame or a protocol error, no more events come out: the connection
//!   answers with its close frame and ends.

use serde_json::Value;

use crate::wire::encode::{base64_encode, write_json, write_json_str};

/// The GUID RFC 6455 4.2.2 appends to the client's key.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Close codes (RFC 6455 7.4.1) execd sends.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_PROTOCOL: u16 = 1002;
pub const CLOSE_UNSUPPORTED: u16 = 1003;
pub const CLOSE_INVALID_DATA: u16 = 1007;
pub const CLOSE_POLICY: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_INTERNAL: u16 = 1011;

/// The subprotocol a browser offers to say nothing secret: execd selects it when
/// offered, so the token it sent beside it is never echoed back.
pub const PROTOCOL: &str = "execd";
/// The prefix of the subprotocol that carries the bearer token (`execd.token.T`).
pub const TOKEN_PROTOCOL: &str = "execd.token.";

const OP_CONT: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// Longest payload of a control frame (RFC 6455 5.5).
const MAX_CONTROL: usize = 125;

// ---- the opening handshake --------------------------------------------------------------

/// What the HTTP codec read of a request that asks to upgrade to a WebSocket
/// (`Upgrade: websocket`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WsHead {
    /// `Connection` names `upgrade`.
    pub connection_upgrade: bool,
    /// `Sec-WebSocket-Key`, trimmed; several are none.
    pub key: Option<String>,
    /// `Sec-WebSocket-Version`, trimmed.
    pub version: Option<String>,
    /// Every subprotocol offered (`Sec-WebSocket-Protocol`, each list element trimmed).
    pub protocols: Vec<String>,
}

impl WsHead {
    /// The token an `execd.token.T` subprotocol carries, if one is offered.
    pub fn token(&self) -> Option<&str> {
        self.protocols
            .iter()
            .find_map(|p| p.strip_prefix(TOKEN_PROTOCOL))
    }
}

/// Why an opening handshake is refused: its status and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub reason: &'static str,
}

/// An opening handshake that may be answered `101`: the accept value and the subprotocol
/// chosen (`execd` when offered; else the token's own, which a browser requires back when
/// it offered one; else none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub accept: String,
    pub protocol: Option<String>,
}

/// Checks an opening handshake (RFC 6455 4.2.1): `Connection: upgrade`, version 13 (else
/// 426 naming it), a key that is 16 bytes in base64.
pub fn opening(head: &WsHead) -> Result<Opening, Refused> {
    if !head.connection_upgrade {
        return Err(Refused {
            status: 400,
            reason: "a WebSocket handshake needs Connection: upgrade",
        });
    }
    if head.version.as_deref() != Some("13") {
        return Err(Refused {
            status: 426,
            reason: "WebSocket version 13 is the one spoken",
        });
    }
    let Some(key) = head.key.as_deref() else {
        return Err(Refused {
            status: 400,
            reason: "a WebSocket handshake needs one Sec-WebSocket-Key",
        });
    };
    if crate::wire::encode::base64_decode(key).map(|k| k.len()) != Some(16) {
        return Err(Refused {
            status: 400,
            reason: "Sec-WebSocket-Key is not 16 bytes in base64",
        });
    }
    let protocol = if head.protocols.iter().any(|p| p == PROTOCOL) {
        Some(PROTOCOL.to_string())
    } else {
        head.protocols
            .iter()
            .find(|p| p.starts_with(TOKEN_PROTOCOL))
            .cloned()
    };
    Ok(Opening {
        accept: accept_key(key),
        protocol,
    })
}

/// `Sec-WebSocket-Accept` for `key`: base64 of SHA-1 of the key and the GUID.
pub fn accept_key(key: &str) -> String {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(GUID.as_bytes());
    let mut out = Vec::with_capacity(28);
    base64_encode(&mut out, &sha.digest().bytes());
    String::from_utf8(out).unwrap_or_default()
}

/// The `101 Switching Protocols` answer to `opening`.
pub fn switching(opening: &Opening) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n",
        opening.accept
    );
    if let Some(p) = &opening.protocol {
        head.push_str("Sec-WebSocket-Protocol: ");
        head.push_str(p);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

// ---- frames in ---------------------------------------------------------------------------

/// What the peer sent, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A text message (its fragments reassembled, valid UTF-8).
    Text(String),
    /// A ping: answer with a pong carrying `payload`.
    Ping(Vec<u8>),
    /// A pong (unsolicited or not): nothing to do.
    Pong(Vec<u8>),
    /// The peer's close frame: its code (none when it gave none) and reason. Echo the
    /// code, then end.
    Close(Option<u16>, String),
    /// The peer broke the protocol or a limit: close with `code`, saying `reason`.
    Fail(u16, &'static str),
}

/// One frame's header, once whole.
#[derive(Debug, Clone, Copy)]
struct Header {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Header bytes.
    len: usize,
    payload: usize,
}

/// A server's reader of client frames.
#[derive(Debug)]
pub struct WsCodec {
    buf: Vec<u8>,
    /// Consumed bytes at the front of `buf`.
    pos: usize,
    max_message: usize,
    /// The text message being reassembled, once its first fragment came.
    message: Option<Vec<u8>>,
    /// A close or a failure came out: nothing more does.
    done: bool,
}

impl WsCodec {
    /// A reader whose frames and messages are at most `max_message` bytes
    /// (`--max-message`).
    pub fn new(max_message: usize) -> WsCodec {
        WsCodec {
            buf: Vec::new(),
            pos: 0,
            max_message,
            message: None,
            done: false,
        }
    }

    /// Bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.done {
            return;
        }
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 4096 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not consumed, the message being reassembled included.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.pos + self.message.as_ref().map_or(0, Vec::len)
    }

    /// Whether a close or a failure came out (the reader takes nothing more).
    #[cfg(test)]
    pub fn done(&self) -> bool {
        self.done
    }

    /// The next whole event, if the bytes buffered hold one.
    pub fn next(&mut self) -> Option<Event> {
        while !self.done {
            let avail = &self.buf[self.pos..];
            let head = match header(avail) {
                Ok(Some(h)) => h,
                Ok(None) => return None,
                Err((code, reason)) => return Some(self.fail(code, reason)),
            };
            if let Err((code, reason)) = self.check(&head) {
                return Some(self.fail(code, reason));
            }
            if avail.len() < head.len + head.payload {
                return None;
            }
            let start = self.pos + head.len;
            let end = start + head.payload;
            unmask(&mut self.buf[start..end], head.mask);
            self.pos = end;
            if let Some(event) = self.frame(head, start, end) {
                return Some(event);
            }
        }
        None
    }

    /// Refuses a header before its payload is read: what the protocol forbids, binary
    /// messages (1003), and what is over the limits (1009).
    fn check(&self, h: &Header) -> Result<(), (u16, &'static str)> {
        match h.opcode {
            OP_CLOSE | OP_PING | OP_PONG => {
                if !h.fin {
                    return Err((CLOSE_PROTOCOL, "a fragmented control frame"));
                }
                if h.payload > MAX_CONTROL {
                    return Err((CLOSE_PROTOCOL, "a control frame over 125 bytes"));
                }
            }
            OP_BINARY => {
                return Err((
                    CLOSE_UNSUPPORTED,
                    "binary messages are not taken; send text",
                ))
            }
            OP_TEXT if self.message.is_some() => {
                return Err((CLOSE_PROTOCOL, "a new message inside a fragmented one"))
            }
            OP_CONT if self.message.is_none() => {
                return Err((CLOSE_PROTOCOL, "a continuation frame with no message begun"))
            }
            OP_TEXT | OP_CONT => {}
            _ => return Err((CLOSE_PROTOCOL, "an unknown opcode")),
        }
        let so_far = self.message.as_ref().map_or(0, Vec::len);
        if h.payload > self.max_message || so_far + h.payload > self.max_message {
            return Err((CLOSE_TOO_BIG, "a message over --max-message"));
        }
        Ok(())
    }

    /// One whole frame (payload unmasked at `buf[start..end]`): an event, or nothing yet
    /// (a fragment of a message not finished).
    fn frame(&mut self, h: Header, start: usize, end: usize) -> Option<Event> {
        let payload = &self.buf[start..end];
        match h.opcode {
            OP_PING => Some(Event::Ping(payload.to_vec())),
            OP_PONG => Some(Event::Pong(payload.to_vec())),
            OP_CLOSE => {
                let event = close_of(payload);
                self.done = true;
                self.message = None;
                // Nothing after a close is read: what followed it is let go.
                self.buf = Vec::new();
                self.pos = 0;
                Some(match event {
                    Ok((code, reason)) => Event::Close(code, reason),
                    Err((code, reason)) => Event::Fail(code, reason),
                })
            }
            _ => {
                let mut message = self.message.take().unwrap_or_default();
                message.extend_from_slice(payload);
                if !h.fin {
                    self.message = Some(message);
                    return None;
                }
                match String::from_utf8(message) {
                    Ok(text) => Some(Event::Text(text)),
                    Err(_) => Some(self.fail(CLOSE_INVALID_DATA, "a text message not in UTF-8")),
                }
            }
        }
    }

    fn fail(&mut self, code: u16, reason: &'static str) -> Event {
        self.done = true;
        self.message = None;
        self.buf = Vec::new();
        self.pos = 0;
        Event::Fail(code, reason)
    }
}

/// A frame header from the front of `buf`: `None` until it is whole. Client frames must be
/// masked and set no reserved bit (no extension is negotiated).
fn header(buf: &[u8]) -> Result<Option<Header>, (u16, &'static str)> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err((CLOSE_PROTOCOL, "a reserved bit is set"));
    }
    if b1 & 0x80 == 0 {
        return Err((CLOSE_PROTOCOL, "a client frame that is not masked"));
    }
    let (payload, at) = match b1 & 0x7f {
        126 => {
            let Some(b) = buf.get(2..4) else {
                return Ok(None);
            };
            (u64::from(u16::from_be_bytes([b[0], b[1]])), 4)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut n = [0u8; 8];
            n.copy_from_slice(b);
            let n = u64::from_be_bytes(n);
            if n >> 63 != 0 {
                return Err((CLOSE_PROTOCOL, "a payload length with its top bit set"));
            }
            (n, 10)
        }
        n => (u64::from(n), 2),
    };
    let Some(m) = buf.get(at..at + 4) else {
        return Ok(None);
    };
    Ok(Some(Header {
        fin: b0 & 0x80 != 0,
        opcode: b0 & 0x0f,
        mask: [m[0], m[1], m[2], m[3]],
        len: at + 4,
        // Saturates on a 32-bit target; such a length is over any limit anyway.
        payload: usize::try_from(payload).unwrap_or(usize::MAX),
    }))
}

fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    for (i, b) in payload.iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// A close frame's payload: nothing, or a code (one RFC 6455 allows on the wire) and a
/// UTF-8 reason.
fn close_of(payload: &[u8]) -> Result<(Option<u16>, String), (u16, &'static str)> {
    match payload {
        [] => Ok((None, String::new())),
        [_] => Err((CLOSE_PROTOCOL, "a close frame with half a code")),
        [a, b, reason @ ..] => {
            let code = u16::from_be_bytes([*a, *b]);
            let allowed = matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999);
            if !allowed {
                return Err((CLOSE_PROTOCOL, "a close code that may not be sent"));
            }
            match std::str::from_utf8(reason) {
                Ok(r) => Ok((Some(code), r.to_string())),
                Err(_) => Err((CLOSE_INVALID_DATA, "a close reason not in UTF-8")),
            }
        }
    }
}

// ---- frames out --------------------------------------------------------------------------

/// Appends a server frame's header (final, unmasked) for a payload of `len` bytes.
fn frame_head(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(0x80 | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// A text frame carrying `text`.
pub fn write_text(out: &mut Vec<u8>, text: &[u8]) {
    frame_head(out, OP_TEXT, text.len());
    out.extend_from_slice(text);
}

/// A pong answering a ping's `payload`.
pub fn write_pong(out: &mut Vec<u8>, payload: &[u8]) {
    let payload = &payload[..payload.len().min(MAX_CONTROL)];
    frame_head(out, OP_PONG, payload.len());
    out.extend_from_slice(payload);
}

/// A close frame: `code` (none: an empty payload) and a reason cut to what fits.
pub fn write_close(out: &mut Vec<u8>, code: Option<u16>, reason: &str) {
    let Some(code) = code else {
        frame_head(out, OP_CLOSE, 0);
        return;
    };
    let mut end = reason.len().min(MAX_CONTROL - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    frame_head(out, OP_CLOSE, 2 + end);
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&reason.as_bytes()[..end]);
}

// ---- the AIO terminal's messages ---------------------------------------------------------

/// A message from the page (PROTOCOL 12.5).
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMsg {
    /// `{"type":"input","data":KEYS}`.
    Input(String),
    /// `{"type":"resize","data":{"cols":C,"rows":R}}`.
    Resize { cols: u64, rows: u64 },
    /// `{"type":"pong","data":{"timestamp":MS}}`.
    Pong,
    /// Anything else: ignored, and logged with this reason.
    Ignored(String),
}

/// Reads one text message from the page.
pub fn client_msg(text: &str) -> ClientMsg {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return ClientMsg::Ignored("a message that is not JSON".into());
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    let data = v.get("data");
    match kind {
        "input" => match data.and_then(Value::as_str) {
            Some(keys) => ClientMsg::Input(keys.to_string()),
            None => ClientMsg::Ignored("an input message whose data is not a string".into()),
        },
        "resize" => {
            let n = |f: &str| data.and_then(|d| d.get(f)).and_then(Value::as_u64);
            match (n("cols"), n("rows")) {
                (Some(cols), Some(rows)) => ClientMsg::Resize { cols, rows },
                _ => ClientMsg::Ignored("a resize message without cols and rows".into()),
            }
        }
        "pong" => ClientMsg::Pong,
        "" => ClientMsg::Ignored("a message without a type".into()),
        other => {
            let mut shown: String = other.chars().take(40).collect();
            if shown.len() < other.len() {
                shown.push_str("...");
            }
            ClientMsg::Ignored(format!("a message of unknown type {shown:?}"))
        }
    }
}

/// `{"type":"output","data":TEXT}` as one text frame, `text` escaped straight into it.
pub fn write_output(out: &mut Vec<u8>, scratch: &mut Vec<u8>, text: &str) {
    scratch.clear();
    scratch.extend_from_slice(br#"{"type":"output","data":"#);
    write_json_str(scratch, text);
    scratch.push(b'}');
    write_text(out, scratch);
}

/// A JSON message as one text frame.
pub fn write_message(out: &mut Vec<u8>, message: &Value) {
    let mut payload = Vec::with_capacity(64);
    write_json(&mut payload, message);
    write_text(out, &payload);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// A client frame: masked with `mask`, `fin` and `opcode` as given.
    pub fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        let len = payload.len();
        if len < 126 {
            out.push(0x80 | len as u8);
        } else if len <= 0xffff {
            out.push(0x80 | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            out.push(0x80 | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    const M: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    fn text(s: &str) -> Vec<u8> {
        client_frame(true, OP_TEXT, s.as_bytes(), M)
    }

    fn all(codec: &mut WsCodec) -> Vec<Event> {
        std::iter::from_fn(|| codec.next()).collect()
    }

    fn events(bytes: &[u8]) -> Vec<Event> {
        let mut c = WsCodec::new(1 << 16);
        c.push(bytes);
        all(&mut c)
    }

    /// A server frame read back: (fin, opcode, payload).
    fn server_frame(bytes: &[u8]) -> (bool, u8, Vec<u8>, usize) {
        let (payload, at) = match bytes[1] {
            126 => (usize::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
            127 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&bytes[2..10]);
                (u64::from_be_bytes(n) as usize, 10)
            }
            n => {
                assert!(n & 0x80 == 0, "server frames are never masked");
                (usize::from(n), 2)
            }
        };
        (
            bytes[0] & 0x80 != 0,
            bytes[0] & 0x0f,
            bytes[at..at + payload].to_vec(),
            at + payload,
        )
    }

    #[test]
    fn the_accept_key_is_the_rfc_s_example() {
        // RFC 6455 1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn a_handshake_is_checked_and_answered() {
        let head = WsHead {
            connection_upgrade: true,
            key: Some("dGhlIHNhbXBsZSBub25jZQ==".into()),
            version: Some("13".into()),
            protocols: vec!["execd.token.abc".into(), "execd".into()],
        };
        let o = opening(&head).expect("valid");
        assert_eq!(o.protocol.as_deref(), Some("execd"), "never the token");
        assert_eq!(head.token(), Some("abc"));
        let answer = String::from_utf8(switching(&o)).unwrap();
        assert!(answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(answer.contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(answer.contains("\r\nSec-WebSocket-Protocol: execd\r\n"));
        assert!(answer.ends_with("\r\n\r\n"));
        // Only the token offered: it is the one a browser must get back.
        let only = WsHead {
            protocols: vec!["execd.token.abc".into()],
            ..head.clone()
        };
        assert_eq!(
            opening(&only).unwrap().protocol.as_deref(),
            Some("execd.token.abc")
        );
        let none = WsHead {
            protocols: vec![],
            ..head.clone()
        };
        assert_eq!(opening(&none).unwrap().protocol, None);
        let refused = |h: WsHead| opening(&h).unwrap_err().status;
        assert_eq!(
            refused(WsHead {
                version: Some("8".into()),
                ..head.clone()
            }),
            426
        );
        assert_eq!(
            refused(WsHead {
                connection_upgrade: false,
                ..head.clone()
            }),
            400
        );
        assert_eq!(
            refused(WsHead {
                key: None,
                ..head.clone()
            }),
            400
        );
        assert_eq!(
            refused(WsHead {
                key: Some("c2hvcnQ=".into()),
                ..head
            }),
            400
        );
    }

    #[test]
    fn a_masked_text_frame_is_read() {
        assert_eq!(events(&text("héllo")), vec![Event::Text("héllo".into())]);
        // 126 and 127 length forms.
        let long = "x".repeat(300);
        assert_eq!(events(&text(&long)), vec![Event::Text(long)]);
        let longer = "y".repeat(70_000);
        let mut c = WsCodec::new(1 << 20);
        c.push(&text(&longer));
        assert_eq!(all(&mut c), vec![Event::Text(longer)]);
    }

    #[test]
    fn fragments_are_reassembled_with_control_frames_between_them() {
        let mut bytes = client_frame(false, OP_TEXT, b"hel", M);
        bytes.extend(client_frame(true, OP_PING, b"p", M));
        bytes.extend(client_frame(false, OP_CONT, b"lo ", M));
        bytes.extend(client_frame(true, OP_PONG, b"", M));
        bytes.extend(client_frame(true, OP_CONT, "wörld".as_bytes(), M));
        bytes.extend(text("next"));
        assert_eq!(
            events(&bytes),
            vec![
                Event::Ping(b"p".to_vec()),
                Event::Pong(vec![]),
                Event::Text("hello wörld".into()),
                Event::Text("next".into()),
            ]
        );
        // A character split between two fragments is whole once reassembled.
        let e = "é".as_bytes();
        let mut split = client_frame(false, OP_TEXT, &e[..1], M);
        split.extend(client_frame(true, OP_CONT, &e[1..], M));
        assert_eq!(events(&split), vec![Event::Text("é".into())]);
    }

    #[test]
    fn a_close_is_read_with_its_code_and_nothing_after_it() {
        let mut payload = 1001u16.to_be_bytes().to_vec();
        payload.extend_from_slice(b"bye");
        let mut bytes = client_frame(true, OP_CLOSE, &payload, M);
        bytes.extend(text("after"));
        assert_eq!(events(&bytes), vec![Event::Close(Some(1001), "bye".into())]);
        assert_eq!(
            events(&client_frame(true, OP_CLOSE, b"", M)),
            vec![Event::Close(None, String::new())]
        );
        for (payload, code) in [
            (vec![3u8], CLOSE_PROTOCOL),
            (1005u16.to_be_bytes().to_vec(), CLOSE_PROTOCOL),
            (999u16.to_be_bytes().to_vec(), CLOSE_PROTOCOL),
            (
                [&1000u16.to_be_bytes()[..], &[0xff]].concat(),
                CLOSE_INVALID_DATA,
            ),
        ] {
            assert_eq!(
                events(&client_frame(true, OP_CLOSE, &payload, M))[0],
                Event::Fail(
                    code,
                    match code {
                        CLOSE_PROTOCOL if payload.len() == 1 => "a close frame with half a code",
                        CLOSE_PROTOCOL => "a close code that may not be sent",
                        _ => "a close reason not in UTF-8",
                    }
                ),
                "{payload:?}"
            );
        }
    }

    #[test]
    fn protocol_errors_and_limits_close_with_their_codes() {
        let code = |bytes: Vec<u8>| match events(&bytes).last() {
            Some(Event::Fail(code, _)) => *code,
            other => panic!("no failure: {other:?}"),
        };
        assert_eq!(code(client_frame(true, OP_BINARY, b"x", M)), 1003);
        let mut unmasked = text("x");
        unmasked[1] &= 0x7f;
        assert_eq!(code(unmasked[..6].to_vec()), 1002);
        let mut rsv = text("x");
        rsv[0] |= 0x40;
        assert_eq!(code(rsv), 1002);
        assert_eq!(code(client_frame(true, 0x3, b"", M)), 1002);
        assert_eq!(code(client_frame(true, OP_CONT, b"x", M)), 1002);
        assert_eq!(code(client_frame(false, OP_PING, b"", M)), 1002);
        assert_eq!(code(client_frame(true, OP_PING, &[0; 126], M)), 1002);
        let mut two = client_frame(false, OP_TEXT, b"a", M);
        two.extend(text("b"));
        assert_eq!(code(two), 1002);
        assert_eq!(code(client_frame(true, OP_TEXT, &[0xc3, 0x28], M)), 1007);
        // Over the limit: refused on the header, before the payload arrives.
        let mut c = WsCodec::new(100);
        let big = client_frame(true, OP_TEXT, &[b'a'; 101], M);
        c.push(&big[..8]);
        assert_eq!(
            c.next(),
            Some(Event::Fail(1009, "a message over --max-message"))
        );
        assert!(c.done() && c.pending() == 0);
        // A message over the limit in fragments that are each under it.
        let mut c = WsCodec::new(100);
        c.push(&client_frame(false, OP_TEXT, &[b'a'; 60], M));
        c.push(&client_frame(true, OP_CONT, &[b'a'; 60], M));
        assert!(matches!(c.next(), Some(Event::Fail(1009, _))));
        // A 64-bit length with its top bit set.
        let mut huge = vec![0x81, 0xff];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        huge.extend_from_slice(&M);
        assert_eq!(code(huge), 1002);
    }

    #[test]
    fn frames_out_are_unmasked_and_sized_in_the_three_forms() {
        for len in [0, 125, 126, 65535, 65536] {
            let mut out = Vec::new();
            write_text(&mut out, &vec![b'z'; len]);
            let (fin, op, payload, used) = server_frame(&out);
            assert!(fin);
            assert_eq!((op, payload.len(), used), (OP_TEXT, len, out.len()));
        }
        let mut out = Vec::new();
        write_close(&mut out, Some(1008), &"é".repeat(100));
        let (_, op, payload, _) = server_frame(&out);
        assert_eq!(op, OP_CLOSE);
        assert!(payload.len() <= 125);
        assert_eq!(&payload[..2], &1008u16.to_be_bytes());
        assert!(
            std::str::from_utf8(&payload[2..]).is_ok(),
            "cut at a character"
        );
        let mut out = Vec::new();
        write_pong(&mut out, b"abc");
        assert_eq!(server_frame(&out).2, b"abc");
    }

    #[test]
    fn the_aio_messages_are_read_and_written() {
        assert_eq!(
            client_msg(r#"{"type":"input","data":"ls\r"}"#),
            ClientMsg::Input("ls\r".into())
        );
        assert_eq!(
            client_msg(r#"{"type":"resize","data":{"cols":100,"rows":30}}"#),
            ClientMsg::Resize {
                cols: 100,
                rows: 30
            }
        );
        assert_eq!(
            client_msg(r#"{"type":"pong","data":{"timestamp":1}}"#),
            ClientMsg::Pong
        );
        for bad in [
            "nope",
            r#"{"type":"input","data":3}"#,
            r#"{"type":"x"}"#,
            "{}",
        ] {
            assert!(matches!(client_msg(bad), ClientMsg::Ignored(_)), "{bad}");
        }
        let mut out = Vec::new();
        write_output(&mut out, &mut Vec::new(), "a\u{1b}[1m\"b\"");
        let (_, _, payload, _) = server_frame(&out);
        let v: Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(v, json!({"type": "output", "data": "a\u{1b}[1m\"b\""}));
    }

    fn stream_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<Event>)> {
        let frame = prop_oneof![
            "[a-zé☃ ]{0,200}".prop_map(|s| (vec![text(&s)], vec![Event::Text(s)])),
            "[a-z]{0,40}".prop_map(|s| {
                (
                    vec![client_frame(true, OP_PING, s.as_bytes(), M)],
                    vec![Event::Ping(s.into_bytes())],
                )
            }),
            ("[a-z]{1,40}", "[a-z]{0,300}").prop_map(|(a, b)| {
                let whole = format!("{a}{b}");
                (
                    vec![
                        client_frame(false, OP_TEXT, a.as_bytes(), [1, 2, 3, 4]),
                        client_frame(true, OP_PONG, b"", M),
                        client_frame(true, OP_CONT, b.as_bytes(), [9, 8, 7, 6]),
                    ],
                    vec![Event::Pong(vec![]), Event::Text(whole)],
                )
            }),
        ];
        proptest::collection::vec(frame, 0..6).prop_map(|frames| {
            let mut bytes = Vec::new();
            let mut evs = Vec::new();
            for (parts, es) in frames {
                for p in parts {
                    bytes.extend(p);
                }
                evs.extend(es);
            }
            (bytes, evs)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every frame split at every byte boundary gives the same events.
        #[test]
        fn a_stream_split_at_every_byte_gives_the_same_events(
            (bytes, expected) in stream_strategy()
        ) {
            let mut c = WsCodec::new(1 << 16);
            c.push(&bytes);
            prop_assert_eq!(&all(&mut c), &expected);
            for cut in 0..=bytes.len() {
                let mut c = WsCodec::new(1 << 16);
                c.push(&bytes[..cut]);
                let mut got = all(&mut c);
                c.push(&bytes[cut..]);
                got.extend(all(&mut c));
                prop_assert_eq!(&got, &expected, "cut at {}", cut);
            }
            // Byte by byte.
            let mut c = WsCodec::new(1 << 16);
            let mut got = Vec::new();
            for b in &bytes {
                c.push(std::slice::from_ref(b));
                got.extend(all(&mut c));
            }
            prop_assert_eq!(got, expected);
        }

        /// Whatever a peer sends, the reader neither panics nor holds more than a frame
        /// and a message past the limit.
        #[test]
        fn arbitrary_bytes_never_panic_nor_pile_up(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..32)
        ) {
            let mut c = WsCodec::new(256);
            for chunk in chunks {
                c.push(&chunk);
                while c.next().is_some() {}
                prop_assert!(c.pending() <= 256 + 14 + 64 + 256);
            }
        }
    }
}
