//! execd: a command-execution daemon for AI agents and the tools around them.
//!
//! One single-threaded mio loop serves JSON-RPC 2.0 over a Unix socket (and HTTP for the
//! bash pipe API): the ACP terminal methods, a bash pipe API and Wire-style live events,
//! all from one process table.
//!
//! The house, one room per kind of work (data flows down and comes back up only as
//! return values and effects):
//! - `server/`: the loop and every descriptor: Poll, signals, timers, listeners, client
//!   connections, the commands' pipes and reaping. `settle` turns a family's `Step` into
//!   action; `apply` carries out the core's `Effect`s.
//! - `methods/`: method name -> family function (`acp`, `bash`, `events`, `approvals`),
//!   each `fn(&mut Core, &Caller, &Params) -> Result<Step, RpcError>`, and the family's
//!   rendering of a parked request's answer.
//! - `core/`: every piece of state and every decision, pure and on fake clocks in its
//!   tests: parked requests, a command's life, the output budget, the gate and approvals,
//!   sessions, shutdown, the event pump; the table, rings, timers, the launch request.
//! - `wire/`: sans-I/O codecs: JSON-RPC lines, HTTP/1.1, the encodings they share, and
//!   the versioned state an upgrade in place carries to the next image (`wire::state`).
//! - `policy/`: the rules and the shell-line splitter they judge by. Pure.
//! - `sys/`: every system call and every `unsafe` block: spawn, reap, ids, sockets,
//!   inotify, containment (process groups, cgroups), systemd, the log and audit sinks.
//! - `types`: plain types every room speaks (a leaf). `config`: every flag. `client`: a
//!   small blocking client for `execctl`, tests and benches. `cli/`: `execctl`.
//!
//! ```text
//! bin -> server -> methods -> core -> policy
//!          |                   \-> wire
//!          +-> wire, sys       cli -> client -> wire
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod client;
pub mod config;
pub mod policy;
pub mod server;

mod core;
mod methods;
mod sys;
mod types;
mod wire;

// What tests and benches use besides the client: small helpers that would otherwise be
// written a second time there.
pub use sys::cgroup::cgroup2_mount;
pub use sys::ids::current_uid;
pub use wire::encode::{base64_decode, base64_encode};
