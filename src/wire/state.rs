//! The state an upgrade in place carries from one image of the daemon to the next
//! (PROTOCOL 13): a versioned schema and its encoding, sans I/O. Every room turns its own
//! state into its part of this schema and back (`core::carry`, the sessions' `carry` in
//! `wire::rpc` and `wire::http`, `server::upgrade`, `sys::contain`); `sys::upgrade` puts
//! the encoded state in a memfd and `execve`s the new binary with `--resume-from FD`.
//!
//! # Encoding
//!
//! ```text
//! offset  size  what
//! 0       8     magic "EXECDST\n"
//! 8       4     schema version, little-endian u32 (VERSION)
//! 12      4     descriptor of the writer's executable, little-endian i32 (-1: none)
//! 16      8     length N of the JSON document, little-endian u64
//! 24      N     the JSON document: a `State`
//! 24 + N  ...   the blob area: raw bytes the document names by `Blob [at, len]`
//! ```
//!
//! The first 16 bytes keep this meaning in every version: a reader that takes no state of
//! this version still finds the executable to hand the state back to (`hand_back_fd`).
//!
//! The document is serde_json of the types below; bulky bytes (output rings, unread input,
//! unsent output, stdin buffers, queued log lines) live in the blob area and are named by
//! offset and length, so carrying a full ring costs a copy, not an encoding. Short byte
//! strings that need not be UTF-8 (paths, arguments) are base64 text (`Bytes`).
//!
//! # Rules every room follows
//!
//! - Times on the monotonic clock are signed nanoseconds relative to `State::clock`, the
//!   writer's reading taken as it wrote (`Rel`): a deadline is the time left, a start is
//!   how long ago. The reader places them on its own clock shifted back by the time the
//!   swap took (both images read the same CLOCK_MONOTONIC), so a timeout keeps its
//!   instant and a duration counts the pause. Wall times are nanoseconds since the epoch.
//! - Descriptors travel by number: the writer clears close-on-exec on exactly the numbers
//!   the document names, and the reader checks each one is open (and of the kind it
//!   expects) before it takes any, and marks them close-on-exec again.
//! - Ids, keys, tokens, request numbers and sequences are carried as they are: nothing is
//!   renumbered, so what a client holds (a `term_N`, a request id, a subscription) and what
//!   the rooms hold of each other (a connection's token is its `ConnId`) still match.
//! - What can be recomputed from what is carried is not carried (indexes, counts, the
//!   output memory total, interest registrations); what cannot is (queues, counters,
//!   partial reads).
//! - A reader refuses a document whose version it does not take, whose JSON does not
//!   match the schema exactly (unknown fields included), or whose blobs or names (a kill
//!   reason, a method family) it does not know: the old image then resumes (hand-back).
//!
//! # Outline (version 1)
//!
//! ```text
//! State { version, from, clock, upgrade, core, server }
//!   upgrade: old and new binary, the flags, count, who asked, when serving stopped
//!   core: commands (streams and rings, stdin, exit, kill, tty and screen, waiters,
//!         subscribers), bash sessions, shell sessions (their shell, phase, console
//!         records, marker scanner, nonces), parked requests, the core's timers,
//!         approvals (approvers, pending asks with their launch, for-session grants),
//!         connected peers, log and audit queues, policy text, id sequences, memory
//!         given back
//!   server: listeners, connections (fd, token, peer, codec, unsent output, answers
//!           waiting for room), pipes and PTY masters by command, input files,
//!           containment (holds, cgroup tree, inotify, cookie sweeps), the audit fd,
//!           the descriptor limit, the next token
//! ```

use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The first bytes of an encoded state.
pub const MAGIC: &[u8; 8] = b"EXECDST\n";
/// The schema this build writes.
pub const VERSION: u32 = 1;
/// The schemas this build reads (what `--upgrade-check` reports as `states`).
pub const ACCEPTED: &[u32] = &[1];
/// Bytes before the document.
const HEADER: usize = 24;

/// Why a state cannot be read.
#[derive(Debug, Clone, PartialEq)]
pub struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StateError {
    pub fn new(what: impl Into<String>) -> StateError {
        StateError(what.into())
    }
}

/// A range of the blob area: `[at, len]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob(pub u64, pub u64);

/// The blob area as it is written.
#[derive(Debug, Default)]
pub struct BlobsOut(Vec<u8>);

impl BlobsOut {
    /// Appends `bytes` and names them.
    pub fn put(&mut self, bytes: &[u8]) -> Blob {
        self.put2(bytes, &[])
    }

    /// Appends two slices as one blob (a ring's retained bytes, oldest first).
    pub fn put2(&mut self, a: &[u8], b: &[u8]) -> Blob {
        let at = self.0.len() as u64;
        self.0.extend_from_slice(a);
        self.0.extend_from_slice(b);
        Blob(at, (a.len() + b.len()) as u64)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The blob area as it is read.
#[derive(Debug, Clone, Copy)]
pub struct BlobsIn<'a>(pub &'a [u8]);

impl BlobsIn<'_> {
    /// The bytes `blob` names; an error when they lie outside the area.
    pub fn get(&self, blob: Blob) -> Result<&[u8], StateError> {
        let Blob(at, len) = blob;
        at.checked_add(len)
            .filter(|end| *end <= self.0.len() as u64)
            .map(|end| &self.0[at as usize..end as usize])
            .ok_or_else(|| {
                StateError::new(format!(
                    "blob [{at}, {len}] lies outside the {} bytes carried",
                    self.0.len()
                ))
            })
    }
}

/// Bytes that need not be UTF-8 (a path, an argument), as base64 text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = Vec::with_capacity(self.0.len() * 4 / 3 + 4);
        crate::wire::encode::base64_encode(&mut text, &self.0);
        s.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(d)?;
        crate::wire::encode::base64_decode(&text)
            .map(Bytes)
            .ok_or_else(|| serde::de::Error::custom("not base64"))
    }
}

impl Bytes {
    pub fn of_os(s: &std::ffi::OsStr) -> Bytes {
        use std::os::unix::ffi::OsStrExt;
        Bytes(s.as_bytes().to_vec())
    }

    pub fn to_os(&self) -> std::ffi::OsString {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(self.0.clone())
    }
}

/// A monotonic time relative to the clock the state was written by: nanoseconds after
/// (positive) or before (negative) it.
pub type Rel = i64;

/// Where the relative times of a state are placed: the writer's `now`, or for a reader,
/// its own `now` less the time since the writer read its clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub base: Instant,
}

impl Clock {
    /// `at` relative to the base (saturating at a few centuries either way).
    pub fn rel(&self, at: Instant) -> Rel {
        if at >= self.base {
            i64::try_from(at.duration_since(self.base).as_nanos()).unwrap_or(i64::MAX)
        } else {
            -i64::try_from(self.base.duration_since(at).as_nanos()).unwrap_or(i64::MAX)
        }
    }

    /// The instant `rel` names. One before the monotonic clock's origin (a state older
    /// than the boot, which cannot be) is the base itself.
    pub fn at(&self, rel: Rel) -> Instant {
        let d = Duration::from_nanos(rel.unsigned_abs());
        if rel >= 0 {
            self.base.checked_add(d).unwrap_or(self.base)
        } else {
            self.base.checked_sub(d).unwrap_or(self.base)
        }
    }
}

/// A wall time as nanoseconds since the epoch (negative before it).
pub fn wall_ns(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// The wall time `wall_ns` wrote.
pub fn wall_of(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        SystemTime::UNIX_EPOCH + d
    } else {
        SystemTime::UNIX_EPOCH - d
    }
}

// ---------------------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------------------

/// The whole state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// `VERSION` of the writer (the header says it too).
    pub version: u32,
    /// The writer's release (`CARGO_PKG_VERSION`): the upgrade's `from`.
    pub from: String,
    /// CLOCK_MONOTONIC as the writer read it, in nanoseconds: what `Rel` times are
    /// relative to, and where the reader's pause is measured from.
    pub clock: i64,
    pub upgrade: UpgradeImage,
    pub core: CoreImage,
    pub server: ServerImage,
}

/// The upgrade itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeImage {
    /// The binary of the image that wrote the state: what a hand-back executes.
    pub old_binary: Bytes,
    /// The binary executed with the state.
    pub new_binary: Bytes,
    /// The flags the daemon was started with (without `--resume-from`), passed unchanged.
    pub args: Vec<Bytes>,
    /// Upgrades completed before this one.
    pub upgrades: u64,
    /// The `daemon/upgrade` request to answer once the upgrade is done or refused:
    /// `[connection token, request number]`; none for SIGUSR2.
    pub asked_by: Option<(usize, u64)>,
    /// CLOCK_MONOTONIC, nanoseconds, when the writer stopped serving: the pause is from
    /// there to the first turn of the image that serves next.
    pub stopped: i64,
    /// Who asked, for the `upgrade` record (an older writer says nothing).
    #[serde(default)]
    pub asker: Option<AskerImage>,
    /// The nice value the writer had before it raised its priority for the swap: what
    /// the image that serves next puts back (none: not raised, or an older writer).
    #[serde(default)]
    pub nice_before: Option<i32>,
}

/// Who asked for an upgrade: a peer's `daemon/upgrade`, or a SIGUSR2 (the sender's pid
/// and uid, none when the kernel sent it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AskerImage {
    Peer(PeerImage),
    Signal(Option<(i32, u32)>),
}

// ---- core -------------------------------------------------------------------------------

/// The core (`core::carry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreImage {
    pub procs: Vec<ProcImage>,
    pub sessions: Vec<SessionImage>,
    /// The last command key handed out (`term_N`, `cmd_N`): ids are never reused.
    pub next_key: u64,
    /// The last generated session number (`session_N`).
    pub next_session: u64,
    /// The next parked request's number.
    pub next_park: u64,
    /// Exited, unreleased terminals per owner, oldest first (the first released past
    /// `--max-retained`).
    pub exited_terminals: Vec<(u32, Vec<u64>)>,
    /// Output bytes of exited commands given back to the budget so far.
    pub memory_released: u64,
    pub timers: Vec<TimerImage>,
    pub parked: Vec<ParkedImage>,
    /// Released commands to forget once nothing needs them.
    pub forget: Vec<u64>,
    /// Connected clients as the core knows them.
    pub clients: Vec<ClientImage>,
    /// When the daemon first started (kept across upgrades).
    pub started: Rel,
    pub log: LogImage,
    pub audit: Option<QueueImage>,
    /// The text of the policy in force (none: no `--policy`).
    pub policy: Option<String>,
    pub approvals: ApprovalsImage,
    pub shells: ShellsImage,
    pub input_watch: bool,
    /// Sessions the daemon closed by itself, per owner oldest first, for a call naming
    /// one again (PROTOCOL 8).
    #[serde(default)]
    pub closed: Vec<ClosedImage>,
}

/// A session the daemon closed by itself (`core::sessions::Closed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedImage {
    pub owner: u32,
    pub shell: bool,
    pub id: String,
    /// Wall time it was closed.
    pub at: i64,
    /// Closed for idleness after this long (else to make room).
    pub idle_ns: Option<u64>,
    /// Closed to make room at this `--max-sessions`.
    pub room: Option<usize>,
}

/// A timer of the core, with what it does when due.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerImage {
    pub at: Rel,
    pub what: TimerKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerKind {
    /// SIGKILL what is left of command `key` (public id `id`) after the grace.
    Escalate { key: u64, id: String },
    /// Parked request `park`'s deadline.
    Deadline { park: u64 },
    /// Bash command `key`'s `hard_timeout`.
    HardTimeout { key: u64 },
    /// Check session `session` of `owner` for idleness.
    SessionIdle { owner: u32, session: String },
    /// Approval `id` not answered in time.
    Approval { id: String },
    /// Shell session command `seq` reached its `hard_timeout`.
    ShellHard {
        owner: u32,
        session: String,
        seq: u64,
    },
    /// Shell session command `seq` may have had no output for its `no_change_timeout`.
    ShellQuiet {
        owner: u32,
        session: String,
        seq: u64,
    },
    /// Shell session command `seq` did not stop at SIGINT within the grace.
    ShellKill {
        owner: u32,
        session: String,
        seq: u64,
    },
    /// Check a shell session for idleness.
    ShellIdle { owner: u32, session: String },
}

/// A parked request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParkedImage {
    pub id: u64,
    pub conn: usize,
    pub req: u64,
    pub wait: WaitImage,
}

/// What a parked request (or an answer waiting for room) waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitImage {
    Exit {
        key: u64,
    },
    Killed {
        key: u64,
    },
    BashExec {
        key: u64,
        max_len: usize,
    },
    BashOutput {
        key: u64,
        from: [u64; 2],
        screen: bool,
    },
    BashKill {
        key: u64,
    },
    Signalled {
        key: u64,
    },
    StdinRoom {
        key: u64,
        data: Blob,
        eof: bool,
    },
    /// A request on command `seq` of a shell session.
    Shell {
        owner: u32,
        session: String,
        seq: u64,
        what: ShellWaitImage,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShellWaitImage {
    Exec { truncate: bool },
    End,
    Kill,
    View,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerImage {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientImage {
    pub conn: usize,
    pub peer: PeerImage,
    pub groups: Vec<u32>,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcImage {
    pub key: u64,
    pub id: String,
    pub family: FamilyImage,
    pub owner: u32,
    pub peer: PeerImage,
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Bytes,
    pub pid: i32,
    pub started: Rel,
    pub started_wall: i64,
    pub streams: Vec<StreamImage>,
    pub stdin: Option<StdinImage>,
    /// A shell session's command channel: the gated lines waiting for the shell.
    pub commands: Option<StdinImage>,
    /// The uid it runs as.
    pub runs_as: u32,
    /// The sandbox it runs in (`policy::sandbox::Given` as JSON).
    #[serde(default)]
    pub sandbox: Option<Value>,
    pub exit: Option<ExitImage>,
    /// Why the daemon ended it (`request`, `release`, `timeout`, `session close`,
    /// `shutdown`, `disconnect`).
    pub kill: Option<String>,
    pub tied_to: Option<usize>,
    pub signalled: bool,
    pub released: bool,
    pub tty: Option<TtyImage>,
    pub quiet_since: Rel,
    pub waiting_for_input: bool,
    pub waiters: Vec<u64>,
    pub held: u32,
    pub subs: Vec<SubImage>,
    pub paused: bool,
    pub drained: bool,
    pub read_out: [bool; 2],
    pub meta: usize,
    /// Its tree had members when its leader exited.
    #[serde(default)]
    pub lingers: bool,
    /// What its `bash/exec` answer says: its session was made again.
    #[serde(default)]
    pub notice: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FamilyImage {
    Terminal {
        session_id: String,
    },
    Bash {
        session_id: String,
    },
    /// A shell session's own bash.
    Shell {
        session_id: String,
    },
}

/// One output stream and its ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamImage {
    pub ring: RingImage,
    pub open: bool,
    pub plain: bool,
}

/// A ring: its bound, the memory it held (the budget counted it), its end offset, whether
/// it wraps, and the bytes it retains, oldest first (the first is at `end - len`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingImage {
    pub limit: usize,
    pub committed: usize,
    pub end: u64,
    pub wrapped: bool,
    pub bytes: Blob,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinImage {
    pub buf: Blob,
    pub capacity: usize,
    pub eof_requested: bool,
    pub open: bool,
    pub undelivered: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitImage {
    /// `{"code": N}` or `{"signal": N}`.
    pub ended: EndedImage,
    pub user_ns: u64,
    pub system_ns: u64,
    pub max_rss_kb: u64,
    pub tree: Option<TreeImage>,
    pub at: Rel,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedImage {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeImage {
    pub cpu_ms: Option<u64>,
    pub memory_peak_kb: Option<u64>,
    pub oom_killed: bool,
}

/// A command's terminal: its size, and its screen when one is kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtyImage {
    pub rows: u16,
    pub cols: u16,
    pub screen: Option<ScreenImage>,
    /// A shell session's terminal by path (`/dev/pts/N`). Absent in a state from an image
    /// whose shells read a pipe: such a shell is started again before its next line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Bytes>,
}

/// A terminal emulator's screen: the visible grid as escape sequences that redraw it on
/// an empty terminal of the same size (vt100's own rendering of the grid, the cursor, the
/// attributes and the input modes), and whether it is the alternate screen. vt100 does not
/// hand out the primary grid hidden under a full-screen program: the reader re-creates
/// that one by replaying the output the command's ring retains, then redraws the
/// alternate screen on top.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScreenImage {
    pub visible: Blob,
    pub alternate: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubImage {
    pub conn: usize,
    pub lossless: bool,
    pub base64: bool,
    /// The next offset owed, per stream.
    pub next: [u64; 2],
    pub lagging: bool,
    pub done: bool,
}

/// A bash session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionImage {
    pub id: String,
    pub owner: u32,
    pub workdir: Bytes,
    pub created_wall: i64,
    pub last_used: Rel,
    pub last_used_wall: i64,
    pub commands: Vec<u64>,
    pub command_count: u64,
    /// Made by a request that named no session, never named since.
    #[serde(default)]
    pub oneshot: bool,
    /// The notice its creator's answer has not taken yet.
    #[serde(default)]
    pub reopened: Option<String>,
    /// Commands dropped from its history that left processes: (key, id).
    #[serde(default)]
    pub left: Vec<(u64, String)>,
}

/// A queue of whole lines waiting for their target (`core::log::Queue`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueImage {
    /// The bytes not yet written.
    pub pending: Blob,
    /// Every line still (partly) waiting: its length and the drops it reports.
    pub lines: Vec<(usize, u64)>,
    /// Bytes of the first line already written.
    pub front_written: usize,
    pub cap: usize,
    pub dropped: u64,
    /// Per line, as `lines`: the shared uid it belongs to (or whose drops it reports),
    /// and whether it is held in that uid's share (PROTOCOL 7.4). Empty from an older
    /// writer: no line of any uid's.
    #[serde(default)]
    pub uids: Vec<(Option<u32>, bool)>,
    /// Drops not yet reported, per shared uid.
    #[serde(default)]
    pub dropped_by: Vec<(u32, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogImage {
    pub queue: QueueImage,
    /// Rate-limited refusals: kind, when its window opened, how many were logged in it,
    /// how many were counted instead.
    pub refusals: Vec<RefusalImage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalImage {
    pub kind: String,
    pub window_start: Option<Rel>,
    pub in_window: u32,
    pub suppressed: u64,
}

/// Approvers, pending asks and for-session grants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsImage {
    pub approvers: Vec<ApproverImage>,
    pub deaf: Vec<usize>,
    pub pending: Vec<PendingImage>,
    /// Per owner and session (`acp:ID`, `bash:ID`): the ask rules approved for it.
    pub grants: Vec<(u32, String, Vec<String>)>,
    /// The last approval number handed out (`appr_N`).
    pub next: u64,
    /// Connections told when their requests wait for an approver (absent when none, so
    /// a state without any reads in an image that predates them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproverImage {
    pub conn: usize,
    pub uid: u32,
    pub gids: Vec<u32>,
    pub pid: i32,
}

/// A request waiting for an approver, with everything it will start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingImage {
    pub id: String,
    pub conn: usize,
    pub req: Option<u64>,
    pub launch: LaunchImage,
    pub rule: String,
    pub covers: Vec<String>,
    pub description: String,
    pub display: Value,
    pub sent_to: Vec<usize>,
}

/// A command to start (`core::launch::LaunchRequest`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchImage {
    pub family: FamilyImage,
    pub peer: PeerImage,
    pub program: ProgramImage,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Bytes,
    pub cwd_field: String,
    pub stdio: StdioImage,
    pub ring_capacity: usize,
    pub prefix: String,
    /// `[connection, lossless, base64]`.
    pub subscribe: Option<(usize, bool, bool)>,
    pub kill_on_disconnect: Option<usize>,
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
    pub cpu_max: Option<u32>,
    pub after: AfterImage,
    pub admitted: Option<AdmittedImage>,
    /// Whence the request came: `[over TCP, the Unix peer's groups]`.
    pub origin: Option<(bool, Vec<u32>)>,
    /// The sandbox the gate gave it (`policy::sandbox::Given` as JSON).
    #[serde(default)]
    pub sandbox: Option<Value>,
    /// The front door it came through (`rpc` in the images of builds before it was kept).
    #[serde(default = "rpc")]
    pub via: String,
}

fn rpc() -> String {
    "rpc".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramImage {
    Direct { program: String, args: Vec<String> },
    Shell { shell: Bytes, line: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdioImage {
    Merged,
    MergedWithStdin,
    Separate,
    Pty {
        rows: u16,
        cols: u16,
    },
    /// A shell session's bash: a PTY, with a command channel (a socket) for its stdin.
    Shell {
        rows: u16,
        cols: u16,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterImage {
    Terminal,
    BashExec {
        async_mode: bool,
        timeout: Option<f64>,
        hard_timeout: Option<f64>,
        max_len: usize,
        created_session: bool,
        exec_dir: Option<Bytes>,
    },
    /// A line for a shell session, typed into its shell once admitted.
    ShellLine(ShellExecImage),
    /// A shell session's own bash, and what follows once it runs.
    ShellStart(ShellThenImage),
}

/// A shell session's `exec` on its way (`core::shell::ShellExec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellExecImage {
    pub session_id: String,
    pub creates: bool,
    #[serde(default)]
    pub unnamed: bool,
    pub dir: Bytes,
    pub async_mode: bool,
    pub timeout_ns: Option<u64>,
    pub no_change_timeout_ns: Option<u64>,
    pub truncate: bool,
    pub opts: LineOptsImage,
}

/// What an `exec` asked for besides its command (`core::shell::LineOpts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineOptsImage {
    pub exec_dir: Option<String>,
    pub enter: bool,
    pub strict: bool,
    pub keep_symlinks: Option<bool>,
    pub hard_timeout_ns: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShellThenImage {
    Create,
    Exec { exec: ShellExecImage, seq: u64 },
    Restart { fallback: bool },
}

/// Every shell session (`core::shell::Shells`), and what makes their names, command
/// numbers and nonces go on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellsImage {
    pub sessions: Vec<ShellSessionImage>,
    pub next_id: u64,
    pub next_seq: u64,
    pub nonces: u64,
    /// The daemon's secret the nonces are made from.
    pub secret: Bytes,
}

/// A shell session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSessionImage {
    pub id: String,
    pub owner: u32,
    pub workdir: Bytes,
    pub created_wall: i64,
    pub created: Rel,
    pub last_used: Rel,
    pub last_used_wall: i64,
    pub no_change_timeout_ns: u64,
    pub keep_symlinks: bool,
    /// Its shell now (a command key).
    pub shell: Option<u64>,
    pub phase: PhaseImage,
    pub nonce: String,
    /// A marker begun in the terminal's output and not finished: its bytes and offset.
    pub scan_partial: Bytes,
    pub scan_at: u64,
    pub prompt_from: Option<u64>,
    pub ps1: String,
    pub records: Vec<RecordImage>,
    pub restarts: u64,
    pub notice: Option<String>,
    pub failed_starts: u32,
    /// Its terminal's window size (`shell/resize`), for the shell started next too.
    pub rows: u16,
    pub cols: u16,
    pub peer: PeerImage,
    pub origin: Option<(bool, Vec<u32>)>,
    /// Its sandbox (`policy::sandbox::Given` as JSON); absent in a state from an image
    /// without sandboxes.
    #[serde(default)]
    pub sandbox: Option<Value>,
    /// Requests parked on it.
    pub waiters: Vec<u64>,
    /// Its shells that died, kept for their records' output.
    pub old: Vec<u64>,
    #[serde(default)]
    pub oneshot: bool,
    #[serde(default)]
    pub reopened: Option<String>,
    /// The last command's exit status (what `$?` says when the next line starts); absent
    /// in a state from an image whose shells kept it themselves (0 then).
    #[serde(default)]
    pub last_status: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseImage {
    Spawning,
    Starting,
    Prompt,
    Busy,
    Failed(String),
}

/// One command of a shell session (a console record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordImage {
    pub seq: u64,
    pub id: String,
    pub peer: PeerImage,
    pub decision: String,
    pub rule: String,
    pub ps1: String,
    pub command: String,
    pub opts: LineOptsImage,
    pub shell: Option<u64>,
    pub from: Option<u64>,
    pub to: Option<u64>,
    pub step: RecordStepImage,
    pub exit_code: Option<i32>,
    pub kill: Option<EndingImage>,
    pub escalated: bool,
    pub created: Rel,
    pub last_change: Rel,
    pub quiet_after_ns: Option<u64>,
    pub quiet: bool,
    pub waiting_for_input: bool,
    pub no_dir: bool,
    pub note: Option<String>,
    #[serde(default)]
    pub notice: Option<String>,
    /// Input written before it started.
    pub input: Blob,
    pub bytes: usize,
    /// The front door its line came through.
    #[serde(default = "rpc")]
    pub via: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStepImage {
    Queued,
    Sent,
    Running,
    Done(EndingImage),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndingImage {
    Completed,
    Terminated,
    HardTimeout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmittedImage {
    pub key: u64,
    pub id: String,
    pub decision: String,
    pub rule: String,
}

// ---- wire -------------------------------------------------------------------------------

/// A JSON-RPC connection's exchange (`wire::rpc::RpcSession`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcImage {
    /// Bytes read and not yet framed.
    pub unframed: Blob,
    /// Of those, how many were already searched for a newline.
    pub scanned: usize,
    /// An overlong line is being discarded up to its newline.
    pub discarding: bool,
    /// A batch's elements not handed out yet, and batch ends.
    pub queue: Vec<QueuedImage>,
    /// Requests handed out and not answered: their number and where the answer goes.
    pub open: Vec<(u64, ReplyToImage)>,
    pub next_req: u64,
    pub batches: Vec<BatchImage>,
    pub next_batch: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueuedImage {
    Message {
        msg: MessageImage,
        batch: Option<u64>,
    },
    BatchEnd(u64),
}

/// A parsed message: ids are the JSON text the client sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageImage {
    Request {
        id: Option<String>,
        method: String,
        params: Map<String, Value>,
    },
    Response {
        id: String,
        ok: Option<Value>,
        error: Option<Value>,
    },
    Invalid {
        id: String,
        error: ErrorImage,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorImage {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyToImage {
    Single { id: String },
    Batch { batch: u64, slot: usize, id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchImage {
    pub id: u64,
    /// Each element's encoded answer once it has one.
    pub slots: Vec<Option<Blob>>,
    pub pending: usize,
    pub bytes: usize,
    pub open: bool,
}

/// An HTTP connection's exchange (`wire::http::HttpSession`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpImage {
    /// Bytes read and not yet consumed by the parser.
    pub unparsed: Blob,
    pub scanned: usize,
    pub state: HttpStateImage,
    pub max_head: usize,
    pub max_headers: usize,
    pub max_body: usize,
    pub auth: AuthImage,
    /// Answers in request order: written bytes held behind a request still waiting, or
    /// the request number waited for.
    pub order: Vec<SlotImage>,
    pub waiting: usize,
    pub held: usize,
    pub requests: u64,
    pub next_req: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpStateImage {
    Head,
    Body {
        method: String,
        path: String,
        body: Blob,
        keep_alive: bool,
        authorization: Option<String>,
        /// Absent from the images of builds before WebSockets: no query, HTTP/1.1, no
        /// event stream asked for.
        #[serde(default)]
        query: String,
        #[serde(default = "yes")]
        http11: bool,
        #[serde(default)]
        event_stream: bool,
        framing: FramingImage,
        continue_due: bool,
    },
    Done,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FramingImage {
    Length(usize),
    ChunkSize,
    ChunkData(usize),
    ChunkDataEnd,
    Trailers,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthImage {
    Peer,
    Token(Bytes),
    Open,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotImage {
    Ready(Blob),
    Waiting {
        req: u64,
        keep_alive: bool,
        /// An event stream's: its head written, and the events held behind an earlier
        /// answer (absent from the images of builds before event streams).
        #[serde(default)]
        sse: Option<(bool, Blob)>,
    },
}

// ---- server -----------------------------------------------------------------------------

/// The loop and its descriptors (`server::upgrade`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerImage {
    pub next_token: usize,
    pub listeners: ListenersImage,
    pub conns: Vec<ConnImage>,
    pub pipes: Vec<PipesImage>,
    /// The file each command with open stdin reads its input from.
    pub inputs: Vec<(u64, InputImage)>,
    /// Pipes left readable after their turn's budget.
    pub hot: Vec<(u64, usize)>,
    /// Leaders killed as they started, by pid.
    pub abandoned: Vec<(i32, u64)>,
    pub contain: ContainImage,
    /// The audit file's descriptor (`--audit FILE`).
    pub audit_fd: Option<i32>,
    /// `RLIMIT_NOFILE` as the daemon runs with it, and as it was at the first start
    /// (what commands get back).
    pub nofile: u64,
    pub nofile_raised_from: Option<(u64, u64)>,
    /// The most output memory held since the heap was last trimmed.
    pub memory_peak: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenersImage {
    /// The Unix socket: `[token, fd]`.
    pub unix: Option<(usize, i32)>,
    /// The socket file execd bound and removes at shutdown (none: systemd's).
    pub socket_file: Option<Bytes>,
    /// TCP listeners: `[token, fd]`.
    pub http: Vec<(usize, i32)>,
    pub http_auth: AuthImage,
    pub http_peer: PeerImage,
    pub http_groups: Vec<u32>,
}

/// One connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnImage {
    pub token: usize,
    pub fd: i32,
    pub tcp: bool,
    pub peer: PeerImage,
    pub codec: CodecImage,
    /// Queued bytes not yet written.
    pub out: Blob,
    pub read_pending: bool,
    pub eof: bool,
    pub broken: bool,
    pub groups: Vec<u32>,
    pub last_request: Rel,
    /// Parked answers waiting for room, oldest first.
    pub deferred: Vec<(u64, WaitImage)>,
    /// Whether its peer descends from the daemon, and from which command (PROTOCOL 7.3):
    /// found once, at accept. A state without it (an older writer) resumes the
    /// connection as `unknown`, a descendant.
    #[serde(default)]
    pub tie: Option<TieImage>,
}

/// A connection's tie (`core::tie::Tie`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TieImage {
    pub descends: bool,
    pub command: Option<u64>,
    /// `outside`, `cgroup`, `ancestry`, `cookie`, `unknown` or `remote`.
    pub by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodecImage {
    Undecided,
    Rpc(RpcImage),
    Http(HttpImage),
}

/// A command's descriptors: output pipes (or its PTY master) and its stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipesImage {
    pub key: u64,
    /// Per stream: `[fd, token, grown]` while open.
    pub outs: Vec<Option<(i32, usize, bool)>>,
    /// `[fd, token]` while open.
    pub stdin: Option<(i32, usize)>,
    /// A shell session's command channel: `[fd, token]` while open.
    pub commands: Option<(i32, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputImage {
    pub dev: u64,
    pub ino: u64,
    pub tty: Option<u64>,
}

/// How command trees are held (`sys::contain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainImage {
    pub holds: Vec<HoldImage>,
    pub lingering: Vec<u64>,
    pub cgroups: Option<CgroupsImage>,
    pub fallback: Option<FallbackImage>,
    /// This run's cookie instance (`<path>-<pid>-<start>`).
    pub instance: String,
    /// Commands whose cookies the next sweep looks for (the one under way included).
    pub sweep_asked: Vec<String>,
    /// `no`, `asked` or `done`: the sweep of every cookie at shutdown.
    pub sweep_every: String,
    /// The sweep of what earlier instances on this socket left is still owed (it runs
    /// in the off-loop reader, after the daemon started serving).
    #[serde(default)]
    pub sweep_earlier: bool,
    /// Processes a sweep could not read (their memory did not answer), to be read again.
    #[serde(default)]
    pub sweep_retries: Vec<SweepRetryImage>,
}

/// A process a cookie sweep skipped: its pid and start time, and what it is read for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRetryImage {
    pub pid: i32,
    pub start: u64,
    pub ids: Vec<String>,
    pub every: bool,
    pub earlier: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldImage {
    pub key: u64,
    pub pgid: i32,
    pub leader_alive: bool,
    pub group_alive: bool,
    pub cgroup: Option<Bytes>,
    pub wd: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupsImage {
    pub root: Bytes,
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
    pub inotify_fd: i32,
    pub watches: Vec<(i32, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackImage {
    Off,
    NoCgroup2,
    RootCgroup,
    Shared { others: usize },
    NotWritable(String),
    Taken { pid: u32 },
    Setup(String),
}

/// What a carried descriptor must be, for the reader's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FdRole {
    /// A listener or a connection.
    Socket,
    /// A pipe end, a PTY master, or a shell session's command channel (our end of a
    /// socket pair; a pipe in a state from an older image).
    Stream,
    /// The inotify descriptor, the audit file.
    Other,
}

impl State {
    /// Every descriptor the state names, each once, with what it must be: what the writer
    /// clears close-on-exec on, and what the reader checks before taking any.
    pub fn descriptors(&self) -> Vec<(i32, FdRole)> {
        let s = &self.server;
        let mut fds: Vec<(i32, FdRole)> = s
            .listeners
            .unix
            .iter()
            .chain(&s.listeners.http)
            .map(|(_, fd)| (*fd, FdRole::Socket))
            .chain(s.conns.iter().map(|c| (c.fd, FdRole::Socket)))
            .chain(s.pipes.iter().flat_map(|p| {
                p.outs
                    .iter()
                    .flatten()
                    .map(|(fd, _, _)| (*fd, FdRole::Stream))
                    .chain(p.stdin.map(|(fd, _)| (fd, FdRole::Stream)))
                    .chain(p.commands.map(|(fd, _)| (fd, FdRole::Stream)))
            }))
            .chain(
                s.contain
                    .cgroups
                    .as_ref()
                    .map(|c| (c.inotify_fd, FdRole::Other)),
            )
            .chain(s.audit_fd.map(|fd| (fd, FdRole::Other)))
            .collect();
        fds.sort_unstable();
        fds.dedup();
        fds
    }
}

/// Encodes a state: the header (naming `old_exe`, the descriptor of the writer's own
/// executable) and the document; the blob area follows it, written apart without another
/// copy.
pub fn encode(state: &State, old_exe: Option<i32>) -> Result<Vec<u8>, StateError> {
    let json = serde_json::to_vec(state).map_err(|e| StateError::new(e.to_string()))?;
    let mut out = Vec::with_capacity(HEADER + json.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&state.version.to_le_bytes());
    out.extend_from_slice(&old_exe.unwrap_or(-1).to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// The version an encoded state says it is, if it is one.
pub fn version_of(bytes: &[u8]) -> Option<u32> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    Some(u32::from_le_bytes(bytes[8..12].try_into().ok()?))
}

/// The descriptor of the executable that wrote an encoded state, whatever its version.
pub fn hand_back_fd(bytes: &[u8]) -> Option<i32> {
    version_of(bytes)?;
    let fd = i32::from_le_bytes(bytes[12..16].try_into().ok()?);
    (fd >= 0).then_some(fd)
}

/// Reads an encoded state: the document and the blob area after it. Refuses a version
/// this build does not take, and a document that does not match the schema exactly.
pub fn decode(bytes: &[u8]) -> Result<(State, BlobsIn<'_>), StateError> {
    let version = version_of(bytes).ok_or_else(|| StateError::new("not an execd state"))?;
    if !ACCEPTED.contains(&version) {
        return Err(StateError::new(format!(
            "state version {version}, and this build takes {ACCEPTED:?}"
        )));
    }
    let len = u64::from_le_bytes(
        bytes[16..24]
            .try_into()
            .map_err(|_| StateError::new("short header"))?,
    );
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(HEADER))
        .filter(|e| *e <= bytes.len())
        .ok_or_else(|| StateError::new("the document runs past the state's end"))?;
    let state: State = serde_json::from_slice(&bytes[HEADER..end]).map_err(|e| {
        StateError::new(format!("the state does not read as version {version}: {e}"))
    })?;
    if state.version != version {
        return Err(StateError::new(format!(
            "the header says version {version} and the document {}",
            state.version
        )));
    }
    Ok((state, BlobsIn(&bytes[end..])))
}

/// What an image that resumes does for the one that wrote the state, named in its
/// `--upgrade-check` answer: `priority`, it puts back the priority raised for the swap
/// (`UpgradeImage::nice_before`). A writer raises it only for an image that says so: an
/// older one would keep the daemon in real time.
pub const RESTORES: [&str; 1] = ["priority"];

/// What `execd --upgrade-check` prints: this build's release, the states it reads and
/// what it restores.
pub fn check_line() -> String {
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "states": ACCEPTED,
        "restores": RESTORES,
    })
    .to_string()
}

/// The pre-flight's answer: the new image's release, and whether it puts the priority
/// back (`RESTORES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub version: String,
    pub restores_priority: bool,
}

/// Reads the answer of `--upgrade-check` (its first line): the release, whether it takes
/// `VERSION`, and what it restores. An error says what is wrong with the answer.
pub fn read_check(line: &str) -> Result<Check, String> {
    let v: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("its --upgrade-check answer is not JSON ({e}): {line:?}"))?;
    let version = v["version"]
        .as_str()
        .ok_or_else(|| format!("its --upgrade-check answer has no \"version\": {line:?}"))?;
    let states: Vec<u64> = v["states"]
        .as_array()
        .ok_or_else(|| format!("its --upgrade-check answer has no \"states\": {line:?}"))?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    if !states.contains(&u64::from(VERSION)) {
        return Err(format!(
            "it reads states {states:?}, not version {VERSION}, which this daemon writes"
        ));
    }
    let restores_priority = v["restores"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r == "priority"));
    Ok(Check {
        version: version.to_string(),
        restores_priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> State {
        State {
            version: VERSION,
            from: "0.1.0".into(),
            clock: 5,
            upgrade: UpgradeImage {
                old_binary: Bytes(b"/old/\xffexecd".to_vec()),
                new_binary: Bytes(b"/new/execd".to_vec()),
                args: vec![Bytes(b"--socket".to_vec()), Bytes(b"/s".to_vec())],
                upgrades: 3,
                asked_by: Some((7, 9)),
                stopped: 4,
                asker: Some(AskerImage::Signal(Some((42, 1000)))),
                nice_before: Some(0),
            },
            core: CoreImage {
                procs: vec![],
                sessions: vec![],
                next_key: 12,
                next_session: 2,
                next_park: 4,
                exited_terminals: vec![],
                memory_released: 0,
                timers: vec![],
                parked: vec![],
                forget: vec![],
                clients: vec![],
                started: -1_000,
                log: LogImage {
                    queue: QueueImage {
                        pending: Blob(0, 3),
                        lines: vec![(3, 0)],
                        front_written: 0,
                        cap: 1 << 20,
                        dropped: 0,
                        uids: vec![(Some(1000), true)],
                        dropped_by: vec![(1001, 2)],
                    },
                    refusals: vec![],
                },
                audit: None,
                policy: None,
                approvals: ApprovalsImage {
                    approvers: vec![],
                    deaf: vec![],
                    pending: vec![],
                    notices: vec![],
                    grants: vec![],
                    next: 0,
                },
                shells: ShellsImage {
                    sessions: vec![],
                    next_id: 0,
                    next_seq: 0,
                    nonces: 0,
                    secret: Bytes(vec![7; 32]),
                },
                input_watch: false,
                closed: vec![],
            },
            server: ServerImage {
                next_token: 9,
                listeners: ListenersImage {
                    unix: Some((0, 3)),
                    socket_file: Some(Bytes(b"/s".to_vec())),
                    http: vec![(6, 4)],
                    http_auth: AuthImage::Token(Bytes(b"t".to_vec())),
                    http_peer: PeerImage {
                        uid: 1,
                        gid: 1,
                        pid: 0,
                    },
                    http_groups: vec![],
                },
                conns: vec![],
                pipes: vec![PipesImage {
                    key: 1,
                    outs: vec![Some((7, 8, false)), None],
                    stdin: Some((3, 9)),
                    commands: None,
                }],
                inputs: vec![],
                hot: vec![],
                abandoned: vec![],
                contain: ContainImage {
                    holds: vec![],
                    lingering: vec![],
                    cgroups: None,
                    fallback: Some(FallbackImage::Off),
                    instance: "x".into(),
                    sweep_asked: vec![],
                    sweep_every: "no".into(),
                    sweep_earlier: false,
                    sweep_retries: vec![SweepRetryImage {
                        pid: 4242,
                        start: 7,
                        ids: vec!["term_1".into()],
                        every: false,
                        earlier: true,
                    }],
                },
                audit_fd: None,
                nofile: 1024,
                nofile_raised_from: None,
                memory_peak: 0,
            },
        }
    }

    #[test]
    fn a_state_reads_back_as_written_with_its_blobs() {
        let state = empty();
        let mut blobs = BlobsOut::default();
        assert_eq!(blobs.put(b"ab\n"), Blob(0, 3));
        let mut bytes = encode(&state, Some(11)).unwrap();
        bytes.extend_from_slice(blobs.bytes());
        let (back, area) = decode(&bytes).unwrap();
        assert_eq!(back, state);
        assert_eq!(area.get(Blob(0, 3)).unwrap(), b"ab\n");
        assert!(area.get(Blob(2, 2)).is_err(), "past the end");
        assert!(area.get(Blob(u64::MAX, 2)).is_err(), "overflowing");
        assert_eq!(
            state.descriptors(),
            vec![
                (3, FdRole::Socket),
                (3, FdRole::Stream),
                (4, FdRole::Socket),
                (7, FdRole::Stream)
            ]
        );
        assert_eq!(hand_back_fd(&bytes), Some(11));
    }

    #[test]
    fn other_versions_and_other_documents_are_refused_with_the_reason() {
        let mut bytes = encode(&empty(), None).unwrap();
        assert_eq!(hand_back_fd(&bytes), None);
        assert_eq!(version_of(&bytes), Some(VERSION));
        bytes[8] = 99;
        let e = decode(&bytes).unwrap_err();
        assert!(e.0.contains("state version 99"), "{e}");
        assert!(decode(b"nonsense").is_err());
        // A field this build does not know means another schema, not version 1.
        let mut doc = serde_json::to_value(empty()).unwrap();
        doc["core"]["surprise"] = 1.into();
        let json = serde_json::to_vec(&doc).unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&(-1i32).to_le_bytes());
        bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&json);
        let e = decode(&bytes).unwrap_err();
        assert!(e.0.contains("surprise"), "{e}");
    }

    #[test]
    fn times_are_placed_relative_to_the_clock() {
        let t0 = crate::types::test_clock().0;
        let base = Clock { base: t0 };
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(base.rel(later), 1_500_000_000);
        assert_eq!(base.at(base.rel(later)), later);
        let before = t0 - Duration::from_millis(20);
        assert_eq!(base.rel(before), -20_000_000);
        assert_eq!(base.at(-20_000_000), before);
        let w = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_795_564_800_123_456_789);
        assert_eq!(wall_of(wall_ns(w)), w);
    }

    #[test]
    fn the_upgrade_check_answer_names_the_states_read() {
        assert_eq!(
            read_check(&check_line()).unwrap(),
            Check {
                version: env!("CARGO_PKG_VERSION").into(),
                restores_priority: true
            }
        );
        // An older image says nothing of it: the priority is not raised for it.
        let old = read_check(r#"{"version":"0.1.0","states":[1]}"#).unwrap();
        assert!(!old.restores_priority);
        let e = read_check(r#"{"version":"9.0.0","states":[7]}"#).unwrap_err();
        assert!(e.contains("not version 1"), "{e}");
        assert!(read_check("hello").unwrap_err().contains("not JSON"));
        assert!(read_check(r#"{"states":[1]}"#)
            .unwrap_err()
            .contains("version"));
    }
}
