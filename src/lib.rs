//! execd: a command-execution daemon for AI agents and the tools around them.
//!
//! One single-threaded mio loop serves JSON-RPC 2.0 over a Unix socket: the ACP terminal
//! methods, a bash pipe API and Wire-style live events, all from one process table.
//!
//! Crate map (data flows down this list and back up only through `server`):
//! - `config`: every flag and its documented default; socket path resolution.
//! - `rpc`: JSON-RPC framing, parsing, error codes, params access. Pure.
//! - `server`: the loop: Poll, listener, connections, pipes, signals, timers, dispatch.
//! - `conn`: one client connection: line reader, capped write buffer, interest.
//! - `acp`, `bash`, `events`: one method family each: params in, results out.
//! - `table`: processes and sessions, fed events and `now`. Pure.
//! - `ring`: fixed-capacity output rings with absolute offsets and UTF-8 windows. Pure.
//! - `timers`: the deadline heap. Pure.
//! - `process`: spawn, group kill, `wait4` reaping, peer credentials. All `unsafe` is here.
//! - `client`: a small blocking client for `execctl`, tests and benches.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod acp;
pub mod bash;
pub mod client;
pub mod config;
pub mod conn;
pub mod events;
pub mod process;
pub mod ring;
pub mod rpc;
pub mod server;
pub mod table;
pub mod timers;
