//! Sans-I/O codecs: JSON-RPC lines and HTTP/1.1 in, messages and responses out.

pub mod encode;
pub mod http;
pub mod rpc;
pub mod sha256;
pub mod shown;
pub mod state;
pub mod ws;
