//! execd's integration tests: one binary, a module per area (ripgrep's `tests/tests.rs`).
//!
//! Each test starts the real `execd` (and `execctl`) on a private temp socket and talks to
//! it as a client would; `util` holds the harness. All tests share this one process and
//! run on many threads at once, so none may change what the process shares: the
//! environment, the current directory, the umask, signal dispositions, or a descriptor's
//! close-on-exec flag (a child another test spawns meanwhile would inherit it; change it
//! in the child, in `pre_exec`). What two areas need exclusively, such as the README's
//! fixed TCP port, is taken through a hold in `util`. Other tests' children exiting can
//! interrupt a socket read that has a timeout: read through `util::read_some`.
//!
//! Run one area with `cargo test --test integration acp::`.

mod util;

mod acp;
mod acp_schema;
mod attacks;
mod backlog;
mod bash;
mod bounds;
mod browser;
mod cli_manage;
mod cli_policy;
mod cli_shell;
mod cli_stream;
mod cli_tty;
mod contain;
mod cookie;
mod events;
mod execctl;
mod gate;
mod holds;
mod hosts;
mod http;
mod hung;
mod input;
mod lifetime;
mod mcp;
mod peers;
mod protocol;
mod pty;
mod readme;
mod robustness;
mod sandbox;
mod scale;
mod shell;
mod shell_door;
mod sinks;
mod slow_cwd;
mod streams;
mod subjects;
mod systemd;
mod upgrade;
mod ws;
