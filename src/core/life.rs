//! A command's life in the core: started, output and EOF, exit, kill (SIGTERM, then
//! SIGKILL after the grace), signals, release and forgetting, stdin.
//!
//! Invariants:
//! - A kill is one SIGTERM to the tree and, after `--kill-grace`, one SIGKILL to whatever
//!   of it is left (even when the leader died of the SIGTERM). A second kill of a command
//!   already being killed only waits for the first.
//! - A released process is hidden at once and forgotten (`sweep`) once it has exited,
//!   nobody waits on it and the loop has delivered its last events.

use std::time::Duration;

use serde_json::json;

use super::launch::LaunchRequest;
use super::screen::Screen;
use super::table::{Exit, Key, KillReason, Proc, Stdin, Stream, Tty};
use super::view;
use super::vocab::Wait;
use super::{Core, Effect, Queued, Timer};
use crate::config::BASH_HISTORY;
use crate::types::TreeUsage;
use crate::types::{Ended, Stdio3, Usage};
use crate::types::{Stage, WinSize};
use crate::wire::rpc::RpcError;

/// The fields of a command's `start` record (PROTOCOL 7.4).
fn start_fields(req: &LaunchRequest, id: &str, pid: i32, runs_as: u32) -> serde_json::Value {
    let (decision, rule) = req
        .admitted
        .as_ref()
        .map_or(("allow", "default"), |a| (a.decision, a.rule.as_str()));
    let mut fields = json!({
        "id": id, "session": req.family.session_id(), "cwd": req.cwd,
        "uid": runs_as, "decision": decision, "rule": rule, "pid": pid,
        "via": req.via.as_str(),
    });
    match &req.program {
        crate::types::Program::Shell { line, .. } => fields["line"] = line.clone().into(),
        crate::types::Program::Direct { .. } => {
            fields["argv"] = json!(req.program.argv());
        }
    }
    fields["sandbox"] = req.sandbox.as_ref().map_or_else(
        || crate::policy::sandbox::Given::off().to_json(),
        |g| g.to_json(),
    );
    fields
}

/// A command refused because its `start` record could not be queued.
fn audit_full() -> RpcError {
    let cap = super::log::QUEUE_BYTES;
    RpcError::limit("audit", cap).with_data(json!({
        "limit": "audit",
        "value": cap,
        "reason": "the audit log does not take records fast enough to record this command's \
                   start; nothing runs unrecorded",
    }))
}

impl Core {
    /// Whether `req` may start now: at most `--max-processes` run, a uid held to fair
    /// shares at most half of them and all such uids together seven eighths, and its
    /// record fits its owner's share of the output memory once retained output of
    /// exited commands is given back (PROTOCOL 8).
    pub fn may_start(&mut self, req: &LaunchRequest) -> Result<(), RpcError> {
        let owner = req.peer.uid;
        let max = self.cfg.max_processes;
        if self.table.running() + self.table.starting(None) >= max {
            return Err(RpcError::limit("max-processes", max));
        }
        let held = |uid| self.table.running_of(uid) + self.table.starting(Some(uid));
        let shared = self
            .table
            .owners_running()
            .filter(|&u| self.shares(u))
            .map(held)
            .sum();
        self.fair_share(owner, (held(owner), shared), ("max-processes", max))?;
        self.room_for_record(owner, req.record_bytes())
    }

    /// Promises the audit queue room for the `start` record of `req`, about to be spawned
    /// as `key` (public id `id`), so that it never runs unrecorded (PROTOCOL 7.4):
    /// `-32003` (`audit`) when the queue cannot take it (a stalled audit target). The
    /// promise is kept by `started`, or given back by `unpromise_start`.
    pub fn promise_start(
        &mut self,
        req: &LaunchRequest,
        key: Key,
        id: &str,
    ) -> Result<(), RpcError> {
        if !self.auditing() {
            return Ok(());
        }
        // The record as `started` makes it, with the longest pid and uid it can hold.
        let fields = start_fields(req, id, i32::MAX, u32::MAX);
        let peer = json!({ "uid": req.peer.uid, "gid": req.peer.gid, "pid": req.peer.pid });
        let fields = match fields {
            serde_json::Value::Object(m) => m,
            _ => Default::default(),
        };
        let bytes = super::log::bounded_audit_line(self.wall, "start", Some(peer), fields).len();
        if !self.audit_queue().reserve(bytes) {
            return Err(audit_full());
        }
        self.audit_promised.insert(key, bytes);
        Ok(())
    }

    /// A spawn promised room for its `start` record did not start.
    pub fn unpromise_start(&mut self, key: Key) {
        if let Some(bytes) = self.audit_promised.remove(&key) {
            self.audit_queue().unreserve(bytes);
        }
    }

    /// Whether the audit queue has room now for the `start` record of a shell session's
    /// line `line` (PROTOCOL 7.4): `-32003` (`audit`) when not. The record itself is
    /// queued when the line is typed, at the next prompt, into that room or past the
    /// queue's capacity (one line per session at most waits so).
    pub fn room_for_line_record(&mut self, line: &str, session: &str) -> Result<(), RpcError> {
        if !self.auditing() {
            return Ok(());
        }
        // The line and its session, and what every start record holds beside them.
        let bytes = (line.len() + session.len()).min(super::log::RECORD_MAX) + 4096;
        let q = self.audit_queue();
        if !q.reserve(bytes) {
            return Err(audit_full());
        }
        q.unreserve(bytes);
        Ok(())
    }

    /// Records a command the loop just started as `key` (public id `id`, leader `pid`).
    /// `runs_as` is the uid the command runs as (a root daemon runs peers as
    /// themselves, or as `--run-as`).
    pub fn started(&mut self, req: &LaunchRequest, key: Key, id: String, pid: i32, runs_as: u32) {
        let (streams, stdin) = match req.stdio {
            Stdio3::Merged => (vec![Stream::new(req.ring_capacity)], None),
            Stdio3::MergedWithStdin => (
                vec![Stream::new(req.ring_capacity)],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
            Stdio3::Separate => (
                vec![
                    Stream::new(req.ring_capacity),
                    Stream::new(req.ring_capacity),
                ],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
            // A bash command keeps its two streams: stderr, which the terminal merges
            // into stdout, stays empty and closed.
            Stdio3::Pty(_) if req.family.is_bash() => (
                vec![Stream::terminal(req.ring_capacity), Stream::closed()],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
            Stdio3::Pty(_) | Stdio3::Shell(_) => (
                vec![Stream::terminal(req.ring_capacity)],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
        };
        let tty = match req.stdio {
            Stdio3::Pty(size) | Stdio3::Shell(size) => Some(Tty {
                size,
                screen: None,
                path: None,
            }),
            _ => None,
        };
        let commands = match req.stdio {
            Stdio3::Shell(_) => Some(Stdin::new(super::vocab::COMMAND_PIPE_BUFFER)),
            _ => None,
        };
        self.input_watch |= stdin.is_some();
        // The uid it runs as; the peer's too when that is another (a root daemon runs a
        // peer's command as the peer, or as --run-as).
        let peer = if req.peer.uid == runs_as {
            String::new()
        } else {
            format!(" (for peer uid {})", req.peer.uid)
        };
        self.log.line(format_args!(
            "{id} started: pid {pid} uid {runs_as}{peer} cwd {:?} command {:?}{}",
            req.cwd,
            req.command,
            if req.args.is_empty() {
                String::new()
            } else {
                format!(" args {:?}", req.args)
            }
        ));
        if self.auditing() {
            let how = self
                .audit_promised
                .remove(&key)
                .map_or(Queued::Any, Queued::Promised);
            let fields = start_fields(req, &id, pid, runs_as);
            self.record_queued("start", Some(req.peer), fields, how);
        }
        // A shell session's sandbox is fixed once its first shell runs: its restarts
        // (in whatever directory a `cd` left it) keep it, unchecked.
        if let (crate::core::vocab::After::ShellStart(_), Some(g)) = (&req.after, &req.sandbox) {
            let key = (req.peer.uid, req.family.session_id().to_string());
            if let Some(s) = self.shells.map.get_mut(&key) {
                s.sandbox = Some(crate::policy::sandbox::Given {
                    verify_cwd: false,
                    ..g.clone()
                });
            }
        }
        // `may_start` made room for its record, but output that arrived while it was being
        // spawned may have taken that room again: made once more (it is not refused now).
        let _ = self.room_for_record(req.peer.uid, req.record_bytes());
        self.table.insert(Proc {
            key,
            id,
            family: req.family.clone(),
            owner: req.peer.uid,
            peer: req.peer,
            command: req.command.clone(),
            args: req.args.clone(),
            cwd: req.cwd.clone(),
            pid,
            started: self.now,
            started_wall: self.wall,
            streams,
            stdin,
            commands,
            runs_as,
            sandbox: req.sandbox.clone().filter(|g| !g.is_off()),
            exit: None,
            kill: None,
            tied_to: req.kill_on_disconnect,
            signalled: false,
            released: false,
            tty,
            quiet_since: self.now,
            waiting_for_input: false,
            waiters: Vec::new(),
            held: 0,
            subs: Vec::new(),
            paused: false,
            drained: false,
            read_out: [false; 2],
            meta: req.record_bytes(),
            lingers: false,
            notice: None,
        });
        // Subscribed from the first byte, unless its connection left while it started.
        if let Some((conn, opts)) = req.subscribe.filter(|(c, _)| self.clients.contains_key(c)) {
            self.table.subscribe(key, conn, [0, 0], opts);
        }
        // A command tied to a connection that is already gone has nobody to run for.
        if let Some(conn) = req.kill_on_disconnect {
            if !self.clients.contains_key(&conn) {
                self.kill(key, KillReason::Disconnect);
            }
        }
    }

    /// Output stream `stream` of `key` reached its end.
    pub fn eof(&mut self, key: Key, stream: usize) {
        if let Some(s) = self
            .table
            .get_mut(key)
            .and_then(|p| p.streams.get_mut(stream))
        {
            s.open = false;
        }
        self.out.push(Effect::Pump(key));
        self.wake(key);
    }

    /// As the leader of `key` was reaped, its tree still had members: what it left lives
    /// while its session does (PROTOCOL 8, 14).
    pub fn lingers(&mut self, key: Key) {
        if let Some(p) = self.table.get_mut(key) {
            p.lingers = true;
        }
    }

    /// The leader of `key` was reaped (after its pipes were drained of what they held).
    pub fn exited(&mut self, key: Key, ended: Ended, usage: Usage, tree: Option<TreeUsage>) {
        let exit = Exit {
            ended,
            usage,
            tree,
            at: self.now,
        };
        let evict = self.table.record_exit(key, exit, self.cfg.max_retained);
        if let Some(p) = self.table.get_mut(key) {
            // The loop read what the pipes held, unless a lossless subscriber holds them
            // paused: then `drained` comes when they are read again.
            p.drained = !p.paused;
        }
        self.close_stdin(key);
        if let Some(t) = self.hard_timers.remove(&key) {
            self.timers.cancel(t);
        }
        let Some(p) = self.table.get(key) else { return };
        self.log.line(format_args!(
            "{} exited: {} after {} ms",
            p.id,
            view::describe_exit(p),
            p.duration().as_millis()
        ));
        if self.audit.is_some() || self.audit_to_log {
            let (code, signal) = view::exit_fields(p);
            let streams: Vec<u64> = p.streams.iter().map(|s| s.ring.end()).collect();
            let fields = json!({
                "id": p.id, "status": p.status(), "exit_code": code, "signal": signal,
                "duration_ms": p.duration().as_millis() as u64,
                "cpu_ms": tree.and_then(|t| t.cpu_ms)
                    .unwrap_or((usage.user + usage.system).as_millis() as u64),
                "memory_peak_kb": tree.and_then(|t| t.memory_peak_kb),
                "oomKilled": tree.is_some_and(|t| t.oom_killed),
                "max_rss_kb": usage.max_rss_kb,
                "stdout_bytes": streams.first().copied().unwrap_or(0),
                "stderr_bytes": streams.get(1).copied(),
            });
            let peer = p.peer;
            self.record("exit", Some(peer), fields);
        }
        self.shell_exited(key, ended);
        let Some(p) = self.table.get(key) else { return };
        let (released, session) = (p.released, p.session_key());
        self.out.push(Effect::Pump(key));
        self.wake(key);
        if released {
            self.forget.push(key);
        }
        for k in evict {
            self.release(k, KillReason::Release);
        }
        if let Some(s) = session {
            for k in self.table.history_overflow(&s, BASH_HISTORY) {
                // What it left still lives while its session does (PROTOCOL 14): the
                // session remembers it, to end at its close.
                let left = self
                    .table
                    .get(k)
                    .filter(|p| super::sessions::left_processes(p))
                    .map(|p| (k, p.id.clone()));
                if let (Some(left), Some(sess)) = (left, self.table.sessions.get_mut(&s)) {
                    sess.left.push(left);
                }
                self.drop_finished(k);
            }
        }
    }

    /// Output stream `stream` of `key` was just read to empty (or found closed). After an
    /// exit that found the pipes paused, the `Exit` event may follow once every stream
    /// has been: each may still hold what was written before the exit.
    pub fn read_out(&mut self, key: Key, stream: usize) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if p.exit.is_none() || p.drained || p.paused {
            return;
        }
        if let Some(done) = p.read_out.get_mut(stream) {
            *done = true;
        }
        let all = p
            .streams
            .iter()
            .enumerate()
            .all(|(i, s)| !s.open || p.read_out[i]);
        if all {
            p.drained = true;
            self.out.push(Effect::Pump(key));
        }
    }

    /// Starts ending a command: SIGTERM to its tree now, SIGKILL to what is left after the
    /// grace. A command already being killed is left to that kill.
    pub fn kill(&mut self, key: Key, reason: KillReason) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if !p.running() || p.kill.is_some() {
            return;
        }
        p.kill = Some(reason);
        let fields = json!({ "id": p.id, "reason": reason.as_str() });
        let (peer, shell) = (p.peer, p.family.is_shell());
        self.record("kill", Some(peer), fields);
        if shell {
            // An interactive bash ignores SIGTERM; on SIGHUP it sends SIGHUP to every job
            // it started (each in a group of its own) and exits. The section 3 kill
            // follows for whatever is left.
            self.out.push(Effect::Signal {
                key,
                sig: libc::SIGHUP,
            });
        }
        self.end_tree(key);
    }

    /// What an ended command left (PROTOCOL 14) is ended: SIGTERM to what is left of its
    /// group now, SIGKILL to its cgroup and whatever carries its cookie after the grace
    /// (`terminal/kill` of an exited terminal). A running command is left alone.
    pub fn end_leftovers(&mut self, key: Key) {
        if self.table.get(key).is_some_and(|p| !p.running()) {
            self.end_tree(key);
        }
    }

    /// SIGTERM to a tree now, SIGKILL to what is left after the grace.
    pub(super) fn end_tree(&mut self, key: Key) {
        let Some(id) = self.table.get(key).map(|p| p.id.clone()) else {
            return;
        };
        self.end_tree_of(key, id);
    }

    /// `end_tree` of command `id` (`key`), which may be forgotten already.
    pub(super) fn end_tree_of(&mut self, key: Key, id: String) {
        self.out.push(Effect::End {
            key,
            id: id.clone(),
            stage: Stage::Term,
        });
        self.timers
            .add(self.now + self.cfg.kill_grace, Timer::Escalate(key, id));
    }

    /// A signal from `bash/kill` (or `terminal/kill` with one) to a running command; to
    /// an ended one, only SIGKILL does anything: it kills what that command left.
    pub fn signal(&mut self, key: Key, sig: i32) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if !p.running() {
            // SIGKILL to an ended command kills what it left, at once (PROTOCOL 5, 14).
            if sig == libc::SIGKILL {
                let id = p.id.clone();
                self.out.push(Effect::End {
                    key,
                    id,
                    stage: Stage::Kill,
                });
            }
            return;
        }
        if sig != libc::SIGSTOP && sig != libc::SIGCONT {
            p.signalled = true;
        }
        self.log.debug(format_args!(
            "{} sent {}",
            p.id,
            crate::types::signal_name(sig)
        ));
        // SIGKILL means the whole tree, escaped or not; other signals are requests the
        // process group gets.
        if sig == libc::SIGKILL {
            let id = p.id.clone();
            self.out.push(Effect::End {
                key,
                id,
                stage: Stage::Kill,
            });
        } else {
            self.out.push(Effect::Signal { key, sig });
        }
    }

    /// Release: hide the id, stop reading, end what runs (or what an exited command left
    /// in its tree). Parked waiters still get the exit.
    pub fn release(&mut self, key: Key, reason: KillReason) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        let running = p.running();
        for s in &mut p.streams {
            s.open = false;
        }
        self.log.debug(format_args!("{} released", p.id));
        let fields = json!({ "id": p.id });
        let peer = p.peer;
        self.record("release", Some(peer), fields);
        self.table.hide(key);
        self.out.push(Effect::ClosePipes(key));
        self.close_stdin(key);
        if running {
            self.kill(key, reason);
        } else {
            // The leader is gone; descendants that kept its tree alive are not wanted.
            self.end_tree(key);
            self.out.push(Effect::Pump(key));
            self.forget.push(key);
        }
    }

    /// Marks a command's stdin closed (counting what never got through) and has the loop
    /// close its pipe; a write waiting for room learns it never will.
    pub fn close_stdin(&mut self, key: Key) {
        // A shell's command channel goes with its input: both end only with the shell.
        if let Some(c) = self.table.get_mut(key).and_then(|p| p.commands.as_mut()) {
            c.close();
        }
        if let Some(stdin) = self.table.get_mut(key).and_then(|p| p.stdin.as_mut()) {
            if stdin.open {
                stdin.close();
                self.out.push(Effect::CloseStdin(key));
                self.wake(key);
            }
        }
    }

    /// Queues input for a running command's stdin (`bash/write`, `terminal/write`): taken
    /// at once (`Ok(None)`), or, with `wait`, to be parked until it fits the buffer
    /// (`Ok(Some(wait))`). Input that does not fit is otherwise refused whole (`-32003`);
    /// so is a write while another waits, which keeps input in the order it was sent.
    pub fn write_stdin(
        &mut self,
        key: Key,
        data: Vec<u8>,
        eof: bool,
        wait: bool,
    ) -> Result<Option<Wait>, RpcError> {
        // A terminal's end of input is its EOF character (Ctrl-D), typed after the rest;
        // the terminal stays open (PROTOCOL 12.1).
        let (data, eof) = match self.table.get(key).and_then(|p| p.tty.as_ref()) {
            Some(_) if eof => ([data.as_slice(), &[CTRL_D]].concat(), false),
            _ => (data, eof),
        };
        let waiting = self.table.get(key).is_some_and(|p| {
            p.waiters.iter().any(|w| {
                self.parked
                    .get(w)
                    .is_some_and(|x| matches!(x.wait, Wait::StdinRoom { .. }))
            })
        });
        let capacity = self
            .table
            .get(key)
            .and_then(|p| p.stdin.as_ref())
            .map_or(0, |s| s.capacity);
        if !waiting && self.table.queue_stdin(key, &data, eof)?.is_some() {
            self.out.push(Effect::FlushStdin(key));
            // Input given: whatever waited for it is not waiting any more.
            self.set_waiting(key, false);
            return Ok(None);
        }
        if wait && !waiting && data.len() <= capacity {
            return Ok(Some(Wait::StdinRoom { key, data, eof }));
        }
        Err(RpcError::limit("stdin-buffer", capacity))
    }

    /// Sets the window size of `key`'s terminal (`terminal/resize`, `bash/resize`, a shell
    /// session's `shell/resize`): the screen, if one is kept, takes the new size, and the
    /// loop tells the kernel (which sends SIGWINCH to the foreground job). `-32602` naming
    /// `tty` for a command without one.
    pub fn resize(&mut self, key: Key, size: WinSize) -> Result<(), RpcError> {
        let tty = self
            .table
            .get_mut(key)
            .and_then(|p| p.tty.as_mut())
            .ok_or_else(|| RpcError::invalid_params("tty", "the command has no terminal"))?;
        tty.size = size;
        if let Some(screen) = &mut tty.screen {
            screen.resize(size);
        }
        self.out.push(Effect::Resize { key, size });
        Ok(())
    }

    /// Makes sure `key`, a PTY command, keeps a screen (PROTOCOL 12.1): one is started
    /// from what its output retains, its memory counted against the output budget
    /// (`-32003` when it does not fit). `-32602` naming `screen` for a command without a
    /// terminal.
    pub fn keep_screen(&mut self, key: Key) -> Result<(), RpcError> {
        let Some(p) = self.table.get(key) else {
            return Err(RpcError::not_found("process", "released"));
        };
        let Some(tty) = &p.tty else {
            return Err(RpcError::invalid_params(
                "screen",
                "the command has no terminal",
            ));
        };
        if tty.screen.is_some() {
            return Ok(());
        }
        let (owner, size) = (p.owner, tty.size);
        let bytes = Screen::bytes_for(size);
        self.room_for_record(owner, bytes)?;
        let Some(p) = self.table.get_mut(key) else {
            return Ok(());
        };
        let screen = Screen::new(size, &p.streams[0].ring);
        if let Some(tty) = &mut p.tty {
            tty.screen = Some(Box::new(screen));
            p.meta += bytes;
            self.table.memory.add(owner, bytes);
        }
        Ok(())
    }

    /// Removes a finished command from view (bash history trimming, session close).
    pub(super) fn drop_finished(&mut self, key: Key) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if p.running() {
            return;
        }
        for s in &mut p.streams {
            s.open = false;
        }
        let waiters = p.waiters.clone();
        self.table.hide(key);
        self.out.push(Effect::ClosePipes(key));
        for w in waiters {
            self.resolve(w, true);
        }
        self.forget.push(key);
    }

    /// Forgets released, exited processes that nobody waits on any more. The loop calls
    /// it after carrying out the effects, so their last events were delivered first.
    pub fn sweep(&mut self) {
        for key in std::mem::take(&mut self.forget) {
            let done = self.table.get(key).is_some_and(|p| {
                p.released && p.exit.is_some() && p.waiters.is_empty() && p.held == 0
            });
            if done {
                self.table.remove(key);
            }
        }
    }

    /// An answer about `key` waits for room on its connection: keep the process (and the
    /// output the answer will carry) until `let_go`.
    pub fn hold(&mut self, key: Key) {
        if let Some(p) = self.table.get_mut(key) {
            p.held += 1;
        }
    }

    /// An answer `hold` kept `key` for was rendered, or its connection went away.
    pub fn let_go(&mut self, key: Key) {
        if let Some(p) = self.table.get_mut(key) {
            p.held = p.held.saturating_sub(1);
            if p.held == 0 && p.released {
                self.forget.push(key);
            }
        }
    }

    /// Arms a bash command's hard timeout.
    pub fn arm_hard_timeout(&mut self, key: Key, after: Duration) {
        let t = self.timers.add(self.now + after, Timer::HardTimeout(key));
        if let Some(old) = self.hard_timers.insert(key, t) {
            self.timers.cancel(old);
        }
    }
}

/// A terminal's default EOF character, sent for `eof: true`.
const CTRL_D: u8 = 0x04;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;

    /// Two shared uids together never fill `--max-processes`: one holds at most half,
    /// both seven eighths, and root still starts.
    #[test]
    fn shared_uids_together_leave_root_room_to_start() {
        let mut c = core();
        c.cfg.max_processes = 8;
        let start = |c: &mut Core, uid: u32| -> Result<(), RpcError> {
            let mut req = request(
                Family::Terminal {
                    session_id: "s".into(),
                },
                Stdio3::Merged,
            );
            req.peer.uid = uid;
            c.may_start(&req)?;
            let (key, id) = c.table.next_ids("term");
            c.started(&req, key, id, key.0 as i32 + 1000, uid);
            Ok(())
        };
        let limit = |r: Result<(), RpcError>| r.unwrap_err().data.unwrap()["limit"].clone();
        for _ in 0..4 {
            start(&mut c, 1000).unwrap();
        }
        assert_eq!(limit(start(&mut c, 1000)), "max-processes-per-uid");
        for _ in 0..3 {
            start(&mut c, 1001).unwrap();
        }
        assert_eq!(limit(start(&mut c, 1001)), "max-processes-shared");
        assert_eq!(limit(start(&mut c, 1002)), "max-processes-shared");
        start(&mut c, 0).expect("root has room");
        assert_eq!(limit(start(&mut c, 0)), "max-processes");
        assert_eq!(crate::core::fair_shares(1), (1, 1));
        assert_eq!(crate::core::fair_shares(2), (1, 1));
        assert_eq!(crate::core::fair_shares(1024), (512, 896));
        assert_eq!(
            crate::core::fair_shares(usize::MAX).1,
            usize::MAX / 8 * 7 + 6
        );
    }

    #[test]
    fn kill_escalates_after_the_grace_even_when_the_leader_died() {
        let mut c = core();
        let k = terminal(&mut c);
        c.kill(k, KillReason::Request);
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        // A second kill waits for the first: no new SIGTERM, no second escalation.
        c.kill(k, KillReason::Request);
        assert!(ends(&mut c).is_empty());
        // The leader dies of the SIGTERM; a descendant may not have.
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        std::mem::take(&mut c.out);
        later(&mut c, Duration::from_millis(1999));
        assert!(ends(&mut c).is_empty());
        later(&mut c, Duration::from_millis(1));
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)], "exactly one SIGKILL");
        assert_eq!(c.table.get(k).unwrap().status(), "killed");
    }

    #[test]
    fn release_of_a_running_command_kills_it_and_forgets_it_once_reaped() {
        let mut c = core();
        let k = terminal(&mut c);
        let id = c.table.get(k).unwrap().id.clone();
        c.park(C1, ReqNo(1), Wait::Exit(k), None);
        c.release(k, KillReason::Release);
        assert_eq!(c.table.find(&id, 1000), None, "hidden at once");
        let effects = std::mem::take(&mut c.out);
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::ClosePipes(x) if *x == k)));
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::End { key, stage: Stage::Term, .. } if *key == k)));
        c.sweep();
        assert!(c.table.get(k).is_some(), "kept until reaped");
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        assert_eq!(
            replies(&mut c).len(),
            1,
            "the parked waiter still gets the exit"
        );
        c.sweep();
        assert!(
            c.table.get(k).is_none(),
            "forgotten once reaped and answered"
        );
    }

    #[test]
    fn release_of_an_exited_command_ends_its_leftovers_and_forgets_it() {
        let mut c = core();
        let k = terminal(&mut c);
        c.exited(k, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.release(k, KillReason::Release);
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        c.sweep();
        assert!(c.table.get(k).is_none());
        later(&mut c, Duration::from_secs(2));
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)]);
    }

    #[test]
    fn a_kill_of_an_exited_command_ends_its_leftovers_and_sigkill_does_at_once() {
        let mut c = core();
        let k = terminal(&mut c);
        c.exited(k, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.end_leftovers(k);
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        later(&mut c, Duration::from_secs(2));
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)]);
        c.signal(k, libc::SIGKILL);
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)]);
        c.signal(k, libc::SIGTERM);
        assert!(ends(&mut c).is_empty(), "other signals reach nothing");
        assert_eq!(c.table.get(k).unwrap().status(), "completed");
    }

    #[test]
    fn the_start_line_names_the_uid_the_command_runs_as() {
        let mut c = core();
        let req = request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, 4242, 65534);
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, 4243, 1000);
        let log = String::from_utf8(c.log.queue.pending().to_vec()).unwrap();
        assert!(
            log.contains("pid 4242 uid 65534 (for peer uid 1000) cwd"),
            "{log}"
        );
        assert!(log.contains("pid 4243 uid 1000 cwd"), "{log}");
    }

    /// The final stage names the command, whose cookie the loop sweeps for, even when the
    /// command was forgotten during the grace.
    #[test]
    fn the_final_kill_names_the_command_even_once_forgotten() {
        let mut c = core();
        let k = terminal(&mut c);
        let id = c.table.get(k).unwrap().id.clone();
        c.exited(k, Ended::Code(0), Usage::default(), None);
        c.release(k, KillReason::Release);
        c.sweep();
        assert!(c.table.get(k).is_none(), "forgotten");
        std::mem::take(&mut c.out);
        later(&mut c, Duration::from_secs(2));
        let kills: Vec<(Key, String)> = std::mem::take(&mut c.out)
            .into_iter()
            .filter_map(|e| match e {
                Effect::End {
                    key,
                    id,
                    stage: Stage::Kill,
                } => Some((key, id)),
                _ => None,
            })
            .collect();
        assert_eq!(kills, vec![(k, id)]);
    }

    #[test]
    fn a_released_command_an_answer_still_refers_to_is_kept_until_it_is_let_go() {
        let mut c = core();
        let k = terminal(&mut c);
        c.exited(k, Ended::Code(0), Usage::default(), None);
        c.hold(k);
        c.hold(k);
        c.release(k, KillReason::Release);
        c.sweep();
        assert!(c.table.get(k).is_some(), "two answers refer to it");
        c.let_go(k);
        c.sweep();
        assert!(c.table.get(k).is_some(), "one answer still refers to it");
        c.let_go(k);
        c.sweep();
        assert!(
            c.table.get(k).is_none(),
            "forgotten once the last is rendered"
        );
    }

    /// A terminal of uid 1000 created by connection `conn`, tied to it when `tied`.
    fn tied_terminal(c: &mut Core, conn: ConnId, tied: bool) -> Key {
        let mut req = request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        req.kill_on_disconnect = tied.then_some(conn);
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, key.0 as i32 + 1000, req.peer.uid);
        key
    }

    #[test]
    fn a_command_tied_to_its_connection_is_killed_when_it_closes_and_audited() {
        let mut c = core();
        c.cfg.audit = Some(crate::config::AuditTarget::Stderr);
        let mut c = Core::new(c.cfg, c.now, c.wall, Log::new(false));
        let peer = Peer {
            uid: 1000,
            gid: 1000,
            pid: 42,
        };
        c.connected(C1, peer, vec![]);
        c.connected(C2, peer, vec![]);
        let tied = tied_terminal(&mut c, C1, true);
        let free = tied_terminal(&mut c, C1, false);
        let other = tied_terminal(&mut c, C2, true);
        std::mem::take(&mut c.out);
        c.disconnected(C1);
        // Only the tied command of the closed connection: SIGTERM now, SIGKILL after
        // the grace, as every kill.
        assert_eq!(ends(&mut c), vec![(tied, Stage::Term)]);
        later(&mut c, Duration::from_millis(1999));
        assert!(ends(&mut c).is_empty());
        later(&mut c, Duration::from_millis(1));
        assert_eq!(ends(&mut c), vec![(tied, Stage::Kill)]);
        c.exited(tied, Ended::Signal(libc::SIGKILL), Usage::default(), None);
        assert_eq!(c.table.get(tied).unwrap().status(), "killed");
        assert_eq!(
            c.table.get(tied).unwrap().kill,
            Some(KillReason::Disconnect)
        );
        assert!(c.table.get(free).unwrap().running(), "not tied: runs on");
        assert!(
            c.table.get(other).unwrap().running(),
            "tied to another connection"
        );
        let exit = crate::core::view::exit_event(c.table.get(tied).unwrap());
        assert_eq!(exit["reason"], "disconnect");
        let log = String::from_utf8(c.log.queue.pending().to_vec()).unwrap();
        let kill = log
            .lines()
            .find(|l| l.contains(r#""event":"kill""#))
            .unwrap_or_else(|| panic!("no kill record in {log}"));
        assert!(kill.contains(r#""reason":"disconnect""#), "{kill}");
        // A command whose creating connection is gone before it started is killed at once.
        let late = tied_terminal(&mut c, C1, true);
        assert_eq!(ends(&mut c), vec![(late, Stage::Term)]);
    }

    #[test]
    fn a_hard_timeout_kills_and_reports_timed_out() {
        let mut c = core();
        let k = bash(&mut c, "h");
        c.arm_hard_timeout(k, Duration::from_secs(3));
        later(&mut c, Duration::from_secs(3));
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        assert_eq!(c.table.get(k).unwrap().status(), "timed_out");
    }
}
