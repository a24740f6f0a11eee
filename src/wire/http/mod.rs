//! The HTTP/1.1 front end of section 11, sans I/O: `codec` cuts requests from bytes,
//! `route` maps paths to methods and errors to statuses and envelopes, `exchange` is one
//! connection's pipelined requests and their answers in order. Nothing here reads a
//! socket, a clock or a process: `server::conn` feeds an exchange what it read and writes
//! what it encodes.

pub mod codec;
pub mod exchange;
pub mod page;
pub mod route;

pub use codec::Auth;
pub use codec::Hosts;
pub use codec::Limits;
pub use exchange::HttpSession;
pub use route::*;
