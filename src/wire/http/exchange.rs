//! One connection's HTTP exchange, sans I/O: its codec, who its requests must prove to
//! be, the requests handed to the loop as `bash/*` and `shell/*` methods, and their answers written in
//! request order (pipelining) with the envelope and status of section 11.
//!
//! Two answers are not one response: a request for server-sent events (`Accept:
//! text/event-stream` on `POST /v1/shell/exec` and `/v1/shell/view`) gets its events as
//! they come, then its result (PROTOCOL 12.5); a WebSocket handshake (`GET /v1/shell/ws`)
//! is handed to the loop once nothing before it is owed, and the connection then leaves
//! HTTP (`take_upgrade`, `take_rest`).

use std::collections::VecDeque;

use serde_json::{json, Map, Value};

use super::codec::{query_param, Auth, Event, Hosts, HttpCodec, HttpRequest, Limits, CONTINUE};
use super::route::*;
use crate::wire::rpc::{Incoming, ReqNo, Room, RpcError};
use crate::wire::state::{BlobsIn, BlobsOut, HttpImage, SlotImage, StateError};
use crate::wire::ws::{self, Opening};

/// The method a WebSocket handshake is handed to the loop as. Only an HTTP exchange makes
/// one, and the loop takes it as a handshake only when `take_upgrade` says this exchange
/// did (a JSON-RPC request of that name is an unknown method).
pub const WS_METHOD: &str = "shell/ws";

/// One answer in request order: written already, or still being worked on.
#[derive(Debug)]
enum Slot {
    Ready(Vec<u8>),
    Waiting {
        req: ReqNo,
        keep_alive: bool,
        /// It answers with server-sent events.
        sse: Option<Stream>,
    },
}

/// Where a server-sent events answer is.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stream {
    /// The head is written (or held): the answer is an event stream from here on.
    pub begun: bool,
    /// Events written while an earlier answer is still owed: they go out once it is.
    pub held: Vec<u8>,
}

/// Requests one connection may have in flight at once (pipelining): further requests stay
/// unread until the oldest is answered. Answers are written in request order, so those
/// ready behind a long poll are held here; the depth bounds how many.
pub const MAX_PIPELINE: usize = 32;

/// One connection's HTTP exchange: its codec, the requests it handed to the loop as
/// `bash/*` methods, and their answers, written in request order (pipelining) with the
/// envelope and status of section 11. Sans-I/O like the codec.
#[derive(Debug)]
pub struct HttpSession {
    codec: HttpCodec,
    order: VecDeque<Slot>,
    /// `Waiting` slots in `order`.
    waiting: usize,
    /// Bytes of `Ready` slots held behind a `Waiting` one.
    held: usize,
    /// Whole requests read, those answered here included.
    requests: u64,
    next_req: u64,
    /// A WebSocket handshake read while answers before it are owed: handed out once they
    /// are written.
    stalled: Option<HttpRequest>,
    /// The handshake handed to the loop, with its answer's accept value.
    upgrade: Option<(ReqNo, Opening)>,
}

impl HttpSession {
    pub fn new(limits: Limits, auth: Auth) -> HttpSession {
        HttpSession {
            codec: HttpCodec::with_auth(limits, auth),
            order: VecDeque::new(),
            waiting: 0,
            held: 0,
            requests: 0,
            next_req: 0,
            stalled: None,
            upgrade: None,
        }
    }

    /// The `--http-host` names a browser's request may give (PROTOCOL 11).
    pub fn set_hosts(&mut self, hosts: Hosts) {
        self.codec.set_hosts(hosts);
    }

    /// Bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.codec.push(bytes);
    }

    /// Bytes buffered and not yet consumed.
    pub fn pending_input(&self) -> usize {
        self.codec.pending()
    }

    /// Requests handed out and not answered yet.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whole requests read so far, those answered without the loop (health, refusals)
    /// included.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Bytes of answers ready and held behind an earlier request: owed like queued ones.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether as many requests are in flight as one connection may have: take no more
    /// until the oldest is answered. A handshake waiting for earlier answers counts as
    /// full until they are written: nothing after it is HTTP.
    pub fn pipeline_full(&self) -> bool {
        self.order.len() >= MAX_PIPELINE || (self.stalled.is_some() && !self.order.is_empty())
    }

    /// Nothing owed.
    pub fn idle(&self) -> bool {
        self.order.is_empty()
    }

    /// The connection closes once what is owed is written: a refusal that closes, a
    /// request without keep-alive, or HTTP/1.0.
    pub fn done(&self) -> bool {
        self.codec.closed() && self.order.is_empty()
    }

    /// The next request for the loop, as a `bash/*` method with its params. Everything
    /// else (health, refusals, routing errors, bodies that are not a JSON object) is
    /// answered into `out` here, in order. `None` while the outgoing buffer is full (answers
    /// held count) or the pipeline is.
    pub fn next(&mut self, out: &mut Vec<u8>, room: Room) -> Option<Incoming> {
        let base = out.len();
        loop {
            if let Some(r) = self.stalled.take() {
                if !self.order.is_empty() {
                    self.stalled = Some(r);
                    return None;
                }
                match self.handshake(r) {
                    Ok(incoming) => return Some(incoming),
                    Err(bytes) => {
                        self.held += bytes.len();
                        self.order.push_back(Slot::Ready(bytes));
                        self.write_ready(out);
                        continue;
                    }
                }
            }
            if room.owed + self.held + (out.len() - base) >= room.cap || self.pipeline_full() {
                return None;
            }
            let event = self.codec.next()?;
            if !matches!(event, Event::Continue) {
                self.requests += 1;
            }
            let answered = match event {
                Event::Continue => CONTINUE.to_vec(),
                Event::Reject { response, .. } => response,
                // A handshake waits until what is owed before it is written: its answer
                // ends the HTTP exchange.
                Event::Request(r) if r.websocket.is_some() && !self.order.is_empty() => {
                    self.stalled = Some(r);
                    continue;
                }
                Event::Request(r) => match self.request(r) {
                    Ok(incoming) => return Some(incoming),
                    Err(bytes) => bytes,
                },
            };
            self.held += answered.len();
            self.order.push_back(Slot::Ready(answered));
            self.write_ready(out);
        }
    }

    /// A whole request: the loop's `Incoming`, or the response it gets at once.
    fn request(&mut self, r: HttpRequest) -> Result<Incoming, Vec<u8>> {
        // What follows a handshake is not HTTP: a refused one closes the connection.
        let keep = r.keep_alive && r.websocket.is_none();
        let route = route(&r.method, &r.path).map_err(|refusal| refusal.response(keep))?;
        match route {
            Route::Terminal => return Err(super::page::response(keep)),
            Route::Ws => return self.handshake(r),
            _ => {}
        }
        let Some(method) = route.method() else {
            return Err(response(200, HEALTH_BODY, keep, &[]));
        };
        // Server-sent events, for the two routes that have them, over HTTP/1.1 (whose
        // chunks say where the stream ends).
        let sse = r.event_stream
            && r.http11
            && matches!(route, Route::Shell("shell/exec" | "shell/view"));
        let mut params = match body_params(&r.body) {
            Ok(p) => p,
            Err((code, message, data)) => {
                let (status, body) = error_body(code, &message, data.as_ref());
                return Err(response(status, &body, keep, &[]));
            }
        };
        if route == Route::SessionsCreate
            && params.get("snapshot_path").is_some_and(|v| !v.is_null())
        {
            let (status, body) = error_body(
                -32602,
                "execd does not source session snapshots",
                Some(&json!({
                    "field": "snapshot_path",
                    "reason": "execd does not source session snapshots",
                })),
            );
            return Err(response(status, &body, keep, &[]));
        }
        match route {
            Route::SessionClose(id) => {
                params.insert("session_id".into(), id.into());
            }
            Route::ShellClose(id) => {
                params.insert("id".into(), id.into());
            }
            _ => {}
        }
        if sse && method == "shell/view" {
            // The view follows the running command to its end.
            params.insert("follow".into(), true.into());
        }
        let req = ReqNo(self.next_req);
        self.next_req += 1;
        self.order.push_back(Slot::Waiting {
            req,
            keep_alive: keep,
            sse: sse.then(Stream::default),
        });
        self.waiting += 1;
        Ok(Incoming::Request {
            req: Some(req),
            method: method.to_string(),
            params,
        })
    }

    /// A WebSocket handshake with nothing owed before it: refused here (the connection
    /// closes after the answer), or handed to the loop, which checks the session and
    /// answers 101 (`take_upgrade`) or refuses.
    fn handshake(&mut self, r: HttpRequest) -> Result<Incoming, Vec<u8>> {
        let Some(head) = r.websocket.as_deref() else {
            let body = failure_body("this route is a WebSocket: send Upgrade: websocket", None);
            return Err(response(426, &body, false, &[("Upgrade", "websocket")]));
        };
        let opening = match ws::opening(head) {
            Ok(o) => o,
            Err(refused) => {
                let body = failure_body(refused.reason, None);
                let extra: &[(&str, &str)] = if refused.status == 426 {
                    &[("Sec-WebSocket-Version", "13")]
                } else {
                    &[]
                };
                return Err(response(refused.status, &body, false, extra));
            }
        };
        let mut params = Map::new();
        for name in ["session_id", "render"] {
            if let Some(v) = query_param(&r.query, name) {
                let Some(v) = percent_decode(v) else {
                    let body = failure_body("a query parameter with a bad escape", None);
                    return Err(response(400, &body, false, &[]));
                };
                params.insert(name.into(), v.into());
            }
        }
        let req = ReqNo(self.next_req);
        self.next_req += 1;
        self.order.push_back(Slot::Waiting {
            req,
            keep_alive: false,
            sse: None,
        });
        self.waiting += 1;
        self.upgrade = Some((req, opening));
        Ok(Incoming::Request {
            req: Some(req),
            method: WS_METHOD.to_string(),
            params,
        })
    }

    /// The handshake `req` was, if it was the one this exchange handed out. Its answer is
    /// a refusal (`answer`, after which the connection closes) or the loop's `101` once
    /// the loop has taken what followed it (`take_rest`).
    pub fn take_upgrade(&mut self, req: ReqNo) -> Option<Opening> {
        if self.upgrade.as_ref().is_none_or(|(r, _)| *r != req) {
            return None;
        }
        self.upgrade.take().map(|(_, opening)| opening)
    }

    /// What the client sent after its handshake (its first frames); the exchange is over
    /// (the handshake was the only request owed an answer).
    pub fn take_rest(&mut self) -> Vec<u8> {
        self.order.clear();
        self.waiting = 0;
        self.held = 0;
        self.codec.take_rest()
    }

    /// Whether request `req` is answered with server-sent events.
    pub fn streams(&self, req: ReqNo) -> bool {
        self.order
            .iter()
            .any(|s| matches!(s, Slot::Waiting { req: r, sse: Some(_), .. } if *r == req))
    }

    /// One event for request `req`, which streams (`name`, one line of JSON as `data`):
    /// written now if nothing is owed before it, else held until it is.
    pub fn event(&mut self, req: ReqNo, name: &str, data: &[u8], out: &mut Vec<u8>) {
        let front = matches!(self.order.front(), Some(Slot::Waiting { req: r, .. }) if *r == req);
        let Some(Slot::Waiting {
            keep_alive,
            sse: Some(stream),
            ..
        }) = self
            .order
            .iter_mut()
            .find(|s| matches!(s, Slot::Waiting { req: r, .. } if *r == req))
        else {
            return;
        };
        let mut bytes = Vec::new();
        if !stream.begun {
            stream.begun = true;
            bytes.extend_from_slice(&event_stream_head(*keep_alive));
        }
        event_chunk(&mut bytes, name, data);
        if front {
            out.extend_from_slice(&bytes);
        } else {
            self.held += bytes.len();
            stream.held.extend_from_slice(&bytes);
        }
    }

    /// Answers request `req`: the envelope with 200, or the error's status and body (for
    /// an event stream: its `result` event, then its end); what is next in order is
    /// written to `out`.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        let Some(slot) = self
            .order
            .iter_mut()
            .find(|s| matches!(s, Slot::Waiting { req: r, .. } if *r == req))
        else {
            return;
        };
        let Slot::Waiting {
            keep_alive, sse, ..
        } = slot
        else {
            return;
        };
        let keep_alive = *keep_alive;
        let (status, body) = match result {
            Ok(v) => (200, success_body(v)),
            Err(e) => error_body(e.code, &e.message, e.data.as_ref()),
        };
        let bytes = match sse.take() {
            // Streamed: the result is its last event, whatever it says.
            Some(mut stream) if stream.begun || status == 200 => {
                let mut bytes = std::mem::take(&mut stream.held);
                self.held = self.held.saturating_sub(bytes.len());
                if !stream.begun {
                    bytes.extend_from_slice(&event_stream_head(keep_alive));
                }
                event_chunk(&mut bytes, "result", &body);
                bytes.extend_from_slice(LAST_CHUNK);
                bytes
            }
            _ => response(status, &body, keep_alive, &[]),
        };
        self.waiting -= 1;
        self.held += bytes.len();
        *slot = Slot::Ready(bytes);
        self.write_ready(out);
    }

    /// Writes the answers that are ready at the front of the order, and the events a
    /// stream that reached the front held.
    fn write_ready(&mut self, out: &mut Vec<u8>) {
        while let Some(Slot::Ready(_)) = self.order.front() {
            if let Some(Slot::Ready(bytes)) = self.order.pop_front() {
                out.extend_from_slice(&bytes);
                self.held = self.held.saturating_sub(bytes.len());
            }
        }
        if let Some(Slot::Waiting { sse: Some(s), .. }) = self.order.front_mut() {
            let held = std::mem::take(&mut s.held);
            self.held = self.held.saturating_sub(held.len());
            out.extend_from_slice(&held);
        }
    }
}

impl HttpSession {
    /// What an upgrade in place carries of this exchange: the codec's state, and the
    /// answers in request order (written ones held behind a waiting request, and the
    /// request numbers still waited for).
    pub fn carry(&self, blobs: &mut BlobsOut) -> HttpImage {
        let mut img = self.codec.carry(blobs);
        img.order = self
            .order
            .iter()
            .map(|slot| match slot {
                Slot::Ready(bytes) => SlotImage::Ready(blobs.put(bytes)),
                Slot::Waiting {
                    req,
                    keep_alive,
                    sse,
                } => SlotImage::Waiting {
                    req: req.0,
                    keep_alive: *keep_alive,
                    sse: sse.as_ref().map(|s| (s.begun, blobs.put(&s.held))),
                },
            })
            .collect();
        img.waiting = self.waiting;
        img.held = self.held;
        img.requests = self.requests;
        img.next_req = self.next_req;
        img
    }

    /// The exchange `carry` described.
    pub fn resume(img: &HttpImage, blobs: &BlobsIn) -> Result<HttpSession, StateError> {
        let order = img
            .order
            .iter()
            .map(|slot| {
                Ok(match slot {
                    SlotImage::Ready(blob) => Slot::Ready(blobs.get(*blob)?.to_vec()),
                    SlotImage::Waiting {
                        req,
                        keep_alive,
                        sse,
                    } => Slot::Waiting {
                        req: ReqNo(*req),
                        keep_alive: *keep_alive,
                        sse: match sse {
                            Some((begun, held)) => Some(Stream {
                                begun: *begun,
                                held: blobs.get(*held)?.to_vec(),
                            }),
                            None => None,
                        },
                    },
                })
            })
            .collect::<Result<VecDeque<_>, StateError>>()?;
        Ok(HttpSession {
            codec: HttpCodec::resume(img, blobs)?,
            order,
            waiting: img.waiting,
            held: img.held,
            requests: img.requests,
            next_req: img.next_req,
            stalled: None,
            upgrade: None,
        })
    }
}

/// A body as a method's params: empty is `{}`, a JSON object is itself; anything else is
/// the error it maps to (`-32700` not JSON, `-32602` not an object or nested too deeply).
fn body_params(body: &[u8]) -> Result<Map<String, Value>, (i64, String, Option<Value>)> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err((-32602, "the body must be a JSON object".into(), None)),
        Err(e) if crate::wire::rpc::message::nested_too_deep(&e) => {
            let err = crate::wire::rpc::message::unreadable_params(&e);
            Err((err.code, err.message, err.data))
        }
        Err(e) => Err((-32700, format!("the body is not JSON: {e}"), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::tests::*;
    use super::*;

    #[test]
    fn a_body_nested_too_deeply_is_said_to_be() {
        let deep = format!(
            r#"{{"command":"true","env":{}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let (code, message, data) = body_params(deep.as_bytes()).unwrap_err();
        assert_eq!(code, -32602);
        assert!(message.contains("nested too deeply"), "{message}");
        assert_eq!(data.unwrap()["field"], "params");
        assert_eq!(body_params(b"{nope").unwrap_err().0, -32700);
    }

    const SESSIONS: &[u8] = b"GET /v1/bash/sessions HTTP/1.1\r\nHost: x\r\n\r\n";
    fn room(cap: usize) -> Room {
        Room { owed: 0, cap }
    }

    /// The requests `s` hands out now.
    fn take(s: &mut HttpSession, out: &mut Vec<u8>, room: Room) -> Vec<ReqNo> {
        std::iter::from_fn(|| match s.next(out, room)? {
            Incoming::Request { req, .. } => req,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
    }

    fn responses(out: &[u8]) -> usize {
        out.windows(12).filter(|w| w == b"HTTP/1.1 200").count()
    }

    const HANDSHAKE: &str = "GET /v1/shell/ws?session_id=a%20b&render=screen HTTP/1.1\r\n\
        Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn a_handshake_waits_for_earlier_answers_then_is_handed_out_once() {
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        s.push(SESSIONS);
        s.push(HANDSHAKE.as_bytes());
        s.push(b"\x81\x80");
        let first = take(&mut s, &mut out, room(1 << 20));
        assert_eq!(first.len(), 1, "the handshake waits");
        assert!(s.pipeline_full());
        s.answer(first[0], &Ok(json!([])), &mut out);
        assert!(!s.pipeline_full());
        let Some(Incoming::Request {
            req,
            method,
            params,
        }) = s.next(&mut out, room(1 << 20))
        else {
            panic!("the handshake")
        };
        assert_eq!(method, WS_METHOD);
        assert_eq!(
            params,
            json!({"session_id": "a b", "render": "screen"})
                .as_object()
                .unwrap()
                .clone()
        );
        let req = req.unwrap();
        assert_eq!(s.take_upgrade(ReqNo(99)), None);
        let opening = s.take_upgrade(req).expect("it is ours");
        assert_eq!(opening.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(s.take_upgrade(req), None, "once");
        assert!(!s.idle(), "its answer is owed");
        assert_eq!(s.take_rest(), b"\x81\x80");
        assert!(s.idle() && s.done());
        // Refused instead: the answer is written and the connection closes.
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        s.push(HANDSHAKE.as_bytes());
        let req = take(&mut s, &mut out, room(1 << 20))[0];
        assert!(s.take_upgrade(req).is_some());
        s.answer(
            req,
            &Err(RpcError::not_found("shell session", "a b")),
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 404 ") && text.contains("Connection: close"),
            "{text}"
        );
        assert!(s.done());
    }

    #[test]
    fn a_handshake_that_is_not_one_is_refused_and_closes() {
        for (head, status) in [
            ("GET /v1/shell/ws HTTP/1.1\r\n\r\n", 426),
            (
                "GET /v1/shell/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\
              Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
                426,
            ),
            (
                "GET /v1/shell/ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
                400,
            ),
            ("POST /v1/shell/ws HTTP/1.1\r\n\r\n", 405),
        ] {
            let mut s = HttpSession::new(limits(), Auth::Peer);
            let mut out = Vec::new();
            s.push(head.as_bytes());
            assert!(take(&mut s, &mut out, room(1 << 20)).is_empty());
            let text = String::from_utf8_lossy(&out).to_string();
            assert!(
                text.starts_with(&format!("HTTP/1.1 {status} ")),
                "{head}: {text}"
            );
            if head.contains("Upgrade") {
                assert!(text.contains("Connection: close"), "{text}");
                assert!(s.done(), "{head}");
            }
        }
    }

    #[test]
    fn an_event_stream_sends_its_events_then_its_result_then_ends() {
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        let body = r#"{"command":"ls"}"#;
        let exec = format!(
            "POST /v1/shell/exec HTTP/1.1\r\nAccept: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        // Behind a long poll, its events are held; once that is answered, they go.
        s.push(b"POST /v1/bash/output HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
        s.push(exec.as_bytes());
        let reqs = take(&mut s, &mut out, room(1 << 20));
        assert_eq!(reqs.len(), 2);
        assert!(!s.streams(reqs[0]) && s.streams(reqs[1]));
        s.event(reqs[1], "output", br#""a\n""#, &mut out);
        assert!(out.is_empty() && s.held() > 0);
        s.answer(reqs[0], &Ok(json!({})), &mut out);
        s.event(reqs[1], "output", br#""b\n""#, &mut out);
        s.answer(reqs[1], &Ok(json!({"status": "completed"})), &mut out);
        assert_eq!((s.held(), s.waiting()), (0, 0));
        let text = String::from_utf8(out).unwrap();
        let stream = &text[text
            .find("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream")
            .expect(&text)..];
        assert!(stream.contains("Transfer-Encoding: chunked\r\n"));
        let a = stream
            .find("event: output\ndata: \"a\\n\"\n\n")
            .expect(stream);
        let b = stream
            .find("event: output\ndata: \"b\\n\"\n\n")
            .expect(stream);
        let r = stream.find("event: result\ndata: {").expect(stream);
        assert!(a < b && b < r);
        assert!(stream.ends_with("\r\n0\r\n\r\n"), "{stream:?}");
        // Each chunk's size is its payload's.
        let body = &stream[stream.find("\r\n\r\n").unwrap() + 4..];
        let mut rest = body;
        while !rest.is_empty() {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size, 16).unwrap();
            assert_eq!(&after[n..n + 2], "\r\n");
            rest = &after[n + 2..];
        }
        // An error before any event is an ordinary error answer.
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        s.push(exec.as_bytes());
        let reqs = take(&mut s, &mut out, room(1 << 20));
        s.answer(
            reqs[0],
            &Err(RpcError::not_found("shell session", "x")),
            &mut out,
        );
        assert!(String::from_utf8(out).unwrap().starts_with("HTTP/1.1 404 "));
        // A view asks for the stream's follow; HTTP/1.0 gets no stream.
        let mut s = HttpSession::new(limits(), Auth::Peer);
        s.push(b"POST /v1/shell/view HTTP/1.1\r\nAccept: text/event-stream\r\nContent-Length: 2\r\n\r\n{}");
        s.push(b"POST /v1/shell/view HTTP/1.0\r\nAccept: text/event-stream\r\nContent-Length: 2\r\n\r\n{}");
        let mut follows = Vec::new();
        while let Some(Incoming::Request { params, .. }) = s.next(&mut Vec::new(), room(1 << 20)) {
            follows.push(params.get("follow").cloned());
        }
        assert_eq!(follows, vec![Some(json!(true)), None]);
    }

    #[test]
    fn the_terminal_page_is_served_with_its_policy() {
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        s.push(b"GET /terminal?session_id=x HTTP/1.1\r\n\r\n");
        assert!(take(&mut s, &mut out, room(1 << 20)).is_empty());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"));
        assert!(text.contains(&format!(
            "\r\nContent-Security-Policy: {}\r\n",
            super::super::page::policy()
        )));
    }

    #[test]
    fn a_session_takes_no_more_than_the_pipeline_depth() {
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        for _ in 0..MAX_PIPELINE + 8 {
            s.push(SESSIONS);
        }
        let reqs = take(&mut s, &mut out, room(1 << 20));
        assert_eq!(reqs.len(), MAX_PIPELINE);
        assert!(s.pipeline_full());
        assert_eq!(s.waiting(), MAX_PIPELINE);
        // Answers behind the first are held until it is answered, then written in order.
        for req in &reqs[1..] {
            s.answer(*req, &Ok(json!([])), &mut out);
        }
        assert!(out.is_empty());
        assert!(
            take(&mut s, &mut out, room(1 << 20)).is_empty(),
            "still full"
        );
        s.answer(reqs[0], &Ok(json!([])), &mut out);
        assert_eq!(responses(&out), MAX_PIPELINE);
        assert_eq!((s.waiting(), s.held()), (0, 0));
        assert_eq!(take(&mut s, &mut out, room(1 << 20)).len(), 8);
    }

    #[test]
    fn answers_held_behind_a_wait_count_against_the_room() {
        let mut s = HttpSession::new(limits(), Auth::Peer);
        let mut out = Vec::new();
        s.push(SESSIONS);
        s.push(SESSIONS);
        let reqs = take(&mut s, &mut out, room(1 << 20));
        assert_eq!(reqs.len(), 2);
        s.answer(reqs[1], &Ok(json!([])), &mut out);
        let held = s.held();
        assert!(held > 0 && out.is_empty());
        s.push(SESSIONS);
        assert!(
            take(&mut s, &mut out, room(held)).is_empty(),
            "held fills the room"
        );
        assert_eq!(take(&mut s, &mut out, room(held + 1)).len(), 1);
    }

    #[test]
    fn an_exchange_carried_by_an_upgrade_goes_on_as_if_nothing_happened() {
        let mut s = HttpSession::new(limits(), Auth::Token(b"tok".to_vec().into()));
        let mut out = Vec::new();
        let auth = "Authorization: Bearer tok\r\n";
        // A long poll waits, the request after it is answered (held behind it), and a
        // third arrives in pieces: its head and half of its chunked body.
        s.push(
            format!("POST /v1/bash/output HTTP/1.1\r\n{auth}Content-Length: 2\r\n\r\n{{}}")
                .as_bytes(),
        );
        s.push(format!("GET /v1/bash/sessions HTTP/1.1\r\n{auth}\r\n").as_bytes());
        s.push(format!("POST /v1/bash/exec HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n7\r\n{{\"com").as_bytes());
        let reqs = take(&mut s, &mut out, room(1 << 20));
        assert_eq!(reqs.len(), 2);
        s.answer(reqs[1], &Ok(json!([])), &mut out);
        assert!(out.is_empty(), "held behind the long poll");
        let mut blobs = BlobsOut::default();
        let img = s.carry(&mut blobs);
        let read: HttpImage = serde_json::from_slice(&serde_json::to_vec(&img).unwrap()).unwrap();
        assert_eq!(read, img);
        let area = blobs.bytes().to_vec();
        let mut t = HttpSession::resume(&read, &BlobsIn(&area)).unwrap();
        let mut again = BlobsOut::default();
        assert_eq!(t.carry(&mut again), img, "carried again, it is the same");
        for (s, mut out) in [(&mut s, out), (&mut t, Vec::new())] {
            s.push(b"ma\r\nb\r\nnd\":\"true\"}\r\n0\r\n\r\n");
            let third = take(s, &mut out, room(1 << 20));
            assert_eq!(third, vec![ReqNo(2)], "the third request, whole");
            s.answer(reqs[0], &Ok(json!({"late": true})), &mut out);
            s.answer(third[0], &Ok(json!({"third": true})), &mut out);
            let text = String::from_utf8(out).unwrap();
            let bodies: Vec<&str> = text
                .match_indices("\"data\":")
                .map(|(i, _)| &text[i..i + 20])
                .collect();
            assert_eq!(responses(text.as_bytes()), 3, "{text}");
            assert!(bodies[0].starts_with("\"data\":{\"late\""), "{bodies:?}");
            assert!(bodies[1].starts_with("\"data\":[]"), "{bodies:?}");
            assert!(bodies[2].starts_with("\"data\":{\"third\""), "{bodies:?}");
            assert_eq!((s.waiting(), s.held()), (0, 0));
        }
    }
}
