//! JSON-RPC 2.0 messages: ids echoed exactly as sent, requests, notifications, client
//! responses and batches parsed from one line, and responses and Wire events encoded.

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::error::{RpcError, INVALID_REQUEST};
use crate::wire::encode::write_json;

/// A request id exactly as the client wrote it: the JSON text of a string, a number or
/// `null`. Kept as text so that it is echoed byte for byte (a 30-digit number stays those
/// digits; parsing it would round it to a float).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id(String);

impl Id {
    pub fn null() -> Id {
        Id("null".into())
    }

    #[cfg(test)]
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
    Request(RpcRequest),
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
pub struct RpcRequest {
    /// `None` for a notification, which is never answered.
    pub id: Option<Id>,
    pub method: String,
    /// Always an object (absent and `null` params become `{}`).
    pub params: Map<String, Value>,
}

/// What one line holds.
#[derive(Debug, PartialEq)]
pub enum ParsedLine {
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
pub fn parse_line(line: &[u8], max_batch: usize) -> ParsedLine {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => return ParsedLine::Error(RpcError::parse_error(&e.to_string())),
    };
    if !text.trim_start().starts_with('[') {
        return match serde_json::from_str::<&RawValue>(text) {
            Ok(raw) => ParsedLine::Single(parse_message(raw)),
            Err(e) => ParsedLine::Error(RpcError::parse_error(&e.to_string())),
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
        Ok(items) if items.is_empty() => {
            ParsedLine::Error(RpcError::invalid_request("empty batch"))
        }
        Ok(items) => ParsedLine::Batch(items.into_iter().map(parse_message).collect()),
        Err(_) if too_many.get() => ParsedLine::Error(
            RpcError::new(
                INVALID_REQUEST,
                format!("invalid request: a batch may hold at most {max_batch} messages"),
            )
            .with_data(json!({ "limit": "max-batch", "value": max_batch })),
        ),
        Err(e) => ParsedLine::Error(RpcError::parse_error(&e.to_string())),
    }
}

/// How deep JSON may nest in a value execd reads (serde_json's own limit, which keeps a
/// recursive parse off the end of the stack).
pub const MAX_DEPTH: usize = 128;

/// Whether a JSON error is the nesting limit: the text was JSON (a raw value already
/// read it), only deeper than `MAX_DEPTH`.
pub fn nested_too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// What a params object that does not read as a value is answered: `-32602` naming
/// `params`, and why (never "a field is missing", which would be a lie about a request
/// that sent it).
pub fn unreadable_params(e: &serde_json::Error) -> RpcError {
    if nested_too_deep(e) {
        RpcError::invalid_params(
            "params",
            format!("nested too deeply: execd reads JSON at most {MAX_DEPTH} levels deep"),
        )
    } else {
        RpcError::invalid_params("params", format!("unreadable: {e}"))
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
            let params = obj
                .remove("params")
                .map(|r| serde_json::from_str::<Value>(r.get()));
            let params = match params {
                None | Some(Ok(Value::Null)) => Map::new(),
                Some(Ok(Value::Object(m))) => m,
                Some(Err(e)) => {
                    return Message::Invalid {
                        id: echo_id,
                        error: unreadable_params(&e),
                    };
                }
                Some(Ok(Value::Array(_))) => {
                    return Message::Invalid {
                        id: echo_id,
                        error: RpcError::invalid_params(
                            "params",
                            "by-position params (an array) are not supported; pass an object",
                        ),
                    };
                }
                Some(Ok(_)) => return invalid("\"params\" must be an object"),
            };
            Message::Request(RpcRequest {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rpc::error::*;

    #[test]
    fn parses_requests_and_notifications() {
        let p = parse_line(
            br#"{"jsonrpc":"2.0","id":7,"method":"m","params":{"x":1}}"#,
            10,
        );
        let ParsedLine::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id, Some(Id("7".into())));
        assert_eq!(r.method, "m");
        assert_eq!(r.params["x"], 1);
        let p = parse_line(br#"{"jsonrpc":"2.0","method":"n"}"#, 10);
        let ParsedLine::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id, None);
        assert!(r.params.is_empty());
        let p = parse_line(
            br#"{"jsonrpc":"2.0","id":"s","method":"m","params":null}"#,
            10,
        );
        let ParsedLine::Single(Message::Request(r)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.id.unwrap().to_value(), json!("s"));
    }
    #[test]
    fn rejects_what_is_not_a_request() {
        assert!(matches!(
            parse_line(b"{nope", 10),
            ParsedLine::Error(RpcError {
                code: PARSE_ERROR,
                ..
            })
        ));
        assert!(matches!(
            parse_line(b"[]", 10),
            ParsedLine::Error(RpcError {
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
            let ParsedLine::Single(Message::Invalid { error, .. }) = parse_line(bad, 10) else {
                panic!("{}", String::from_utf8_lossy(bad))
            };
            assert_eq!(error.code, INVALID_REQUEST);
        }
        // The id is echoed when it is usable.
        let ParsedLine::Single(Message::Invalid { id, .. }) =
            parse_line(br#"{"jsonrpc":"1.0","id":"k","method":"m"}"#, 10)
        else {
            panic!()
        };
        assert_eq!(id.as_json(), "\"k\"");
        let ParsedLine::Single(Message::Invalid { id, .. }) =
            parse_line(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"m"}"#, 10)
        else {
            panic!()
        };
        assert_eq!(id, Id::null());
    }
    #[test]
    fn ids_are_echoed_exactly_as_sent() {
        let line = br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}"#;
        let ParsedLine::Single(Message::Request(r)) = parse_line(line, 10) else {
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
        let ParsedLine::Single(Message::Request(r)) = parse_line(line, 10) else {
            panic!()
        };
        assert_eq!(r.id.unwrap().as_json(), r#""a\u00e9b""#);
    }
    #[test]
    fn params_by_position_are_invalid_params() {
        let line = br#"{"jsonrpc":"2.0","id":4,"method":"m","params":[1,2]}"#;
        let ParsedLine::Single(Message::Invalid { id, error }) = parse_line(line, 10) else {
            panic!()
        };
        assert_eq!(id.as_json(), "4");
        assert_eq!(error.code, INVALID_PARAMS);
        assert_eq!(error.data.unwrap()["field"], "params");
    }
    /// Params nested past the limit are said to be that, under the request's id: never
    /// taken for an empty object whose fields are missing.
    #[test]
    fn params_nested_too_deeply_are_said_to_be() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"terminal/create","params":{{"sessionId":"s","command":"true","env":{deep}}}}}"#
        );
        let ParsedLine::Single(Message::Invalid { id, error }) = parse_line(line.as_bytes(), 10)
        else {
            panic!()
        };
        assert_eq!(id.as_json(), "7");
        assert_eq!(error.code, INVALID_PARAMS);
        assert!(error.message.contains("nested too deeply"), "{error:?}");
        assert_eq!(error.data.unwrap()["field"], "params");
        // At the limit it still reads.
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 2), "]".repeat(MAX_DEPTH - 2));
        let line = format!(r#"{{"jsonrpc":"2.0","id":8,"method":"m","params":{{"a":{ok}}}}}"#);
        assert!(matches!(
            parse_line(line.as_bytes(), 10),
            ParsedLine::Single(Message::Request(_))
        ));
    }
    #[test]
    fn a_batch_over_the_limit_is_refused_whole() {
        let big = format!("[{}1]", "1,".repeat(1000));
        let ParsedLine::Error(e) = parse_line(big.as_bytes(), 1000) else {
            panic!()
        };
        assert_eq!(e.code, INVALID_REQUEST);
        assert_eq!(e.data.unwrap()["value"], 1000);
        let ok = format!("[{}1]", "1,".repeat(999));
        let ParsedLine::Batch(items) = parse_line(ok.as_bytes(), 1000) else {
            panic!()
        };
        assert_eq!(items.len(), 1000);
        // Broken JSON after the limit is still "too large", not a parse error.
        let ParsedLine::Error(e) = parse_line(b"[1,1,1,{", 2) else {
            panic!()
        };
        assert_eq!(e.code, INVALID_REQUEST);
        let ParsedLine::Error(e) = parse_line(b"[1,{", 5) else {
            panic!()
        };
        assert_eq!(e.code, PARSE_ERROR);
    }
    #[test]
    fn batches_keep_order_and_mark_bad_elements() {
        let ParsedLine::Batch(items) = parse_line(
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
            ParsedLine::Single(Message::Response { result: Ok(_), .. })
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
}
