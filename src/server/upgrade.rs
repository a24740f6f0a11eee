//! Upgrading in place (PROTOCOL 13): the loop's side of `SIGUSR2` and `daemon/upgrade`.
//!
//! 1. Pre-flight, while the daemon serves on: the new binary runs as a child with
//!    `--upgrade-check`, cloned like a command and watched by the loop like one (its spawn
//!    report, its output pipe, its reaping, and a 5 s timer). It must answer one JSON line
//!    naming the state version this daemon writes; anything else refuses the upgrade
//!    (`-32000` with the reason, logged, audited `upgrade_failed`), and nothing else
//!    changes.
//! 2. The daemon stops reading requests and accepting, and waits for the spawns in flight
//!    to be reported (at most 5 s), so every command it carries is whole.
//! 3. In one go, between two turns: `RELOADING=1` to systemd, every room's state into one
//!    `wire::state::State` (`carry`), encoded into a sealed memfd, close-on-exec cleared on
//!    exactly the descriptors the state names, the handled signals blocked (they stay
//!    pending), and `execve` of the new binary with the same flags plus `--resume-from FD`.
//!    A failed `execve` undoes the last two steps and refuses the upgrade: nothing was torn
//!    down, so the daemon serves on as if nothing happened.
//! 4. The new image (`Server::resume`) reads the state, checks every descriptor it names,
//!    takes duplicates of them and rebuilds every room on them. Only once all of that
//!    worked does it close the numbers it was handed and unblock the signals; until then a
//!    refusal (a state version or a name it does not know, a descriptor missing, flags it
//!    does not parse, or `EXECD_TEST_REFUSE_STATE=1`) hands the untouched state back:
//!    `execve` of the old executable (through a descriptor of it, which stays the old file
//!    when a package manager renamed a new one over its path) with `EXECD_UPGRADE_REFUSED`
//!    saying why, and the old image resumes (its flags taken from the state it wrote) and
//!    answers the upgrade with that error.
//! 5. The image that serves reaps what exited meanwhile (those children stayed zombies of
//!    the same pid), sends `READY=1`, answers `daemon/upgrade` with `{from, to, upgrades,
//!    pause_ms}` and audits `upgrade`.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use mio::unix::pipe::Receiver;
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};
use serde_json::json;

use super::children::Children;
use super::clients::Clients;
use super::conn::Bounds;
use super::listen::Listeners;
use super::{
    LoopTimer, Server, Signals, AUDIT, CGROUPS, EXITS, FIRST_DYNAMIC, HANDLED_SIGNALS, LOG, SIGNALS,
};
use crate::config::Config;
use crate::core::table::Peer;
use crate::core::timers::TimerId;
use crate::core::{Containment, Core};
use crate::sys::sinks::Sinks;
use crate::sys::spawn::{FailedAt, InFlight, Report, Spawned};
use crate::sys::systemd;
use crate::sys::upgrade::{self as os, Carried, FdKind, Image};
use crate::wire::rpc::{ReqNo, RpcError};
use crate::wire::state::{
    self, AskerImage, BlobsIn, BlobsOut, Bytes, Clock, FdRole, PeerImage, ServerImage, State,
    UpgradeImage,
};

/// How long the new binary has to answer `--upgrade-check`.
const PROBE_TIME: Duration = Duration::from_secs(5);
/// How long the daemon waits for spawns in flight before it gives up on an upgrade.
const DRAIN_TIME: Duration = Duration::from_secs(5);
/// The longest the image that resumed keeps the swap's real time while it catches up.
const CATCH_UP_TIME: Duration = Duration::from_millis(100);
/// The most of the pre-flight's output kept, for its answer or for saying why it failed.
const PROBE_OUTPUT: usize = 4096;

/// Who asked for an upgrade: what its `upgrade` and `upgrade_failed` records name.
#[derive(Debug, Clone, Copy)]
pub(super) enum Asker {
    /// A peer's `daemon/upgrade`.
    Peer(Peer),
    /// SIGUSR2 from this process (pid, uid); none when the kernel sent it.
    Signal(Option<(i32, u32)>),
}

impl Asker {
    /// Audits `event` with `fields`, naming who asked: the record's `peer`, or `signal:
    /// "SIGUSR2"` with the sender's `pid` and `uid`.
    fn record(self, core: &mut Core, event: &str, mut fields: serde_json::Value) {
        match self {
            Asker::Peer(peer) => core.record(event, Some(peer), fields),
            Asker::Signal(from) => {
                fields["signal"] = "SIGUSR2".into();
                if let Some((pid, uid)) = from {
                    fields["pid"] = pid.into();
                    fields["uid"] = uid.into();
                }
                core.record(event, None, fields);
            }
        }
    }

    fn carry(self) -> AskerImage {
        match self {
            Asker::Peer(p) => AskerImage::Peer(PeerImage {
                uid: p.uid,
                gid: p.gid,
                pid: p.pid,
            }),
            Asker::Signal(from) => AskerImage::Signal(from),
        }
    }

    fn resume(img: &AskerImage) -> Asker {
        match img {
            AskerImage::Peer(p) => Asker::Peer(Peer {
                uid: p.uid,
                gid: p.gid,
                pid: p.pid,
            }),
            AskerImage::Signal(from) => Asker::Signal(*from),
        }
    }
}

/// How an upgrade was refused: what its asker is answered.
enum Refused {
    /// `-32000` with the reason.
    State(String),
    /// The `binary` named may not be run (`-32602` naming it): nothing of it ran.
    Binary(String),
}

impl Refused {
    fn why(&self) -> &str {
        match self {
            Refused::State(w) | Refused::Binary(w) => w,
        }
    }

    fn error(&self) -> RpcError {
        match self {
            Refused::State(why) => RpcError::invalid_state(format!("upgrade refused: {why}")),
            Refused::Binary(why) => RpcError::invalid_params("binary", why.clone()),
        }
    }
}

/// An upgrade under way.
pub(super) struct Upgrading {
    binary: PathBuf,
    /// The `daemon/upgrade` request to answer; none for SIGUSR2.
    asked_by: Option<(Token, ReqNo)>,
    asker: Asker,
    stage: UpgradeStage,
    /// The timer of the stage under way (the pre-flight's 5 s, then the drain's),
    /// cancelled when the upgrade is refused: an earlier attempt's timer never ends a
    /// later one.
    timer: Option<TimerId>,
}

enum UpgradeStage {
    /// The new binary runs with `--upgrade-check`.
    Probing {
        pid: i32,
        /// Its spawn's report pipe, until it says exec'd or failed, and the memory the
        /// child reads until then.
        report: Option<(OwnedFd, Token)>,
        memory: Option<InFlight>,
        out: Option<(Receiver, Token)>,
        /// What it printed so far.
        got: Vec<u8>,
        /// The nice value before the daemon raised its priority for the upgrade
        /// (`os::raise_for_swap`), put back when the upgrade is refused, or at the answer
        /// of a new image that would not put it back.
        nice: Option<i32>,
    },
    /// It answered: the daemon no longer reads requests and waits for spawns in flight.
    Draining {
        to: String,
        /// When serving stopped (CLOCK_MONOTONIC, ns): where the pause starts.
        stopped: i64,
        /// The nice value before the pre-flight or the drain raised the priority to real
        /// time (`os::raise_for_swap`), put back when the upgrade is refused.
        nice: Option<i32>,
        /// The new image puts a raised priority back (its pre-flight said so); none is
        /// raised for one that does not.
        restores: bool,
    },
}

/// The real time of an upgrade's swap, kept by the image that resumed while it catches
/// up with what queued during the pause (`Server::settle_after_swap`).
pub(super) struct SwapRaised {
    /// The nice value to put back.
    pub(super) nice: i32,
    /// When the image resumed, and the latest it keeps real time.
    since: Instant,
    pub(super) until: Instant,
    /// Turns of the loop since.
    turns: u32,
}

/// What an image resumed from an upgrade (or handed back one) tells once it serves.
pub(super) struct Resumed {
    from: String,
    asked_by: Option<(Token, ReqNo)>,
    /// Who asked (none: a writer that did not say).
    asker: Option<Asker>,
    stopped: i64,
    /// The nice value to put back (`UpgradeImage::nice_before`).
    nice: Option<i32>,
    /// Why the new image refused the state, when this is the old one resuming.
    refused: Option<String>,
    commands: usize,
    connections: usize,
    /// Bytes of the state carried.
    state_bytes: usize,
}

impl Server {
    /// `SIGUSR2` or `daemon/upgrade`: starts the pre-flight of `binary` (default: what the
    /// daemon was started as). Refused at once when one is under way or the daemon stops.
    pub(super) fn begin_upgrade(
        &mut self,
        asked_by: Option<(Token, ReqNo)>,
        binary: Option<PathBuf>,
        asker: Asker,
    ) {
        let refuse = |s: &mut Server, why: String| {
            s.upgrade_failed(asked_by, asker, &Refused::State(why));
        };
        let named = binary.is_some();
        if self.upgrade.is_some() {
            return refuse(self, "an upgrade is already under way".into());
        }
        if self.shutdown.is_some() {
            return refuse(self, "the daemon is stopping".into());
        }
        let Some(binary) = binary.or_else(|| self.core.cfg.binary.clone()) else {
            return refuse(
                self,
                "the binary execd was started as is not known; name one (--binary)".into(),
            );
        };
        let Some(text) = binary.to_str() else {
            return refuse(self, format!("{} is not a UTF-8 path", binary.display()));
        };
        // From the pre-flight on, in real time where the daemon may: the new binary's
        // check, and the daemon reading its answer, would otherwise queue for a CPU behind
        // the clients it serves (issue 33). Nothing the daemon starts inherits it.
        let nice = self
            .swap_raised
            .take()
            .map(|r| r.nice)
            .or_else(|| os::raise_for_swap(false));
        let Spawned {
            pid,
            ends,
            report,
            memory,
        } = match self.children.probe(text, named) {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(nice) = nice {
                    os::lower_after_swap(nice);
                }
                return refuse(
                    self,
                    format!("cannot run {} --upgrade-check: {e}", binary.display()),
                );
            }
        };
        if nice.is_some() {
            os::raise_pre_flight(pid);
        }
        let (report_token, out_token) = (Token(self.next_token), Token(self.next_token + 1));
        self.next_token += 2;
        let mut rx = Receiver::from(ends.out);
        let registry = self.poll.registry();
        let watched = registry
            .register(
                &mut SourceFd(&report.as_raw_fd()),
                report_token,
                Interest::READABLE,
            )
            .and_then(|()| registry.register(&mut rx, out_token, Interest::READABLE));
        self.upgrade = Some(Upgrading {
            binary: binary.clone(),
            asked_by,
            asker,
            timer: None,
            stage: UpgradeStage::Probing {
                pid,
                report: Some((report, report_token)),
                memory: Some(memory),
                out: Some((rx, out_token)),
                got: Vec::new(),
                nice,
            },
        });
        if let Err(e) = watched {
            return self.refuse_upgrade(&format!("watching the pre-flight: {e}"));
        }
        self.core.log.line(format_args!(
            "upgrade: asking {} --upgrade-check",
            binary.display()
        ));
        let timer = self
            .timers
            .add(Instant::now() + PROBE_TIME, LoopTimer::UpgradeProbe);
        self.upgrade_timer(timer);
    }

    /// Makes `timer` the one of the stage under way, cancelling the previous stage's.
    fn upgrade_timer(&mut self, timer: TimerId) {
        match self.upgrade.as_mut() {
            Some(up) => {
                if let Some(old) = up.timer.replace(timer) {
                    self.timers.cancel(old);
                }
            }
            None => self.timers.cancel(timer),
        }
    }

    /// Whether the daemon has stopped reading requests for an upgrade.
    pub(super) fn draining(&self) -> bool {
        matches!(
            self.upgrade,
            Some(Upgrading {
                stage: UpgradeStage::Draining { .. },
                ..
            })
        )
    }

    /// Whether the pre-flight runs.
    fn probing(&self) -> bool {
        matches!(
            self.upgrade,
            Some(Upgrading {
                stage: UpgradeStage::Probing { .. },
                ..
            })
        )
    }

    /// Whether `token` is the pre-flight's report or output pipe.
    pub(super) fn probe_token(&self, token: Token) -> bool {
        match &self.upgrade {
            Some(Upgrading {
                stage: UpgradeStage::Probing { report, out, .. },
                ..
            }) => {
                report.as_ref().is_some_and(|(_, t)| *t == token)
                    || out.as_ref().is_some_and(|(_, t)| *t == token)
            }
            _ => false,
        }
    }

    /// One of the pre-flight's pipes is readable.
    pub(super) fn on_probe(&mut self, token: Token) {
        let Some(Upgrading {
            binary,
            stage:
                UpgradeStage::Probing {
                    pid,
                    report,
                    memory,
                    ..
                },
            ..
        }) = &mut self.upgrade
        else {
            return;
        };
        let Some((fd, t)) = report.as_ref().map(|(fd, t)| (fd.as_raw_fd(), *t)) else {
            return self.read_probe();
        };
        if t != token {
            return self.read_probe();
        }
        let failed = match crate::sys::spawn::read_report(fd, memory.as_mut()) {
            Report::Pending => return,
            Report::Execd => None,
            Report::Failed(at, e) => Some((at, e)),
        };
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        *report = None;
        let (pid, memory, binary) = (*pid, memory.take(), binary.display().to_string());
        if let Some((at, e)) = failed {
            if let Some(m) = memory {
                self.children.probe_failed(pid, m);
            }
            let e = crate::wire::rpc::os_error_text(&e);
            let refused = match at {
                // Nothing of it ran: the child refused it before its exec.
                FailedAt::Binary(_) => Refused::Binary(format!(
                    "{binary} {e}: an upgrade runs only a regular file of root's or the \
                     daemon's user that nobody else may write, in directories likewise"
                )),
                _ => Refused::State(format!("cannot run {binary} --upgrade-check: {e}")),
            };
            self.refused(refused);
        }
    }

    /// The pre-flight's output is readable: read it; its first whole line is its answer,
    /// and its end without one (it exited, or closed its output) is a refusal.
    fn read_probe(&mut self) {
        let mut buf = [0u8; 1024];
        let (line, eof) = {
            let Some(Upgrading {
                stage:
                    UpgradeStage::Probing {
                        out: Some((rx, _)),
                        got,
                        ..
                    },
                ..
            }) = &mut self.upgrade
            else {
                return;
            };
            let mut eof = false;
            loop {
                match rx.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        let room = PROBE_OUTPUT.saturating_sub(got.len());
                        got.extend_from_slice(&buf[..n.min(room)]);
                        if got.len() >= PROBE_OUTPUT {
                            eof = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        eof = true;
                        break;
                    }
                }
            }
            let line = got
                .iter()
                .position(|b| *b == b'\n')
                .map(|i| String::from_utf8_lossy(&got[..i]).into_owned());
            let shown = String::from_utf8_lossy(got).trim().to_string();
            (line.ok_or(shown), eof)
        };
        match line {
            Ok(line) => self.probe_answered(&line),
            Err(shown) if eof => {
                let binary = self
                    .upgrade
                    .as_ref()
                    .map(|u| u.binary.display().to_string());
                let ended = match self.children.probe_ended() {
                    Some(crate::types::Ended::Code(c)) => format!(" (exit status {c})"),
                    Some(crate::types::Ended::Signal(s)) => {
                        format!(" (killed by {})", crate::types::signal_name(s))
                    }
                    None => String::new(),
                };
                let said = if shown.is_empty() {
                    String::new()
                } else {
                    format!(": {}", cut(&shown))
                };
                self.refuse_upgrade(&format!(
                    "{} did not answer --upgrade-check{ended}{said}",
                    binary.unwrap_or_default()
                ));
            }
            Err(_) => {}
        }
    }

    /// The pre-flight answered `line`: the upgrade goes on when the new binary takes the
    /// state this daemon writes.
    fn probe_answered(&mut self, line: &str) {
        let Some(up) = self.upgrade.as_mut() else {
            return;
        };
        let binary = up.binary.display().to_string();
        match state::read_check(line) {
            Ok(state::Check {
                version: to,
                restores_priority: restores,
            }) => {
                let raised = match &up.stage {
                    UpgradeStage::Probing { nice, .. } => *nice,
                    _ => None,
                };
                // A new image that would not put a raised priority back runs the swap at
                // the daemon's own; one that would keeps what the pre-flight raised.
                let nice = match raised {
                    Some(nice) if !restores => {
                        os::lower_after_swap(nice);
                        None
                    }
                    raised => raised,
                };
                self.close_probe();
                self.core.log.line(format_args!(
                    "upgrade: {binary} is execd {to} and takes state version {}; no longer \
                     reading requests",
                    state::VERSION
                ));
                if let Some(up) = self.upgrade.as_mut() {
                    up.stage = UpgradeStage::Draining {
                        to,
                        stopped: os::monotonic_ns(),
                        // The drain is part of the pause: in real time where the daemon
                        // may (what it starts meanwhile does not inherit it).
                        nice: nice
                            .or_else(|| restores.then(|| os::raise_for_swap(false)).flatten()),
                        restores,
                    };
                }
                let timer = self
                    .timers
                    .add(Instant::now() + DRAIN_TIME, LoopTimer::UpgradeDrain);
                self.upgrade_timer(timer);
            }
            Err(why) => self.refuse_upgrade(&format!("{binary}: {why}")),
        }
    }

    /// The pre-flight's time is up.
    pub(super) fn probe_timed_out(&mut self) {
        if !self.probing() {
            return;
        }
        let binary = self
            .upgrade
            .as_ref()
            .map(|u| u.binary.display().to_string())
            .unwrap_or_default();
        self.refuse_upgrade(&format!(
            "{binary} did not answer --upgrade-check within {} s",
            PROBE_TIME.as_secs()
        ));
    }

    /// The wait for spawns in flight is over without them.
    pub(super) fn drain_timed_out(&mut self) {
        if self.draining() {
            let n = self.children.spawning();
            self.refuse_upgrade(&format!(
                "{n} command(s) still being started after {} s (a working directory or \
                 program on a file system that does not answer?)",
                DRAIN_TIME.as_secs()
            ));
        }
    }

    /// At the end of a turn: once nothing is being started, the swap.
    pub(super) fn upgrade_step(&mut self) {
        if self.draining() && self.children.spawning() == 0 && self.core.out.is_empty() {
            self.swap();
        }
    }

    /// Stops the pre-flight: its pipe closed, the process killed if it still runs.
    fn close_probe(&mut self) {
        if let Some(Upgrading {
            stage:
                UpgradeStage::Probing {
                    pid,
                    report,
                    memory,
                    out,
                    ..
                },
            ..
        }) = &mut self.upgrade
        {
            if let Some((mut rx, _)) = out.take() {
                let _ = self.poll.registry().deregister(&mut rx);
            }
            if let Some((fd, _)) = report.take() {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&fd.as_raw_fd()));
            }
            // Not exec'd yet: what it reads stays until it is reaped.
            if let Some(m) = memory.take() {
                self.children.probe_failed(*pid, m);
            }
        }
        self.children.end_probe();
    }

    /// Gives up an upgrade under way, if there is one, for `why`.
    pub(super) fn stop_upgrade(&mut self, why: &str) {
        if self.upgrade.is_some() {
            self.refuse_upgrade(why);
        }
    }

    /// Gives up the upgrade under way: said to its asker, logged, audited; a daemon that
    /// had stopped reading reads again.
    fn refuse_upgrade(&mut self, why: &str) {
        self.refused(Refused::State(why.to_string()));
    }

    fn refused(&mut self, refused: Refused) {
        let was_draining = self.draining();
        self.close_probe();
        let Some(up) = self.upgrade.take() else {
            return;
        };
        if let Some(t) = up.timer {
            self.timers.cancel(t);
        }
        if let UpgradeStage::Draining {
            nice: Some(nice), ..
        }
        | UpgradeStage::Probing {
            nice: Some(nice), ..
        } = up.stage
        {
            os::lower_after_swap(nice);
        }
        self.upgrade_failed(up.asked_by, up.asker, &refused);
        if was_draining {
            for t in self.listeners.tokens() {
                self.accept(t);
            }
            let tokens: Vec<Token> = self.clients.tokens();
            for t in tokens {
                self.read_requests(t);
                self.clients.dirty.push(t);
            }
        }
    }

    /// An upgrade refused: its asker told (`-32000` with the reason, or `-32602` naming
    /// `binary`), logged, audited with who asked.
    fn upgrade_failed(
        &mut self,
        asked_by: Option<(Token, ReqNo)>,
        asker: Asker,
        refused: &Refused,
    ) {
        let why = refused.why();
        self.core
            .log
            .line(format_args!("upgrade refused, this image goes on: {why}"));
        asker.record(&mut self.core, "upgrade_failed", json!({ "reason": why }));
        if let Some((token, req)) = asked_by {
            self.answer(token, Some(req), Err(refused.error()));
        }
        self.apply();
    }

    /// The swap: the whole state into a memfd and `execve` of the new binary. Returns
    /// only when the `execve` failed, with nothing torn down: the upgrade is refused and
    /// the daemon serves on.
    fn swap(&mut self) {
        let Some(Upgrading {
            binary,
            asked_by,
            asker,
            stage:
                UpgradeStage::Draining {
                    to,
                    stopped,
                    nice,
                    restores,
                },
            timer,
        }) = self.upgrade.take()
        else {
            return;
        };
        self.close_websockets();
        // From here to the image that serves next, at a raised priority where the daemon
        // may: nothing is spawned meanwhile (the drain is over). That image keeps real
        // time (which nothing it spawns inherits) while it catches up, and puts a raised
        // nice back before it spawns anything.
        let nice = nice.or_else(|| restores.then(|| os::raise_for_swap(true)).flatten());
        let pausing = os::monotonic_ns();
        if let Some(n) = &self.notifier {
            n.send(&format!(
                "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=upgrading to execd {to}",
                pausing / 1000
            ));
        }
        self.core.log.line(format_args!(
            "upgrade: handing {} command(s) and {} connection(s) to {} (execd {to})",
            self.core.table.procs.len(),
            self.clients.count(),
            binary.display()
        ));
        self.write_log();
        let built = self.write_state(&binary, (asked_by, asker), (stopped, nice));
        let failure = match built {
            Ok((memfd, old_exe, fds)) => {
                // The off-loop reader does not cross: the new image starts its own (what
                // it owed is carried: the sweeps asked, the processes still to read).
                self.children.stop_reader(self.poll.registry());
                let mut args = self.core.cfg.args.clone();
                args.push("--resume-from".into());
                args.push(memfd.as_raw_fd().to_string().into());
                let arg0: OsString = self
                    .core
                    .cfg
                    .binary
                    .clone()
                    .unwrap_or_else(|| binary.clone())
                    .into_os_string();
                let mut open: Vec<RawFd> = fds.clone();
                open.push(memfd.as_raw_fd());
                open.extend(old_exe.as_ref().map(AsRawFd::as_raw_fd));
                let cleared = open.iter().try_for_each(|fd| os::set_cloexec(*fd, false));
                let e = match cleared {
                    Ok(()) => {
                        let mask = os::block_signals(&HANDLED_SIGNALS);
                        let e = os::exec(Image::Path(&binary), &arg0, &args, None);
                        os::restore_signals(&mask);
                        e
                    }
                    Err(e) => e,
                };
                for fd in &open {
                    let _ = os::set_cloexec(*fd, true);
                }
                format!("execve {}: {e}", binary.display())
            }
            Err(e) => format!("writing the state: {e}"),
        };
        if let Some(nice) = nice {
            os::lower_after_swap(nice);
        }
        if let Some(n) = &self.notifier {
            n.send("READY=1");
        }
        self.upgrade = Some(Upgrading {
            binary,
            asked_by,
            asker,
            stage: UpgradeStage::Draining {
                to,
                stopped,
                nice,
                restores,
            },
            timer,
        });
        self.refuse_upgrade(&failure);
    }

    /// Every room's state, encoded into a sealed memfd: the memfd, a descriptor of this
    /// executable (for a hand-back), and the descriptors the state names.
    fn write_state(
        &mut self,
        binary: &std::path::Path,
        (asked_by, asker): (Option<(Token, ReqNo)>, Asker),
        (stopped, nice_before): (i64, Option<i32>),
    ) -> Result<(OwnedFd, Option<OwnedFd>, Vec<RawFd>), String> {
        let base = Instant::now();
        let mono = os::monotonic_ns();
        let clock = Clock { base };
        let mut blobs = BlobsOut::default();
        let core = self.core.carry(&clock, &mut blobs);
        let mut server = ServerImage {
            next_token: self.next_token,
            listeners: self.listeners.carry(),
            conns: self.clients.carry(&mut blobs, &clock),
            pipes: Vec::new(),
            inputs: Vec::new(),
            hot: Vec::new(),
            abandoned: Vec::new(),
            contain: self.children.contain.carry(),
            audit_fd: self.sinks.audit_fd(),
            nofile: 0,
            nofile_raised_from: None,
            memory_peak: self.memory_peak,
        };
        self.children.carry(&mut server);
        let cfg = &self.core.cfg;
        let old_binary = cfg
            .binary
            .clone()
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_default();
        let state = State {
            version: state::VERSION,
            from: env!("CARGO_PKG_VERSION").to_string(),
            clock: mono,
            upgrade: UpgradeImage {
                old_binary: Bytes::of_os(old_binary.as_os_str()),
                new_binary: Bytes::of_os(binary.as_os_str()),
                args: cfg.args.iter().map(|a| Bytes::of_os(a)).collect(),
                upgrades: self.core.upgrades,
                asked_by: asked_by.map(|(t, r)| (t.0, r.0)),
                stopped,
                asker: Some(asker.carry()),
                nice_before,
            },
            core,
            server,
        };
        let old_exe = os::own_executable().ok();
        let head =
            state::encode(&state, old_exe.as_ref().map(AsRawFd::as_raw_fd)).map_err(|e| e.0)?;
        let memfd = os::memfd_with(&[&head, blobs.bytes()]).map_err(|e| e.to_string())?;
        let fds = state.descriptors().into_iter().map(|(fd, _)| fd).collect();
        Ok((memfd, old_exe, fds))
    }

    /// The image that serves after an upgrade (or a hand-back): tells what happened once
    /// its loop runs.
    pub(super) fn after_resume(&mut self) {
        let Some(r) = self.resumed.take() else {
            return;
        };
        let pause_ms = (os::monotonic_ns() - r.stopped).max(0) as f64 / 1e6;
        let to = env!("CARGO_PKG_VERSION");
        match &r.refused {
            None => {
                self.core.log.line(format_args!(
                    "upgraded in place from execd {} to {to} (upgrade {}): {} command(s), {} \
                     connection(s) carried in {} KiB of state, paused {pause_ms:.1} ms",
                    r.from,
                    self.core.upgrades,
                    r.commands,
                    r.connections,
                    r.state_bytes.div_ceil(1024)
                ));
                let fields = json!({ "from": r.from, "to": to, "commands": r.commands,
                            "connections": r.connections, "pause_ms": pause_ms });
                match r.asker {
                    Some(asker) => asker.record(&mut self.core, "upgrade", fields),
                    None => self.core.record("upgrade", None, fields),
                }
                if let Some((token, req)) = r.asked_by {
                    let answer = json!({ "from": r.from, "to": to,
                        "upgrades": self.core.upgrades, "pause_ms": pause_ms });
                    self.answer(token, Some(req), Ok(answer));
                }
            }
            Some(why) => {
                // Said here, by the old image's log (which never blocks), not by the new
                // image on its stderr before the hand-back.
                let why = format!(
                    "the new image refused the state: {why}; it was handed back to the old \
                     image"
                );
                let asker = r.asker.unwrap_or(Asker::Signal(None));
                self.upgrade_failed(r.asked_by, asker, &Refused::State(why));
            }
        }
        self.apply();
    }

    /// Resumes from the state of an upgrade in place (`--resume-from FD`). A state this
    /// image cannot take is handed back to the image that wrote it, which resumes; only
    /// when that is impossible too does this fail (and the daemon exits).
    pub fn resume(mut cfg: Config) -> io::Result<Server> {
        let Some(fd) = cfg.resume_from.take() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no state to resume from",
            ));
        };
        crate::sys::host::tune_allocator();
        let bytes = os::read_whole(fd)?;
        let refused = std::env::var_os(os::REFUSED_VAR).map(|v| v.to_string_lossy().into_owned());
        if refused.is_some() {
            // Read once, by this image alone: commands never see it. No other thread
            // runs yet.
            std::env::remove_var(os::REFUSED_VAR);
        }
        if refused.is_none() {
            let pause = std::env::var(os::TEST_PAUSE_VAR).ok();
            if let Some(ms) = pause.and_then(|v| v.parse::<u64>().ok()) {
                std::thread::sleep(Duration::from_millis(ms.min(10_000)));
            }
        }
        let why = match Server::rebuild(cfg.clone(), &bytes, refused.clone()) {
            Ok((mut server, carried, state_fds)) => {
                // The state is taken: the numbers it came under go, and signals that
                // arrived during the swap are delivered now.
                let mut originals = state_fds;
                originals.push(fd);
                originals.extend(state::hand_back_fd(&bytes));
                carried.commit(&originals);
                server.children.carried_in();
                crate::sys::host::unblock_signals(&HANDLED_SIGNALS);
                if let Some(r) = server.resumed.as_mut() {
                    r.state_bytes = bytes.len();
                    // The swap is over. Real time, which nothing spawned inherits, stays
                    // while this image catches up with what queued during the pause (the
                    // clients it serves would otherwise get a CPU first); a raised nice
                    // goes back before anything is spawned (a shell restarted as its
                    // exit is reaped next), so no command inherits it.
                    match r.nice {
                        Some(nice) if os::real_time() => {
                            let since = Instant::now();
                            server.swap_raised = Some(SwapRaised {
                                nice,
                                since,
                                until: since + CATCH_UP_TIME,
                                turns: 0,
                            });
                        }
                        Some(nice) => {
                            os::lower_after_swap(nice);
                        }
                        None => {}
                    }
                }
                server.reap_all();
                server.arm_after_resume();
                return Ok(server);
            }
            Err(why) => why,
        };
        if refused.is_some() {
            // The old image cannot take its own state back: nothing is left to try.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the state handed back cannot be taken either: {why}"),
            ));
        }
        Err(hand_back(fd, &bytes, &why))
    }

    /// Rebuilds every room from `bytes` on duplicates of the descriptors it names. The
    /// server, the duplicates not yet committed, and the numbers the state named; or why
    /// the state is refused (with the numbers it came under untouched).
    fn rebuild(
        cfg: Config,
        bytes: &[u8],
        refused: Option<String>,
    ) -> Result<(Server, Carried, Vec<RawFd>), String> {
        let (state, blobs) = state::decode(bytes).map_err(|e| e.0)?;
        if refused.is_none() && std::env::var_os(os::TEST_REFUSE_VAR).is_some_and(|v| v == "1") {
            return Err(format!("{}=1 is set", os::TEST_REFUSE_VAR));
        }
        let fds: Vec<(RawFd, FdKind)> = state
            .descriptors()
            .into_iter()
            .map(|(fd, role)| {
                let kind = match role {
                    FdRole::Socket => FdKind::Socket,
                    FdRole::Stream => FdKind::Stream,
                    FdRole::Other => FdKind::Any,
                };
                (fd, kind)
            })
            .collect();
        let mut carried = Carried::take_all(&fds)?;
        let now = Instant::now();
        // Where the writer's times land: its clock reading was this long ago.
        let since = Duration::from_nanos((os::monotonic_ns() - state.clock).max(0) as u64);
        let clock = Clock {
            base: now.checked_sub(since).unwrap_or(now),
        };
        let server = Server::rebuild_rooms(cfg, &state, &blobs, &clock, &mut carried, refused)?;
        Ok((server, carried, fds.into_iter().map(|(fd, _)| fd).collect()))
    }

    fn rebuild_rooms(
        mut cfg: Config,
        state: &State,
        blobs: &BlobsIn,
        clock: &Clock,
        carried: &mut Carried,
        refused: Option<String>,
    ) -> Result<Server, String> {
        let img = &state.server;
        let mut take = |fd: RawFd| carried.take(fd);
        let poll = Poll::new().map_err(failed("epoll"))?;
        let mut signals = Signals::new(&HANDLED_SIGNALS).map_err(failed("signals"))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)
            .map_err(failed("signals"))?;
        let exits = crate::sys::reap::ExitSignals::new().map_err(failed("SIGCHLD"))?;
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&exits.fd()),
                EXITS,
                Interest::READABLE,
            )
            .map_err(failed("SIGCHLD"))?;
        crate::sys::host::become_subreaper().map_err(failed("subreaper"))?;
        let mut children = Children::resume(&cfg, img, poll.registry(), &mut take)?;
        if let Some(fd) = children.contain.events_fd() {
            poll.registry()
                .register(&mut mio::unix::SourceFd(&fd), CGROUPS, Interest::READABLE)
                .map_err(failed("cgroup events"))?;
        }
        let listeners = Listeners::resume(&img.listeners, &poll, &mut take)?;
        if let Some(path) = listeners.bound_path() {
            cfg.socket = path; // systemd's socket keeps the path it was reported under
        }
        let bounds = Bounds {
            max_message: cfg.max_message,
            max_batch: cfg.max_batch,
            cap: cfg.client_buffer,
            hosts: crate::wire::http::Hosts(cfg.http_hosts.clone().into()),
        };
        let uid = crate::sys::ids::current_uid();
        let clients = Clients::resume(
            uid,
            &img.conns,
            (blobs, clock),
            bounds,
            poll.registry(),
            &mut take,
        )?;
        let audit = img.audit_fd.map(&mut take).transpose()?;
        let sinks = Sinks::resume(audit, LOG, AUDIT).map_err(failed("the audit file"))?;
        let notifier = systemd::Notifier::from_env(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var_os("WATCHDOG_USEC"),
            std::env::var_os("WATCHDOG_PID"),
        )
        .map_err(failed("NOTIFY_SOCKET"))?;
        let policy_path = cfg.policy.clone();
        let stamp = std::env::var_os("JOURNAL_STREAM").is_none();
        let mut core = Core::resume(
            cfg,
            &state.core,
            blobs,
            clock,
            (Instant::now(), SystemTime::now()),
            stamp,
        )
        .map_err(|e| e.0)?;
        // The policy file is read again, as SIGHUP reads it; one that no longer loads
        // leaves the policy that was in force (its text came with the state).
        core.policy = match (&policy_path, &state.core.policy) {
            (None, _) => crate::policy::Policy::default(),
            (Some(path), carried_text) => match crate::policy::Policy::load(path) {
                Ok(p) => p,
                Err(e) => {
                    let Some(text) = carried_text else {
                        return Err(format!("the policy does not load ({e}) and none came"));
                    };
                    core.log.line(format_args!(
                        "policy not reloaded after the upgrade, the old one stays: {e}"
                    ));
                    core.record("policy_reload", None, json!({ "ok": false, "error": e }));
                    crate::policy::Policy::parse(text)
                        .map_err(|e| format!("the carried policy: {e}"))?
                }
            },
        };
        core.containment = Containment {
            kind: children.contain.kind(),
            detail: children.contain.describe(),
            cookie: children.contain.instance(),
        };
        core.sandboxing = children.prepare_sandboxes(&core.cfg, &core.policy)?;
        core.daemon_uid = uid;
        core.nofile = children.nofile.limit;
        core.upgrades = state.upgrade.upgrades + u64::from(refused.is_none());
        let asked_by = state
            .upgrade
            .asked_by
            .map(|(t, r)| (Token(t), ReqNo(r)))
            .filter(|(t, _)| clients.contains(t));
        let resumed = Resumed {
            from: state.from.clone(),
            asked_by,
            asker: state.upgrade.asker.as_ref().map(Asker::resume),
            stopped: state.upgrade.stopped,
            nice: state.upgrade.nice_before,
            refused,
            commands: state.core.procs.len(),
            connections: state.server.conns.len(),
            state_bytes: 0,
        };
        let mut server = Server {
            core,
            poll,
            listeners,
            signals,
            exits,
            clients,
            children,
            timers: crate::core::timers::Timers::default(),
            next_token: img.next_token.max(FIRST_DYNAMIC),
            scratch: vec![0; super::CONN_READ],
            shutdown: None,
            accept_paused: false,
            tcp_sweep_armed: false,
            input_check_armed: false,
            memory_peak: img.memory_peak,
            quiet_since: Instant::now(),
            active: false,
            given_back: false,
            turn: 0,
            notifier,
            status_pending: false,
            sinks,
            upgrade: None,
            resumed: Some(resumed),
            swap_raised: None,
            final_sweep_until: None,
            frames_due: Vec::new(),
            ws_frames_armed: false,
            ws_ping_armed: false,
        };
        // Input that waited for a command's stdin, and lines that waited for a shell's
        // command channel, go on being written.
        let waiting = |s: &Option<crate::core::table::Stdin>| {
            s.as_ref().is_some_and(|s| s.open && !s.buf.is_empty())
        };
        let mut flush = Vec::new();
        for p in server.core.table.procs.values() {
            if waiting(&p.stdin) {
                flush.push(crate::core::Effect::FlushStdin(p.key));
            }
            if waiting(&p.commands) {
                flush.push(crate::core::Effect::FlushCommands(p.key));
            }
        }
        server.core.out.extend(flush);
        Ok(server)
    }

    /// At the end of a turn: once this image has caught up with what queued during the
    /// swap (`caught_up`: the turn took in every event there was, accepted no connection
    /// and left nothing over), or at the latest `CATCH_UP_TIME` after it rebuilt, the
    /// swap's real time goes. (A new upgrade begun meanwhile takes it over instead.)
    pub(super) fn settle_after_swap(&mut self, caught_up: bool) {
        let Some(r) = self.swap_raised.as_mut() else {
            return;
        };
        r.turns += 1;
        let now = Instant::now();
        if !caught_up && now < r.until {
            return;
        }
        let (nice, turns, ms) = (r.nice, r.turns, (now - r.since).as_secs_f64() * 1e3);
        self.swap_raised = None;
        if !os::lower_after_swap(nice) {
            self.core.log.warn(format_args!(
                "upgrade: the kernel refused to put the normal scheduling policy back; \
                 the daemon stays in real time"
            ));
            return;
        }
        self.core.log.line(format_args!(
            "upgrade: real time given back after {turns} turn(s) and {ms:.1} ms ({})",
            if caught_up {
                "caught up"
            } else {
                "at its bound"
            }
        ));
    }

    /// After a resume: the loop's own timers that the carried state calls for.
    fn arm_after_resume(&mut self) {
        // A connection whose requests waited (for room, a spawn, a cookie read that the
        // upgrade did not carry) is looked at again.
        let tokens = self.clients.tokens();
        self.clients.dirty.extend(tokens);
        if self.clients.values().any(super::conn::Conn::is_tcp) {
            self.tcp_sweep_armed = true;
            self.timers.add(
                self.core.now + self.tcp_sweep_every(),
                LoopTimer::TcpIdleSweep,
            );
        }
    }
}

/// Hands the state at `fd` (`bytes`) back to the image that wrote it, with
/// `EXECD_UPGRADE_REFUSED` saying `why`, and `--resume-from FD` its only flag: it takes
/// its own flags from the state it wrote (`handed_back_flags`), whatever this image was
/// given. Returns only when that cannot be done, with the error.
fn hand_back(fd: RawFd, bytes: &[u8], why: &str) -> io::Error {
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let args: [OsString; 2] = ["--resume-from".into(), fd.to_string().into()];
    let e = match state::hand_back_fd(bytes) {
        Some(exe) => os::exec(Image::Fd(exe), &arg0, &args, Some((os::REFUSED_VAR, why))),
        None => io::Error::new(
            io::ErrorKind::NotFound,
            "no descriptor of the old executable",
        ),
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the new image refused the state ({why}) and could not hand it back: {e}"),
    )
}

/// A new image whose flags do not parse (a flag this release no longer has) cannot take
/// the state at `fd`: it is handed back. Returns only when that cannot be done, with the
/// error.
pub fn refuse_unparsed(fd: RawFd, why: &str) -> io::Error {
    if std::env::var_os(os::REFUSED_VAR).is_some() {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the state handed back cannot be taken either: {why}"),
        );
    }
    match os::read_whole(fd) {
        Ok(bytes) => hand_back(fd, &bytes, &format!("the flags do not parse: {why}")),
        Err(e) => e,
    }
}

/// The flags of the image that is handed its own state back (`EXECD_UPGRADE_REFUSED`
/// set, state at `fd`): those it was started with, as the state it wrote says. `None`
/// when this is not a hand-back, or the state does not read.
pub fn handed_back_flags(fd: RawFd) -> Option<Vec<OsString>> {
    std::env::var_os(os::REFUSED_VAR)?;
    let bytes = os::read_whole(fd).ok()?;
    let (state, _) = state::decode(&bytes).ok()?;
    let mut flags: Vec<OsString> = state.upgrade.args.iter().map(Bytes::to_os).collect();
    flags.push("--resume-from".into());
    flags.push(fd.to_string().into());
    Some(flags)
}

/// An error of step `what` of a resume, as the reason it is refused.
fn failed(what: &'static str) -> impl Fn(io::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// A pre-flight's output as a reason: one line, bounded.
fn cut(text: &str) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::core::view::cut_middle(&one, 300)
}
