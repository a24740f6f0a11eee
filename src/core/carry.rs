//! The core's part of an upgrade in place (PROTOCOL 13): every command, session, parked
//! request, timer, approval and queue turned into `wire::state::CoreImage`, and back into
//! a core that goes on exactly where this one stopped. Pure: the clock comes in.
//!
//! Invariants:
//! - Nothing is renumbered: keys, public ids, parked request numbers, approval ids and
//!   the sequences that make them go on from where they were.
//! - What is carried is what cannot be worked out again; the table's indexes, counts and
//!   output memory are rebuilt from the commands (`Table::restore`).
//! - A timer keeps its instant (see `wire::state::Clock`); the indexes that name timers
//!   (a parked request's deadline, a hard timeout, a session's idle check, an approval's
//!   timeout) name the re-armed ones.
//! - Effects are never carried: the loop carries out every effect before it writes the
//!   state, so `out` is empty on both sides.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::gate::{Approver, Asked, PendingApproval};
use super::launch::{Admitted, LaunchRequest};
use super::log::{Kind, Log, Queue};
use super::park::Parked;
use super::screen::Screen;
use super::sessions::ClosedSessions;
use super::shell::{self, Shells};
use super::table::{
    BashSession, ConnId, Exit, Family, Key, KillReason, ParkId, Peer, Proc, Stdin, Stream, Sub,
    SubOpts, Table, Tty,
};
use super::vocab::{After, ShellWait, Wait};
use super::{Core, Timer};
use crate::config::Config;
use crate::types::{CgroupLimits, Ended, Program, Stdio3, TreeUsage, Usage, WinSize};
use crate::wire::rpc::ReqNo;
use crate::wire::state::{
    wall_ns, wall_of, AdmittedImage, AfterImage, ApprovalsImage, ApproverImage, BlobsIn, BlobsOut,
    Bytes, ClientImage, Clock, CoreImage, EndedImage, ExitImage, FamilyImage, LaunchImage,
    ParkedImage, PeerImage, PendingImage, ProcImage, ProgramImage, RingImage, ScreenImage,
    SessionImage, ShellWaitImage, StateError, StdinImage, StdioImage, StreamImage, SubImage,
    TimerImage, TimerKind, TreeImage, TtyImage, WaitImage,
};

use super::ring::Ring;

impl Core {
    /// The core as an upgrade in place carries it, times relative to `clock`.
    pub fn carry(&self, clock: &Clock, blobs: &mut BlobsOut) -> CoreImage {
        let (next_key, next_session, exited_terminals, memory_released) = self.table.sequences();
        let mut sessions: Vec<SessionImage> = self
            .table
            .sessions
            .values()
            .map(|s| SessionImage {
                id: s.id.clone(),
                owner: s.owner,
                workdir: Bytes::of_os(s.workdir.as_os_str()),
                created_wall: wall_ns(s.created_wall),
                last_used: clock.rel(s.last_used),
                last_used_wall: wall_ns(s.last_used_wall),
                commands: s.commands.iter().map(|k| k.0).collect(),
                command_count: s.command_count,
                oneshot: s.oneshot,
                reopened: s.reopened.clone(),
                left: s.left.iter().map(|(k, id)| (k.0, id.clone())).collect(),
            })
            .collect();
        sessions.sort_by(|a, b| (a.owner, &a.id).cmp(&(b.owner, &b.id)));
        let timers = self
            .timers
            .live()
            .into_iter()
            .filter_map(|(at, what)| {
                let what = match what {
                    Timer::Escalate(key, id) => TimerKind::Escalate {
                        key: key.0,
                        id: id.clone(),
                    },
                    Timer::Deadline(park) => TimerKind::Deadline { park: park.0 },
                    Timer::HardTimeout(key) => TimerKind::HardTimeout { key: key.0 },
                    Timer::SessionIdle((owner, session)) => TimerKind::SessionIdle {
                        owner: *owner,
                        session: session.clone(),
                    },
                    Timer::Approval(id) => TimerKind::Approval { id: id.clone() },
                    Timer::ShellHard((owner, session), seq) => TimerKind::ShellHard {
                        owner: *owner,
                        session: session.clone(),
                        seq: *seq,
                    },
                    Timer::ShellQuiet((owner, session), seq) => TimerKind::ShellQuiet {
                        owner: *owner,
                        session: session.clone(),
                        seq: *seq,
                    },
                    Timer::ShellKill((owner, session), seq) => TimerKind::ShellKill {
                        owner: *owner,
                        session: session.clone(),
                        seq: *seq,
                    },
                    Timer::ShellIdle((owner, session)) => TimerKind::ShellIdle {
                        owner: *owner,
                        session: session.clone(),
                    },
                    // A second look for a SIGINT a shell may have held: not carried (the
                    // grace's end still ends the shell if the command goes on).
                    Timer::ShellInterrupt(..) => return None,
                };
                Some(TimerImage {
                    at: clock.rel(at),
                    what,
                })
            })
            .collect();
        let mut parked: Vec<ParkedImage> = self
            .parked
            .iter()
            .map(|(id, p)| ParkedImage {
                id: id.0,
                conn: p.conn.0,
                req: p.req.0,
                wait: carry_wait(&p.wait, blobs),
            })
            .collect();
        parked.sort_by_key(|p| p.id);
        let mut clients: Vec<ClientImage> = self
            .clients
            .iter()
            .map(|(conn, peer)| ClientImage {
                conn: conn.0,
                peer: peer_image(*peer),
                groups: self.groups.get(conn).cloned().unwrap_or_default(),
            })
            .collect();
        clients.sort_by_key(|c| c.conn);
        CoreImage {
            procs: self
                .table
                .procs
                .values()
                .map(|p| carry_proc(p, clock, blobs))
                .collect(),
            sessions,
            next_key,
            next_session,
            next_park: self.next_park,
            exited_terminals,
            memory_released,
            timers,
            parked,
            forget: self.forget.iter().map(|k| k.0).collect(),
            clients,
            started: clock.rel(self.started),
            log: self.log.carry(clock, blobs),
            audit: self.audit.as_ref().map(|q| q.carry(blobs)),
            policy: self.policy.source().map(str::to_string),
            approvals: self.approvals.carry(),
            shells: self.shells.carry(clock, blobs),
            // As images before shells at their prompt were left out read it: any running
            // command with its stdin open (an older image taking this state would
            // otherwise not look at a session's next line). This one recomputes it.
            input_watch: self.input_watch
                || self
                    .table
                    .procs
                    .values()
                    .any(|p| p.running() && p.stdin.as_ref().is_some_and(|s| s.open)),
            closed: self.closed.carry(),
        }
    }

    /// The core `carry` described, with the configuration the daemon was started with
    /// (the same flags), on the reader's clock. `now` and `wall` are this turn's;
    /// `stamp` is whether log lines carry their time. The policy is the server's to
    /// load (it re-reads the file, PROTOCOL 13): this core starts with none.
    pub fn resume(
        cfg: Config,
        img: &CoreImage,
        blobs: &BlobsIn,
        clock: &Clock,
        (now, wall): (Instant, SystemTime),
        stamp: bool,
    ) -> Result<Core, StateError> {
        let mut log = Log::resume(&img.log, blobs, clock, stamp)?;
        log.wall = wall;
        let mut core = Core::new(cfg, now, wall, log);
        if let (Some(q), true) = (&img.audit, core.audit.is_some()) {
            core.audit = Some(Queue::resume(q, blobs, Kind::Audit)?);
        }
        let procs = img
            .procs
            .iter()
            .map(|p| resume_proc(p, blobs, clock))
            .collect::<Result<Vec<_>, _>>()?;
        let sessions = img
            .sessions
            .iter()
            .map(|s| BashSession {
                id: s.id.clone(),
                owner: s.owner,
                workdir: PathBuf::from(s.workdir.to_os()),
                created_wall: wall_of(s.created_wall),
                last_used: clock.at(s.last_used),
                last_used_wall: wall_of(s.last_used_wall),
                commands: s.commands.iter().copied().map(Key).collect(),
                command_count: s.command_count,
                oneshot: s.oneshot,
                reopened: s.reopened.clone(),
                left: s.left.iter().map(|(k, id)| (Key(*k), id.clone())).collect(),
            })
            .collect();
        core.table = Table::restore(
            procs,
            sessions,
            (
                img.next_key,
                img.next_session,
                img.exited_terminals.clone(),
                img.memory_released,
            ),
        );
        core.shells = Shells::resume(&img.shells, clock, blobs)?;
        core.next_park = img.next_park;
        core.started = clock.at(img.started);
        core.forget = img.forget.iter().copied().map(Key).collect();
        core.input_watch = img.input_watch;
        core.closed = ClosedSessions::resume(&img.closed)?;
        for c in &img.clients {
            core.clients.insert(ConnId(c.conn), peer_of(c.peer));
            if !c.groups.is_empty() {
                core.groups.insert(ConnId(c.conn), c.groups.clone());
            }
        }
        // Timers first: the indexes that name them take the re-armed ones.
        let mut deadlines = HashMap::new();
        let mut approval_timers = HashMap::new();
        for t in &img.timers {
            let at = clock.at(t.at);
            match &t.what {
                TimerKind::Escalate { key, id } => {
                    core.timers.add(at, Timer::Escalate(Key(*key), id.clone()));
                }
                TimerKind::Deadline { park } => {
                    let id = core.timers.add(at, Timer::Deadline(ParkId(*park)));
                    deadlines.insert(*park, id);
                }
                TimerKind::HardTimeout { key } => {
                    let id = core.timers.add(at, Timer::HardTimeout(Key(*key)));
                    core.hard_timers.insert(Key(*key), id);
                }
                TimerKind::SessionIdle { owner, session } => {
                    let sk = (*owner, session.clone());
                    let id = core.timers.add(at, Timer::SessionIdle(sk.clone()));
                    core.idle_timers.insert(sk, id);
                }
                TimerKind::Approval { id } => {
                    let t = core.timers.add(at, Timer::Approval(id.clone()));
                    approval_timers.insert(id.clone(), t);
                }
                TimerKind::ShellHard {
                    owner,
                    session,
                    seq,
                }
                | TimerKind::ShellQuiet {
                    owner,
                    session,
                    seq,
                }
                | TimerKind::ShellKill {
                    owner,
                    session,
                    seq,
                } => {
                    let sk = (*owner, session.clone());
                    let timer = match &t.what {
                        TimerKind::ShellHard { .. } => Timer::ShellHard(sk.clone(), *seq),
                        TimerKind::ShellQuiet { .. } => Timer::ShellQuiet(sk.clone(), *seq),
                        _ => Timer::ShellKill(sk.clone(), *seq),
                    };
                    let id = core.timers.add(at, timer);
                    // A record keeps its timers, to cancel them when it ends.
                    let record = core
                        .shells
                        .map
                        .get_mut(&sk)
                        .and_then(|s| s.records.iter_mut().find(|r| r.seq == *seq));
                    if let Some(r) = record {
                        r.timers.push(id);
                    }
                }
                TimerKind::ShellIdle { owner, session } => {
                    let sk = (*owner, session.clone());
                    let id = core.timers.add(at, Timer::ShellIdle(sk.clone()));
                    if let Some(s) = core.shells.map.get_mut(&sk) {
                        s.idle_timer = Some(id);
                    }
                }
            }
        }
        for p in &img.parked {
            core.parked.insert(
                ParkId(p.id),
                Parked {
                    conn: ConnId(p.conn),
                    req: ReqNo(p.req),
                    wait: resume_wait(&p.wait, blobs)?,
                    timer: deadlines.get(&p.id).copied(),
                },
            );
            core.parked_of
                .entry(ConnId(p.conn))
                .or_default()
                .insert(ParkId(p.id));
        }
        core.approvals.next = img.approvals.next;
        for a in &img.approvals.approvers {
            core.approvals.approvers.insert(
                ConnId(a.conn),
                Approver {
                    uid: a.uid,
                    gids: a.gids.clone(),
                    pid: a.pid,
                },
            );
        }
        core.approvals.deaf = img.approvals.deaf.iter().copied().map(ConnId).collect();
        core.approvals.notices = img.approvals.notices.iter().copied().map(ConnId).collect();
        for (owner, session, rules) in &img.approvals.grants {
            core.approvals.grants.insert(
                (*owner, session.clone()),
                rules.iter().cloned().collect::<HashSet<String>>(),
            );
        }
        for p in &img.approvals.pending {
            let timer = approval_timers
                .remove(&p.id)
                .ok_or_else(|| StateError::new(format!("approval {} has no timeout", p.id)))?;
            core.approvals.pending.insert(
                p.id.clone(),
                PendingApproval {
                    id: p.id.clone(),
                    conn: ConnId(p.conn),
                    req: p.req.map(ReqNo),
                    launch: Box::new(resume_launch(&p.launch)?),
                    asked: Asked {
                        rule: p.rule.clone(),
                        covers: p.covers.clone(),
                        description: p.description.clone(),
                        display: p.display.clone(),
                    },
                    sent_to: p.sent_to.iter().copied().map(ConnId).collect(),
                    timer,
                },
            );
        }
        Ok(core)
    }
}

impl super::gate::Approvals {
    fn carry(&self) -> ApprovalsImage {
        let mut approvers: Vec<ApproverImage> = self
            .approvers
            .iter()
            .map(|(conn, a)| ApproverImage {
                conn: conn.0,
                uid: a.uid,
                gids: a.gids.clone(),
                pid: a.pid,
            })
            .collect();
        approvers.sort_by_key(|a| a.conn);
        let mut deaf: Vec<usize> = self.deaf.iter().map(|c| c.0).collect();
        deaf.sort_unstable();
        let mut pending: Vec<PendingImage> = self
            .pending
            .values()
            .map(|p| PendingImage {
                id: p.id.clone(),
                conn: p.conn.0,
                req: p.req.map(|r| r.0),
                launch: carry_launch(&p.launch),
                rule: p.asked.rule.clone(),
                covers: p.asked.covers.clone(),
                description: p.asked.description.clone(),
                display: p.asked.display.clone(),
                sent_to: p.sent_to.iter().map(|c| c.0).collect(),
            })
            .collect();
        pending.sort_by(|a, b| a.id.cmp(&b.id));
        let mut grants: Vec<(u32, String, Vec<String>)> = self
            .grants
            .iter()
            .map(|((owner, session), rules)| {
                let mut rules: Vec<String> = rules.iter().cloned().collect();
                rules.sort();
                (*owner, session.clone(), rules)
            })
            .collect();
        grants.sort();
        let mut notices: Vec<usize> = self.notices.iter().map(|c| c.0).collect();
        notices.sort_unstable();
        ApprovalsImage {
            approvers,
            deaf,
            pending,
            grants,
            next: self.next,
            notices,
        }
    }
}

/// A peer as the state carries it.
pub(super) fn peer_image(p: Peer) -> PeerImage {
    PeerImage {
        uid: p.uid,
        gid: p.gid,
        pid: p.pid,
    }
}

/// The peer `peer_image` described.
pub(super) fn peer_of(p: PeerImage) -> Peer {
    Peer {
        uid: p.uid,
        gid: p.gid,
        pid: p.pid,
    }
}

fn family_image(f: &Family) -> FamilyImage {
    match f {
        Family::Terminal { session_id } => FamilyImage::Terminal {
            session_id: session_id.clone(),
        },
        Family::Bash { session_id } => FamilyImage::Bash {
            session_id: session_id.clone(),
        },
        Family::Shell { session_id } => FamilyImage::Shell {
            session_id: session_id.clone(),
        },
    }
}

fn family_of(f: &FamilyImage) -> Family {
    match f {
        FamilyImage::Terminal { session_id } => Family::Terminal {
            session_id: session_id.clone(),
        },
        FamilyImage::Bash { session_id } => Family::Bash {
            session_id: session_id.clone(),
        },
        FamilyImage::Shell { session_id } => Family::Shell {
            session_id: session_id.clone(),
        },
    }
}

/// A parked wait (or an answer waiting for room) as the state carries it.
pub fn carry_wait(w: &Wait, blobs: &mut BlobsOut) -> WaitImage {
    match w {
        Wait::Exit(k) => WaitImage::Exit { key: k.0 },
        Wait::Killed(k) => WaitImage::Killed { key: k.0 },
        Wait::BashExec { key, max_len } => WaitImage::BashExec {
            key: key.0,
            max_len: *max_len,
        },
        Wait::BashOutput { key, from, screen } => WaitImage::BashOutput {
            key: key.0,
            from: *from,
            screen: *screen,
        },
        Wait::BashKill(k) => WaitImage::BashKill { key: k.0 },
        Wait::Signalled(k) => WaitImage::Signalled { key: k.0 },
        Wait::StdinRoom { key, data, eof } => WaitImage::StdinRoom {
            key: key.0,
            data: blobs.put(data),
            eof: *eof,
        },
        Wait::Shell { session, seq, what } => WaitImage::Shell {
            owner: session.0,
            session: session.1.clone(),
            seq: *seq,
            what: match what {
                ShellWait::Exec { truncate } => ShellWaitImage::Exec {
                    truncate: *truncate,
                },
                ShellWait::End => ShellWaitImage::End,
                ShellWait::Kill => ShellWaitImage::Kill,
                ShellWait::View => ShellWaitImage::View,
            },
        },
    }
}

/// The wait `carry_wait` described.
pub fn resume_wait(w: &WaitImage, blobs: &BlobsIn) -> Result<Wait, StateError> {
    Ok(match w {
        WaitImage::Exit { key } => Wait::Exit(Key(*key)),
        WaitImage::Killed { key } => Wait::Killed(Key(*key)),
        WaitImage::BashExec { key, max_len } => Wait::BashExec {
            key: Key(*key),
            max_len: *max_len,
        },
        WaitImage::BashOutput { key, from, screen } => Wait::BashOutput {
            key: Key(*key),
            from: *from,
            screen: *screen,
        },
        WaitImage::BashKill { key } => Wait::BashKill(Key(*key)),
        WaitImage::Signalled { key } => Wait::Signalled(Key(*key)),
        WaitImage::StdinRoom { key, data, eof } => Wait::StdinRoom {
            key: Key(*key),
            data: blobs.get(*data)?.to_vec(),
            eof: *eof,
        },
        WaitImage::Shell {
            owner,
            session,
            seq,
            what,
        } => Wait::Shell {
            session: (*owner, session.clone()),
            seq: *seq,
            what: match what {
                ShellWaitImage::Exec { truncate } => ShellWait::Exec {
                    truncate: *truncate,
                },
                ShellWaitImage::End => ShellWait::End,
                ShellWaitImage::Kill => ShellWait::Kill,
                ShellWaitImage::View => ShellWait::View,
            },
        },
    })
}

/// Every reason the daemon ends a command for, as the state names them.
const KILL_REASONS: [KillReason; 6] = [
    KillReason::Request,
    KillReason::Release,
    KillReason::Timeout,
    KillReason::SessionClose,
    KillReason::Shutdown,
    KillReason::Disconnect,
];

fn carry_proc(p: &Proc, clock: &Clock, blobs: &mut BlobsOut) -> ProcImage {
    ProcImage {
        key: p.key.0,
        id: p.id.clone(),
        family: family_image(&p.family),
        owner: p.owner,
        peer: peer_image(p.peer),
        command: p.command.clone(),
        args: p.args.clone(),
        cwd: Bytes::of_os(p.cwd.as_os_str()),
        pid: p.pid,
        started: clock.rel(p.started),
        started_wall: wall_ns(p.started_wall),
        streams: p
            .streams
            .iter()
            .map(|s| StreamImage {
                ring: s.ring.carry(blobs),
                open: s.open,
                plain: s.plain,
            })
            .collect(),
        stdin: p.stdin.as_ref().map(|s| stdin_image(s, blobs)),
        commands: p.commands.as_ref().map(|s| stdin_image(s, blobs)),
        runs_as: p.runs_as,
        sandbox: p.sandbox.as_ref().map(|g| g.to_json()),
        exit: p.exit.map(|e| ExitImage {
            ended: match e.ended {
                Ended::Code(c) => EndedImage::Code(c),
                Ended::Signal(s) => EndedImage::Signal(s),
            },
            user_ns: e.usage.user.as_nanos() as u64,
            system_ns: e.usage.system.as_nanos() as u64,
            max_rss_kb: e.usage.max_rss_kb,
            tree: e.tree.map(|t| TreeImage {
                cpu_ms: t.cpu_ms,
                memory_peak_kb: t.memory_peak_kb,
                oom_killed: t.oom_killed,
            }),
            at: clock.rel(e.at),
        }),
        kill: p.kill.map(|k| k.as_str().to_string()),
        tied_to: p.tied_to.map(|c| c.0),
        signalled: p.signalled,
        released: p.released,
        tty: p.tty.as_ref().map(|t| TtyImage {
            rows: t.size.rows,
            cols: t.size.cols,
            screen: t.screen.as_ref().map(|s| {
                let (visible, alternate) = s.carry();
                ScreenImage {
                    visible: blobs.put(&visible),
                    alternate,
                }
            }),
            path: t.path.as_ref().map(|p| Bytes::of_os(p.as_os_str())),
        }),
        quiet_since: clock.rel(p.quiet_since),
        waiting_for_input: p.waiting_for_input,
        waiters: p.waiters.iter().map(|w| w.0).collect(),
        held: p.held,
        subs: p
            .subs
            .iter()
            .map(|s| SubImage {
                conn: s.conn.0,
                lossless: s.opts.lossless,
                base64: s.opts.base64,
                next: s.next,
                lagging: s.lagging,
                done: s.done,
            })
            .collect(),
        paused: p.paused,
        drained: p.drained,
        read_out: p.read_out,
        meta: p.meta,
        lingers: p.lingers,
        notice: p.notice.clone(),
    }
}

fn stdin_image(s: &Stdin, blobs: &mut BlobsOut) -> StdinImage {
    let (a, b) = s.buf.as_slices();
    StdinImage {
        buf: blobs.put2(a, b),
        capacity: s.capacity,
        eof_requested: s.eof_requested,
        open: s.open,
        undelivered: s.undelivered,
    }
}

fn stdin_of(s: &StdinImage, blobs: &BlobsIn) -> Result<Stdin, StateError> {
    Ok(Stdin {
        buf: blobs.get(s.buf)?.iter().copied().collect::<VecDeque<u8>>(),
        capacity: s.capacity,
        eof_requested: s.eof_requested,
        open: s.open,
        undelivered: s.undelivered,
    })
}

fn resume_ring(r: &RingImage, blobs: &BlobsIn) -> Result<Ring, StateError> {
    Ring::resume(r, blobs)
}

fn resume_proc(p: &ProcImage, blobs: &BlobsIn, clock: &Clock) -> Result<Proc, StateError> {
    let streams = p
        .streams
        .iter()
        .map(|s| {
            Ok(Stream {
                ring: resume_ring(&s.ring, blobs)?,
                open: s.open,
                plain: s.plain,
            })
        })
        .collect::<Result<Vec<_>, StateError>>()?;
    if streams.is_empty() || streams.len() > 2 {
        return Err(StateError::new(format!(
            "{} has {} output streams",
            p.id,
            streams.len()
        )));
    }
    let stdin = p.stdin.as_ref().map(|s| stdin_of(s, blobs)).transpose()?;
    let commands = p
        .commands
        .as_ref()
        .map(|s| stdin_of(s, blobs))
        .transpose()?;
    let kill = match &p.kill {
        None => None,
        Some(name) => Some(
            KILL_REASONS
                .into_iter()
                .find(|r| r.as_str() == name)
                .ok_or_else(|| StateError::new(format!("kill reason {name:?}")))?,
        ),
    };
    let tty = match &p.tty {
        None => None,
        Some(t) => {
            let size = WinSize {
                rows: t.rows,
                cols: t.cols,
            };
            let screen = match &t.screen {
                None => None,
                Some(s) => Some(Box::new(Screen::resume(
                    size,
                    blobs.get(s.visible)?,
                    s.alternate,
                    &streams[0].ring,
                ))),
            };
            let path = t.path.as_ref().map(|p| std::path::PathBuf::from(p.to_os()));
            Some(Tty { size, screen, path })
        }
    };
    Ok(Proc {
        key: Key(p.key),
        id: p.id.clone(),
        family: family_of(&p.family),
        owner: p.owner,
        peer: peer_of(p.peer),
        command: p.command.clone(),
        args: p.args.clone(),
        cwd: PathBuf::from(p.cwd.to_os()),
        pid: p.pid,
        started: clock.at(p.started),
        started_wall: wall_of(p.started_wall),
        streams,
        stdin,
        commands,
        runs_as: p.runs_as,
        sandbox: p
            .sandbox
            .as_ref()
            .and_then(crate::policy::sandbox::Given::from_json),
        exit: p.exit.as_ref().map(|e| Exit {
            ended: match e.ended {
                EndedImage::Code(c) => Ended::Code(c),
                EndedImage::Signal(s) => Ended::Signal(s),
            },
            usage: Usage {
                user: Duration::from_nanos(e.user_ns),
                system: Duration::from_nanos(e.system_ns),
                max_rss_kb: e.max_rss_kb,
            },
            tree: e.tree.map(|t| TreeUsage {
                cpu_ms: t.cpu_ms,
                memory_peak_kb: t.memory_peak_kb,
                oom_killed: t.oom_killed,
            }),
            at: clock.at(e.at),
        }),
        kill,
        tied_to: p.tied_to.map(ConnId),
        signalled: p.signalled,
        released: p.released,
        tty,
        quiet_since: clock.at(p.quiet_since),
        waiting_for_input: p.waiting_for_input,
        waiters: p.waiters.iter().copied().map(ParkId).collect(),
        held: p.held,
        subs: p
            .subs
            .iter()
            .map(|s| Sub {
                conn: ConnId(s.conn),
                opts: SubOpts {
                    lossless: s.lossless,
                    base64: s.base64,
                },
                next: s.next,
                lagging: s.lagging,
                done: s.done,
            })
            .collect(),
        paused: p.paused,
        drained: p.drained,
        read_out: p.read_out,
        meta: p.meta,
        lingers: p.lingers,
        notice: p.notice.clone(),
    })
}

/// One of `known`, as the `&'static str` the live types hold.
fn known(what: &str, name: &str, known: &[&'static str]) -> Result<&'static str, StateError> {
    known
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| StateError::new(format!("{what} {name:?}")))
}

/// Request fields that name a working directory.
const CWD_FIELDS: [&str; 2] = ["cwd", "exec_dir"];
/// Public id prefixes: terminals, bash commands, shell session lines, shells.
const PREFIXES: [&str; 4] = ["term", "cmd", "shcmd", "sh"];
/// How the gate lets a command through.
const DECISIONS: [&str; 3] = ["allow", "approve", "approve_for_session"];

fn carry_launch(l: &LaunchRequest) -> LaunchImage {
    LaunchImage {
        family: family_image(&l.family),
        peer: peer_image(l.peer),
        program: match &l.program {
            Program::Direct { program, args } => ProgramImage::Direct {
                program: program.clone(),
                args: args.clone(),
            },
            Program::Shell { shell, line } => ProgramImage::Shell {
                shell: Bytes::of_os(shell.as_os_str()),
                line: line.clone(),
            },
        },
        command: l.command.clone(),
        args: l.args.clone(),
        env: l.env.clone(),
        cwd: Bytes::of_os(l.cwd.as_os_str()),
        cwd_field: l.cwd_field.to_string(),
        stdio: match l.stdio {
            Stdio3::Merged => StdioImage::Merged,
            Stdio3::MergedWithStdin => StdioImage::MergedWithStdin,
            Stdio3::Separate => StdioImage::Separate,
            Stdio3::Pty(size) => StdioImage::Pty {
                rows: size.rows,
                cols: size.cols,
            },
            Stdio3::Shell(size) => StdioImage::Shell {
                rows: size.rows,
                cols: size.cols,
            },
        },
        ring_capacity: l.ring_capacity,
        prefix: l.prefix.to_string(),
        subscribe: l.subscribe.map(|(c, o)| (c.0, o.lossless, o.base64)),
        kill_on_disconnect: l.kill_on_disconnect.map(|c| c.0),
        memory_max: l.limits.memory_max,
        pids_max: l.limits.pids_max,
        cpu_max: l.limits.cpu_max,
        after: match &l.after {
            After::Terminal => AfterImage::Terminal,
            After::BashExec {
                async_mode,
                timeout,
                hard_timeout,
                max_len,
                created_session,
                exec_dir,
            } => AfterImage::BashExec {
                async_mode: *async_mode,
                timeout: *timeout,
                hard_timeout: *hard_timeout,
                max_len: *max_len,
                created_session: *created_session,
                exec_dir: exec_dir.as_ref().map(|d| Bytes::of_os(d.as_os_str())),
            },
            After::ShellLine(e) => AfterImage::ShellLine(shell::carry::exec_image(e)),
            After::ShellStart(then) => AfterImage::ShellStart(shell::carry::then_image(then)),
        },
        admitted: l.admitted.as_ref().map(|a| AdmittedImage {
            key: a.key.0,
            id: a.id.clone(),
            decision: a.decision.to_string(),
            rule: a.rule.clone(),
        }),
        origin: shell::carry::origin_image(&l.origin),
        sandbox: l.sandbox.as_ref().map(|g| g.to_json()),
        via: l.via.as_str().to_string(),
    }
}

fn resume_launch(l: &LaunchImage) -> Result<LaunchRequest, StateError> {
    Ok(LaunchRequest {
        family: family_of(&l.family),
        peer: peer_of(l.peer),
        program: match &l.program {
            ProgramImage::Direct { program, args } => Program::Direct {
                program: program.clone(),
                args: args.clone(),
            },
            ProgramImage::Shell { shell, line } => Program::Shell {
                shell: PathBuf::from(shell.to_os()),
                line: line.clone(),
            },
        },
        command: l.command.clone(),
        args: l.args.clone(),
        env: l.env.clone(),
        cwd: PathBuf::from(l.cwd.to_os()),
        cwd_field: known("request field", &l.cwd_field, &CWD_FIELDS)?,
        stdio: match l.stdio {
            StdioImage::Merged => Stdio3::Merged,
            StdioImage::MergedWithStdin => Stdio3::MergedWithStdin,
            StdioImage::Separate => Stdio3::Separate,
            StdioImage::Pty { rows, cols } => Stdio3::Pty(WinSize { rows, cols }),
            StdioImage::Shell { rows, cols } => Stdio3::Shell(WinSize { rows, cols }),
        },
        ring_capacity: l.ring_capacity,
        prefix: known("id prefix", &l.prefix, &PREFIXES)?,
        subscribe: l
            .subscribe
            .map(|(c, lossless, base64)| (ConnId(c), SubOpts { lossless, base64 })),
        kill_on_disconnect: l.kill_on_disconnect.map(ConnId),
        limits: CgroupLimits {
            memory_max: l.memory_max,
            pids_max: l.pids_max,
            cpu_max: l.cpu_max,
        },
        after: match &l.after {
            AfterImage::Terminal => After::Terminal,
            AfterImage::BashExec {
                async_mode,
                timeout,
                hard_timeout,
                max_len,
                created_session,
                exec_dir,
            } => After::BashExec {
                async_mode: *async_mode,
                timeout: *timeout,
                hard_timeout: *hard_timeout,
                max_len: *max_len,
                created_session: *created_session,
                exec_dir: exec_dir.as_ref().map(|d| PathBuf::from(d.to_os())),
            },
            AfterImage::ShellLine(e) => After::ShellLine(Box::new(shell::carry::exec_of(e))),
            AfterImage::ShellStart(t) => After::ShellStart(shell::carry::then_of(t)),
        },
        admitted: match &l.admitted {
            None => None,
            Some(a) => Some(Admitted {
                key: Key(a.key),
                id: a.id.clone(),
                decision: known("decision", &a.decision, &DECISIONS)?,
                rule: a.rule.clone(),
            }),
        },
        origin: shell::carry::origin_of(&l.origin),
        sandbox_asked: None,
        sandbox: l
            .sandbox
            .as_ref()
            .and_then(crate::policy::sandbox::Given::from_json),
        ceiling: None,
        via: super::vocab::Via::named(&l.via),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;
    use crate::core::Gated;
    use crate::policy::Policy;

    const APPROVER: ConnId = ConnId(9);

    /// Carries `c` as an upgrade does, through the encoded document and the blob area,
    /// onto a reader whose clock is `later` past the writer's (the time the swap took):
    /// the core that comes back, and the image it was carried as.
    fn through_upgrade(c: &Core, later: Duration) -> (Core, CoreImage) {
        let writer = Clock { base: c.now };
        let mut blobs = BlobsOut::default();
        let img = c.carry(&writer, &mut blobs);
        let json = serde_json::to_vec(&img).unwrap();
        let read: CoreImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, img, "the document reads back as written");
        let area = blobs.bytes().to_vec();
        // The reader's now is `later` on; its clock base is shifted back by the swap, so
        // every instant lands where it was.
        let now = c.now + later;
        let reader = Clock { base: now - later };
        let mut back = Core::resume(
            c.cfg.clone(),
            &read,
            &BlobsIn(&area),
            &reader,
            (now, c.wall + later),
            false,
        )
        .unwrap();
        back.policy = match &read.policy {
            Some(text) => Policy::parse(text).unwrap(),
            None => Policy::default(),
        };
        let mut again = BlobsOut::default();
        assert_eq!(
            back.carry(&writer, &mut again),
            img,
            "carried again, the same state"
        );
        assert_eq!(again.bytes(), blobs.bytes());
        (back, img)
    }

    /// A core holding some of everything a daemon holds: commands of both families and a
    /// PTY one with a screen, running, exited and being killed; output, stdin, a session,
    /// subscribers, parked requests with deadlines, a hard timeout, a pending approval and
    /// a grant, approvers and their peers, log lines and audit records not yet written.
    fn busy() -> Core {
        let mut c = core();
        c.cfg.audit = Some(crate::config::AuditTarget::File("/dev/null".into()));
        c.cfg.approval_timeout = Duration::from_secs(60);
        let mut c = Core::new(c.cfg, c.now, c.wall, Log::new(false));
        c.policy = Policy::parse(
            r#"{"rules": [{"name": "rm", "pattern": ["rm"], "decision": "ask"},
                          {"name": "git", "pattern": ["git"], "decision": "ask"}]}"#,
        )
        .unwrap();
        for (conn, uid) in [(C1, 1000), (C2, 1000), (APPROVER, 1000)] {
            let peer = Peer {
                uid,
                gid: uid,
                pid: conn.0 as i32 + 100,
            };
            c.connected(conn, peer, vec![4, 5]);
        }
        c.approvals.approvers.insert(
            APPROVER,
            Approver {
                uid: 1000,
                gids: vec![1000],
                pid: 109,
            },
        );
        c.approvals.set_notices(C2, true);
        let t = terminal(&mut c);
        c.output(t, 0, "héllo wörld\n".as_bytes());
        c.table.subscribe(
            t,
            C1,
            [3, 0],
            SubOpts {
                lossless: true,
                base64: false,
            },
        );
        c.park(C2, ReqNo(7), Wait::Exit(t), None);
        let done = terminal(&mut c);
        c.output(done, 0, b"bye");
        c.exited(done, Ended::Signal(9), Usage::default(), None);
        let b = bash(&mut c, "s1");
        c.output(b, 0, b"out");
        c.output(b, 1, b"err");
        c.write_stdin(b, b"typed".to_vec(), false, false).unwrap();
        c.arm_hard_timeout(b, Duration::from_secs(30));
        c.park(
            C1,
            ReqNo(8),
            Wait::BashOutput {
                key: b,
                from: [3, 3],
                screen: false,
            },
            Some(c.now + Duration::from_secs(5)),
        );
        let dying = terminal(&mut c);
        c.kill(dying, KillReason::Request);
        let mut req = request(
            Family::Bash {
                session_id: "s1".into(),
            },
            Stdio3::Pty(WinSize { rows: 4, cols: 10 }),
        );
        let (pty, id) = c.table.next_ids("cmd");
        req.prefix = "cmd";
        c.started(&req, pty, id, 4242, 1000);
        c.output(pty, 0, b"\x1b[2J\x1b[2;3Hmid\r\n> ");
        c.keep_screen(pty).unwrap();
        let mut ask = request(
            Family::Bash {
                session_id: "s1".into(),
            },
            Stdio3::Separate,
        );
        ask.program = Program::Shell {
            shell: "/bin/sh".into(),
            line: "rm -rf build".into(),
        };
        ask.command = "rm -rf build".into();
        ask.prefix = "cmd";
        ask.env = vec![("A".into(), "1".into())];
        assert!(matches!(
            c.gate(Box::new(ask), C1, Some(ReqNo(9))),
            Gated::Asked
        ));
        c.approvals
            .grants
            .insert((1000, "bash:s1".into()), ["git".to_string()].into());
        c.log
            .refusal("max-processes", c.now, format_args!("refused"));
        std::mem::take(&mut c.out);
        c
    }

    #[test]
    fn a_core_carried_by_an_upgrade_is_the_same_and_goes_on_the_same() {
        let c = busy();
        let swap = Duration::from_millis(40);
        let (mut back, img) = through_upgrade(&c, swap);
        assert_eq!(img.procs.len(), 5);
        assert_eq!(back.table.running(), c.table.running());
        assert_eq!(back.table.memory.total, c.table.memory.total);
        assert_eq!(back.table.memory.of(1000), c.table.memory.of(1000));
        // Ids go on from where they were.
        assert_eq!(back.table.next_ids("term"), {
            let mut c = busy();
            c.table.next_ids("term")
        });
        // Retained output from offset 0, the screen, stdin, the session.
        let t = back.table.find("term_1", 1000).unwrap();
        let p = back.table.get(t).unwrap();
        assert_eq!(
            p.streams[0].text(0, p.streams[0].ring.end()),
            "héllo wörld\n"
        );
        assert_eq!(p.subs[0].next, [3, 0]);
        assert!(p.subs[0].opts.lossless);
        let b = back.table.find("cmd_3", 1000).unwrap();
        let bp = back.table.get(b).unwrap();
        assert_eq!(bp.stdin.as_ref().unwrap().buf, b"typed".to_vec());
        let screen = back.table.find("cmd_5", 1000).unwrap();
        let v = back
            .table
            .get(screen)
            .unwrap()
            .tty
            .as_ref()
            .unwrap()
            .screen
            .as_ref()
            .unwrap()
            .view();
        assert_eq!(v["lines"][1], "  mid");
        assert_eq!(v["cursor"], json!({"row": 2, "col": 2}));
        assert!(back.table.sessions.contains_key(&(1000, "s1".to_string())));
        // Every timer keeps its instant, the swap included: the command being killed gets
        // its SIGKILL at the end of its grace (2 s after the kill), the parked output wait
        // its answer at its deadline (5 s after it was parked).
        let dying = back.table.find("term_4", 1000).unwrap();
        let kills = |c: &mut Core| {
            std::mem::take(&mut c.out)
                .iter()
                .filter(
                    |e| matches!(e, Effect::End { key, stage: Stage::Kill, .. } if *key == dying),
                )
                .count()
        };
        later(
            &mut back,
            Duration::from_secs(2) - swap - Duration::from_millis(1),
        );
        assert_eq!(kills(&mut back), 0, "not before the grace ends");
        later(&mut back, Duration::from_millis(1));
        assert_eq!(kills(&mut back), 1);
        later(&mut back, Duration::from_secs(3) - Duration::from_millis(1));
        assert!(replies(&mut back).is_empty(), "not before its deadline");
        later(&mut back, Duration::from_millis(1));
        let r = replies(&mut back);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1), (C1, ReqNo(8)));
        back.exited(t, Ended::Code(4), Usage::default(), None);
        let r = replies(&mut back);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1), (C2, ReqNo(7)));
        assert_eq!(r[0].2.as_ref().unwrap()["exitCode"], 4);
        // The pending approval is answered by the approver and starts its command.
        back.approval_answer(
            APPROVER,
            "appr_1",
            &Ok(json!({"request_id": "appr_1", "response": "approve"})),
        );
        let launched: Vec<_> = std::mem::take(&mut back.out)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Launch { conn, req, launch } => Some((conn, req, launch)),
                _ => None,
            })
            .collect();
        assert_eq!(launched.len(), 1);
        assert_eq!((launched[0].0, launched[0].1), (C1, Some(ReqNo(9))));
        assert_eq!(launched[0].2.command, "rm -rf build");
        assert_eq!(launched[0].2.admitted.as_ref().unwrap().id, "cmd_6");
        // Log lines and audit records still waiting are written after the swap.
        assert!(String::from_utf8_lossy(back.log.queue.pending()).contains("refused"));
        let audit = String::from_utf8_lossy(back.audit.as_ref().unwrap().pending()).to_string();
        assert!(audit.contains("\"event\":\"ask\""), "{audit}");
    }

    #[test]
    fn a_state_naming_what_this_build_does_not_know_is_refused() {
        let c = busy();
        let clock = Clock { base: c.now };
        let mut blobs = BlobsOut::default();
        let mut img = c.carry(&clock, &mut blobs);
        img.procs[0].kill = Some("boredom".into());
        let area = blobs.bytes().to_vec();
        let e = Core::resume(
            c.cfg.clone(),
            &img,
            &BlobsIn(&area),
            &clock,
            (c.now, c.wall),
            false,
        )
        .unwrap_err();
        assert!(e.0.contains("boredom"), "{e}");
        let mut img = c.carry(&clock, &mut blobs);
        img.procs[0].streams[0].ring.bytes = crate::wire::state::Blob(1 << 40, 1);
        assert!(Core::resume(
            c.cfg.clone(),
            &img,
            &BlobsIn(&area),
            &clock,
            (c.now, c.wall),
            false
        )
        .is_err());
    }
}
