//! Every system call and every `unsafe` block of the daemon, one room per concern:
//! `spawn` (starting commands), `reap` (signals and `wait4`), `ids` (users, peer
//! credentials), `peer` (what a peer process is: its parent, cgroup and pidfd), `socket`,
//! `host` (the daemon's own process), `cwd` (where a process is), `inotify`; and the
//! OS-facing parts of containment (`contain`, `cgroup`, `cookie`), systemd, the log and
//! audit sinks, whether a command waits for input (`waiting`), the off-loop reader's
//! process (`reader`: what reads other processes' memory, away from the loop), the
//! sandbox (`sandbox`), and the system calls of an upgrade in place (`upgrade`). `term` is
//! execctl's: its own terminal's modes and size.
//!
//! Nothing here ever waits: descriptors are non-blocking, reaping is `WNOHANG`.

pub mod cgroup;
pub mod contain;
pub mod cookie;
pub mod cwd;
pub mod host;
pub mod ids;
pub mod inotify;
pub mod peer;
pub mod pty;
pub mod reader;
pub mod reap;
pub mod sandbox;
pub mod sinks;
pub mod socket;
pub mod spawn;
pub mod systemd;
pub mod term;
pub mod upgrade;
pub mod waiting;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstring(s: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}
