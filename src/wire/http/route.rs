//! Routes and responses of section 11 (and of 12.2's `/v1/shell/*`): which method a path
//! maps to, the seed's envelopes (`{"success", "message", "data", "hint"}`), FastAPI-style 422 bodies, and
//! the status each JSON-RPC error code maps to. The bash pipe API's own clients (curl, its
//! Python and TypeScript SDKs) must work unmodified, so the shapes follow that API exactly.

use serde_json::{json, Value};

/// The body of `GET /v1/health`.
pub const HEALTH_BODY: &[u8] = br#"{"status":"ok"}"#;

/// The `message` of every success envelope. The seed's responses do not show one; "ok"
/// matches `GET /v1/health` and carries no claim about the command itself (its `status`
/// and `exit_code` do).
pub const SUCCESS_MESSAGE: &str = "ok";

/// What a route maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /v1/health`: answered with `HEALTH_BODY`, no method behind it.
    Health,
    Exec,
    Output,
    Write,
    Kill,
    /// `POST /v1/bash/resize`: a PTY command's window size (PROTOCOL 12.1).
    Resize,
    SessionsCreate,
    Sessions,
    /// `POST /v1/bash/sessions/{session_id}/close`, with the id percent-decoded. The caller
    /// puts it into the params as `session_id`.
    SessionClose(String),
    /// A `/v1/shell/*` route (PROTOCOL 12.2): the `shell/*` method it maps to.
    Shell(&'static str),
    /// `DELETE /v1/shell/sessions/{id}`, with the id percent-decoded. The caller puts it
    /// into the params as `id`.
    ShellClose(String),
    /// `GET /v1/shell/ws`: the session as a WebSocket (PROTOCOL 12.5).
    Ws,
    /// `GET /terminal`: the page that shows a session in a browser (PROTOCOL 12.5).
    Terminal,
}

impl Route {
    /// The `bash/*` method of section 5 this route maps to; `None` for `Health`.
    pub fn method(&self) -> Option<&'static str> {
        Some(match self {
            Route::Health | Route::Ws | Route::Terminal => return None,
            Route::Exec => "bash/exec",
            Route::Output => "bash/output",
            Route::Write => "bash/write",
            Route::Kill => "bash/kill",
            Route::Resize => "bash/resize",
            Route::SessionsCreate => "bash/sessions/create",
            Route::Sessions => "bash/sessions",
            Route::SessionClose(_) => "bash/sessions/close",
            Route::Shell(method) => method,
            Route::ShellClose(_) => "shell/sessions/close",
        })
    }
}

/// Why a request has no route: 404 (unknown path) or 405 (known path, other method, with
/// the `Allow` value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub allow: Option<&'static str>,
}

impl Refusal {
    /// The encoded answer: the failure envelope, plus `Allow` on a 405.
    pub fn response(&self, keep_alive: bool) -> Vec<u8> {
        let message = match self.status {
            405 => "method not allowed",
            _ => "not found",
        };
        let body = failure_body(message, None);
        match self.allow {
            Some(allow) => response(self.status, &body, keep_alive, &[("Allow", allow)]),
            None => response(self.status, &body, keep_alive, &[]),
        }
    }
}

/// The routes of section 11. Paths are exact (a trailing slash is another path): unknown
/// paths are 404; a known path with another method is 405 with its `Allow` value. Methods
/// are case-sensitive, and `HEAD` is not implied by `GET`. Only the session id of
/// `SessionClose` is percent-decoded: an invalid escape, an empty id or one that is not
/// UTF-8 is 404; an id holding `/` once decoded (sent as `%2F`) is fine.
pub fn route(method: &str, path: &str) -> Result<Route, Refusal> {
    if let Some(rest) = path.strip_prefix("/v1/shell/") {
        return shell_route(method, rest);
    }
    let (route, allow) = match path {
        "/v1/health" => (Route::Health, "GET"),
        "/terminal" => (Route::Terminal, "GET"),
        "/v1/bash/exec" => (Route::Exec, "POST"),
        "/v1/bash/output" => (Route::Output, "POST"),
        "/v1/bash/write" => (Route::Write, "POST"),
        "/v1/bash/kill" => (Route::Kill, "POST"),
        "/v1/bash/resize" => (Route::Resize, "POST"),
        "/v1/bash/sessions/create" => (Route::SessionsCreate, "POST"),
        "/v1/bash/sessions" => (Route::Sessions, "GET"),
        _ => match session_to_close(path) {
            Some(id) => (Route::SessionClose(id), "POST"),
            None => {
                return Err(Refusal {
                    status: 404,
                    allow: None,
                })
            }
        },
    };
    if method == allow {
        Ok(route)
    } else {
        Err(Refusal {
            status: 405,
            allow: Some(allow),
        })
    }
}

/// The routes of the AIO sandbox's `/v1/shell/*` (`rest` is what follows `/v1/shell/`),
/// as its SDK calls them. `DELETE /v1/shell/sessions/{id}` closes session `id` whatever
/// the segment (as FastAPI routes it, `stats` and `create` included); the same paths with
/// another method are 405 naming both.
fn shell_route(method: &str, rest: &str) -> Result<Route, Refusal> {
    let fixed = |name: &'static str, allow: &'static str| {
        if method == allow {
            Ok(Route::Shell(name))
        } else {
            Err(Refusal {
                status: 405,
                allow: Some(allow),
            })
        }
    };
    match rest {
        "exec" => fixed("shell/exec", "POST"),
        "view" => fixed("shell/view", "POST"),
        "wait" => fixed("shell/wait", "POST"),
        "write" => fixed("shell/write", "POST"),
        "kill" => fixed("shell/kill", "POST"),
        // execd's, beside the SDK's routes (PROTOCOL 12.2, as /v1/bash/resize is to 12.1).
        "resize" => fixed("shell/resize", "POST"),
        "ws" if method == "GET" => Ok(Route::Ws),
        "ws" => Err(Refusal {
            status: 405,
            allow: Some("GET"),
        }),
        "sessions" => match method {
            "GET" => Ok(Route::Shell("shell/sessions")),
            "DELETE" => Ok(Route::Shell("shell/sessions/close_all")),
            _ => Err(Refusal {
                status: 405,
                allow: Some("GET, DELETE"),
            }),
        },
        _ => {
            let Some(segment) = rest.strip_prefix("sessions/") else {
                return Err(Refusal {
                    status: 404,
                    allow: None,
                });
            };
            let (name, allow) = match segment {
                "stats" => (Some("shell/sessions/stats"), "GET, DELETE"),
                "create" => (Some("shell/sessions/create"), "POST, DELETE"),
                "update" => (Some("shell/sessions/update"), "POST, DELETE"),
                _ => (None, "DELETE"),
            };
            let own = allow.split(", ").next().unwrap_or("");
            match (name, method) {
                (Some(name), m) if m == own => Ok(Route::Shell(name)),
                (_, "DELETE") => match decoded_segment(segment) {
                    Some(id) => Ok(Route::ShellClose(id)),
                    None => Err(Refusal {
                        status: 404,
                        allow: None,
                    }),
                },
                _ if decoded_segment(segment).is_none() => Err(Refusal {
                    status: 404,
                    allow: None,
                }),
                _ => Err(Refusal {
                    status: 405,
                    allow: Some(allow),
                }),
            }
        }
    }
}

/// One path segment percent-decoded: `None` when it is empty, holds `/`, has a bad
/// escape or is not UTF-8 once decoded.
fn decoded_segment(segment: &str) -> Option<String> {
    if segment.is_empty() || segment.contains('/') {
        return None;
    }
    let id = percent_decode(segment)?;
    (!id.is_empty()).then_some(id)
}

/// The decoded id of `/v1/bash/sessions/{id}/close`, if `path` is one.
fn session_to_close(path: &str) -> Option<String> {
    let segment = path
        .strip_prefix("/v1/bash/sessions/")?
        .strip_suffix("/close")?;
    decoded_segment(segment)
}

/// Decodes `%XX` escapes (RFC 3986 §2.1; `+` stays `+` in a path). `None` for a bad escape
/// or a result that is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The reason phrase of the statuses this module and its callers send.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        // The phrase is informative only (RFC 9112 §4); clients read the code.
        _ => "Unknown",
    }
}

/// Encodes a complete response: status line (HTTP/1.1), `Content-Type: application/json;
/// charset=utf-8`, `Content-Length`, `Connection: keep-alive|close`, the `extra` headers
/// (e.g. `("Allow", "POST")`, `("WWW-Authenticate", "Bearer")`), then `body`.
pub fn response(status: u16, body: &[u8], keep_alive: bool, extra: &[(&str, &str)]) -> Vec<u8> {
    typed_response(
        status,
        "application/json; charset=utf-8",
        body,
        keep_alive,
        extra,
    )
}

/// `response` with another `Content-Type` (the terminal page's HTML).
pub fn typed_response(
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: {connection}\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in extra {
        // Extra headers are the caller's constants, never peer input; a line break in one
        // would be a bug that splits the response.
        debug_assert!(!name.contains(['\r', '\n']) && !value.contains(['\r', '\n']));
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// The head of a server-sent events answer (PROTOCOL 12.5): chunked, so its end is seen
/// and the connection may be kept alive.
pub fn event_stream_head(keep_alive: bool) -> Vec<u8> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
         Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: {connection}\r\n\r\n"
    )
    .into_bytes()
}

/// One server-sent event (`event: NAME`, `data: DATA`, a blank line) as one chunk. `data`
/// is one line of JSON.
pub fn event_chunk(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    let len = "event: \ndata: \n\n".len() + name.len() + data.len();
    out.extend_from_slice(format!("{len:x}\r\nevent: {name}\ndata: ").as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n\r\n");
}

/// The chunk that ends a chunked answer.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The success envelope: `{"success": true, "message": "ok", "data": RESULT, "hint": null}`,
/// RESULT being the JSON-RPC result unchanged.
pub fn success_body(result: &Value) -> Vec<u8> {
    envelope(true, SUCCESS_MESSAGE, Some(result))
}

/// The failure envelope: `{"success": false, "message": MESSAGE, "data": DATA or null,
/// "hint": null}`.
pub fn failure_body(message: &str, data: Option<&Value>) -> Vec<u8> {
    envelope(false, message, data)
}

/// An envelope, its keys in the seed's order whatever serde_json's map keeps (sorted, or
/// as inserted where a dependency turns on `preserve_order`), and `data` written where it
/// is rather than copied into a map first.
fn envelope(success: bool, message: &str, data: Option<&Value>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(if success {
        b"{\"success\":true,\"message\":"
    } else {
        b"{\"success\":false,\"message\":"
    });
    // Writing a string or a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut b, message);
    b.extend_from_slice(b",\"data\":");
    let _ = serde_json::to_writer(&mut b, &data.unwrap_or(&Value::Null));
    b.extend_from_slice(b",\"hint\":null}");
    b
}

/// Maps a JSON-RPC error to its HTTP status and body (section 11). `-32602` is 422 with a
/// FastAPI-style `detail` naming `data.field` and `data.reason` (loc `["body"]` when there is
/// no field; msg the message when there is no reason); `-32700` is 422 with loc `["body"]`;
/// every other code gets the failure envelope with status 404 (`-32002`), 429 (`-32003`),
/// 403 (`-32005`, `-32006`), 503 (`-32007`), 500 (`-32603`) or 400 (anything else).
pub fn error_body(code: i64, message: &str, data: Option<&Value>) -> (u16, Vec<u8>) {
    let status = match code {
        -32602 | -32700 => 422,
        -32002 => 404,
        -32003 => 429,
        -32005 | -32006 => 403,
        -32007 => 503,
        -32603 => 500,
        _ => 400,
    };
    if status != 422 {
        return (status, failure_body(message, data));
    }
    let field = data.filter(|_| code == -32602).and_then(|d| d.get("field"));
    let loc = match field.and_then(Value::as_str) {
        Some(field) => json!(["body", field]),
        None => json!(["body"]),
    };
    let msg = data
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str)
        .unwrap_or(message);
    let body = json!({
        "detail": [{ "loc": loc, "msg": msg, "type": "value_error" }],
    });
    (status, body.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::super::codec::tests::*;
    use super::*;
    // ---- routes ----

    #[test]
    fn every_route_of_the_seed_is_served() {
        let cases = [
            ("GET", "/v1/health", Route::Health, None),
            ("POST", "/v1/bash/exec", Route::Exec, Some("bash/exec")),
            (
                "POST",
                "/v1/bash/output",
                Route::Output,
                Some("bash/output"),
            ),
            ("POST", "/v1/bash/write", Route::Write, Some("bash/write")),
            ("POST", "/v1/bash/kill", Route::Kill, Some("bash/kill")),
            (
                "POST",
                "/v1/bash/resize",
                Route::Resize,
                Some("bash/resize"),
            ),
            (
                "POST",
                "/v1/bash/sessions/create",
                Route::SessionsCreate,
                Some("bash/sessions/create"),
            ),
            (
                "GET",
                "/v1/bash/sessions",
                Route::Sessions,
                Some("bash/sessions"),
            ),
            (
                "POST",
                "/v1/bash/sessions/s1/close",
                Route::SessionClose("s1".into()),
                Some("bash/sessions/close"),
            ),
        ];
        for (method, path, expected, rpc) in cases {
            let got = route(method, path);
            assert_eq!(got.as_ref(), Ok(&expected), "{method} {path}");
            assert_eq!(expected.method(), rpc);
        }
    }

    #[test]
    fn every_shell_route_of_the_sdk_is_served() {
        let cases = [
            ("POST", "/v1/shell/exec", "shell/exec"),
            ("POST", "/v1/shell/view", "shell/view"),
            ("POST", "/v1/shell/wait", "shell/wait"),
            ("POST", "/v1/shell/write", "shell/write"),
            ("POST", "/v1/shell/kill", "shell/kill"),
            ("POST", "/v1/shell/resize", "shell/resize"),
            ("POST", "/v1/shell/sessions/create", "shell/sessions/create"),
            ("POST", "/v1/shell/sessions/update", "shell/sessions/update"),
            ("GET", "/v1/shell/sessions", "shell/sessions"),
            ("GET", "/v1/shell/sessions/stats", "shell/sessions/stats"),
            ("DELETE", "/v1/shell/sessions", "shell/sessions/close_all"),
        ];
        for (method, path, rpc) in cases {
            let got = route(method, path).expect(path);
            assert_eq!(got.method(), Some(rpc), "{method} {path}");
        }
        for (path, id) in [
            ("/v1/shell/sessions/s1", "s1"),
            ("/v1/shell/sessions/a%20b", "a b"),
            ("/v1/shell/sessions/stats", "stats"),
            ("/v1/shell/sessions/create", "create"),
        ] {
            assert_eq!(
                route("DELETE", path),
                Ok(Route::ShellClose(id.into())),
                "{path}"
            );
        }
        let refused = |method: &str, path: &str| route(method, path).expect_err(path);
        assert_eq!(refused("GET", "/v1/shell/exec").allow, Some("POST"));
        assert_eq!(
            refused("POST", "/v1/shell/sessions").allow,
            Some("GET, DELETE")
        );
        assert_eq!(
            refused("POST", "/v1/shell/sessions/stats").allow,
            Some("GET, DELETE")
        );
        assert_eq!(
            refused("GET", "/v1/shell/sessions/s1").allow,
            Some("DELETE")
        );
        for path in [
            "/v1/shell",
            "/v1/shell/",
            "/v1/shell/terminal-url",
            "/v1/shell/sessions/",
            "/v1/shell/sessions/a/b",
            "/v1/shell/sessions/%zz",
        ] {
            assert_eq!(refused("DELETE", path).status, 404, "{path}");
        }
    }

    #[test]
    fn unknown_paths_are_404_and_a_trailing_slash_is_another_path() {
        for path in [
            "/",
            "*",
            "/v1",
            "/v1/bash",
            "/v1/bash/exec/",
            "/v1/health/",
            "/v1/bash/sessions/",
            "/V1/bash/exec",
            "/v1/bash/%65xec",
            "/v1/bash/sessions/a/b/close",
            "/v1/bash/sessions/s1/close/",
            "/v1/bash/sessions//close",
            "/v1/bash/sessions/close",
            "/v2/bash/exec",
        ] {
            assert_eq!(
                route("POST", path),
                Err(Refusal {
                    status: 404,
                    allow: None
                }),
                "{path}"
            );
        }
    }

    #[test]
    fn a_known_path_with_another_method_is_405_with_allow() {
        let cases = [
            ("POST", "/v1/health", "GET"),
            ("HEAD", "/v1/health", "GET"),
            ("GET", "/v1/bash/exec", "POST"),
            ("post", "/v1/bash/exec", "POST"),
            ("PUT", "/v1/bash/output", "POST"),
            ("GET", "/v1/bash/write", "POST"),
            ("DELETE", "/v1/bash/kill", "POST"),
            ("GET", "/v1/bash/sessions/create", "POST"),
            ("POST", "/v1/bash/sessions", "GET"),
            ("GET", "/v1/bash/sessions/s1/close", "POST"),
        ];
        for (method, path, allow) in cases {
            let refusal = route(method, path).expect_err(path);
            assert_eq!(
                refusal,
                Refusal {
                    status: 405,
                    allow: Some(allow)
                },
                "{method} {path}"
            );
            let (code, head, _) = split(&refusal.response(true));
            assert_eq!(code, 405);
            assert!(head.contains(&format!("\r\nAllow: {allow}\r\n")), "{head}");
            assert!(head.contains("\r\nConnection: keep-alive\r\n"), "{head}");
        }
        let (code, head, _) = split(&route("GET", "/nope").expect_err("404").response(false));
        assert_eq!(code, 404);
        assert!(!head.contains("Allow"));
    }

    #[test]
    fn the_session_id_is_percent_decoded() {
        let close = |path: &str| route("POST", path);
        let id = |id: &str| Ok(Route::SessionClose(id.into()));
        assert_eq!(close("/v1/bash/sessions/a%20b/close"), id("a b"));
        assert_eq!(close("/v1/bash/sessions/a%2Fb/close"), id("a/b"));
        assert_eq!(close("/v1/bash/sessions/a%2fb%2F/close"), id("a/b/"));
        assert_eq!(close("/v1/bash/sessions/a+b/close"), id("a+b"));
        assert_eq!(close("/v1/bash/sessions/%C3%A9t%C3%A9/close"), id("été"));
        assert_eq!(close("/v1/bash/sessions/create/close"), id("create"));
        let not_found = Err(Refusal {
            status: 404,
            allow: None,
        });
        for bad in ["%zz", "a%2", "%", "%%", "%FF", "%C3", "%2G"] {
            assert_eq!(
                close(&format!("/v1/bash/sessions/{bad}/close")),
                not_found,
                "{bad}"
            );
            // The path is unknown whatever the method: 404 comes before 405.
            assert_eq!(
                route("GET", &format!("/v1/bash/sessions/{bad}/close")),
                not_found
            );
        }
    }

    // ---- responses and bodies ----

    #[test]
    fn a_response_is_encoded_exactly() {
        let got = response(200, b"{}", true, &[]);
        assert_eq!(
            got,
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n\
              Content-Length: 2\r\nConnection: keep-alive\r\n\r\n{}"
        );
        let got = response(405, b"", false, &[("Allow", "POST"), ("X-A", "b")]);
        assert_eq!(
            got,
            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json; charset=utf-8\r\n\
              Content-Length: 0\r\nConnection: close\r\nAllow: POST\r\nX-A: b\r\n\r\n"
        );
    }

    #[test]
    fn the_success_envelope_carries_the_result_unchanged() {
        let result = json!({ "session_id": "s", "stdout": "x\n", "exit_code": 0, "big": 123456789012345678u64 });
        let body: Value = serde_json::from_slice(&success_body(&result)).expect("JSON");
        assert_eq!(
            body,
            json!({ "success": true, "message": "ok", "data": result, "hint": null })
        );
        let body: Value = serde_json::from_slice(&success_body(&json!([]))).expect("JSON");
        assert_eq!(body["data"], json!([]));
    }

    #[test]
    fn invalid_params_are_422_in_fastapi_shape() {
        let data = json!({ "field": "command", "reason": "missing" });
        let (status, body) = error_body(-32602, "invalid params: command: missing", Some(&data));
        assert_eq!(status, 422);
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            body,
            json!({ "detail": [{ "loc": ["body", "command"], "msg": "missing", "type": "value_error" }] })
        );
        let (status, body) = error_body(-32602, "params must be an object", None);
        assert_eq!(status, 422);
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            body,
            json!({ "detail": [{ "loc": ["body"], "msg": "params must be an object", "type": "value_error" }] })
        );
    }

    #[test]
    fn a_body_that_is_not_json_maps_to_422_at_the_body() {
        let (status, body) = error_body(-32700, "parse error: expected value", None);
        assert_eq!(status, 422);
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            body,
            json!({ "detail": [{ "loc": ["body"], "msg": "parse error: expected value", "type": "value_error" }] })
        );
    }

    #[test]
    fn other_errors_map_to_their_status_with_the_failure_envelope() {
        let cases = [
            (-32002, 404),
            (-32003, 429),
            (-32005, 403),
            (-32006, 403),
            (-32007, 503),
            (-32603, 500),
            (-32000, 400),
            (-32004, 400),
            (-32600, 400),
            (-32601, 400),
            (-32800, 400),
            (1, 400),
        ];
        for (code, expected) in cases {
            let data = json!({ "limit": "max_sessions", "value": 256 });
            let (status, body) = error_body(code, "it failed", Some(&data));
            assert_eq!(status, expected, "{code}");
            let body: Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(
                body,
                json!({ "success": false, "message": "it failed", "data": data, "hint": null }),
                "{code}"
            );
        }
        let (_, body) = error_body(-32002, "unknown session", None);
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["data"], Value::Null);
    }

    #[test]
    fn the_health_body_is_the_seed_s() {
        let body: Value = serde_json::from_slice(HEALTH_BODY).expect("JSON");
        assert_eq!(body, json!({ "status": "ok" }));
    }
}
