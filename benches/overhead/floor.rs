//! The floor of rows 1 and 2: the least a server that speaks the ACP terminal methods can
//! do, run as a third side beside the direct runs and execd, so each host shows what its
//! targets allow any server.
//!
//! A thread per connection (the kernel schedules each client's server side on its own,
//! no loop multiplexes them), requests parsed as JSON lines, `terminal/create` spawns the
//! command with its stdout and stderr on one pipe (std's `Command`: `posix_spawn`, the
//! thread waits until the exec is done), `terminal/wait_for_exit` reads that pipe to its
//! end and waits for the child, `terminal/release` forgets it, and anything else is
//! answered with an empty result (a ping). Nothing execd adds: no event loop, no log, no
//! policy, containment, spares or limits, no state shared between connections, and a
//! server thread that waits on its child as long as it takes.
//!
//! The bench runs it as `overhead --floor-server SOCKET`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// Serves `socket` until killed.
pub fn serve(socket: &Path) -> ! {
    let listener = UnixListener::bind(socket).unwrap_or_else(|e| {
        eprintln!("floor server: bind {}: {e}", socket.display());
        std::process::exit(1)
    });
    for conn in listener.incoming().flatten() {
        std::thread::spawn(move || connection(conn));
    }
    std::process::exit(0)
}

/// A command started by `terminal/create`: the child and the read end of its output.
struct Terminal {
    child: Child,
    output: std::fs::File,
}

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
        let id = req.get("id").cloned().unwrap_or(Value::Null);
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
                Some(mut t) => {
                    // What a release must do to a command still running.
                    let _ = t.child.kill();
                    let _ = t.child.wait();
                    Ok(json!({}))
                }
                None => Err(format!("unknown terminal {terminal:?}")),
            },
            _ => Ok(json!({})),
        };
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

fn create(params: &Value) -> Result<Terminal, String> {
    let command = params["command"].as_str().ok_or("no command")?;
    let args: Vec<&str> = params["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (output, w) = pipe().map_err(|e| e.to_string())?;
    let w2 = w.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(command)
        .args(args)
        .stdin(Stdio::null())
        .stdout(w)
        .stderr(w2)
        .spawn()
        .map_err(|e| format!("{command}: {e}"))?;
    Ok(Terminal { child, output })
}

/// A pipe, both ends close-on-exec (`Command` puts the write end at 1 and 2).
fn pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, ours alone.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((std::fs::File::from(r), w))
}

fn wait(t: &mut Terminal) -> Result<Value, String> {
    let mut buf = Vec::new();
    t.output.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let status = t.child.wait().map_err(|e| e.to_string())?;
    use std::os::unix::process::ExitStatusExt;
    Ok(json!({"exitCode": status.code(), "signal": status.signal().map(|s| s.to_string())}))
}
