//! JSON-RPC 2.0 over newline-delimited JSON, sans I/O: `framer` cuts lines, `message`
//! parses and encodes messages, `batch` is one connection's exchange (batches, answers
//! owed, bounds), `params` gives typed access to params, `error` holds the codes.

pub mod batch;
pub mod error;
pub mod framer;
pub mod message;
pub mod params;

pub use batch::{Room, RpcSession};
pub use error::*;
pub use message::{encode_response, write_event, write_event_head, Id, Incoming, ReqNo};
pub use params::Params;
