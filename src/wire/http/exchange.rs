//! One connection's HTTP exchange, sans I/O: its codec, who its requests must prove to
//! be, the requests handed to the loop as `bash/*` and `shell/*` methods, and their answers written in
//! request order (pipelining) with the envelope and status of section 11.

use std::collections::VecDeque;

use serde_json::{json, Map, Value};

use super::codec::{Auth, Event, HttpCodec, HttpRequest, Limits, CONTINUE};
use super::route::*;
use crate::wire::rpc::{Incoming, ReqNo, Room, RpcError};
use crate::wire::state::{BlobsIn, BlobsOut, HttpImage, SlotImage, StateError};

/// One answer in request order: written already, or still being worked on.
#[derive(Debug)]
enum Slot {
    Ready(Vec<u8>),
    Waiting { req: ReqNo, keep_alive: bool },
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
        }
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
    /// until the oldest is answered.
    pub fn pipeline_full(&self) -> bool {
        self.order.len() >= MAX_PIPELINE
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
        let keep = r.keep_alive;
        let route = route(&r.method, &r.path).map_err(|refusal| refusal.response(keep))?;
        let Some(method) = route.method() else {
            return Err(response(200, HEALTH_BODY, keep, &[]));
        };
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
        let req = ReqNo(self.next_req);
        self.next_req += 1;
        self.order.push_back(Slot::Waiting {
            req,
            keep_alive: keep,
        });
        self.waiting += 1;
        Ok(Incoming::Request {
            req: Some(req),
            method: method.to_string(),
            params,
        })
    }

    /// Answers request `req`: the envelope with 200, or the error's status and body; what
    /// is next in order is written to `out`.
    pub fn answer(&mut self, req: ReqNo, result: &Result<Value, RpcError>, out: &mut Vec<u8>) {
        let Some(slot) = self
            .order
            .iter_mut()
            .find(|s| matches!(s, Slot::Waiting { req: r, .. } if *r == req))
        else {
            return;
        };
        let Slot::Waiting { keep_alive, .. } = *slot else {
            return;
        };
        let bytes = match result {
            Ok(v) => response(200, &success_body(v), keep_alive, &[]),
            Err(e) => {
                let (status, body) = error_body(e.code, &e.message, e.data.as_ref());
                response(status, &body, keep_alive, &[])
            }
        };
        self.waiting -= 1;
        self.held += bytes.len();
        *slot = Slot::Ready(bytes);
        self.write_ready(out);
    }

    /// Writes the answers that are ready at the front of the order.
    fn write_ready(&mut self, out: &mut Vec<u8>) {
        while let Some(Slot::Ready(_)) = self.order.front() {
            if let Some(Slot::Ready(bytes)) = self.order.pop_front() {
                out.extend_from_slice(&bytes);
                self.held = self.held.saturating_sub(bytes.len());
            }
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
                Slot::Waiting { req, keep_alive } => SlotImage::Waiting {
                    req: req.0,
                    keep_alive: *keep_alive,
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
                    SlotImage::Waiting { req, keep_alive } => Slot::Waiting {
                        req: ReqNo(*req),
                        keep_alive: *keep_alive,
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
