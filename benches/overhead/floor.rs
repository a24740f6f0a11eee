//! The floor of rows 1 and 2: a minimal server for the ACP terminal methods those rows
//! use, run as a third side beside the direct runs and execd, so each host shows how much
//! of a target's gap a server this plain leaves too.
//!
//! A thread per connection (no loop multiplexes clients), requests parsed as JSON lines,
//! `terminal/create` spawns the command with its stdout and stderr on one pipe (std's
//! `Command`: `posix_spawn`, the thread waits until the exec is done),
//! `terminal/wait_for_exit` reads that pipe to its end and waits for the child,
//! `terminal/release` forgets it, and any other request is answered with an empty result
//! (a ping). Nothing execd adds: no event loop, no log, no policy, containment, spares or
//! limits, no state shared between connections, and a server thread that waits on its
//! child as long as it takes. It is not a design execd could take, only a reference.
//!
//! The bench runs it as `overhead --floor-server SOCKET`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// Serves `socket` until killed; exits when it cannot bind or accept.
pub fn serve(socket: &Path) -> ! {
    let listener = UnixListener::bind(socket).unwrap_or_else(|e| {
        eprintln!("floor server: bind {}: {e}", socket.display());
        std::process::exit(1)
    });
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                std::thread::spawn(move || connection(conn));
            }
            Err(e) => {
                eprintln!("floor server: accept: {e}");
                std::process::exit(1)
            }
        }
    }
    std::process::exit(0)
}

/// A command started by `terminal/create`: the child and the read end of its output.
/// Dropped (released, or its connection gone), it is killed if it still runs and reaped.
struct Terminal {
    child: Child,
    output: std::fs::File,
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // A child already waited for is not signalled again (std knows it is gone).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Answers one connection's requests, in order, until it closes or sends a line that is
/// not JSON.
fn connection(conn: UnixStream) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut terminals: HashMap<String, Terminal> = HashMap::new();
    let mut next = 0u64;
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let Ok(req) = serde_json::from_str::<Value>(&line) else {
            return;
        };
        let params = &req["params"];
        let terminal = params["terminalId"].as_str().unwrap_or_default();
        let result = match req["method"].as_str().unwrap_or_default() {
            "terminal/create" => create(params).map(|t| {
                next += 1;
                let name = format!("floor_{next}");
                terminals.insert(name.clone(), t);
                json!({ "terminalId": name })
            }),
            "terminal/wait_for_exit" => match terminals.get_mut(terminal) {
                Some(t) => wait(t),
                None => Err(format!("unknown terminal {terminal:?}")),
            },
            "terminal/release" => match terminals.remove(terminal) {
                Some(t) => {
                    drop(t);
                    Ok(json!({}))
                }
                None => Err(format!("unknown terminal {terminal:?}")),
            },
            _ => Ok(json!({})),
        };
        // A notification (no id) is answered with nothing.
        let Some(id) = req.get("id") else { continue };
        let answer = match result {
            Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
            Err(m) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": m}}),
        };
        let mut bytes = answer.to_string().into_bytes();
        bytes.push(b'\n');
        if out.write_all(&bytes).is_err() {
            return;
        }
    }
}

/// Starts `params.command` with `params.args`, its stdin `/dev/null` and its stdout and
/// stderr one pipe.
fn create(params: &Value) -> Result<Terminal, String> {
    let command = params["command"].as_str().ok_or("no command")?;
    let args: Vec<&str> = params["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (output, w) = pipe().map_err(|e| e.to_string())?;
    let w2 = w.try_clone().map_err(|e| e.to_string())?;
    // The `Command` owns both write ends and closes them as this statement ends, so the
    // output's end comes with the command's exit.
    let child = Command::new(command)
        .args(args)
        .stdin(Stdio::null())
        .stdout(w)
        .stderr(w2)
        .spawn()
        .map_err(|e| format!("{command}: {e}"))?;
    Ok(Terminal { child, output })
}

/// A pipe, both ends close-on-exec (`Command` puts the write end at 1 and 2 in the
/// child): `(read, write)`. By hand because `std::io::pipe` is newer than the crate's
/// minimum Rust (1.85).
fn pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, an array of two ints we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are new, and owned only here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((std::fs::File::from(r), w))
}

/// Reads the command's output to its end and waits for it: its exit code, or the number of
/// the signal that ended it (as text; execd gives the signal's name).
fn wait(t: &mut Terminal) -> Result<Value, String> {
    let mut buf = Vec::new();
    t.output.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let status = t.child.wait().map_err(|e| e.to_string())?;
    Ok(json!({"exitCode": status.code(), "signal": status.signal().map(|s| s.to_string())}))
}
