//! HTTP/1.1 requests from bytes, sans I/O: bytes in, `Event`s (whole requests, interim
//! `100 Continue`s, refusals) out.
//!
//! Invariants of a `HttpCodec`:
//! - Requests come out whole and in the order they were sent, however the bytes were split
//!   across reads: splitting a stream at any byte boundary yields the same requests.
//! - Nothing a peer sends can make it panic or hold unbounded memory. Once `next` has
//!   returned `None`, the unconsumed bytes it holds are at most `max(max_head,
//!   MAX_CHUNK_LINE)`, and a request in progress holds at most `max_body` body bytes: a body
//!   over the limit is refused (413) when its size becomes known, before it is buffered.
//!   Consumed bytes are compacted away on the next `push`.
//! - Framing is strict where leniency would let two parsers disagree about where a request
//!   ends (request smuggling): `Content-Length` with `Transfer-Encoding`, conflicting
//!   lengths, a transfer coding other than a final `chunked`, and malformed chunk lines are
//!   refused and the connection is closed.
//! - After a refusal that closes (or after a request that does not keep the connection
//!   alive), nothing more is parsed: `next` returns `None` for ever and `push` drops input.
//! - Each head is handed to `httparse` only when a new line has arrived (or the head is over
//!   its bound), so a head trickled in byte by byte costs linear time, not quadratic.

use crate::wire::state::{
    AuthImage, BlobsIn, BlobsOut, Bytes, FramingImage, HttpImage, HttpStateImage, StateError,
};
use serde_json::{json, Value};

use super::route::{failure_body, response};
use crate::wire::ws::WsHead;

/// The routes that take a token in their query string (`?token=T`, for a browser, which
/// cannot set a header on a page load or a WebSocket): nowhere else is one accepted
/// (PROTOCOL 12.5).
pub const QUERY_TOKEN_PATHS: [&str; 2] = ["/v1/shell/ws", "/terminal"];

/// The static page a browser loads with no credential (its token is in the URL fragment,
/// which is never sent): it holds nothing secret.
pub const OPEN_PAGE: &str = "/terminal";

/// The interim response `Event::Continue` asks for.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Default bound of a request head (request line and header fields), in bytes (section 11).
pub const DEFAULT_MAX_HEAD: usize = 64 * 1024;

/// Default bound of the number of header fields in one request (section 11).
pub const DEFAULT_MAX_HEADERS: usize = 100;

/// The longest chunk-size line (size, extensions, CRLF) accepted in a chunked body.
/// Extensions are ignored, so they get no more room than any sane client needs.
pub const MAX_CHUNK_LINE: usize = 4096;

/// Once a connection's input buffer is drained, capacity above this is given back, so an
/// idle keep-alive connection does not keep the memory of its largest request.
const KEEP_CAPACITY: usize = 16 * 1024;

/// Bounds of one connection's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes in a request head (request line, header fields, final blank line), and in
    /// a chunked body's trailer section. Over it: 431.
    pub max_head: usize,
    /// Most header fields in a request head (and trailer fields). Over it: 431.
    pub max_headers: usize,
    /// Most body bytes, after de-chunking: the daemon's `--max-message`. Over it: 413.
    pub max_body: usize,
}

impl Limits {
    /// Section 11's head bounds (64 KiB, 100 fields) with the given body bound.
    pub fn new(max_body: usize) -> Limits {
        Limits {
            max_head: DEFAULT_MAX_HEAD,
            max_headers: DEFAULT_MAX_HEADERS,
            max_body,
        }
    }
}

/// One request, whole: head understood, body de-chunked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method as sent (methods are case-sensitive): "GET", "POST", ...
    pub method: String,
    /// The target's path, without query string or fragment, not yet percent-decoded. An
    /// absolute-form target (`http://host/p`) is reduced to its path (`/p`).
    pub path: String,
    /// The body, de-chunked; empty when the request declared none. Not interpreted here.
    pub body: Vec<u8>,
    /// Whether the connection stays open after the answer: HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// The `Authorization` header's value, trimmed of surrounding whitespace.
    pub authorization: Option<String>,
    /// The target's query string (after `?`, before `#`), raw. It may hold a token
    /// (`/v1/shell/ws?token=`), so it is never logged.
    pub query: String,
    /// HTTP/1.1 (not 1.0): a streamed answer may be chunked.
    pub http11: bool,
    /// `Accept` names `text/event-stream`: the client asks for server-sent events.
    pub event_stream: bool,
    /// The request asks to become a WebSocket (`Upgrade: websocket`): what its head says
    /// of the handshake. Nothing after it is parsed as HTTP (`take_rest`).
    pub websocket: Option<Box<WsHead>>,
}

/// What a connection must act on next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The client sent `Expect: 100-continue` and its body has not arrived: write
    /// `CONTINUE` now.
    Continue,
    /// A whole request.
    Request(HttpRequest),
    /// Malformed or oversized input: write `response` (already encoded, with
    /// `Connection: close` where `close`), and when `close`, stop reading and close once it
    /// is written.
    Reject {
        status: u16,
        close: bool,
        response: Vec<u8>,
    },
}

/// Who a connection's requests must prove to be.
#[derive(Debug, Clone)]
pub enum Auth {
    /// The Unix socket: the peer's credentials already say who it is.
    Peer,
    /// A TCP listener: `Authorization: Bearer TOKEN` with this token.
    Token(std::sync::Arc<[u8]>),
    /// A loopback TCP listener started with `--http-no-auth`.
    Open,
}

impl Auth {
    pub fn admits(&self, header: Option<&str>) -> bool {
        let bearer = header.and_then(|h| {
            let (scheme, value) = h.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| value.trim())
        });
        self.admits_token(bearer)
    }

    /// Whether `given` (a bearer token however it came) is the one required.
    pub fn admits_token(&self, given: Option<&str>) -> bool {
        match self {
            Auth::Peer | Auth::Open => true,
            Auth::Token(token) => given.is_some_and(|g| same_secret(g.as_bytes(), token)),
        }
    }
}

/// The names a request from a browser may give as its `Host` besides loopback literals
/// and `localhost` (`--http-host`, each with any port), compared without regard to case
/// (PROTOCOL 11).
#[derive(Debug, Clone, Default)]
pub struct Hosts(pub std::sync::Arc<[String]>);

impl Hosts {
    /// Whether `host` (a `Host` header's value: a name or a literal, then an optional
    /// port) is one a browser may reach execd by.
    pub fn allows(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        if name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            return v6
                .parse::<std::net::Ipv6Addr>()
                .is_ok_and(|a| a.is_loopback());
        }
        if let Ok(v4) = name.parse::<std::net::Ipv4Addr>() {
            return v4.is_loopback();
        }
        self.0.iter().any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// The name (or bracketed IPv6 literal) of a `Host` value whose port, if any, is digits.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')? + 1;
        (&host[..end], host[end..].strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    (!name.is_empty() && !host[..name.len()].contains(char::is_whitespace)).then_some(name)
}

/// Whether a request from a browser may be served (PROTOCOL 11): it names one `Host`
/// that `hosts` allows, and its `Origin`, if any, is that host with `http://` or
/// `https://` before it. A request with neither `Origin` nor a `Sec-Fetch-*` header is
/// not a browser's and passes.
fn browser_admitted(req: &httparse::Request, hosts: &Hosts) -> bool {
    let field = |name: &str| {
        req.headers
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case(name))
            .map(|f| std::str::from_utf8(trim(f.value)).ok())
            .collect::<Vec<_>>()
    };
    let origins = field("origin");
    let fetch = req
        .headers
        .iter()
        .any(|f| f.name.len() > 10 && f.name[..10].eq_ignore_ascii_case("sec-fetch-"));
    if origins.is_empty() && !fetch {
        return true;
    }
    // What the browser says of where the request comes from: only a page of this origin,
    // or the person (an address typed, a bookmark), may; never another site, even one
    // that sends no Origin (a GET an image or a link makes).
    let site_ok = field("sec-fetch-site").iter().all(|s| {
        s.is_some_and(|s| s.eq_ignore_ascii_case("same-origin") || s.eq_ignore_ascii_case("none"))
    });
    if !site_ok {
        return false;
    }
    let host = match field("host")[..] {
        [Some(h)] if hosts.allows(h) => h,
        _ => return false,
    };
    match origins[..] {
        [] => true,
        [Some(origin)] => ["http://", "https://"].iter().any(|scheme| {
            origin.len() == scheme.len() + host.len()
                && origin[..scheme.len()].eq_ignore_ascii_case(scheme)
                && origin[scheme.len()..].eq_ignore_ascii_case(host)
        }),
        _ => false,
    }
}

/// The value of `name` in a query string (`a=1&token=T`), not percent-decoded (a token
/// and an id are sent as they are).
pub fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Compares a secret in time that depends on its length only, not on where it differs.
fn same_secret(given: &[u8], token: &[u8]) -> bool {
    given.len() == token.len()
        && given
            .iter()
            .zip(token)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// A sans-I/O HTTP/1.1 server-side codec for one connection, on `httparse`.
#[derive(Debug)]
pub struct HttpCodec {
    limits: Limits,
    /// Checked on each request's head, before anything else and before any body byte
    /// is read: a request without the token is refused 401 and the connection closed.
    auth: Auth,
    /// Where a browser's request may come from (checked after the token).
    hosts: Hosts,
    /// Bytes read; `buf[..start]` is consumed and compacted away on the next `push`.
    buf: Vec<u8>,
    start: usize,
    /// How many unconsumed bytes were already looked at for a line end without finding a
    /// complete item: a parse is retried only once a new line arrives.
    scanned: usize,
    state: Reading,
}

#[derive(Debug)]
enum Reading {
    /// Waiting for a request head.
    Head,
    /// Head understood; reading the body.
    Body(Box<Partial>),
    /// Nothing more is parsed: a refusal closed the connection, or the last request did
    /// not keep it alive.
    Done,
    /// The last request asked to become a WebSocket: what follows it is not HTTP, and is
    /// kept for the WebSocket (`take_rest`) or dropped with the connection.
    Upgraded,
}

/// A request whose body is still arriving.
#[derive(Debug)]
struct Partial {
    request: HttpRequest,
    framing: Framing,
    /// `Expect: 100-continue` was sent and no `Continue` was returned yet.
    continue_due: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many body bytes are still to come.
    Length(usize),
    Chunked(Chunk),
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk: this many data bytes are still to come.
    Data(usize),
    /// After a chunk's data: expecting its CRLF.
    DataEnd,
    /// After the last chunk: expecting the trailer section and its blank line.
    Trailers,
}

/// Why input is refused: becomes an `Event::Reject` that closes the connection.
#[derive(Debug)]
struct Fault {
    status: u16,
    message: &'static str,
    data: Option<Value>,
}

impl Fault {
    fn new(status: u16, message: &'static str) -> Fault {
        Fault {
            status,
            message,
            data: None,
        }
    }

    fn bad(message: &'static str) -> Fault {
        Fault::new(400, message)
    }

    fn head_too_large(limits: &Limits) -> Fault {
        Fault {
            status: 431,
            message: "request header fields too large",
            data: Some(json!({ "max_bytes": limits.max_head, "max_fields": limits.max_headers })),
        }
    }

    fn unauthorized() -> Fault {
        Fault::new(401, "unauthorized: a valid bearer token is required")
    }

    fn from_browser() -> Fault {
        Fault::new(
            403,
            "forbidden: a request from a browser must name a loopback address, localhost \
             or an --http-host name as its Host, and come from a page of that host",
        )
    }

    fn body_too_large(limits: &Limits) -> Fault {
        Fault {
            status: 413,
            message: "request body too large",
            data: Some(json!({ "limit": limits.max_body })),
        }
    }
}

/// What one step of the decoder produced.
enum Progress {
    /// An event to hand out.
    Event(Event),
    /// The state moved on (a head was understood): step again.
    Again,
    /// Nothing more can be done until more bytes arrive.
    Wait,
}

impl HttpCodec {
    /// A codec for a new connection whose peer needs no token (the Unix socket).
    #[cfg(test)]
    pub fn new(limits: Limits) -> HttpCodec {
        HttpCodec::with_auth(limits, Auth::Peer)
    }

    /// A codec for a new connection whose requests must prove themselves with `auth`.
    pub fn with_auth(limits: Limits, auth: Auth) -> HttpCodec {
        HttpCodec {
            limits,
            auth,
            hosts: Hosts::default(),
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            state: Reading::Head,
        }
    }

    /// The `--http-host` names a browser's request may give besides loopback ones.
    pub fn set_hosts(&mut self, hosts: Hosts) {
        self.hosts = hosts;
    }

    /// The bytes after a request that asked to become a WebSocket: the first frames, if
    /// the client sent them before the answer. Empty otherwise.
    pub fn take_rest(&mut self) -> Vec<u8> {
        if !matches!(self.state, Reading::Upgraded) {
            return Vec::new();
        }
        let rest = self.avail().to_vec();
        self.release();
        rest
    }

    /// Bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if matches!(self.state, Reading::Upgraded) {
            // The WebSocket's, kept for it (bounded by the connection's read limit).
            self.buf.extend_from_slice(bytes);
            return;
        }
        if self.closed() {
            // Nothing more will be parsed; holding the bytes would only cost memory.
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet consumed (for read back-pressure).
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// True once nothing more will be parsed: after an `Event::Reject` with close, and also
    /// after an `HttpRequest` whose `keep_alive` is false (answer it, then close). Either way the
    /// connection should stop reading.
    pub fn closed(&self) -> bool {
        matches!(self.state, Reading::Done | Reading::Upgraded)
    }

    /// The unconsumed bytes.
    fn avail(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        self.scanned = 0;
    }

    /// Whether a line end arrived since the last look, marking everything as looked at.
    fn fresh_line(&mut self) -> bool {
        let avail = &self.buf[self.start..];
        let fresh = avail[self.scanned.min(avail.len())..].contains(&b'\n');
        self.scanned = avail.len();
        fresh
    }

    /// Called when waiting for more input: drop consumed bytes that are cheap to drop, and
    /// excess capacity once everything is consumed.
    fn tidy(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_CAPACITY {
                self.buf.shrink_to(KEEP_CAPACITY);
            }
        }
    }

    /// Drops all input for good.
    fn release(&mut self) {
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
    }

    /// Waiting for a head: parse it when a line has completed, then decide the framing.
    fn head(&mut self) -> Result<Progress, Fault> {
        // RFC 9112 §2.2: empty lines before a request line are ignored (some clients send
        // an extra CRLF after a body). Consuming them keeps them out of the head bound.
        let skip = leading_empty_lines(self.avail());
        if skip > 0 {
            self.consume(skip);
        }
        let over = self.pending() > self.limits.max_head;
        if !self.fresh_line() && !over {
            self.state = Reading::Head;
            return Ok(Progress::Wait);
        }
        let parsed = parse_head(self.avail(), &self.limits, &self.auth, &self.hosts)?;
        let Some((len, head)) = parsed else {
            if over {
                return Err(Fault::head_too_large(&self.limits));
            }
            self.state = Reading::Head;
            return Ok(Progress::Wait);
        };
        if len > self.limits.max_head {
            return Err(Fault::head_too_large(&self.limits));
        }
        self.consume(len);
        let Head {
            request,
            framing,
            expect_continue,
        } = head;
        self.state = Reading::Body(Box::new(Partial {
            request,
            framing,
            continue_due: expect_continue,
        }));
        Ok(Progress::Again)
    }

    /// Reading a body: take what is buffered; hand out the request once it is whole.
    fn body(&mut self, mut partial: Box<Partial>) -> Result<Progress, Fault> {
        self.decode(&mut partial)?;
        if partial.framing == Framing::Length(0) {
            let request = partial.request;
            if request.websocket.is_some() {
                // What follows is the WebSocket's, whatever the answer turns out to be.
                self.state = Reading::Upgraded;
            } else if request.keep_alive {
                self.state = Reading::Head;
            } else {
                // The answer to this request is the last thing the connection does: bytes
                // pipelined after it are never answered, so they are not parsed or kept.
                self.state = Reading::Done;
                self.release();
            }
            return Ok(Progress::Event(Event::Request(request)));
        }
        // The body is incomplete: the moment to invite the rest, once.
        let due = std::mem::take(&mut partial.continue_due);
        self.state = Reading::Body(partial);
        Ok(if due {
            Progress::Event(Event::Continue)
        } else {
            Progress::Wait
        })
    }

    /// Advances the body decoder as far as the buffered bytes allow. A finished body is
    /// left as `Length(0)`.
    fn decode(&mut self, partial: &mut Partial) -> Result<(), Fault> {
        loop {
            match partial.framing {
                Framing::Length(0) => return Ok(()),
                Framing::Length(left) => {
                    let taken = self.take(&mut partial.request.body, left, left);
                    if taken == 0 {
                        return Ok(());
                    }
                    partial.framing = Framing::Length(left - taken);
                }
                Framing::Chunked(Chunk::Size) => {
                    let Some((len, size)) = self.chunk_line()? else {
                        return Ok(());
                    };
                    self.consume(len);
                    if size == 0 {
                        partial.framing = Framing::Chunked(Chunk::Trailers);
                        continue;
                    }
                    let room = self
                        .limits
                        .max_body
                        .saturating_sub(partial.request.body.len());
                    match usize::try_from(size) {
                        Ok(size) if size <= room => {
                            partial.framing = Framing::Chunked(Chunk::Data(size));
                        }
                        _ => return Err(Fault::body_too_large(&self.limits)),
                    }
                }
                Framing::Chunked(Chunk::Data(left)) => {
                    let bound = self
                        .limits
                        .max_body
                        .saturating_sub(partial.request.body.len());
                    let taken = self.take(&mut partial.request.body, left, bound);
                    if taken == 0 {
                        return Ok(());
                    }
                    partial.framing = Framing::Chunked(match left - taken {
                        0 => Chunk::DataEnd,
                        left => Chunk::Data(left),
                    });
                }
                Framing::Chunked(Chunk::DataEnd) => match self.avail() {
                    [b'\r', b'\n', ..] => {
                        self.consume(2);
                        partial.framing = Framing::Chunked(Chunk::Size);
                    }
                    [] | [b'\r'] => return Ok(()),
                    _ => return Err(Fault::bad("chunk data not followed by CRLF")),
                },
                Framing::Chunked(Chunk::Trailers) => {
                    let over = self.pending() > self.limits.max_head;
                    if !self.fresh_line() && !over {
                        return Ok(());
                    }
                    match parse_trailers(self.avail(), &self.limits)? {
                        Some(len) if len <= self.limits.max_head => {
                            self.consume(len);
                            partial.framing = Framing::Length(0);
                            return Ok(());
                        }
                        None if !over => return Ok(()),
                        _ => return Err(Fault::head_too_large(&self.limits)),
                    }
                }
            }
        }
    }

    /// Moves up to `left` buffered body bytes into `body`, growing it by doubling but never
    /// past `bound` more bytes than it holds. Returns how many were moved.
    fn take(&mut self, body: &mut Vec<u8>, left: usize, bound: usize) -> usize {
        let avail = &self.buf[self.start..];
        let n = avail.len().min(left);
        if n == 0 {
            return 0;
        }
        if body.capacity() - body.len() < n {
            let want = n.max(body.len()).min(bound.max(n));
            body.reserve_exact(want);
        }
        body.extend_from_slice(&avail[..n]);
        self.consume(n);
        n
    }

    /// A complete chunk-size line, if buffered: its length with CRLF, and the chunk size.
    fn chunk_line(&self) -> Result<Option<(usize, u64)>, Fault> {
        let avail = self.avail();
        let Some(lf) = avail.iter().position(|&b| b == b'\n') else {
            if avail.len() > MAX_CHUNK_LINE {
                return Err(Fault::bad("chunk-size line too long"));
            }
            return Ok(None);
        };
        if lf >= MAX_CHUNK_LINE {
            return Err(Fault::bad("chunk-size line too long"));
        }
        let size = parse_chunk_size(&avail[..=lf]).ok_or(Fault::bad("invalid chunk-size line"))?;
        Ok(Some((lf + 1, size)))
    }
}

/// `codec.next()` is the one way events come out. The iterator is not fused: after `None`,
/// a `push` may make more events available (until `closed()`).
impl Iterator for HttpCodec {
    type Item = Event;

    /// The next thing the connection must act on, if a whole one is buffered.
    fn next(&mut self) -> Option<Event> {
        loop {
            // Each step puts back the state it leaves; a fault leaves `Done`.
            let step = match std::mem::replace(&mut self.state, Reading::Done) {
                Reading::Done => return None,
                Reading::Upgraded => {
                    self.state = Reading::Upgraded;
                    return None;
                }
                Reading::Head => self.head(),
                Reading::Body(partial) => self.body(partial),
            };
            match step {
                Ok(Progress::Again) => continue,
                Ok(Progress::Event(event)) => return Some(event),
                Ok(Progress::Wait) => {
                    self.tidy();
                    return None;
                }
                Err(fault) => {
                    self.state = Reading::Done;
                    self.release();
                    let body = failure_body(fault.message, fault.data.as_ref());
                    let extra: &[(&str, &str)] = if fault.status == 401 {
                        &[("WWW-Authenticate", "Bearer")]
                    } else {
                        &[]
                    };
                    return Some(Event::Reject {
                        status: fault.status,
                        close: true,
                        response: response(fault.status, &body, false, extra),
                    });
                }
            }
        }
    }
}

/// A request head, understood.
struct Head {
    /// The request as far as the head tells (empty body).
    request: HttpRequest,
    framing: Framing,
    expect_continue: bool,
}

/// How many bytes of empty lines (CRLF or LF) `buf` starts with. A lone trailing CR is
/// left for the next read to complete.
fn leading_empty_lines(buf: &[u8]) -> usize {
    let mut n = 0;
    loop {
        match &buf[n..] {
            [b'\n', ..] => n += 1,
            [b'\r', b'\n', ..] => n += 2,
            _ => return n,
        }
    }
}

/// Parses a head with `httparse`: `None` while incomplete, else its length and meaning.
fn parse_head(
    buf: &[u8],
    limits: &Limits,
    auth: &Auth,
    hosts: &Hosts,
) -> Result<Option<(usize, Head)>, Fault> {
    let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) => {
            Ok(Some((len, understand(&req, limits, auth, hosts)?)))
        }
        Err(httparse::Error::TooManyHeaders) => Err(Fault::head_too_large(limits)),
        Err(httparse::Error::Version) if well_formed_version(buf) => {
            Err(Fault::new(505, "HTTP version not supported"))
        }
        Err(_) => Err(Fault::bad("malformed request head")),
    }
}

/// Whether the request line is `method SP target SP HTTP/d.d` (RFC 9112 3, 2.3): only a
/// well-formed line whose version execd does not speak is 505; anything else is a bad
/// request.
fn well_formed_version(buf: &[u8]) -> bool {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    matches!(parts[..], [_, _, [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]]
        if major.is_ascii_digit() && minor.is_ascii_digit())
}

/// Parses a chunked body's trailer section: `None` while incomplete, else its length. The
/// fields are checked for syntax and count, then ignored.
fn parse_trailers(buf: &[u8], limits: &Limits) -> Result<Option<usize>, Fault> {
    let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete((len, _))) => Ok(Some(len)),
        Err(httparse::Error::TooManyHeaders) => Err(Fault::head_too_large(limits)),
        Err(_) => Err(Fault::bad("malformed trailer section")),
    }
}

/// Reads what section 11 needs from a parsed head and decides how its body is framed
/// (RFC 9112 §6).
fn understand(
    req: &httparse::Request,
    limits: &Limits,
    auth: &Auth,
    hosts: &Hosts,
) -> Result<Head, Fault> {
    // A complete parse always sets these; a missing one is refused, not unwrapped.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(Fault::bad("malformed request line"));
    };
    let path = target_path(target);
    let query = target_query(target);
    let websocket = websocket_head(req);
    // The token first: a peer without it learns nothing else (no 413, no 400 for its
    // framing), and none of its body is read (PROTOCOL 11).
    let mut tokens = req
        .headers
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("authorization"))
        .map(|f| std::str::from_utf8(trim(f.value)).ok());
    // Two credentials are none: which one would count is ambiguous.
    let token = match (tokens.next(), tokens.next()) {
        (Some(one), None) => one,
        _ => None,
    };
    // A browser cannot set a header on a page load or a WebSocket: on the two routes made
    // for one, the token may come in the query string or (WebSocket) as the subprotocol
    // `execd.token.T`; nowhere else (PROTOCOL 12.5). The page itself holds nothing secret
    // and loads without one (its token is in the URL fragment, never sent).
    let browser_route = QUERY_TOKEN_PATHS.contains(&path);
    let in_query = query_param(query, "token").filter(|_| browser_route);
    let in_protocol = websocket
        .as_ref()
        .and_then(|w| w.token())
        .filter(|_| path == QUERY_TOKEN_PATHS[0]);
    let admitted = auth.admits(token)
        || in_query.is_some_and(|t| auth.admits_token(Some(t)))
        || in_protocol.is_some_and(|t| auth.admits_token(Some(t)));
    let open_page = path == OPEN_PAGE && token.is_none() && in_query.is_none();
    if !admitted && !open_page {
        return Err(Fault::unauthorized());
    }
    // Then the browser rule, before anything has an effect (PROTOCOL 11).
    if !browser_admitted(req, hosts) {
        return Err(Fault::from_browser());
    }
    let http11 = version == 1;
    let mut event_stream = false;

    let mut length: Option<u64> = None;
    let mut codings: Vec<&[u8]> = Vec::new();
    let mut has_te = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    let mut authorization: Option<String> = None;
    for field in req.headers.iter() {
        let name = field.name;
        let value = trim(field.value);
        if name.eq_ignore_ascii_case("content-length") {
            // Repeated or listed values are accepted only when all equal (RFC 9112 §6.3).
            for item in value.split(|&b| b == b',') {
                let item = content_length(trim(item))?;
                if length.is_some_and(|seen| seen != item) {
                    return Err(Fault::bad("conflicting Content-Length values"));
                }
                length = Some(item);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            has_te = true;
            // Empty list elements are allowed and mean nothing (RFC 9110 §5.6.1).
            codings.extend(
                value
                    .split(|&b| b == b',')
                    .map(trim)
                    .filter(|c| !c.is_empty()),
            );
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',').map(trim) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("accept") {
            event_stream |= value.split(|&b| b == b',').any(|t| {
                trim(t.split(|&b| b == b';').next().unwrap_or_default())
                    .eq_ignore_ascii_case(b"text/event-stream")
            });
        } else if name.eq_ignore_ascii_case("expect") {
            // Other expectations are ignored (RFC 9110 §10.1.1 lets a server do so).
            expect_continue |= value.eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case("authorization") {
            if authorization.is_some() {
                // Which of two credentials would be checked is ambiguous: refuse both.
                return Err(Fault::bad("more than one Authorization header"));
            }
            let value = std::str::from_utf8(value)
                .map_err(|_| Fault::bad("Authorization header is not UTF-8"))?;
            authorization = Some(value.to_owned());
        }
    }
    // RFC 9110 §10.1.1: a server must not send 100 Continue to an HTTP/1.0 client.
    let expect_continue = expect_continue && http11;

    let framing = if has_te {
        if length.is_some() {
            // Two framings: the classic request-smuggling vector (RFC 9112 §6.1).
            return Err(Fault::bad("both Content-Length and Transfer-Encoding"));
        }
        if !http11 {
            // RFC 9112 §6.1: HTTP/1.0 with Transfer-Encoding has faulty framing.
            return Err(Fault::bad("Transfer-Encoding in an HTTP/1.0 request"));
        }
        let chunked = |c: &&[u8]| c.eq_ignore_ascii_case(b"chunked");
        match codings.split_last() {
            Some((last, rest)) if chunked(last) && !rest.iter().any(chunked) => {
                if rest.is_empty() {
                    Framing::Chunked(Chunk::Size)
                } else {
                    // A known framing under a coding execd does not decode (gzip, ...).
                    return Err(Fault::new(501, "transfer coding not implemented"));
                }
            }
            // Without a final, single chunked the body's end cannot be found (§6.3).
            _ => return Err(Fault::bad("Transfer-Encoding must end in a single chunked")),
        }
    } else if let Some(length) = length {
        match usize::try_from(length) {
            Ok(length) if length <= limits.max_body => Framing::Length(length),
            _ => return Err(Fault::body_too_large(limits)),
        }
    } else if expect_continue {
        // A body is promised but nothing says where it ends.
        return Err(Fault::new(411, "length required"));
    } else {
        // RFC 9112 §6.3: no framing in a request means no body (`curl -X POST` without -d).
        Framing::Length(0)
    };

    if websocket.is_some() && framing != Framing::Length(0) {
        return Err(Fault::bad("a WebSocket handshake has no body"));
    }
    let keep_alive = !close && (http11 || keep_alive_token);
    Ok(Head {
        request: HttpRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            body: Vec::new(),
            keep_alive,
            authorization,
            query: query.to_owned(),
            http11,
            event_stream,
            websocket: websocket.map(Box::new),
        },
        framing,
        expect_continue,
    })
}

/// One `Content-Length` value: 1*DIGIT. A value too large for `u64` saturates: its syntax
/// is fine and it is refused for its size (413), like any length over the limit.
fn content_length(value: &[u8]) -> Result<u64, Fault> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(Fault::bad("invalid Content-Length"));
    }
    Ok(value.iter().fold(0u64, |n, &d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// Parses `chunk-size [ chunk-ext ] CRLF` (RFC 9112 §7.1), strictly: at least one hex
/// digit, at most 16, optional blanks, extensions without control characters (ignored),
/// then CRLF. `line` ends with LF.
fn parse_chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r\n")?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return None;
    }
    let size = line[..digits].iter().try_fold(0u64, |n, &d| {
        let v = char::from(d).to_digit(16)?;
        n.checked_mul(16)?.checked_add(u64::from(v))
    })?;
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()..];
    let ext_ok = match rest.split_first() {
        None => true,
        Some((b';', ext)) => ext.iter().all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f)),
        Some(_) => false,
    };
    ext_ok.then_some(size)
}

/// The path of a request target: origin-form loses its query and fragment; absolute-form
/// (`http://host/p?q`, which RFC 9112 §3.2.2 says servers must accept) is reduced to its
/// path, `/` when it has none. Other forms (`*`, authority-form) are returned as they are,
/// and route to 404.
fn target_path(target: &str) -> &str {
    let path = match target.find("://") {
        Some(i) if !target.starts_with('/') => {
            let rest = &target[i + 3..];
            match rest.find(['/', '?', '#']) {
                Some(j) if rest[j..].starts_with('/') => &rest[j..],
                _ => "/",
            }
        }
        _ => target,
    };
    match path.find(['?', '#']) {
        Some(end) => &path[..end],
        None => path,
    }
}

/// The query string of a request target: what follows `?` up to `#`.
fn target_query(target: &str) -> &str {
    let Some(q) = target.find('?') else {
        return "";
    };
    let rest = &target[q + 1..];
    match rest.find('#') {
        Some(end) => &rest[..end],
        None => rest,
    }
}

/// What a head says of a WebSocket handshake, when it asks for one (`Upgrade:
/// websocket`); a key given twice counts as none.
fn websocket_head(req: &httparse::Request) -> Option<WsHead> {
    let list = |name: &str| -> Vec<String> {
        req.headers
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case(name))
            .filter_map(|f| std::str::from_utf8(f.value).ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect()
    };
    if !list("upgrade")
        .iter()
        .any(|u| u.eq_ignore_ascii_case("websocket"))
    {
        return None;
    }
    let one = |name: &str| match list(name)[..] {
        [ref v] => Some(v.clone()),
        _ => None,
    };
    Some(WsHead {
        connection_upgrade: list("connection")
            .iter()
            .any(|c| c.eq_ignore_ascii_case("upgrade")),
        key: one("sec-websocket-key"),
        version: one("sec-websocket-version"),
        protocols: list("sec-websocket-protocol"),
    })
}

/// Trims optional whitespace (SP, HTAB) from both ends.
fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let bytes = &bytes[start..];
    let end = bytes.len()
        - bytes
            .iter()
            .rev()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
    &bytes[..end]
}

impl HttpCodec {
    /// What an upgrade in place carries of this codec: the bytes not consumed, how far
    /// they were looked at, and where the parser stands (a request whose body is still
    /// arriving keeps what arrived of it).
    pub fn carry(&self, blobs: &mut BlobsOut) -> HttpImage {
        let state = match &self.state {
            Reading::Head => HttpStateImage::Head,
            // An upgrade request not answered yet closes the connection like a refusal
            // would: its WebSocket is not carried.
            Reading::Done | Reading::Upgraded => HttpStateImage::Done,
            Reading::Body(p) => HttpStateImage::Body {
                method: p.request.method.clone(),
                path: p.request.path.clone(),
                body: blobs.put(&p.request.body),
                keep_alive: p.request.keep_alive,
                authorization: p.request.authorization.clone(),
                query: p.request.query.clone(),
                http11: p.request.http11,
                event_stream: p.request.event_stream,
                framing: match p.framing {
                    Framing::Length(n) => FramingImage::Length(n),
                    Framing::Chunked(Chunk::Size) => FramingImage::ChunkSize,
                    Framing::Chunked(Chunk::Data(n)) => FramingImage::ChunkData(n),
                    Framing::Chunked(Chunk::DataEnd) => FramingImage::ChunkDataEnd,
                    Framing::Chunked(Chunk::Trailers) => FramingImage::Trailers,
                },
                continue_due: p.continue_due,
            },
        };
        HttpImage {
            unparsed: blobs.put(self.avail()),
            scanned: self.scanned,
            state,
            max_head: self.limits.max_head,
            max_headers: self.limits.max_headers,
            max_body: self.limits.max_body,
            auth: match &self.auth {
                Auth::Peer => AuthImage::Peer,
                Auth::Open => AuthImage::Open,
                Auth::Token(t) => AuthImage::Token(Bytes(t.to_vec())),
            },
            // The exchange's part (`HttpSession::carry`) fills these.
            order: Vec::new(),
            waiting: 0,
            held: 0,
            requests: 0,
            next_req: 0,
        }
    }

    /// The codec `carry` described.
    pub fn resume(img: &HttpImage, blobs: &BlobsIn) -> Result<HttpCodec, StateError> {
        let state = match &img.state {
            HttpStateImage::Head => Reading::Head,
            HttpStateImage::Done => Reading::Done,
            HttpStateImage::Body {
                method,
                path,
                body,
                keep_alive,
                authorization,
                query,
                http11,
                event_stream,
                framing,
                continue_due,
            } => Reading::Body(Box::new(Partial {
                request: HttpRequest {
                    method: method.clone(),
                    path: path.clone(),
                    body: blobs.get(*body)?.to_vec(),
                    keep_alive: *keep_alive,
                    authorization: authorization.clone(),
                    query: query.clone(),
                    http11: *http11,
                    event_stream: *event_stream,
                    websocket: None,
                },
                framing: match framing {
                    FramingImage::Length(n) => Framing::Length(*n),
                    FramingImage::ChunkSize => Framing::Chunked(Chunk::Size),
                    FramingImage::ChunkData(n) => Framing::Chunked(Chunk::Data(*n)),
                    FramingImage::ChunkDataEnd => Framing::Chunked(Chunk::DataEnd),
                    FramingImage::Trailers => Framing::Chunked(Chunk::Trailers),
                },
                continue_due: *continue_due,
            })),
        };
        let buf = blobs.get(img.unparsed)?.to_vec();
        Ok(HttpCodec {
            limits: Limits {
                max_head: img.max_head,
                max_headers: img.max_headers,
                max_body: img.max_body,
            },
            auth: match &img.auth {
                AuthImage::Peer => Auth::Peer,
                AuthImage::Open => Auth::Open,
                AuthImage::Token(t) => Auth::Token(t.0.clone().into()),
            },
            hosts: Hosts::default(),
            scanned: img.scanned.min(buf.len()),
            buf,
            start: 0,
            state,
        })
    }
}

#[cfg(test)]
impl HttpCodec {
    /// Body bytes held by the request in progress (for the memory-bound tests).
    fn held_body(&self) -> usize {
        match &self.state {
            Reading::Body(partial) => partial.request.body.len(),
            Reading::Head | Reading::Done | Reading::Upgraded => 0,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Small bounds, so the limit tests stay small.
    pub fn limits() -> Limits {
        Limits {
            max_head: 256,
            max_headers: 8,
            max_body: 1024,
        }
    }

    /// Pushes `bytes`, then takes every event the codec has.
    pub fn feed(codec: &mut HttpCodec, bytes: &[u8]) -> Vec<Event> {
        codec.push(bytes);
        std::iter::from_fn(|| codec.next()).collect()
    }

    /// Every event of `bytes` pushed at once into a new codec.
    pub fn events(bytes: &[u8]) -> Vec<Event> {
        feed(&mut HttpCodec::new(limits()), bytes)
    }

    /// The only event of `bytes`, which must be a request.
    #[track_caller]
    pub fn one_request(bytes: &[u8]) -> HttpRequest {
        match events(bytes).as_slice() {
            [Event::Request(request)] => request.clone(),
            other => panic!("expected one request, got {other:?}"),
        }
    }

    /// The status of the only event of `bytes`, which must be a closing refusal; checks
    /// the codec is then closed for good.
    #[track_caller]
    pub fn rejected(bytes: &[u8]) -> u16 {
        let mut codec = HttpCodec::new(limits());
        let events = feed(&mut codec, bytes);
        let status = match events.last() {
            Some(Event::Reject {
                status,
                close: true,
                response,
            }) => {
                let (code, head, body) = split(response);
                assert_eq!(code, *status);
                assert!(head.contains("Connection: close\r\n"), "{head}");
                let body: Value = serde_json::from_slice(&body).expect("JSON body");
                assert_eq!(body["success"], false);
                *status
            }
            other => panic!("expected a closing refusal, got {other:?}"),
        };
        assert!(codec.closed());
        assert_eq!(feed(&mut codec, b"GET /v1/health HTTP/1.1\r\n\r\n"), vec![]);
        assert_eq!(codec.pending(), 0);
        status
    }

    /// Splits an encoded response into status code, head text and body, checking
    /// `Content-Length` and `Content-Type` on the way.
    #[track_caller]
    pub fn split(response: &[u8]) -> (u16, String, Vec<u8>) {
        let text = String::from_utf8_lossy(response);
        let end = text.find("\r\n\r\n").expect("end of head");
        let head = text[..end + 4].to_string();
        let body = response[end + 4..].to_vec();
        let code = head["HTTP/1.1 ".len().."HTTP/1.1 ".len() + 3]
            .parse()
            .expect("status code");
        assert!(head.starts_with("HTTP/1.1 "), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())),
            "{head}"
        );
        assert!(
            head.contains("\r\nContent-Type: application/json; charset=utf-8\r\n"),
            "{head}"
        );
        (code, head, body)
    }

    pub fn requests(events: Vec<Event>) -> Vec<HttpRequest> {
        events
            .into_iter()
            .filter_map(|event| match event {
                Event::Request(request) => Some(request),
                _ => None,
            })
            .collect()
    }

    pub const EXEC: &[u8] = b"POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n\
        Content-Type: application/json\r\nContent-Length: 18\r\n\r\n{\"command\":\"pwd\"}\n";

    pub const CHUNKED: &[u8] = b"POST /v1/bash/write HTTP/1.1\r\nHost: execd\r\n\
        Transfer-Encoding: chunked\r\n\r\n\
        5;name=value\r\nhello\r\n6 ; x=\"y z\"\r\n world\r\n0;last\r\nX-Sum: 1\r\nY: 2\r\n\r\n";

    pub const EXPECTING: &[u8] = b"POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n\
        Expect: 100-continue\r\nContent-Length: 4\r\n\r\nbody";

    // ---- requests ----

    #[test]
    fn a_get_has_no_body_and_keeps_alive() {
        let request = one_request(b"GET /v1/health HTTP/1.1\r\nHost: execd\r\n\r\n");
        assert_eq!(
            request,
            HttpRequest {
                method: "GET".into(),
                path: "/v1/health".into(),
                body: vec![],
                keep_alive: true,
                authorization: None,
                query: String::new(),
                http11: true,
                event_stream: false,
                websocket: None,
            }
        );
    }

    // ---- browsers, tokens in query strings, WebSockets and event streams ----

    /// The status a request gets from a codec with `auth` and `--http-host` names `hosts`:
    /// 200 for a request that comes out whole.
    fn admitted_as(auth: Auth, hosts: &[&str], head: &str) -> u16 {
        let mut c = HttpCodec::with_auth(limits(), auth);
        c.set_hosts(Hosts(hosts.iter().map(|h| h.to_string()).collect()));
        match feed(&mut c, head.as_bytes()).first() {
            Some(Event::Request(_)) => 200,
            Some(Event::Reject { status, .. }) => *status,
            other => panic!("{other:?}"),
        }
    }

    fn post(extra: &str) -> String {
        format!("POST /v1/bash/exec HTTP/1.1\r\n{extra}Content-Length: 0\r\n\r\n")
    }

    #[test]
    fn a_request_from_a_browser_must_name_a_loopback_or_named_host_and_come_from_it() {
        let peer = |extra: &str| admitted_as(Auth::Peer, &["box.example"], &post(extra));
        // Neither Origin nor Sec-Fetch-*: not a browser, any Host.
        assert_eq!(peer("Host: evil.example\r\n"), 200);
        assert_eq!(peer(""), 200);
        // A cross-site page.
        assert_eq!(
            peer("Host: 127.0.0.1:8080\r\nOrigin: http://evil.example\r\n"),
            403
        );
        // DNS rebinding: the page's own origin, but a Host that is not ours.
        assert_eq!(
            peer("Host: evil.example:8080\r\nOrigin: http://evil.example:8080\r\n"),
            403
        );
        assert_eq!(
            peer("Host: evil.example\r\nSec-Fetch-Site: cross-site\r\n"),
            403
        );
        assert_eq!(peer("Sec-Fetch-Mode: no-cors\r\n"), 403, "no Host at all");
        assert_eq!(peer("Host: 127.0.0.1\r\nOrigin: null\r\n"), 403);
        assert_eq!(
            peer("Host: 127.0.0.1:8080\r\nOrigin: http://127.0.0.1:8081\r\n"),
            403,
            "another port is another origin"
        );
        assert_eq!(
            peer("Host: 127.0.0.1\r\nHost: evil.example\r\nOrigin: http://127.0.0.1\r\n"),
            403
        );
        // Our own pages.
        for (host, origin) in [
            ("127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("127.9.9.9", "https://127.9.9.9"),
            ("localhost:1", "http://LOCALHOST:1"),
            ("[::1]:8080", "http://[::1]:8080"),
            ("Box.Example:443", "https://box.example:443"),
        ] {
            assert_eq!(
                peer(&format!("Host: {host}\r\nOrigin: {origin}\r\n")),
                200,
                "{host}"
            );
        }
        assert_eq!(
            peer("Host: localhost\r\nSec-Fetch-Site: same-origin\r\n"),
            200
        );
        for host in [
            "10.0.0.1",
            "[::2]",
            "localhost.evil",
            "127.0.0.1:x",
            "127.0.0.1:",
        ] {
            assert_eq!(
                peer(&format!("Host: {host}\r\nSec-Fetch-Dest: empty\r\n")),
                403,
                "{host}"
            );
        }
        // With a token, the token is decided first, then the browser rule.
        let tok = || Auth::Token(b"tok".to_vec().into());
        let bad = "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n";
        assert_eq!(admitted_as(tok(), &[], &post(bad)), 401);
        let with = format!("{bad}Authorization: Bearer tok\r\n");
        assert_eq!(admitted_as(tok(), &[], &post(&with)), 403);
    }

    #[test]
    fn a_token_in_the_query_counts_on_the_browser_routes_only() {
        let tok = || Auth::Token(b"tok".to_vec().into());
        let get = |target: &str, extra: &str| {
            admitted_as(
                tok(),
                &[],
                &format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"),
            )
        };
        assert_eq!(get("/v1/shell/sessions?token=tok", ""), 401);
        assert_eq!(get("/v1/shell/ws?token=tok", ""), 200);
        assert_eq!(get("/v1/shell/ws?session_id=s&token=tok", ""), 200);
        assert_eq!(get("/v1/shell/ws?token=nope", ""), 401);
        assert_eq!(get("/terminal?token=tok", ""), 200);
        assert_eq!(get("/terminal?token=nope", ""), 401);
        assert_eq!(get("/terminal", ""), 200, "the page itself holds no secret");
        assert_eq!(get("/v1/health", ""), 401);
        let ws = "Upgrade: websocket\r\nConnection: Upgrade\r\n";
        assert_eq!(
            get(
                "/v1/shell/ws",
                &format!("{ws}Sec-WebSocket-Protocol: execd, execd.token.tok\r\n")
            ),
            200
        );
        assert_eq!(
            get(
                "/v1/shell/sessions",
                &format!("{ws}Sec-WebSocket-Protocol: execd.token.tok\r\n")
            ),
            401,
            "the subprotocol is the WebSocket's only"
        );
    }

    #[test]
    fn an_upgrade_request_stops_the_http_parser_and_keeps_what_follows() {
        let head = "GET /v1/shell/ws?session_id=a HTTP/1.1\r\nHost: 127.0.0.1\r\n\
            Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\
            Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
            Sec-WebSocket-Protocol: execd\r\n\r\n";
        let mut c = HttpCodec::new(limits());
        let mut bytes = head.as_bytes().to_vec();
        bytes.extend_from_slice(b"\x81\x80abcdGET /v1/health HTTP/1.1\r\n\r\n");
        let evs = feed(&mut c, &bytes);
        let [Event::Request(r)] = &evs[..] else {
            panic!("{evs:?}")
        };
        assert_eq!(
            (r.path.as_str(), r.query.as_str()),
            ("/v1/shell/ws", "session_id=a")
        );
        let ws = r.websocket.as_deref().expect("a handshake");
        assert!(ws.connection_upgrade);
        assert_eq!(ws.version.as_deref(), Some("13"));
        assert_eq!(ws.protocols, vec!["execd".to_string()]);
        assert!(c.closed());
        c.push(b"more");
        assert_eq!(c.next(), None);
        assert_eq!(
            c.take_rest(),
            b"\x81\x80abcdGET /v1/health HTTP/1.1\r\n\r\nmore"
        );
        // With a body it is refused.
        assert_eq!(
            rejected(
                b"GET /v1/shell/ws HTTP/1.1\r\nUpgrade: websocket\r\nContent-Length: 1\r\n\r\nx"
            ),
            400
        );
    }

    #[test]
    fn accept_event_stream_and_the_version_are_read() {
        let r = one_request(
            b"POST /v1/shell/exec HTTP/1.0\r\nAccept: application/json;q=0.5, Text/Event-Stream\r\n\r\n",
        );
        assert!(r.event_stream && !r.http11);
        let r = one_request(b"POST /v1/shell/exec HTTP/1.1\r\nAccept: */*\r\n\r\n");
        assert!(!r.event_stream && r.http11);
        assert_eq!(query_param("a=1&token=t&b", "token"), Some("t"));
        assert_eq!(query_param("a=1&b", "b"), Some(""));
        assert_eq!(query_param("tokens=x", "token"), None);
    }

    #[test]
    fn a_content_length_body_is_read() {
        let request = one_request(EXEC);
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/bash/exec");
        assert_eq!(request.body, b"{\"command\":\"pwd\"}\n");
    }

    #[test]
    fn a_body_that_is_not_json_is_returned_as_bytes() {
        let request =
            one_request(b"POST /v1/bash/exec HTTP/1.1\r\nContent-Length: 4\r\n\r\n{\xff\x00]");
        assert_eq!(request.body, b"{\xff\x00]");
    }

    #[test]
    fn a_post_without_framing_has_an_empty_body() {
        // What `curl -X POST http://execd/v1/bash/sessions/create` sends.
        let request = one_request(
            b"POST /v1/bash/sessions/create HTTP/1.1\r\nHost: execd\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n",
        );
        assert_eq!(request.body, b"");
        assert_eq!(request.path, "/v1/bash/sessions/create");
    }

    #[test]
    fn the_path_loses_query_and_fragment_and_absolute_form_is_reduced() {
        let path =
            |target: &str| one_request(format!("GET {target} HTTP/1.1\r\n\r\n").as_bytes()).path;
        assert_eq!(path("/v1/health?x=1&y"), "/v1/health");
        assert_eq!(
            path("/v1/bash/sessions/a%20b/close?q"),
            "/v1/bash/sessions/a%20b/close"
        );
        assert_eq!(path("http://execd:8080/v1/health?x"), "/v1/health");
        assert_eq!(path("http://execd"), "/");
        assert_eq!(path("http://execd?x=/y"), "/");
        assert_eq!(path("*"), "*");
    }

    #[test]
    fn authorization_is_kept_raw_and_trimmed() {
        let request =
            one_request(b"GET /v1/health HTTP/1.1\r\nauthorization:   Bearer s3cr=t \r\n\r\n");
        assert_eq!(request.authorization.as_deref(), Some("Bearer s3cr=t"));
    }

    #[test]
    fn two_pipelined_requests_in_one_push_come_out_in_order() {
        let mut stream = EXEC.to_vec();
        stream.extend_from_slice(b"GET /v1/bash/sessions HTTP/1.1\r\n\r\n");
        let mut codec = HttpCodec::new(limits());
        codec.push(&stream);
        let first = codec.next();
        assert!(matches!(&first, Some(Event::Request(r)) if r.path == "/v1/bash/exec"));
        assert!(codec.pending() > 0, "the second request waits its turn");
        let second = codec.next();
        assert!(matches!(&second, Some(Event::Request(r)) if r.path == "/v1/bash/sessions"));
        assert_eq!(codec.next(), None);
        assert_eq!(codec.pending(), 0);
        assert!(!codec.closed());
    }

    #[test]
    fn empty_lines_between_requests_are_ignored() {
        let mut stream = EXEC.to_vec();
        stream.extend_from_slice(b"\r\n\n\r\nGET /v1/health HTTP/1.1\r\n\r\n");
        let got = requests(events(&stream));
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].path, "/v1/health");
    }

    #[test]
    fn bare_lf_line_ends_are_accepted_in_the_head() {
        let request = one_request(b"POST /v1/bash/kill HTTP/1.1\nContent-Length: 2\n\n{}");
        assert_eq!(request.body, b"{}");
    }

    #[test]
    fn equal_duplicate_content_lengths_are_accepted() {
        let request =
            one_request(b"POST /x HTTP/1.1\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\n{}");
        assert_eq!(request.body, b"{}");
    }

    // ---- split at any byte boundary ----

    /// The requests of `stream` fed whole, for comparison with any split of it.
    fn whole(stream: &[u8]) -> Vec<HttpRequest> {
        let got = requests(events(stream));
        assert!(!got.is_empty());
        got
    }

    #[test]
    fn a_request_split_at_every_byte_boundary_assembles_the_same() {
        let mut pipelined = CHUNKED.to_vec();
        pipelined.extend_from_slice(EXEC);
        for stream in [EXEC, CHUNKED, EXPECTING, &pipelined[..]] {
            let expected = whole(stream);
            for at in 0..=stream.len() {
                let mut codec = HttpCodec::new(limits());
                let mut got = feed(&mut codec, &stream[..at]);
                got.extend(feed(&mut codec, &stream[at..]));
                let continues = got.iter().filter(|e| **e == Event::Continue).count();
                assert!(continues <= 1, "split at {at}: {continues} Continue events");
                assert_eq!(requests(got), expected, "split at {at}");
                assert_eq!(codec.pending(), 0, "split at {at}");
            }
        }
    }

    #[test]
    fn a_request_split_in_three_anywhere_assembles_the_same() {
        let stream = CHUNKED;
        let expected = whole(stream);
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                let mut codec = HttpCodec::new(limits());
                let mut got = feed(&mut codec, &stream[..a]);
                got.extend(feed(&mut codec, &stream[a..b]));
                got.extend(feed(&mut codec, &stream[b..]));
                assert_eq!(requests(got), expected, "split at {a} and {b}");
            }
        }
    }

    #[test]
    fn a_request_trickled_byte_by_byte_assembles_the_same() {
        let mut stream = EXPECTING.to_vec();
        stream.extend_from_slice(CHUNKED);
        stream.extend_from_slice(EXEC);
        let mut codec = HttpCodec::new(limits());
        let mut got = Vec::new();
        for byte in &stream {
            got.extend(feed(&mut codec, std::slice::from_ref(byte)));
        }
        assert_eq!(got[0], Event::Continue);
        assert_eq!(requests(got), whole(&stream));
    }

    // ---- chunked ----

    #[test]
    fn chunked_bodies_ignore_extensions_and_trailers() {
        let request = one_request(CHUNKED);
        assert_eq!(request.body, b"hello world");
        assert!(request.keep_alive);
    }

    #[test]
    fn chunked_sizes_are_hex_in_either_case_and_may_have_leading_zeros() {
        let request = one_request(
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n\
              A\r\n0123456789\r\n00b\r\nabcdefghijk\r\n000\r\n\r\n",
        );
        assert_eq!(request.body, b"0123456789abcdefghijk");
    }

    #[test]
    fn an_empty_chunked_body_is_empty() {
        let request =
            one_request(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        assert_eq!(request.body, b"");
    }

    #[test]
    fn malformed_chunk_framing_is_400() {
        let head = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for body in [
            "zz\r\n",                    // not hex
            "\r\nabc",                   // no size at all
            "5\nhello\r\n0\r\n\r\n",     // bare LF after the size
            "5\r\nhelloXY0\r\n\r\n",     // data not followed by CRLF
            "5 6\r\nhello\r\n0\r\n\r\n", // junk after the size
            "5;a\x01b\r\nhello\r\n",     // control character in an extension
            "11111111111111111\r\n",     // more than 16 digits
            "0\r\nbad trailer\r\n\r\n",  // trailer that is not a field
        ] {
            assert_eq!(
                rejected(format!("{head}{body}").as_bytes()),
                400,
                "{body:?}"
            );
        }
        let long = format!(
            "{head}5;{}\r\nhello\r\n0\r\n\r\n",
            "x".repeat(MAX_CHUNK_LINE)
        );
        assert_eq!(rejected(long.as_bytes()), 400);
        let unterminated = format!("{head}5;{}", "x".repeat(MAX_CHUNK_LINE + 1));
        assert_eq!(rejected(unterminated.as_bytes()), 400);
    }

    // ---- keep-alive ----

    #[test]
    fn http10_closes_unless_keep_alive_is_asked_for() {
        let mut codec = HttpCodec::new(limits());
        let got = feed(
            &mut codec,
            b"GET /v1/health HTTP/1.0\r\n\r\nGET /v1/health HTTP/1.0\r\n\r\n",
        );
        assert_eq!(requests(got.clone()).len(), 1, "{got:?}");
        assert!(!requests(got)[0].keep_alive);
        assert!(codec.closed(), "nothing after a last request is parsed");
        assert_eq!(codec.pending(), 0);

        let got = requests(events(
            b"GET /v1/health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET /v1/health HTTP/1.0\r\n\r\n",
        ));
        assert_eq!(got.len(), 2);
        assert!(got[0].keep_alive);
        assert!(!got[1].keep_alive);
    }

    #[test]
    fn connection_close_ends_an_http11_connection() {
        let close = |value: &str| {
            !one_request(format!("GET / HTTP/1.1\r\nConnection: {value}\r\n\r\n").as_bytes())
                .keep_alive
        };
        assert!(close("close"));
        assert!(close("CLOSE"));
        assert!(close("keep-alive, close"));
        assert!(close("Upgrade,  Close "));
        assert!(!close("keep-alive"));
        assert!(!close("upgrade"));
    }

    // ---- Expect: 100-continue ----

    #[test]
    fn expect_continue_is_answered_before_the_body_arrives() {
        let (head, body) = EXPECTING.split_at(EXPECTING.len() - 4);
        let mut codec = HttpCodec::new(limits());
        assert_eq!(feed(&mut codec, head), vec![Event::Continue]);
        assert_eq!(
            feed(&mut codec, &body[..2]),
            vec![],
            "Continue is sent once"
        );
        let got = feed(&mut codec, &body[2..]);
        assert!(matches!(&got[..], [Event::Request(r)] if r.body == b"body"));
        assert_eq!(CONTINUE, b"HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn expect_continue_with_the_body_already_here_needs_no_interim_answer() {
        assert_eq!(requests(events(EXPECTING)).len(), 1);
        assert!(matches!(&events(EXPECTING)[..], [Event::Request(_)]));
        let empty = b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n";
        assert!(matches!(&events(empty)[..], [Event::Request(_)]));
    }

    #[test]
    fn expect_continue_works_with_chunked_bodies() {
        let head =
            b"POST /x HTTP/1.1\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut codec = HttpCodec::new(limits());
        assert_eq!(feed(&mut codec, head), vec![Event::Continue]);
        let got = feed(&mut codec, b"2\r\n{}\r\n0\r\n\r\n");
        assert!(matches!(&got[..], [Event::Request(r)] if r.body == b"{}"));
    }

    #[test]
    fn http10_gets_no_interim_answer() {
        let mut codec = HttpCodec::new(limits());
        let head = b"POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(feed(&mut codec, head), vec![]);
        assert_eq!(requests(feed(&mut codec, b"{}")).len(), 1);
    }

    #[test]
    fn expect_continue_without_framing_is_411() {
        assert_eq!(
            rejected(b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"),
            411
        );
    }

    // ---- refusals ----

    #[test]
    fn a_head_that_does_not_parse_is_400() {
        for head in [
            &b"GET /v1/health HTTP/1.1\r\nNo colon here\r\n\r\n"[..],
            b"GET /v1/he\x01lth HTTP/1.1\r\n\r\n",
            b"GET  /v1/health HTTP/1.1\r\n\r\n",
            b"G(ET /v1/health HTTP/1.1\r\n\r\n",
            b"GET /v1/health HTTP/1.1\r\nBad\x00: v\r\n\r\n",
            b"GET /v1/health HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n",
        ] {
            assert_eq!(rejected(head), 400, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn a_malformed_request_line_is_refused_before_the_head_ends() {
        let mut codec = HttpCodec::new(limits());
        let got = feed(&mut codec, b"GET /v1/he\x7flth HTTP/1.1\r\n");
        assert!(matches!(&got[..], [Event::Reject { status: 400, .. }]));
    }

    #[test]
    fn bad_or_conflicting_lengths_are_400() {
        for length in ["abc", "-1", "+5", "", "5 5", "0x5", "5, 6", "1,"] {
            let head = format!("POST /x HTTP/1.1\r\nContent-Length: {length}\r\n\r\n");
            assert_eq!(rejected(head.as_bytes()), 400, "{length:?}");
        }
        let twice = b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!";
        assert_eq!(rejected(twice), 400);
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let both =
            b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(rejected(both), 400);
        let te = |value: &str, version: &str| {
            rejected(
                format!("POST /x HTTP/{version}\r\nTransfer-Encoding: {value}\r\n\r\n").as_bytes(),
            )
        };
        assert_eq!(te("gzip", "1.1"), 400, "chunked is not final");
        assert_eq!(te("chunked, gzip", "1.1"), 400);
        assert_eq!(te("chunked, chunked", "1.1"), 400);
        assert_eq!(te("identity", "1.1"), 400);
        assert_eq!(te("", "1.1"), 400);
        assert_eq!(
            te("gzip, chunked", "1.1"),
            501,
            "a coding execd does not decode"
        );
        assert_eq!(
            te("chunked", "1.0"),
            400,
            "HTTP/1.0 has no transfer codings"
        );
        let split =
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(rejected(split), 501);
        let listed =
            one_request(b"POST /x HTTP/1.1\r\nTransfer-Encoding: ,chunked,\r\n\r\n0\r\n\r\n");
        assert_eq!(listed.body, b"");
    }

    #[test]
    fn two_authorization_headers_are_400() {
        let head = b"GET /v1/health HTTP/1.1\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n";
        assert_eq!(rejected(head), 400);
        let binary = b"GET /v1/health HTTP/1.1\r\nAuthorization: Bearer \xff\r\n\r\n";
        assert_eq!(rejected(binary), 400);
    }

    #[test]
    fn other_versions_are_505() {
        for line in [
            "GET / HTTP/2.0\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.2\r\n\r\n",
            "GET / HTTP/0.9\r\n\r\n",
        ] {
            assert_eq!(rejected(line.as_bytes()), 505, "{line:?}");
        }
    }

    #[test]
    fn versions_that_are_not_http_versions_are_400() {
        for line in [
            "GET / FTP/1.1\r\n\r\n",
            "GET / HTTP/1.x\r\n\r\n",
            "GET / HTTP/11\r\n\r\n",
            "GET / http/1.1\r\n\r\n",
            "GET /a /b HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(rejected(line.as_bytes()), 400, "{line:?}");
        }
    }

    #[test]
    fn heads_over_their_bounds_are_431() {
        let limits = limits();
        // No end of head within max_head bytes.
        let endless = format!(
            "GET /v1/health HTTP/1.1\r\nX: {}",
            "a".repeat(limits.max_head)
        );
        assert_eq!(rejected(endless.as_bytes()), 431);
        // A head that ends, but past max_head.
        let long = format!(
            "GET /v1/health HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(limits.max_head)
        );
        assert_eq!(rejected(long.as_bytes()), 431);
        // One field too many.
        let fields: String = (0..=limits.max_headers)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            rejected(format!("GET / HTTP/1.1\r\n{fields}\r\n").as_bytes()),
            431
        );
        // Exactly max_headers fields is fine.
        let fields: String = (0..limits.max_headers)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        one_request(format!("GET / HTTP/1.1\r\n{fields}\r\n").as_bytes());
        // Trailers have the same bounds.
        let trailers: String = (0..=limits.max_headers)
            .map(|i| format!("T-{i}: v\r\n"))
            .collect();
        let chunked =
            format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{trailers}\r\n");
        assert_eq!(rejected(chunked.as_bytes()), 431);
        let trailer = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: {}",
            "t".repeat(limits.max_head)
        );
        assert_eq!(rejected(trailer.as_bytes()), 431);
    }

    #[test]
    fn the_431_is_reported_however_the_head_trickles_in() {
        let mut codec = HttpCodec::new(limits());
        let mut got = feed(&mut codec, b"GET / HTTP/1.1\r\nX: ");
        for _ in 0..limits().max_head {
            got.extend(feed(&mut codec, b"a"));
            assert!(codec.pending() <= limits().max_head + 1);
        }
        assert!(
            matches!(&got[..], [Event::Reject { status: 431, .. }]),
            "{got:?}"
        );
    }

    #[test]
    fn a_large_head_trickled_byte_by_byte_is_parsed_once_per_line() {
        // Re-parsing on every byte would be quadratic: ~60 KiB x 60 KiB here.
        let mut codec = HttpCodec::new(Limits::new(1024));
        let head = format!(
            "GET /v1/health HTTP/1.1\r\nX-Long: {}\r\n\r\n",
            "v".repeat(60 * 1024)
        );
        let mut got = Vec::new();
        for byte in head.as_bytes() {
            got.extend(feed(&mut codec, std::slice::from_ref(byte)));
        }
        assert!(matches!(&got[..], [Event::Request(r)] if r.path == "/v1/health"));
    }

    #[test]
    fn bodies_over_the_limit_are_413_before_they_are_buffered() {
        let max = limits().max_body;
        // Refused from the head alone, even with Expect (no Continue is sent).
        let head = format!(
            "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            max + 1
        );
        assert_eq!(rejected(head.as_bytes()), 413);
        let huge = b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999999999\r\n\r\n";
        assert_eq!(rejected(huge), 413);
        // Exactly the limit is fine.
        let exact = format!(
            "POST /x HTTP/1.1\r\nContent-Length: {max}\r\n\r\n{}",
            "a".repeat(max)
        );
        assert_eq!(one_request(exact.as_bytes()).body.len(), max);
        // Chunked: refused at the chunk that would pass the limit.
        let mut codec = HttpCodec::new(limits());
        let first = format!(
            "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n",
            max,
            "a".repeat(max)
        );
        assert_eq!(feed(&mut codec, first.as_bytes()), vec![]);
        let got = feed(&mut codec, b"1\r\n");
        assert!(matches!(
            &got[..],
            [Event::Reject {
                status: 413,
                close: true,
                ..
            }]
        ));
        let giant = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n";
        assert_eq!(rejected(giant), 413);
    }

    #[test]
    fn after_a_refusal_nothing_more_is_parsed() {
        let mut codec = HttpCodec::new(limits());
        let got = feed(
            &mut codec,
            b"GET / HTTP/3\r\n\r\nGET /v1/health HTTP/1.1\r\n\r\n",
        );
        assert_eq!(got.len(), 1);
        assert!(codec.closed());
        for _ in 0..3 {
            assert_eq!(codec.next(), None);
        }
        codec.push(b"GET /v1/health HTTP/1.1\r\n\r\n");
        assert_eq!(codec.pending(), 0);
        assert_eq!(codec.next(), None);
    }

    #[test]
    fn a_request_without_the_token_is_refused_on_its_head_before_anything_else() {
        let token = Auth::Token(std::sync::Arc::from(&b"s3cret"[..]));
        let codec = || HttpCodec::with_auth(limits(), token.clone());
        // A body far over the limit, no token: 401, not 413, and none of it is kept.
        let mut c = codec();
        c.push(b"POST /v1/bash/exec HTTP/1.1\r\nContent-Length: 999999999\r\n\r\nxxxx");
        let Some(Event::Reject {
            status,
            close,
            response,
        }) = c.next()
        else {
            panic!("not refused");
        };
        assert_eq!((status, close), (401, true));
        let (_, head, _) = split(&response);
        assert!(head.contains("\r\nWWW-Authenticate: Bearer\r\n"), "{head}");
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        assert_eq!(c.pending(), 0, "nothing of the body is held");
        c.push(b"more body");
        assert!(
            c.next().is_none() && c.pending() == 0,
            "nothing more is read"
        );
        for head in [
            "GET /v1/health HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n",
            "GET /v1/health HTTP/1.1\r\nAuthorization: Basic s3cret\r\n\r\n",
            "GET /v1/health HTTP/1.1\r\nAuthorization: Bearer s3cret\r\nAuthorization: Bearer s3cret\r\n\r\n",
        ] {
            let got = feed(&mut codec(), head.as_bytes());
            assert!(
                matches!(&got[..], [Event::Reject { status: 401, .. }]),
                "{head:?}: {got:?}"
            );
        }
        let got = feed(
            &mut codec(),
            b"GET /v1/health HTTP/1.1\r\nAuthorization: bearer  s3cret \r\n\r\n",
        );
        assert!(matches!(&got[..], [Event::Request(_)]), "{got:?}");
        // With the token, the other checks follow: 413 for the body.
        let got = feed(
            &mut codec(),
            b"POST /v1/bash/exec HTTP/1.1\r\nAuthorization: Bearer s3cret\r\nContent-Length: 999999999\r\n\r\n",
        );
        assert!(
            matches!(&got[..], [Event::Reject { status: 413, .. }]),
            "{got:?}"
        );
    }

    #[test]
    fn a_refusal_is_a_complete_response() {
        let got = events(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n");
        let Some(Event::Reject { response, .. }) = got.first() else {
            panic!("{got:?}");
        };
        let (code, head, body) = split(response);
        assert_eq!(code, 400);
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["success"], false);
        assert_eq!(body["data"], Value::Null);
        assert_eq!(body["hint"], Value::Null);
        assert!(body["message"]
            .as_str()
            .is_some_and(|m| m.contains("Content-Length")));
        let got = events(format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", 5000).as_bytes());
        let Some(Event::Reject { response, .. }) = got.first() else {
            panic!("{got:?}");
        };
        let body: Value = serde_json::from_slice(&split(response).2).expect("JSON");
        assert_eq!(body["data"], json!({ "limit": limits().max_body }));
    }

    // ---- memory ----

    #[test]
    fn a_body_is_moved_out_of_the_input_buffer_as_it_arrives() {
        let max = limits().max_body;
        let mut codec = HttpCodec::new(limits());
        feed(
            &mut codec,
            format!("POST /x HTTP/1.1\r\nContent-Length: {max}\r\n\r\n").as_bytes(),
        );
        for _ in 0..max / 16 - 1 {
            assert_eq!(feed(&mut codec, &[b'a'; 16]), vec![]);
            assert_eq!(codec.pending(), 0);
        }
        assert!(codec.held_body() <= max);
        let got = feed(&mut codec, &[b'a'; 16]);
        assert!(matches!(&got[..], [Event::Request(r)] if r.body.len() == max));

        // One-byte chunks: the framing never accumulates.
        feed(
            &mut codec,
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        for _ in 0..max {
            assert_eq!(feed(&mut codec, b"1\r\nz\r\n"), vec![]);
            assert_eq!(codec.pending(), 0);
        }
        let got = feed(&mut codec, b"0\r\n\r\n");
        assert!(matches!(&got[..], [Event::Request(r)] if r.body.len() == max));
    }

    #[test]
    fn the_input_buffer_gives_back_its_capacity_when_drained() {
        let mut codec = HttpCodec::new(Limits::new(1 << 20));
        let body = vec![b'a'; 200_000];
        let mut stream =
            format!("POST /x HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        stream.extend_from_slice(&body);
        assert_eq!(requests(feed(&mut codec, &stream)).len(), 1);
        assert!(codec.buf.capacity() <= KEEP_CAPACITY);
    }

    // ---- properties ----

    /// Feeds `stream` cut at `cuts`, draining after each piece and checking the memory
    /// bound; returns every event.
    fn feed_in_pieces(stream: &[u8], cuts: &[usize]) -> Vec<Event> {
        let limits = limits();
        let mut codec = HttpCodec::new(limits);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(stream.len());
        let mut got = Vec::new();
        let mut from = 0;
        for to in cuts {
            got.extend(feed(&mut codec, &stream[from..to]));
            from = to;
            assert!(codec.pending() <= limits.max_head.max(MAX_CHUNK_LINE));
            assert!(codec.held_body() <= limits.max_body);
            if codec.closed() {
                assert_eq!(codec.pending(), 0);
                assert_eq!(codec.next(), None);
            }
        }
        got
    }

    /// One well-formed request, built from generated parts.
    fn request_strategy() -> impl Strategy<Value = Vec<u8>> {
        let method = prop::sample::select(vec!["GET", "POST", "PUT"]);
        let path = "/[a-z0-9%/]{0,12}";
        let body = prop::collection::vec(any::<u8>(), 0..64);
        let chunk_sizes = prop::collection::vec(1usize..8, 0..6);
        (
            method,
            path,
            body,
            any::<bool>(),
            chunk_sizes,
            any::<bool>(),
        )
            .prop_map(|(method, path, body, chunked, sizes, expect)| {
                let mut out = format!("{method} {path} HTTP/1.1\r\nHost: execd\r\n").into_bytes();
                if expect {
                    out.extend_from_slice(b"Expect: 100-continue\r\n");
                }
                if chunked {
                    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    let mut rest = &body[..];
                    let mut sizes = sizes.iter().cycle();
                    while !rest.is_empty() {
                        let n = sizes.next().copied().unwrap_or(rest.len()).min(rest.len());
                        out.extend_from_slice(format!("{n:x};ext=1\r\n").as_bytes());
                        out.extend_from_slice(&rest[..n]);
                        out.extend_from_slice(b"\r\n");
                        rest = &rest[n..];
                    }
                    out.extend_from_slice(b"0\r\nTrailer: t\r\n\r\n");
                } else {
                    out.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    out.extend_from_slice(&body);
                }
                out
            })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_nor_pile_up(
            stream in prop::collection::vec(any::<u8>(), 0..2048),
            cuts in prop::collection::vec(any::<usize>(), 0..16),
        ) {
            feed_in_pieces(&stream, &cuts);
        }

        #[test]
        fn arbitrary_text_after_a_valid_start_never_panics(
            tail in "[ -~\r\n\t]{0,600}",
            cuts in prop::collection::vec(any::<usize>(), 0..16),
        ) {
            let mut stream = b"POST /v1/bash/exec HTTP/1.1\r\n".to_vec();
            stream.extend_from_slice(tail.as_bytes());
            feed_in_pieces(&stream, &cuts);
            let mut stream = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            stream.extend_from_slice(tail.as_bytes());
            feed_in_pieces(&stream, &cuts);
        }

        #[test]
        fn pipelined_requests_split_anywhere_assemble_the_same(
            parts in prop::collection::vec(request_strategy(), 1..5),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let stream = parts.concat();
            let expected = requests(events(&stream));
            prop_assert_eq!(expected.len(), parts.len());
            prop_assert_eq!(requests(feed_in_pieces(&stream, &cuts)), expected);
        }
    }
}
