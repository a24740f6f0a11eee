//! The loop's side of `/v1/shell/ws` (PROTOCOL 12.5): an HTTP connection whose handshake
//! names a session of its peer (or makes one) becomes a watcher of it; its messages go to
//! the core (`core::shell::watch`: keys, resizes), and what the core shows the session's
//! people is written to every watcher, as raw output or as screen frames. Server-sent
//! events of HTTP requests that stream are written here too.
//!
//! Invariants:
//! - The handshake is answered `101` only for a session of the peer's uid (else 404, as
//!   for every route, before anything else is written).
//! - A watcher that holds `--client-buffer` unsent is closed (1008) and let go; the others
//!   go on. A close frame is the last thing written to a WebSocket, which ends once it
//!   is written (or, if its peer does not read it, at the next ping).
//! - Screen frames go out at most once per `FRAME_EVERY` per watcher, the last state of
//!   a burst always among them.

use std::time::{Duration, Instant, SystemTime};

use mio::Token;
use serde_json::{json, Map, Value};

use super::clients::conn_id;
use super::{LoopTimer, Server};
use crate::core::table::SessionKey;
use crate::core::{Caller, Step};
use crate::methods as dispatch;
use crate::types::WinSize;
use crate::wire::rpc::{ReqNo, RpcError};
use crate::wire::ws::{self, ClientMsg, Event, WsCodec};

/// How often every WebSocket is sent `{"type":"ping"}`.
pub const PING_EVERY: Duration = Duration::from_secs(30);
/// The least time between two screen frames to one watcher.
pub const FRAME_EVERY: Duration = Duration::from_millis(20);

/// A connection that became a WebSocket watching a shell session.
#[derive(Debug)]
pub struct WsConn {
    pub codec: WsCodec,
    pub session: SessionKey,
    /// It takes screen frames (`?render=screen`), not the raw output.
    pub screen: bool,
    /// The rows of the screen it was sent (`Screen::frame`).
    seen: Vec<u64>,
    /// A frame is owed; when the last one went.
    frame_due: bool,
    last_frame: Option<Instant>,
    /// Its line with the gate, and the request that started its session's shell.
    line: Option<ReqNo>,
    create: Option<ReqNo>,
    next_req: u64,
    /// A close frame is queued: nothing more is written or read, and it ends once that
    /// is written.
    pub closing: bool,
    /// Still closing at the last ping: its peer does not read.
    stale: bool,
    scratch: Vec<u8>,
}

impl WsConn {
    fn new(max_message: usize, session: SessionKey, screen: bool) -> WsConn {
        WsConn {
            codec: WsCodec::new(max_message),
            session,
            screen,
            seen: Vec::new(),
            frame_due: false,
            last_frame: None,
            line: None,
            create: None,
            // Far from the HTTP exchange's numbers, which are done with.
            next_req: 1 << 32,
            closing: false,
            stale: false,
            scratch: Vec::new(),
        }
    }

    fn req(&mut self) -> ReqNo {
        self.next_req += 1;
        ReqNo(self.next_req)
    }
}

/// Queues a close frame on `out` unless one is, and stops reading.
fn close(w: &mut WsConn, out: &mut Vec<u8>, code: u16, reason: &str) {
    if !w.closing {
        w.closing = true;
        ws::write_close(out, Some(code), reason);
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Server {
    fn caller(&self, token: Token) -> Option<Caller> {
        let c = self.clients.get(&token)?;
        Some(Caller {
            conn: conn_id(token),
            uid: c.peer.uid,
            gid: c.peer.gid,
            pid: c.peer.pid,
            tie: c.tie,
        })
    }

    /// A WebSocket handshake (`GET /v1/shell/ws`) the HTTP exchange handed out as `req`:
    /// the caller's session `session_id` (404 if it has none of that name), or a new one;
    /// then `101`, `session_id`, `ready`, and the screen.
    pub(super) fn handshake(
        &mut self,
        token: Token,
        req: ReqNo,
        opening: &ws::Opening,
        params: &Map<String, Value>,
    ) {
        let Some(caller) = self.caller(token) else {
            return;
        };
        let screen = params.get("render").and_then(Value::as_str) == Some("screen");
        let (key, create) = match params.get("session_id").and_then(Value::as_str) {
            Some(id) if !id.is_empty() => {
                let key = (caller.uid, id.to_string());
                let Some(s) = self.core.shells.map.get(&key) else {
                    let e = RpcError::not_found("shell session", id);
                    return self.answer(token, Some(req), Err(e));
                };
                // Keys typed while a command runs are its input: a caller bounded by its
                // tie watches only a session within its sandbox (PROTOCOL 16).
                if let Err(e) = self.core.may_feed(&caller, s.sandbox.as_ref(), None) {
                    return self.answer(token, Some(req), Err(e));
                }
                (key, None)
            }
            _ => {
                let step = dispatch::call(
                    &mut self.core,
                    &caller,
                    "shell/sessions/create",
                    &Map::new(),
                );
                match step {
                    Ok(Step::Launch(launch)) => {
                        let key = (caller.uid, launch.family.session_id().to_string());
                        (key, Some(launch))
                    }
                    Ok(_) => {
                        let e = RpcError::internal("a new session without a shell");
                        return self.answer(token, Some(req), Err(e));
                    }
                    Err(e) => return self.answer(token, Some(req), Err(e)),
                }
            }
        };
        if let Err(e) = self.core.watch(&key, conn_id(token), screen) {
            if create.is_some() {
                self.core.forget_shell(&key);
            }
            return self.answer(token, Some(req), Err(e));
        }
        let max_message = self.core.cfg.max_message;
        let mut w = Box::new(WsConn::new(max_message, key.clone(), screen));
        let create_req = create.as_ref().map(|_| w.req());
        w.create = create_req;
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        c.become_ws(opening, w);
        self.core.log.line(format_args!(
            "conn {} (uid {}) watches shell session {:?}{}",
            token.0,
            caller.uid,
            key.1,
            if screen { " (screen)" } else { "" }
        ));
        if let Some((_, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) {
            ws::write_message(out, &json!({"type": "session_id", "data": key.1}));
            ws::write_message(out, &json!({"type": "ready", "data": "Terminal ready"}));
        }
        if screen {
            self.frame_now(token);
        } else if create.is_none() {
            let paint = self.core.paint(&key);
            if let Some((w, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) {
                ws::write_output(out, &mut w.scratch, &String::from_utf8_lossy(&paint));
            }
        }
        self.clients.dirty.push(token);
        if !self.ws_ping_armed {
            self.ws_ping_armed = true;
            self.timers
                .add(Instant::now() + PING_EVERY, LoopTimer::WsPing);
        }
        if let Some(launch) = create {
            self.settle(token, create_req, Ok(Step::Launch(launch)));
        }
    }

    /// Acts on what a WebSocket sent: keys and resizes to the core, pings answered, a
    /// close echoed.
    pub(super) fn ws_input(&mut self, token: Token) {
        loop {
            let Some((w, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) else {
                return;
            };
            if w.closing {
                return;
            }
            let Some(event) = w.codec.next() else {
                return;
            };
            let key = w.session.clone();
            match event {
                Event::Text(text) => match ws::client_msg(&text) {
                    ClientMsg::Input(keys) => self.core.people_keys(&key, conn_id(token), &keys),
                    ClientMsg::Resize { cols, rows } => {
                        let ok = (1..=1000).contains(&cols) && (1..=1000).contains(&rows);
                        let size = WinSize {
                            rows: rows as u16,
                            cols: cols as u16,
                        };
                        let done = if ok {
                            self.core.people_resize(&key, size)
                        } else {
                            Err(RpcError::invalid_params(
                                "data",
                                "rows and cols are 1..1000",
                            ))
                        };
                        if let Err(e) = done {
                            self.core.log.refusal(
                                "websocket resize",
                                self.core.now,
                                format_args!("conn {}: resize refused: {}", token.0, e.message),
                            );
                        }
                        self.screens_changed(&key);
                    }
                    ClientMsg::Pong => {}
                    ClientMsg::Ignored(why) => self.core.log.refusal(
                        "websocket message",
                        self.core.now,
                        format_args!("conn {}: ignored {why}", token.0),
                    ),
                },
                Event::Ping(payload) => ws::write_pong(out, &payload),
                Event::Pong(_) => {}
                Event::Close(code, _) => {
                    // Echo its code (none for none), then end.
                    w.closing = true;
                    ws::write_close(out, code, "");
                }
                Event::Fail(code, why) => {
                    self.core.log.refusal(
                        "websocket protocol",
                        self.core.now,
                        format_args!("conn {}: closed {code}: {why}", token.0),
                    );
                    close(w, out, code, why);
                }
            }
            self.ws_bound(token);
            self.apply();
        }
    }

    /// Closes (1008) a watcher that holds `--client-buffer` unsent: it stops watching.
    fn ws_bound(&mut self, token: Token) {
        self.clients.dirty.push(token);
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        if !c.owes_past_cap() {
            return;
        }
        let uid = c.peer.uid;
        if let Some((w, out)) = c.ws_mut() {
            close(
                w,
                out,
                ws::CLOSE_POLICY,
                "not reading: --client-buffer reached",
            );
        }
        self.core.unwatch(conn_id(token));
        self.core.log.refusal(
            "slow watcher",
            self.core.now,
            format_args!(
                "closed the WebSocket conn {} of uid {uid}: it holds --client-buffer unread",
                token.0
            ),
        );
    }

    /// `Effect::Show`: `text` to every watcher of `session`.
    pub(super) fn show(&mut self, session: &SessionKey, text: &str) {
        let watchers = self.core.watchers(session).to_vec();
        for watcher in watchers {
            let token = super::clients::token_of(watcher.conn);
            let Some((w, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) else {
                continue;
            };
            if w.closing {
                continue;
            }
            if w.screen {
                w.frame_due = true;
                self.frames_due.push(token);
            } else {
                ws::write_output(out, &mut w.scratch, text);
                self.ws_bound(token);
            }
        }
    }

    /// The screens of `session`'s watchers may have changed (a resize).
    fn screens_changed(&mut self, session: &SessionKey) {
        for watcher in self.core.watchers(session).to_vec() {
            let token = super::clients::token_of(watcher.conn);
            if let Some((w, _)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) {
                if w.screen {
                    w.frame_due = true;
                    self.frames_due.push(token);
                }
            }
        }
    }

    /// Sends the screen frames that are due and whose time has come; the others are
    /// looked at again when it has (`LoopTimer::WsFrames`).
    pub(super) fn ws_frames(&mut self) {
        let mut due = std::mem::take(&mut self.frames_due);
        due.sort_unstable_by_key(|t| t.0);
        due.dedup();
        let now = Instant::now();
        let mut later: Option<Instant> = None;
        for token in due {
            let Some((w, _)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) else {
                continue;
            };
            if !w.frame_due || w.closing {
                continue;
            }
            match w.last_frame.map(|t| t + FRAME_EVERY) {
                Some(at) if at > now => {
                    self.frames_due.push(token);
                    later = Some(later.map_or(at, |l: Instant| l.min(at)));
                }
                _ => self.frame_now(token),
            }
        }
        if let Some(at) = later {
            if !self.ws_frames_armed {
                self.ws_frames_armed = true;
                self.timers.add(at, LoopTimer::WsFrames);
            }
        }
    }

    /// Writes the screen frame watcher `token` is owed, if the screen changed for it.
    fn frame_now(&mut self, token: Token) {
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let Some((w, out)) = c.ws_mut() else {
            return;
        };
        w.frame_due = false;
        w.last_frame = Some(Instant::now());
        if let Some(frame) = self.core.screen_frame(&w.session, &mut w.seen) {
            ws::write_message(out, &json!({"type": "screen", "data": frame}));
        }
        self.ws_bound(token);
    }

    /// `Effect::Line`: a person ended a line with Enter; it goes to the gate as that
    /// connection's `shell/exec` (answered as soon as it is queued: its output is the
    /// session's).
    pub(super) fn ws_line(&mut self, token: Token, session: &SessionKey, line: String) {
        let Some(caller) = self.caller(token) else {
            return;
        };
        let Some((w, _)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) else {
            return;
        };
        let req = w.req();
        w.line = Some(req);
        let mut params = Map::new();
        params.insert("id".into(), session.1.clone().into());
        params.insert("command".into(), line.into());
        params.insert("async_mode".into(), true.into());
        let step = dispatch::call(&mut self.core, &caller, "shell/exec", &params);
        self.settle(token, Some(req), step);
    }

    /// The answer to a request a WebSocket made (its line, its session's shell): shown on
    /// the terminal, never sent as a response.
    pub(super) fn ws_answered(
        &mut self,
        token: Token,
        req: ReqNo,
        result: &Result<Value, RpcError>,
    ) {
        let Some((w, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) else {
            return;
        };
        let key = w.session.clone();
        if w.line == Some(req) {
            w.line = None;
            let result = result.as_ref().map(|_| ());
            self.core.people_answered(&key, conn_id(token), result);
        } else if w.create == Some(req) {
            w.create = None;
            if let Err(e) = result {
                let text = format!(
                    "[execd: the session's shell could not be started: {}]\r\n",
                    e.message
                );
                ws::write_output(out, &mut w.scratch, &text);
                close(w, out, ws::CLOSE_INTERNAL, "the shell could not be started");
            }
        }
        self.clients.dirty.push(token);
    }

    /// `Effect::Unwatch`.
    pub(super) fn unwatch(&mut self, conn: crate::core::table::ConnId, code: u16, reason: &str) {
        let token = super::clients::token_of(conn);
        if let Some((w, out)) = self.clients.get_mut(&token).and_then(|c| c.ws_mut()) {
            close(w, out, code, reason);
            self.clients.dirty.push(token);
        }
    }

    /// Every 30 s: `{"type":"ping"}` to every WebSocket; one still closing since the last
    /// ping (its peer reads nothing) is dropped.
    pub(super) fn ws_ping(&mut self) {
        self.ws_ping_armed = false;
        let ping = json!({"type": "ping", "timestamp": millis(SystemTime::now())});
        let mut any = false;
        for token in self.clients.tokens() {
            let Some(c) = self.clients.get_mut(&token) else {
                continue;
            };
            let Some((w, out)) = c.ws_mut() else {
                continue;
            };
            any = true;
            if w.closing {
                if std::mem::replace(&mut w.stale, true) {
                    c.broken = true;
                }
            } else {
                ws::write_message(out, &ping);
            }
            self.clients.dirty.push(token);
        }
        if any {
            self.ws_ping_armed = true;
            self.timers
                .add(Instant::now() + PING_EVERY, LoopTimer::WsPing);
        }
    }

    /// Before an upgrade's swap: WebSockets are not carried (their sessions' desks are the
    /// core's, rebuilt on the next watch), so each is told (1012, the page reconnects)
    /// and closed.
    pub(super) fn close_websockets(&mut self) {
        for token in self.clients.tokens() {
            let Some(c) = self.clients.get_mut(&token) else {
                continue;
            };
            let Some((w, out)) = c.ws_mut() else {
                continue;
            };
            close(w, out, 1012, "execd is upgrading; connect again");
            c.flush();
            self.clients
                .close(token, self.poll.registry(), &mut self.core);
        }
    }
}
