//! execd: a command-execution daemon for AI agents and the tools around them.
//!
//! One single-threaded mio loop serves JSON-RPC 2.0 over a Unix socket: the ACP terminal
//! methods, a bash pipe API and Wire-style live events, all from one process table.
//!
//! The house (data flows down and comes back up only as return values and effects):
//! - `server`: the loop only: Poll, listeners, signals, and readiness handed to `conns`
//!   and `children`. Turns a `Step` into action (`settle`) and carries out the core's
//!   `Effect`s (`apply`).
//! - `dispatch`: method name -> family function; a started command -> the family's tail.
//! - `acp`, `bash`, `events`: one method family each, `fn(&mut Core, &Caller, &Params)
//!   -> Result<Step, RpcError>`.
//! - `core`: every piece of state and every decision (parking, kills, release, sessions,
//!   shutdown), with a fake clock in its tests. `table`: the state it keeps.
//! - `launch`: the one `LaunchRequest` every spawn goes through, and its validation.
//! - `view`: one rendering of exits, statuses and usage.
//! - `ring`, `timers`, `rpc`: pure building blocks (rings, deadline heap, JSON-RPC).
//! - `conns`: the connections as a set: who is let in, answers and what they cost, idle
//!   TCP. `conn`: one client's socket, codec, batches and capped output buffer.
//! - `children`: starting a command (place, spawn, pipes), reading its pipes into the
//!   core, writing its stdin, reaping it.
//! - `pipes`, `contain`, `process`, `systemd`, `audit`: descriptors and system calls
//!   (every `unsafe` is in `process`), the loop's tools.
//! - `config`: every flag; `client`: a small blocking client for `execctl`, tests, benches.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod client;
pub mod config;
pub mod core;
pub mod methods;
pub mod policy;
pub mod server;
pub mod sys;
pub mod types;
pub mod wire;

// What tests and benches use besides the client: small helpers that would otherwise be
// written a second time there.
pub use crate::sys::ids::current_uid;
pub use sys::cgroup::cgroup2_mount;
pub use wire::encode::{base64_decode, base64_encode};
