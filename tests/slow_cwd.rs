//! A command's working directory on a file system that hangs must not freeze the daemon.
//!
//! The daemon never touches a request's `cwd` on its loop: the child it clones `chdir`s
//! into it just before `execve`, and nothing waits for that child. These tests hold that `chdir` inside the kernel,
//! with `cwd` in a FUSE file system this process serves (`util::fuse`) whose lookup of the
//! directory answers only when the test says so, the way a dead NFS server or a stuck
//! FUSE daemon makes a path hang. A FUSE mount is the one way to make a lookup block for
//! exactly as long as a test wants, with no network and no timing guesses. While it is
//! held, another connection's `initialize` is answered and another connection's command
//! starts and exits; once released, the held request is
//! answered: its terminal, when the lookup finds a directory, or the same invalid-params
//! error on `cwd` a missing directory gets, when it finds nothing. Were the daemon to look
//! at `cwd` on its loop (a `stat` to check it), the loop would hang in that lookup and the
//! other connections' answers would not come within `WAIT`.

use crate::util::fuse::{Found, SlowFs};
use crate::util::*;

/// Sends `terminal/create` of `true` in `slow` on a connection of its own and waits until
/// the lookup of `slow` is held, by a process other than the daemon's loop (its child,
/// about to `chdir`). Returns the connection and the request's id.
fn stuck_create(d: &Daemon, fs: &SlowFs) -> (Client, u64) {
    let mut stuck = d.client();
    let id = stuck
        .send(
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "cwd": fs.slow()}),
        )
        .expect("send terminal/create");
    let pid = fs.wait_held();
    assert_ne!(
        pid as i32,
        d.pid(),
        "the daemon's loop (its main thread) looked up the cwd itself"
    );
    (stuck, id)
}

/// While the held request waits, the daemon serves other connections: an `initialize`,
/// and a command in a normal directory from start to exit.
fn others_are_served(d: &Daemon) {
    let mut other = d.client();
    let init = other
        .call("initialize", json!({"protocolVersion": 1}))
        .unwrap_or_else(|e| {
            panic!("initialize on another connection, while a cwd lookup hangs: {e}")
        });
    assert_eq!(init["protocolVersion"], 1, "initialize answered {init}");

    let mut third = d.client();
    let dir = TempDir::new();
    let id = create_with(
        &mut third,
        json!({"sessionId": "s", "command": "true", "cwd": dir.path()}),
    );
    let exit = wait_exit(&mut third, &id);
    assert_eq!(exit["exitCode"], 0, "{id} exited {exit}");
}

/// The slow file system, or `None` (after `skip`) where FUSE is not available.
#[track_caller]
fn mount() -> Option<SlowFs> {
    match SlowFs::mount() {
        Ok(fs) => Some(fs),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

#[test]
fn a_hung_cwd_lookup_holds_only_its_own_request() {
    // Declared before the file system, so dropped after it: a failing test releases the
    // lookup first, and the daemon then stops without waiting on a hung spawn.
    let d = Daemon::start(&[]);
    let Some(fs) = mount() else { return };
    let (mut stuck, id) = stuck_create(&d, &fs);

    others_are_served(&d);

    fs.release(Found::Dir);
    let r = stuck
        .wait_response(id)
        .unwrap_or_else(|e| panic!("terminal/create in {} failed: {e}", fs.slow().display()));
    let term = r["terminalId"]
        .as_str()
        .unwrap_or_else(|| panic!("terminalId missing in {r}"))
        .to_string();
    let exit = wait_exit(&mut stuck, &term);
    assert_eq!(exit["exitCode"], 0, "{term} exited {exit}");
    assert_no_panic(&d);
}

#[test]
fn a_hung_cwd_that_is_then_missing_is_refused_as_a_missing_one() {
    let d = Daemon::start(&[]);
    let Some(fs) = mount() else { return };

    // What a directory that is not there gets, found at once.
    let missing = "/nonexistent";
    let (code, _, data) = err(
        &mut d.client(),
        "terminal/create",
        json!({"sessionId": "s", "command": "true", "cwd": missing}),
    );
    assert_eq!(code, -32602, "cwd {missing}");
    let data = data.unwrap_or_else(|| panic!("no data in the error for cwd {missing}"));
    assert_eq!(data["field"], "cwd", "{data}");
    let reason = data["reason"].as_str().unwrap_or_default();
    let quoted = format!("{missing:?}");
    assert!(reason.starts_with(&quoted), "{data}");

    let (mut stuck, id) = stuck_create(&d, &fs);
    others_are_served(&d);

    fs.release(Found::Nothing);
    match stuck.wait_response(id) {
        Ok(v) => panic!("terminal/create in {} succeeded: {v}", fs.slow().display()),
        Err(CallError::Rpc { code, data, .. }) => {
            assert_eq!(code, -32602, "{data:?}");
            let data = data.unwrap_or_default();
            assert_eq!(data["field"], "cwd", "{data}");
            // The same reason, naming this path.
            let want = reason.replacen(&quoted, &format!("{:?}", fs.slow()), 1);
            assert_eq!(data["reason"], want.as_str(), "{data}");
        }
        Err(e) => panic!("terminal/create in {}: {e}", fs.slow().display()),
    }
    assert_no_panic(&d);
}

/// Two spawns hung at once (as many as once held every spawner thread): nothing waits for
/// them, so clients with hung directories never stop everyone else's.
#[test]
fn spawns_hung_at_once_still_leave_others_starting() {
    let d = Daemon::start(&[]);
    let Some(fs) = mount() else { return };
    let (_first, _) = stuck_create(&d, &fs);
    let mut second = d.client();
    second
        .send(
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "cwd": fs.slow()}),
        )
        .expect("send terminal/create");
    let mut third = d.client();
    let dir = TempDir::new();
    let id = create_with(
        &mut third,
        json!({"sessionId": "s", "command": "true", "cwd": dir.path()}),
    );
    assert_eq!(wait_exit(&mut third, &id)["exitCode"], 0);
    fs.release(Found::Dir);
    assert_no_panic(&d);
}

/// A daemon told to stop while a spawn hangs answers it (`-32007`) before it exits.
#[test]
fn stopping_answers_a_hung_spawn() {
    let mut d = Daemon::start(&[]);
    let Some(fs) = mount() else { return };
    let (mut stuck, id) = stuck_create(&d, &fs);
    assert_eq!(d.terminate(), Some(0));
    match stuck.wait_response(id) {
        Err(CallError::Rpc { code, .. }) => assert_eq!(code, -32007),
        other => panic!("a hung spawn at shutdown got {other:?}"),
    }
    fs.release(Found::Dir);
}
