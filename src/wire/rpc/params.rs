//! Typed, field-naming access to a request's params: a wrong type or a missing required
//! field is `-32602` naming the field.

use serde_json::{Map, Value};

use super::error::RpcError;

/// The longest id a peer may name (PROTOCOL 8): a session, terminal or command id is kept
/// and shown back, so it is bounded where it is read.
pub const MAX_ID: usize = 256;

/// The fields that carry ids, in every family.
const ID_FIELDS: [&str; 6] = [
    "sessionId",
    "session_id",
    "terminalId",
    "command_id",
    "id",
    "requestId",
];

/// Typed, field-naming access to a request's params. `null` means absent everywhere.
pub struct Params<'a>(pub &'a Map<String, Value>);

impl<'a> Params<'a> {
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    pub fn str(&self, field: &str) -> Result<&'a str, RpcError> {
        self.opt_str(field)?
            .ok_or_else(|| RpcError::invalid_params(field, "required"))
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if s.len() > MAX_ID && ID_FIELDS.contains(&field) => {
                Err(RpcError::invalid_params(
                    field,
                    format!("an id of at most {MAX_ID} bytes, not {}", s.len()),
                ))
            }
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(RpcError::invalid_params(field, "expected a string")),
        }
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(RpcError::invalid_params(field, "expected a boolean")),
        }
    }

    pub fn opt_u64(&self, field: &str) -> Result<Option<u64>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| RpcError::invalid_params(field, "expected a non-negative integer")),
        }
    }

    /// A non-negative number of seconds (integer or fraction).
    pub fn opt_seconds(&self, field: &str) -> Result<Option<f64>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(s) if s >= 0.0 && s.is_finite() && s <= 1e9 => Ok(Some(s)),
                _ => Err(RpcError::invalid_params(
                    field,
                    "expected a non-negative number of seconds",
                )),
            },
        }
    }

    pub fn opt_str_array(&self, field: &str) -> Result<Option<Vec<&'a str>>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| RpcError::invalid_params(field, "expected strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(RpcError::invalid_params(field, "expected an array")),
        }
    }

    pub fn opt_object(&self, field: &str) -> Result<Option<&'a Map<String, Value>>, RpcError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(RpcError::invalid_params(field, "expected an object")),
        }
    }

    pub fn opt_value(&self, field: &str) -> Option<&'a Value> {
        self.get(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_other_strings_are_not() {
        let long = "x".repeat(MAX_ID + 1);
        let m = json!({"session_id": long, "command": long, "sessionId": "s"});
        let p = Params(m.as_object().unwrap());
        let e = p.opt_str("session_id").unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert_eq!(e.data.unwrap()["field"], "session_id");
        assert_eq!(p.str("command").unwrap().len(), MAX_ID + 1);
        assert_eq!(p.str("sessionId").unwrap(), "s");
    }
    use crate::wire::rpc::error::*;
    use serde_json::json;
    #[test]
    fn params_name_the_bad_field() {
        let m = json!({"s": "x", "n": -1, "b": "yes", "a": ["x", 1], "z": null});
        let p = Params(m.as_object().unwrap());
        assert_eq!(p.str("s").unwrap(), "x");
        assert_eq!(
            p.str("missing").unwrap_err().data,
            Some(json!({"field": "missing", "reason": "required"}))
        );
        assert_eq!(p.opt_str("z").unwrap(), None);
        assert_eq!(p.opt_u64("n").unwrap_err().code, INVALID_PARAMS);
        assert_eq!(p.opt_bool("b").unwrap_err().data.unwrap()["field"], "b");
        assert!(p.opt_str_array("a").is_err());
        assert_eq!(p.opt_seconds("n").unwrap_err().code, INVALID_PARAMS);
    }
}
