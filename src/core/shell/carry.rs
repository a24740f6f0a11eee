//! The shell sessions' part of an upgrade in place (PROTOCOL 13): every session with its
//! shell, phase, marker scanner, nonce and console records, and the counters that make
//! names, command numbers and nonces go on, into `wire::state::ShellsImage` and back.
//! The timers a session and its records hold are re-armed by `core::carry`, which
//! carries every timer of the core; here they come back empty.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use super::markers::Scanner;
use super::{
    Ending, LineOpts, Phase, Record, RecordStep, ShellExec, ShellSession, ShellThen, Shells,
};
use crate::core::carry::{peer_image, peer_of};
use crate::core::launch::Origin;
use crate::core::table::{Key, ParkId};
use crate::wire::state::{
    wall_ns, wall_of, BlobsIn, BlobsOut, Bytes, Clock, EndingImage, LineOptsImage, PhaseImage,
    RecordImage, RecordStepImage, ShellExecImage, ShellSessionImage, ShellThenImage, ShellsImage,
    StateError,
};

/// How the gate lets a line through, as records keep it.
const DECISIONS: [&str; 3] = ["allow", "approve", "approve_for_session"];

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Where a request came from, as the state carries it.
pub fn origin_image(o: &Option<Origin>) -> Option<(bool, Vec<u32>)> {
    o.as_ref().map(|o| (o.over_tcp, o.groups.clone()))
}

/// The origin `origin_image` described.
pub fn origin_of(o: &Option<(bool, Vec<u32>)>) -> Option<Origin> {
    o.as_ref().map(|(over_tcp, groups)| Origin {
        over_tcp: *over_tcp,
        groups: groups.clone(),
    })
}

fn opts_image(o: &LineOpts) -> LineOptsImage {
    LineOptsImage {
        exec_dir: o.exec_dir.clone(),
        enter: o.enter,
        strict: o.strict,
        keep_symlinks: o.keep_symlinks,
        hard_timeout_ns: o.hard_timeout.map(ns),
    }
}

fn opts_of(o: &LineOptsImage) -> LineOpts {
    LineOpts {
        exec_dir: o.exec_dir.clone(),
        enter: o.enter,
        strict: o.strict,
        keep_symlinks: o.keep_symlinks,
        hard_timeout: o.hard_timeout_ns.map(Duration::from_nanos),
    }
}

/// A shell session's `exec` on its way through the gate, as the state carries it.
pub fn exec_image(e: &ShellExec) -> ShellExecImage {
    ShellExecImage {
        session_id: e.session_id.clone(),
        creates: e.creates,
        unnamed: e.unnamed,
        dir: Bytes::of_os(e.dir.as_os_str()),
        async_mode: e.async_mode,
        timeout_ns: e.timeout.map(ns),
        no_change_timeout_ns: e.no_change_timeout.map(ns),
        truncate: e.truncate,
        opts: opts_image(&e.opts),
    }
}

/// The `exec` `exec_image` described.
pub fn exec_of(e: &ShellExecImage) -> ShellExec {
    ShellExec {
        session_id: e.session_id.clone(),
        creates: e.creates,
        unnamed: e.unnamed,
        dir: PathBuf::from(e.dir.to_os()),
        async_mode: e.async_mode,
        timeout: e.timeout_ns.map(Duration::from_nanos),
        no_change_timeout: e.no_change_timeout_ns.map(Duration::from_nanos),
        truncate: e.truncate,
        opts: opts_of(&e.opts),
    }
}

/// What follows a shell's start, as the state carries it.
pub fn then_image(t: &ShellThen) -> ShellThenImage {
    match t {
        ShellThen::Create => ShellThenImage::Create,
        ShellThen::Exec(e, seq) => ShellThenImage::Exec {
            exec: exec_image(e),
            seq: *seq,
        },
        ShellThen::Restart { fallback } => ShellThenImage::Restart {
            fallback: *fallback,
        },
    }
}

/// The tail `then_image` described.
pub fn then_of(t: &ShellThenImage) -> ShellThen {
    match t {
        ShellThenImage::Create => ShellThen::Create,
        ShellThenImage::Exec { exec, seq } => ShellThen::Exec(Box::new(exec_of(exec)), *seq),
        ShellThenImage::Restart { fallback } => ShellThen::Restart {
            fallback: *fallback,
        },
    }
}

fn ending_image(e: Ending) -> EndingImage {
    match e {
        Ending::Completed => EndingImage::Completed,
        Ending::Terminated => EndingImage::Terminated,
        Ending::HardTimeout => EndingImage::HardTimeout,
    }
}

fn ending_of(e: EndingImage) -> Ending {
    match e {
        EndingImage::Completed => Ending::Completed,
        EndingImage::Terminated => Ending::Terminated,
        EndingImage::HardTimeout => Ending::HardTimeout,
    }
}

fn record_image(r: &Record, clock: &Clock, blobs: &mut BlobsOut) -> RecordImage {
    RecordImage {
        seq: r.seq,
        id: r.id.clone(),
        peer: peer_image(r.peer),
        decision: r.admitted.0.to_string(),
        rule: r.admitted.1.clone(),
        ps1: r.ps1.clone(),
        command: r.command.clone(),
        opts: opts_image(&r.opts),
        shell: r.shell.map(|k| k.0),
        from: r.from,
        to: r.to,
        step: match r.step {
            RecordStep::Queued => RecordStepImage::Queued,
            RecordStep::Sent => RecordStepImage::Sent,
            RecordStep::Running => RecordStepImage::Running,
            RecordStep::Done(e) => RecordStepImage::Done(ending_image(e)),
        },
        exit_code: r.exit_code,
        kill: r.kill.map(ending_image),
        escalated: r.escalated,
        created: clock.rel(r.created),
        last_change: clock.rel(r.last_change),
        quiet_after_ns: r.quiet_after.map(ns),
        quiet: r.quiet,
        waiting_for_input: r.waiting_for_input,
        no_dir: r.no_dir,
        note: r.note.clone(),
        notice: r.notice.clone(),
        input: blobs.put(&r.input),
        bytes: r.bytes,
        via: r.via.as_str().to_string(),
    }
}

fn record_of(r: &RecordImage, clock: &Clock, blobs: &BlobsIn) -> Result<Record, StateError> {
    let decision = DECISIONS
        .into_iter()
        .find(|d| *d == r.decision)
        .ok_or_else(|| StateError::new(format!("decision {:?}", r.decision)))?;
    Ok(Record {
        seq: r.seq,
        id: r.id.clone(),
        peer: peer_of(r.peer),
        admitted: (decision, r.rule.clone()),
        ps1: r.ps1.clone(),
        command: r.command.clone(),
        opts: opts_of(&r.opts),
        shell: r.shell.map(Key),
        from: r.from,
        to: r.to,
        step: match r.step {
            RecordStepImage::Queued => RecordStep::Queued,
            RecordStepImage::Sent => RecordStep::Sent,
            RecordStepImage::Running => RecordStep::Running,
            RecordStepImage::Done(e) => RecordStep::Done(ending_of(e)),
        },
        exit_code: r.exit_code,
        kill: r.kill.map(ending_of),
        escalated: r.escalated,
        // A second look for a SIGINT is not carried (its timer is not): the grace's end
        // still ends the shell if the command goes on.
        sigint_to: None,
        sigint_looks: 0,
        created: clock.at(r.created),
        last_change: clock.at(r.last_change),
        quiet_after: r.quiet_after_ns.map(Duration::from_nanos),
        quiet: r.quiet,
        waiting_for_input: r.waiting_for_input,
        no_dir: r.no_dir,
        note: r.note.clone(),
        notice: r.notice.clone(),
        input: blobs.get(r.input)?.to_vec(),
        timers: Vec::new(),
        bytes: r.bytes,
        via: crate::core::vocab::Via::named(&r.via),
    })
}

impl Shells {
    /// What an upgrade in place carries of every shell session.
    pub fn carry(&self, clock: &Clock, blobs: &mut BlobsOut) -> ShellsImage {
        let mut sessions: Vec<ShellSessionImage> = self
            .map
            .values()
            .map(|s| {
                let (partial, at) = s.scan.carry();
                ShellSessionImage {
                    id: s.id.clone(),
                    owner: s.owner,
                    workdir: Bytes::of_os(s.workdir.as_os_str()),
                    created_wall: wall_ns(s.created_wall),
                    created: clock.rel(s.created),
                    last_used: clock.rel(s.last_used),
                    last_used_wall: wall_ns(s.last_used_wall),
                    no_change_timeout_ns: ns(s.no_change_timeout),
                    keep_symlinks: s.keep_symlinks,
                    shell: s.shell.map(|k| k.0),
                    phase: match &s.phase {
                        Phase::Spawning => PhaseImage::Spawning,
                        Phase::Starting => PhaseImage::Starting,
                        Phase::Prompt => PhaseImage::Prompt,
                        Phase::Busy => PhaseImage::Busy,
                        Phase::Failed(why) => PhaseImage::Failed(why.clone()),
                    },
                    nonce: s.nonce.clone(),
                    scan_partial: Bytes(partial.to_vec()),
                    scan_at: at,
                    prompt_from: s.prompt_from,
                    ps1: s.ps1.clone(),
                    records: s
                        .records
                        .iter()
                        .map(|r| record_image(r, clock, blobs))
                        .collect(),
                    restarts: s.restarts,
                    notice: s.notice.clone(),
                    failed_starts: s.failed_starts,
                    rows: s.size.rows,
                    cols: s.size.cols,
                    peer: peer_image(s.peer),
                    origin: origin_image(&s.origin),
                    sandbox: s.sandbox.as_ref().map(|g| g.to_json()),
                    waiters: s.waiters.iter().map(|w| w.0).collect(),
                    old: s.old.iter().map(|k| k.0).collect(),
                    oneshot: s.oneshot,
                    reopened: s.reopened.clone(),
                    last_status: s.last_status,
                }
            })
            .collect();
        sessions.sort_by(|a, b| (a.owner, &a.id).cmp(&(b.owner, &b.id)));
        ShellsImage {
            sessions,
            next_id: self.next_id,
            next_seq: self.next_seq,
            nonces: self.nonces,
            secret: Bytes(self.secret.to_vec()),
        }
    }

    /// The sessions `carry` described, their timers not armed yet (`core::carry` does).
    pub fn resume(img: &ShellsImage, clock: &Clock, blobs: &BlobsIn) -> Result<Shells, StateError> {
        let secret: [u8; 32] = img
            .secret
            .0
            .as_slice()
            .try_into()
            .map_err(|_| StateError::new("a shell secret that is not 32 bytes"))?;
        let mut shells = Shells {
            next_id: img.next_id,
            next_seq: img.next_seq,
            nonces: img.nonces,
            secret,
            ..Shells::default()
        };
        for s in &img.sessions {
            let records = s
                .records
                .iter()
                .map(|r| record_of(r, clock, blobs))
                .collect::<Result<VecDeque<_>, _>>()?;
            let session = ShellSession {
                id: s.id.clone(),
                owner: s.owner,
                workdir: PathBuf::from(s.workdir.to_os()),
                // Read again at its next end marker; nothing is being read across a swap.
                dir_pending: false,
                last_status: s.last_status,
                created_wall: wall_of(s.created_wall),
                created: clock.at(s.created),
                last_used: clock.at(s.last_used),
                last_used_wall: wall_of(s.last_used_wall),
                no_change_timeout: Duration::from_nanos(s.no_change_timeout_ns),
                keep_symlinks: s.keep_symlinks,
                shell: s.shell.map(Key),
                phase: match &s.phase {
                    PhaseImage::Spawning => Phase::Spawning,
                    PhaseImage::Starting => Phase::Starting,
                    PhaseImage::Prompt => Phase::Prompt,
                    PhaseImage::Busy => Phase::Busy,
                    PhaseImage::Failed(why) => Phase::Failed(why.clone()),
                },
                nonce: s.nonce.clone(),
                scan: Scanner::resume(&s.scan_partial.0, s.scan_at),
                prompt_from: s.prompt_from,
                ps1: s.ps1.clone(),
                records,
                restarts: s.restarts,
                notice: s.notice.clone(),
                failed_starts: s.failed_starts,
                size: crate::types::WinSize {
                    rows: s.rows,
                    cols: s.cols,
                },
                peer: peer_of(s.peer),
                origin: origin_of(&s.origin),
                sandbox: s
                    .sandbox
                    .as_ref()
                    .and_then(crate::policy::sandbox::Given::from_json),
                idle_timer: None,
                waiters: s.waiters.iter().copied().map(ParkId).collect(),
                old: s.old.iter().copied().map(Key).collect(),
                oneshot: s.oneshot,
                reopened: s.reopened.clone(),
            };
            shells.map.insert((s.owner, s.id.clone()), session);
        }
        Ok(shells)
    }
}

#[cfg(test)]
mod tests {
    use super::super::markers::*;
    use super::super::*;
    use crate::core::testkit::{self, replies, C1};
    use crate::core::Wait;
    use crate::types::{Stdio3, WinSize};
    use crate::wire::rpc::ReqNo;
    use crate::wire::state::{BlobsIn, BlobsOut, Clock, CoreImage};

    const PEER: Peer = Peer {
        uid: 1000,
        gid: 1000,
        pid: 42,
    };

    /// The marker `body` (kind first) with session `key`'s nonce.
    fn mark(c: &Core, key: &SessionKey, body: &str) -> String {
        let (kind, rest) = body.split_at(1);
        format!("\x1b]6973;{kind};{}{rest}\x07", c.shells.map[key].nonce)
    }

    /// Carries `c` as an upgrade does (through the document and the blob area) onto a
    /// reader `swap` later; returns the new core, checked to carry the same again.
    fn through_upgrade(c: &Core, swap: Duration) -> Core {
        let writer = Clock { base: c.now };
        let mut blobs = BlobsOut::default();
        let img = c.carry(&writer, &mut blobs);
        let read: CoreImage = serde_json::from_slice(&serde_json::to_vec(&img).unwrap()).unwrap();
        assert_eq!(read, img);
        let area = blobs.bytes().to_vec();
        let now = c.now + swap;
        let back = Core::resume(
            c.cfg.clone(),
            &read,
            &BlobsIn(&area),
            &Clock { base: now - swap },
            (now, c.wall + swap),
            false,
        )
        .unwrap();
        assert_eq!(back.carry(&writer, &mut BlobsOut::default()), img);
        back
    }

    /// A session whose shell runs a command with a hard timeout, with half a marker
    /// read, input held for a later command, and a synchronous exec parked on it, goes on
    /// after an upgrade exactly as it would have: the rest of the marker ends the
    /// command, the parked request is answered, and the hard timeout keeps its instant.
    #[test]
    fn a_shell_session_carried_by_an_upgrade_goes_on_the_same() {
        let mut c = testkit::core();
        let key = c
            .open_shell(1000, ("s", false), "/".into(), PEER, (None, false))
            .expect("open");
        let mut req = testkit::request(
            crate::core::table::Family::Shell {
                session_id: "s".into(),
            },
            Stdio3::Shell(WinSize::DEFAULT),
        );
        req.ring_capacity = 1 << 16;
        req.prefix = "sh";
        let (k, id) = c.table.next_ids("sh");
        c.started(&req, k, id, 4242, 1000);
        c.tty_path(k, "/dev/pts/7".into());
        c.shell_started(&key, k, None);
        let (e, p) = (mark(&c, &key, "e;0;2f"), mark(&c, &key, "p"));
        c.output(k, 0, format!("{e}$ {p}").as_bytes());
        // The loop reads where the shell is; the line goes then.
        c.shell_dir(k, Some("/".into()));
        let opts = LineOpts {
            hard_timeout: Some(Duration::from_secs(10)),
            ..LineOpts::default()
        };
        let seq = c
            .shell_queue(
                &key,
                (
                    "shcmd_9".into(),
                    PEER,
                    ("approve", "rm".into()),
                    crate::core::vocab::Via::Ws,
                ),
                "sleep 1; echo done",
                opts,
            )
            .unwrap();
        let s = mark(&c, &key, &format!("s;{seq}"));
        c.output(k, 0, format!("{s}done\r\n").as_bytes());
        assert_eq!(
            c.shells.map[&key].record(seq).unwrap().step,
            RecordStep::Running
        );
        // Half of the end marker: the scanner holds it across the upgrade.
        let end = mark(&c, &key, "e;0;2f");
        let (first, rest) = end.split_at(7);
        c.output(k, 0, first.as_bytes());
        c.park(
            C1,
            ReqNo(3),
            Wait::Shell {
                session: key.clone(),
                seq,
                what: ShellWait::End,
            },
            None,
        );
        // A terminal client's window size, which the next shell would start with.
        let size = WinSize {
            rows: 50,
            cols: 132,
        };
        c.shell_resize(&key, size).expect("resize");
        std::mem::take(&mut c.out);
        let swap = Duration::from_millis(30);
        let mut back = through_upgrade(&c, swap);
        assert_eq!(back.shells.map[&key].nonce, c.shells.map[&key].nonce);
        assert_eq!(back.shells.map[&key].size, size);
        let tty = |core: &Core| core.table.get(k).and_then(|p| p.tty.as_ref()?.path.clone());
        assert_eq!(tty(&back), Some("/dev/pts/7".into()), "its terminal's path");
        let r = back.shells.map[&key].record(seq).unwrap();
        assert_eq!((r.id.as_str(), r.admitted.0), ("shcmd_9", "approve"));
        assert_eq!(r.timers.len(), 1, "its hard timeout, re-armed");
        // The rest of the marker ends the command in both; the parked request is
        // answered once, by the new core.
        for core in [&mut c, &mut back] {
            core.output(k, 0, format!("{rest}$ {p}").as_bytes());
            let r = core.shells.map[&key].record(seq).unwrap();
            assert_eq!(r.step, RecordStep::Done(Ending::Completed));
            assert_eq!(r.exit_code, Some(0));
            let answered = replies(core);
            assert_eq!(answered.len(), 1, "{answered:?}");
            assert_eq!((answered[0].0, answered[0].1), (C1, ReqNo(3)));
        }
        // A new session after the upgrade gets a name and a nonce never handed out.
        let before = c.shells.new_id(1000);
        assert_eq!(back.shells.new_id(1000), before);
        assert_eq!(back.shells.nonce(), c.shells.nonce());
    }

    #[test]
    fn a_scanner_carried_mid_marker_finds_the_marker() {
        let mut s = Scanner::default();
        assert!(s.feed("n1", 0, b"x\x1b]6973;p;").is_empty());
        let (partial, at) = s.carry();
        let mut back = Scanner::resume(partial, at);
        let found = back.feed("n1", 10, b"n1\x07");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, Marker::Prompt);
        assert_eq!(found[0].1, 1, "the marker's first byte, before the upgrade");
    }
}
