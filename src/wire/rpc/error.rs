//! JSON-RPC errors: the codes PROTOCOL.md section 2 lists and the one error type every
//! method returns, with constructors that name the field, the limit or the rule.

use serde_json::{json, Map, Value};

/// Parse error: the line is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a JSON-RPC 2.0 request, message too large, or an empty batch.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Wrong type or missing required field; `data` names the field.
pub const INVALID_PARAMS: i64 = -32602;
/// A bug in execd: logged with context.
pub const INTERNAL_ERROR: i64 = -32603;
/// The target is in the wrong state for this request.
pub const INVALID_STATE: i64 = -32000;
/// Unknown or foreign terminal, session or command id.
pub const NOT_FOUND: i64 = -32002;
/// A configured limit was reached; `data` names it and its value.
pub const LIMIT_REACHED: i64 = -32003;
/// The command could not be started; the message carries the OS error.
pub const SPAWN_FAILED: i64 = -32004;
/// The policy denies the command; `data` names the rule.
pub const DENIED: i64 = -32005;
/// An approver rejected the command, or none answered; `data` says which.
pub const NOT_APPROVED: i64 = -32006;
/// The daemon is shutting down.
pub const SHUTTING_DOWN: i64 = -32007;
/// The client cancelled the request (`$/cancel_request`).
pub const REQUEST_CANCELLED: i64 = -32800;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// What decided, in words, from the `rule` a verdict names: `policy rule NAME`, or for
/// the two decisions that are no rule, `the policy's default` (no rule matched) and `the
/// policy's "unparsed" decision` (a line that is not a plain script).
pub fn rule_words(rule: &str) -> String {
    match rule {
        "default" => "the policy's default (no rule matched)".to_string(),
        "unparsed" => {
            "the policy's \"unparsed\" decision (the line is not a plain script)".to_string()
        }
        name => format!("policy rule {name}"),
    }
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    pub fn parse_error(detail: &str) -> RpcError {
        RpcError::new(PARSE_ERROR, format!("parse error: {detail}"))
    }

    pub fn invalid_request(why: &str) -> RpcError {
        RpcError::new(INVALID_REQUEST, format!("invalid request: {why}"))
    }

    pub fn too_long(limit: usize) -> RpcError {
        RpcError::new(INVALID_REQUEST, "message too large").with_data(json!({ "limit": limit }))
    }

    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(METHOD_NOT_FOUND, format!("method not found: {method}"))
    }

    pub fn invalid_params(field: &str, reason: impl Into<String>) -> RpcError {
        let reason = reason.into();
        RpcError::new(INVALID_PARAMS, format!("invalid params: {field}: {reason}"))
            .with_data(json!({ "field": field, "reason": reason }))
    }

    pub fn internal(what: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, format!("internal error: {}", what.into()))
    }

    pub fn invalid_state(what: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_STATE, what)
    }

    pub fn not_found(kind: &str, id: &str) -> RpcError {
        RpcError::new(NOT_FOUND, format!("{kind} not found: {id}"))
    }

    pub fn limit(name: &str, value: impl Into<Value>) -> RpcError {
        RpcError::new(LIMIT_REACHED, format!("limit reached: {name}"))
            .with_data(json!({ "limit": name, "value": value.into() }))
    }

    /// A command that could not be started: the OS error's text, and in `data` the
    /// program and the errno's name (`ENOENT` is "not found", `EACCES` "not executable").
    pub fn spawn_failed(program: &str, err: &std::io::Error) -> RpcError {
        let errno = err
            .raw_os_error()
            .map_or_else(|| "EINVAL".to_string(), crate::types::errno_name);
        RpcError::new(SPAWN_FAILED, os_error_text(err))
            .with_data(json!({ "program": program, "errno": errno }))
    }

    pub fn shutting_down() -> RpcError {
        RpcError::new(SHUTTING_DOWN, "server shutting down")
    }

    pub fn denied(rule: &str, justification: Option<&str>) -> RpcError {
        let mut data = json!({ "rule": rule });
        if let Some(j) = justification {
            data["justification"] = j.into();
        }
        let why = justification.map_or(String::new(), |j| format!(": {j}"));
        RpcError::new(DENIED, format!("denied by {}{why}", rule_words(rule))).with_data(data)
    }

    pub fn not_approved(rule: &str, reason: &str, feedback: Option<String>) -> RpcError {
        let mut data = json!({ "rule": rule, "reason": reason });
        let mut message = format!("not approved ({reason}; {})", rule_words(rule));
        if let Some(f) = feedback {
            message.push_str(&format!(": {f}"));
            data["feedback"] = f.into();
        }
        RpcError::new(NOT_APPROVED, message).with_data(data)
    }

    pub fn cancelled() -> RpcError {
        RpcError::new(REQUEST_CANCELLED, "request cancelled")
    }

    pub(crate) fn to_value(&self) -> Value {
        let mut e = Map::new();
        e.insert("code".into(), self.code.into());
        e.insert("message".into(), self.message.clone().into());
        if let Some(d) = &self.data {
            e.insert("data".into(), d.clone());
        }
        Value::Object(e)
    }
}

/// The OS error text alone ("No such file or directory"), without Rust's "(os error N)".
pub fn os_error_text(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsed_and_default_are_not_called_rules() {
        let e = RpcError::denied("unparsed", None);
        assert_eq!(
            e.message,
            "denied by the policy's \"unparsed\" decision (the line is not a plain script)"
        );
        let e = RpcError::not_approved("default", "timeout", None);
        assert!(
            e.message
                .starts_with("not approved (timeout; the policy's default (no rule matched))"),
            "{}",
            e.message
        );
        assert_eq!(
            RpcError::denied("no-rm", Some("no")).message,
            "denied by policy rule no-rm: no"
        );
    }

    #[test]
    fn spawn_errors_carry_the_os_text() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        let err = RpcError::spawn_failed("nosuch", &e);
        assert_eq!(err.message, "No such file or directory");
        assert_eq!(
            err.data,
            Some(json!({"program": "nosuch", "errno": "ENOENT"}))
        );
    }
}
