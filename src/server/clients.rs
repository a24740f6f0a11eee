//! Every client connection the loop holds, and the decisions about them as a set: who is
//! let in at accept (credentials, `--max-clients`, the TCP half), what an answer costs (a
//! refusal is logged; a connection piling up rendered, unread answers is closed at the
//! output budget), and which TCP connections went idle. The loop reads requests from them and
//! flushes them; what they asked for goes through `dispatch`, never through here.
//!
//! Invariants:
//! - A connection is in the set from its accept until `close`, which tells the core.
//! - `dirty` names every connection to flush this turn: one that got bytes, was read,
//!   or is to be closed.
//! - Answers are never dropped: a parked request's answer waits, unrendered, for room
//!   on its connection (`Conn::deferred`); a connection that piles up rendered answers
//!   it does not read is closed instead, and never one that reads.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use mio::{Registry, Token};
use serde_json::{json, Value};

use crate::core::pump::{Outbox, Outboxes};
use crate::core::table::{ConnId, Peer};
use crate::core::tie::Tie;
use crate::core::Core;
use crate::server::conn::{Bounds, Conn};
use crate::server::listen::{Accepted, Listeners};
use crate::sys::ids::PeerCred;
use crate::wire::http;
use crate::wire::rpc::{self, ReqNo, RpcError};
use crate::wire::state::{BlobsIn, BlobsOut, Clock, ConnImage};

/// The core's name for the connection under `token`. A connection's token and its
/// `ConnId` are the same number; these two are the only places that say so.
pub fn conn_id(token: Token) -> ConnId {
    ConnId(token.0)
}

/// The token of connection `conn` (see `conn_id`).
pub fn token_of(conn: ConnId) -> Token {
    Token(conn.0)
}

/// What one accept came to.
#[derive(Debug)]
pub enum Admission {
    /// A connection was taken in (`tcp`: from an HTTP listener); `cookie`: its peer,
    /// a descendant tied to no command, waits for a read of its cookie (`Conn::
    /// cookie_wait`): the peer's pid and start time.
    Admitted {
        tcp: bool,
        cookie: Option<(Token, i32, u64)>,
    },
    /// A peer was turned away: a limit told in its own protocol, or a peer that is not
    /// let in (or has no credentials) told nothing. The caller sends the refusal once the
    /// log says why. `None`: a connection that could not be watched (closed at once).
    Refused(Option<Refusal>),
    /// Nothing waits on the listener.
    Nothing,
    /// `accept` failed (out of descriptors or memory): the loop pauses accepting.
    Failed,
}

/// A refused connection: its socket, and what it is told before it is closed (nothing,
/// for a peer that is not let in at all).
#[derive(Debug)]
pub struct Refusal {
    pub socket: OwnedFd,
    pub answer: Vec<u8>,
}

impl Refusal {
    /// Tells the peer (one send, as far as the socket takes it, never raising SIGPIPE:
    /// it is closed next whatever happens) and closes the socket.
    pub fn send(self) {
        if !self.answer.is_empty() {
            let _ = crate::sys::socket::send_nonblocking(self.socket.as_raw_fd(), &self.answer);
        }
    }
}

/// What finds a Unix peer's tie at accept: from its socket and pid, the tie and the
/// peer's start time as read (`Children::tie_of`).
pub type TieOf<'a> = dyn FnMut(&Core, RawFd, i32) -> (Tie, Option<u64>) + 'a;

/// The connections, by token.
#[derive(Default)]
pub struct Clients {
    map: HashMap<Token, Conn>,
    /// Connections with output queued since the last flush.
    pub dirty: Vec<Token>,
    /// The daemon's own uid: its peers are always let in.
    uid: u32,
}

impl Outbox for Conn {
    fn has_room(&self) -> bool {
        Conn::has_room(self)
    }
    fn below_half(&self) -> bool {
        Conn::below_half(self)
    }
    fn pending(&self) -> usize {
        self.pending_out()
    }
    fn buf(&mut self) -> &mut Vec<u8> {
        self.out_buf()
    }
}

impl Outboxes for Clients {
    /// An HTTP connection has no outbox for events: its stream carries responses only (a
    /// subscription an HTTP request asked for is dropped as if its connection were gone).
    fn outbox(&mut self, conn: ConnId) -> Option<&mut dyn Outbox> {
        self.map
            .get_mut(&token_of(conn))
            .filter(|c| !c.is_http() && !c.is_ws())
            .map(|c| c as &mut dyn Outbox)
    }
}

impl Clients {
    pub fn new(uid: u32) -> Clients {
        Clients {
            uid,
            ..Clients::default()
        }
    }

    pub fn get(&self, token: &Token) -> Option<&Conn> {
        self.map.get(token)
    }

    pub fn get_mut(&mut self, token: &Token) -> Option<&mut Conn> {
        self.map.get_mut(token)
    }

    pub fn contains(&self, token: &Token) -> bool {
        self.map.contains_key(token)
    }

    /// How many connections are open.
    pub fn count(&self) -> usize {
        self.map.len()
    }

    pub fn values(&self) -> impl Iterator<Item = &Conn> {
        self.map.values()
    }

    /// Every connection's token.
    pub fn tokens(&self) -> Vec<Token> {
        let mut v: Vec<Token> = self.map.keys().copied().collect();
        v.sort_unstable_by_key(|t| t.0);
        v
    }

    /// Marks every connection for the next flush.
    pub fn mark_all(&mut self) {
        self.dirty.extend(self.map.keys().copied());
    }

    /// Queues bytes that are not an answer (an event, an approval request).
    pub fn send(&mut self, conn: ConnId, line: &[u8]) {
        if let Some(c) = self.map.get_mut(&token_of(conn)) {
            c.queue_bytes(line);
            self.dirty.push(token_of(conn));
        }
    }

    /// Tells `conn` its request `req` waits for an approver (PROTOCOL 7.3).
    pub fn approval_pending(&mut self, conn: ConnId, req: ReqNo, params: Value) {
        if let Some(c) = self.map.get_mut(&token_of(conn)) {
            c.notify_about(req, "_execd/approval_pending", params);
            self.dirty.push(token_of(conn));
        }
    }

    // ---- accept ------------------------------------------------------------------------

    /// Accepts one connection waiting on listener `lt`: a Unix peer its credentials
    /// allow, or an HTTP client; none past `--max-clients` (the refusal, told in the
    /// peer's own protocol, is the caller's to send once the log says why).
    /// A Unix peer's tie (7.3) is what `tie_of` finds of its socket and pid (and the
    /// peer's start time, when it was read).
    pub fn accept(
        &mut self,
        lt: Token,
        listeners: &Listeners,
        core: &mut Core,
        registry: &Registry,
        next_token: &mut usize,
        tie_of: &mut TieOf,
    ) -> Admission {
        let now = core.now;
        let bounds = Bounds {
            max_message: core.cfg.max_message,
            max_batch: core.cfg.max_batch,
            cap: core.cfg.client_buffer,
            hosts: crate::wire::http::Hosts(core.cfg.http_hosts.clone().into()),
        };
        let max_clients = core.cfg.max_clients;
        let (mut conn, peer, groups) = match listeners.accept(lt) {
            Accepted::Nothing => return Admission::Nothing,
            Accepted::Failed(e) => {
                // Out of descriptors (or memory): waiting connections stay queued in the
                // kernel. The loop pauses instead of spinning on a listener that stays ready.
                core.log.refusal(
                    "accept",
                    now,
                    format_args!("accept failed: {e}; pausing accepts"),
                );
                return Admission::Failed;
            }
            Accepted::NoCredentials(stream, e) => {
                core.log.refusal(
                    "peer credentials",
                    now,
                    format_args!("dropped a connection without peer credentials: {e}"),
                );
                return Admission::Refused(Some(Refusal {
                    socket: stream.into(),
                    answer: Vec::new(),
                }));
            }
            Accepted::Unix(stream, peer, groups) => {
                if !self.peer_allowed(core, &peer, &groups) {
                    refuse(core, peer, "peer not allowed");
                    return Admission::Refused(Some(Refusal {
                        socket: stream.into(),
                        answer: Vec::new(),
                    }));
                }
                // A shared uid holds at most half the connections, all shared uids seven
                // eighths (fair shares).
                let own = self.map.values().filter(|c| c.peer.uid == peer.uid).count();
                let shared = self
                    .map
                    .values()
                    .filter(|c| !c.is_tcp() && core.shares(c.peer.uid))
                    .count();
                let full = if self.map.len() >= max_clients {
                    Err(RpcError::limit("max-clients", max_clients))
                } else {
                    core.fair_share(peer.uid, (own, shared), ("max-clients", max_clients))
                };
                if let Err(e) = full {
                    let limit = e
                        .data
                        .as_ref()
                        .and_then(|d| d["limit"].as_str())
                        .unwrap_or("max-clients")
                        .to_string();
                    refuse(core, peer, &limit);
                    return Admission::Refused(Some(Refusal {
                        socket: stream.into(),
                        answer: rpc::encode_response(&rpc::Id::null(), &Err(e)),
                    }));
                }
                let token = Token(*next_token);
                let (tie, start) = tie_of(core, stream.as_raw_fd(), peer.pid);
                let mut conn = Conn::unix(stream, token, peer, bounds);
                conn.tie = tie;
                // Its cookie may still name its command (read off the loop).
                if tie.descends && tie.command.is_none() {
                    conn.cookie_wait = start;
                }
                (conn, peer, groups)
            }
            Accepted::Http(stream) => {
                let peer = listeners.http_peer;
                // TCP peers take at most half the connections: the Unix socket, whose
                // peers say who they are, always keeps the other half.
                let cap = max_clients.div_ceil(2);
                let tcp = self.map.values().filter(|c| c.is_tcp()).count();
                let full = if tcp >= cap {
                    Some(("tcp-clients", cap))
                } else if self.map.len() >= max_clients {
                    Some(("max-clients", max_clients))
                } else {
                    None
                };
                if let Some((limit, value)) = full {
                    let (status, body) = http::error_body(
                        rpc::LIMIT_REACHED,
                        &format!("limit reached: {limit}"),
                        Some(&json!({ "limit": limit, "value": value })),
                    );
                    refuse(core, peer, limit);
                    return Admission::Refused(Some(Refusal {
                        socket: stream.into(),
                        answer: http::response(status, &body, false, &[]),
                    }));
                }
                let token = Token(*next_token);
                let auth = listeners.http_auth.clone();
                let mut conn = Conn::http(stream, token, peer, bounds, auth);
                conn.tie = Tie::remote();
                (conn, peer, listeners.http_groups.clone())
            }
        };
        *next_token += 1;
        if conn.register(registry).is_err() {
            return Admission::Refused(None);
        }
        let token = conn.token;
        let tcp = conn.is_tcp();
        let cookie = conn.cookie_wait.map(|start| (token, conn.peer.pid, start));
        conn.last_request = now;
        conn.groups = groups.clone();
        self.map.insert(token, conn);
        core.connected(conn_id(token), peer_of(peer), groups);
        Admission::Admitted { tcp, cookie }
    }

    fn peer_allowed(&self, core: &Core, peer: &PeerCred, groups: &[u32]) -> bool {
        let cfg = &core.cfg;
        peer.uid == self.uid
            || peer.uid == 0
            || cfg.allow_uids.contains(&peer.uid)
            || std::iter::once(&peer.gid)
                .chain(groups)
                .any(|g| cfg.allow_gids.contains(g))
    }

    // ---- answers -----------------------------------------------------------------------

    /// Queues the answer to request `req` (none for a notification). A refusal at a
    /// limit is logged (rate-limited), an internal error always.
    pub fn answer(
        &mut self,
        core: &mut Core,
        token: Token,
        req: Option<ReqNo>,
        result: Result<Value, RpcError>,
    ) {
        let Some(req) = req else { return };
        if let Err(e) = &result {
            if e.code == rpc::INTERNAL_ERROR {
                core.log.error(format_args!(
                    "internal error answered to conn {}: {}",
                    token.0, e.message
                ));
            }
            if e.code == rpc::LIMIT_REACHED {
                let data = e.data.as_ref();
                let limit = data
                    .and_then(|d| d["limit"].as_str())
                    .unwrap_or("limit")
                    .to_string();
                let value = data.map_or(Value::Null, |d| d["value"].clone());
                let uid = self.map.get(&token).map_or(0, |c| c.peer.uid);
                core.log.refusal(
                    &limit,
                    core.now,
                    format_args!("refused a request of uid {uid}: {limit} ({value}) reached"),
                );
            }
        }
        if let Some(c) = self.map.get_mut(&token) {
            let piling = c.owes_past_cap();
            c.answer(req, &result);
            self.dirty.push(token);
            if piling {
                self.bound_backlog(core, token);
            }
        }
    }

    /// A connection got an answer while more than `--client-buffer` was already owed to it
    /// (it parks requests and does not read their answers). Answers are not dropped, so
    /// when all that connections owe passes `--max-output-memory` this one is closed:
    /// like the rings, the answers waiting to be read stay within the budget (plus one
    /// answer), and a client reading its answers is never the one closed.
    fn bound_backlog(&mut self, core: &mut Core, token: Token) {
        let total: usize = self.map.values().map(Conn::owed).sum();
        if total <= core.cfg.max_output_memory {
            return;
        }
        let Some(c) = self.map.get_mut(&token) else {
            return;
        };
        let (uid, owed) = (c.peer.uid, c.owed());
        c.broken = true;
        core.log.refusal(
            "unread answers",
            core.now,
            format_args!(
                "closed a connection of uid {uid}: {owed} bytes of answers unread while \
                 connections are owed {total} bytes, over --max-output-memory"
            ),
        );
    }

    // ---- idle and closing --------------------------------------------------------------

    /// Marks for closing the TCP connections that went `limit` without a request while
    /// nothing was owed to them. Returns whether any TCP connection is open.
    pub fn close_idle_tcp(&mut self, now: Instant, limit: Duration) -> bool {
        let mut any = false;
        for (token, c) in self.map.iter_mut() {
            // A WebSocket is a person's terminal, pinged every 30 s: never idle.
            if !c.is_tcp() || c.is_ws() {
                continue;
            }
            any = true;
            if c.waiting() > 0 || c.owed() > 0 {
                continue; // in flight: idle from when its answer is written (`flush`)
            }
            if now.saturating_duration_since(c.last_request) >= limit {
                c.broken = true;
                self.dirty.push(*token);
            }
        }
        any
    }

    /// Closes a connection: its descriptor, and what the core keeps for it.
    pub fn close(&mut self, token: Token, registry: &Registry, core: &mut Core) {
        let Some(mut conn) = self.map.remove(&token) else {
            return;
        };
        conn.deregister(registry);
        for (_, wait) in conn.deferred {
            if let Some(key) = wait.key() {
                core.let_go(key);
            }
        }
        core.disconnected(conn_id(token));
    }
}

impl Clients {
    /// What an upgrade in place carries: every connection (see `Conn::carry`).
    pub fn carry(&self, blobs: &mut BlobsOut, clock: &Clock) -> Vec<ConnImage> {
        let mut v: Vec<ConnImage> = self.map.values().map(|c| c.carry(blobs, clock)).collect();
        v.sort_by_key(|c| c.token);
        v
    }

    /// The connections `carry` described, registered under their tokens (a socket that
    /// holds unread bytes already is reported at once), each marked to be flushed.
    pub fn resume(
        uid: u32,
        imgs: &[ConnImage],
        (blobs, clock): (&BlobsIn, &Clock),
        bounds: Bounds,
        registry: &Registry,
        take: &mut dyn FnMut(std::os::fd::RawFd) -> Result<std::os::fd::OwnedFd, String>,
    ) -> Result<Clients, String> {
        let mut clients = Clients::new(uid);
        for img in imgs {
            let socket = take(img.fd)?;
            let mut conn =
                Conn::resume(img, socket, blobs, clock, bounds.clone()).map_err(|e| e.0)?;
            conn.register(registry)
                .map_err(|e| format!("registering connection {}: {e}", img.token))?;
            clients.dirty.push(conn.token);
            clients.map.insert(conn.token, conn);
        }
        Ok(clients)
    }
}

fn peer_of(peer: PeerCred) -> Peer {
    Peer {
        uid: peer.uid,
        gid: peer.gid,
        pid: peer.pid,
    }
}

/// A peer turned away at accept: logged (rate-limited) and audited.
fn refuse(core: &mut Core, peer: PeerCred, why: &str) {
    core.record("refuse", Some(peer_of(peer)), json!({ "why": why }));
    core.log.refusal(
        why,
        core.now,
        format_args!(
            "refused a connection from uid {} gid {} pid {}: {why}",
            peer.uid, peer.gid, peer.pid
        ),
    );
}
