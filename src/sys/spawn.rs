//! Starting a command without holding the loop. The loop prepares everything a spawn needs
//! without touching the file system (argv, environment, pipes, and the candidate paths of
//! the program: `PATH` is searched by the child, never stat'ed here) and clones the child
//! with `clone(CLONE_VM)`, sharing memory but not waiting for it (no `CLONE_VFORK`): the
//! child only makes system calls (signals, stdio, cgroup, session, limits, user,
//! parent-death signal, directory, exec) while the loop goes on. A step that fails writes
//! `{step, errno}` on a close-on-exec report pipe and exits; an exec closes the pipe. The
//! loop watches the pipe like any other: EOF alone says the command runs, a report says
//! what failed. A working directory or `PATH` entry on a hung file system holds only that
//! child; nothing waits for it.
//!
//! The child shares the loop's descriptor table too (`CLONE_FILES`) when the few it needs
//! fit in low slots reserved for them (`Slots`): its first call gives it a table of its
//! own holding only the numbers below them, so a spawn costs the same however many
//! commands run. It says so on the report pipe (one byte), and the loop frees the slots.
//!
//! The clone and the steps that are the same for every command are done ahead, by a
//! spare (`Spare`): a child cloned at the end of a turn (`Spawner::replenish`), once no
//! spawn is between clone and exec (its steps would take a CPU from one), that resets
//! signals, takes a session and its parent-death signal and, for sandboxed
//! commands of one kind, the sandbox's common part (`sandbox::Common`: bounding set,
//! `SECBIT_NOROOT`, `no_new_privs`, the seccomp program), then waits on a futex. The next
//! spawn of its kind puts its plan where the spare reads it and opens the gate; the spare
//! goes on from there as a child cloned then would (`run_plan`, told what is `Done`).
//! At most one spare per kind; none once the daemon stops or upgrades.
//!
//! Invariants:
//! - Every descriptor execd opens is close-on-exec (std, mio and `pipe2(O_CLOEXEC)` ensure
//!   it), so a command inherits exactly its three stdio descriptors.
//! - A child that shares the table touches none of it but its report pipe until its first
//!   call has unshared it; the loop changes none of the child's slots until the child
//!   said so or was reaped.
//! - A spawned command leads its own session and process group (`setsid`), so signalling
//!   `-pid` reaches it and everything it started that did not leave the group.
//! - The child never allocates, locks or unwinds: everything it needs is prepared first
//!   (`InFlight`), and it reads that memory and writes only its own stack. The loop keeps
//!   the `InFlight` until the child has exec'd (its report pipe reached EOF) or was reaped.
//! - Only the loop's thread clones, and it closes its copies of a child's ends right after
//!   the clone (its slots' copies once the child has its own table): another command's
//!   child holds them at most until its own first calls, so the drain at a command's exit
//!   sees their EOF. The child closes every other descriptor it copied at once.
//! - The parent-death signal follows the thread that cloned: the loop's, which lives as
//!   long as the daemon.
//! - A spare touches nothing of the loop's memory but its `Early` (its stack, its gate)
//!   and nothing of its table until it has its plan, whose first step gives it a table
//!   of its own. The loop keeps a spare's `Early` until it has exec'd a command or been
//!   reaped, even after killing it.
//! - A command's environment ends with its `EXECD_TREE_TAG` and `EXECD_TREE` cookie
//!   (`sys::cookie`), after the base environment and the request's variables: it holds
//!   exactly one of each, its own.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::cookie;
use super::cstring;
use super::ids::Identity;
use super::sandbox::{ChildRule, Confined, DROPPED_ENV};
use super::waiting::InputFile;
use crate::types::{Program, Rlimit, Stdio3, WinSize};

/// What one command needs; the daemon-wide rest is in `Spawner`.
pub struct SpawnSpec<'a> {
    pub program: &'a Program,
    /// Variables set on top of the base environment.
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    pub stdio: Stdio3,
    /// Run as this user instead of the daemon's own (the daemon must be root).
    pub user: Option<&'a Identity>,
    /// The `cgroup.procs` of the command's cgroup, opened by the parent. It must stay
    /// open until the spawn is done.
    pub cgroup_procs: Option<RawFd>,
    /// The command's `EXECD_TREE` value (`sys::cookie`), set after every other variable.
    pub cookie: &'a str,
    /// Its `EXECD_TREE_TAG` value, set just before it (none: the upgrade pre-flight, which
    /// no peer is ever tied to).
    pub tag: Option<&'a str>,
    /// Check the program (an absolute path) before exec, as an upgrade's new binary must
    /// be (PROTOCOL 13): owned by root or this uid and writable by nobody else, and so is
    /// every directory above it. Done by the child, so a path on a hung file system holds
    /// only the child; what fails is reported as `FailedAt::Binary`.
    pub check_binary: Option<u32>,
}

/// The parent's ends of a command's stdio, all non-blocking and close-on-exec; the loop
/// holds them from the moment the spawn is handed out.
#[derive(Debug)]
pub struct ParentEnds {
    /// stdout (Separate) or the merged stdout+stderr pipe (Merged).
    pub out: OwnedFd,
    pub err: Option<OwnedFd>,
    pub stdin: Option<OwnedFd>,
    /// The file the command reads its input from (its stdin pipe or PTY slave), for
    /// telling when it waits for input (`sys::waiting`).
    pub input: Option<InputFile>,
    /// A shell session's command channel (`Stdio3::Shell`): our end of the socket the
    /// shell reads its command lines from.
    pub commands: Option<OwnedFd>,
    /// A shell session's terminal by path (`/dev/pts/N`, `Stdio3::Shell`): what every
    /// command line opens as the command's stdin, stdout and stderr.
    pub tty_path: Option<PathBuf>,
}

/// A command's stdio before the spawn: the child's ends (to become 0, 1 and 2) and the
/// parent's.
struct Wired {
    child: [Option<OwnedFd>; 3],
    /// The child's ends are one PTY slave, to become its controlling terminal.
    tty: bool,
    /// The child's stdout is a PTY slave, to become its controlling terminal.
    ctty: bool,
    parent: ParentEnds,
}

impl Wired {
    /// Pipes: stdout (with stderr when merged), stderr apart when separate, stdin unless
    /// it is `/dev/null`. The parent's ends are non-blocking before the child exists
    /// (each end of a pipe has its own flags), so nothing fails after the spawn.
    fn pipes(stdio: Stdio3) -> io::Result<Wired> {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = match stdio {
            Stdio3::Separate => {
                let (r, w) = pipe()?;
                (Some(r), Some(w))
            }
            _ => (None, None),
        };
        let (in_r, stdin_w) = match stdio {
            Stdio3::Separate | Stdio3::MergedWithStdin => {
                let (r, w) = pipe()?;
                (Some(r), Some(w))
            }
            _ => (None, None),
        };
        for fd in [Some(&out_r), err_r.as_ref(), stdin_w.as_ref()]
            .into_iter()
            .flatten()
        {
            set_nonblocking(fd.as_raw_fd())?;
        }
        // Both ends of a pipe are one inode: ours names the command's stdin.
        let input = stdin_w
            .as_ref()
            .and_then(|w| InputFile::of_fd(w.as_raw_fd()).ok());
        Ok(Wired {
            child: [in_r, Some(out_w), err_w],
            tty: false,
            ctty: false,
            parent: ParentEnds {
                out: out_r,
                err: err_r,
                stdin: stdin_w,
                input,
                commands: None,
                tty_path: None,
            },
        })
    }

    /// A pseudo-terminal of `size`: the slave is the child's 0, 1 and 2 and controlling
    /// terminal; the parent reads the master as the output and writes input to a second
    /// descriptor of it (the loop watches the two apart).
    fn pty(size: WinSize) -> io::Result<Wired> {
        let (master, slave) = crate::sys::pty::open(size)?;
        set_nonblocking(master.as_raw_fd())?;
        let writer = master.try_clone()?;
        let input = InputFile::of_fd(slave.as_raw_fd()).ok();
        Ok(Wired {
            child: [Some(slave), None, None],
            tty: true,
            ctty: true,
            parent: ParentEnds {
                out: master,
                err: None,
                stdin: Some(writer),
                input,
                commands: None,
                tty_path: None,
            },
        })
    }

    /// A shell session's bash (`Stdio3::Shell`): a pseudo-terminal of `size` whose slave
    /// is the child's stdout, stderr and controlling terminal, as for `pty`, and one end of
    /// a Unix socket pair as its stdin, which the parent writes command lines to
    /// (PROTOCOL 12.2). The shell reads commands only from the socket, so nothing typed
    /// into the terminal reaches it as a command; and the socket, unlike a pipe, cannot be
    /// opened again through `/proc/PID/fd` (`ENXIO`), while its shell end is shut for
    /// writing, so no copy of it (inherited, or taken with `pidfd_getfd`) writes a line.
    /// The slave is given to `owner` (the user the shell runs as), who opens it by its
    /// path for every command.
    fn shell(size: WinSize, owner: Option<u32>) -> io::Result<Wired> {
        let (master, slave) = crate::sys::pty::open(size)?;
        set_nonblocking(master.as_raw_fd())?;
        let writer = master.try_clone()?;
        let tty_path = crate::sys::pty::path_of(&slave)?;
        if let Some(uid) = owner {
            std::os::unix::fs::fchown(&slave, Some(uid), None)?;
        }
        // Programs read the terminal; the shell itself reads only the socket, so it never
        // counts as waiting for input at its prompt.
        let input = InputFile::of_fd(slave.as_raw_fd()).ok();
        let (ours, theirs) = command_channel()?;
        Ok(Wired {
            child: [Some(theirs), Some(slave), None],
            tty: false,
            ctty: true,
            parent: ParentEnds {
                out: master,
                err: None,
                stdin: Some(writer),
                input,
                commands: Some(ours),
                tty_path: Some(tty_path),
            },
        })
    }
}

/// A shell session's command channel (PROTOCOL 12.2): a connected pair of Unix stream
/// sockets, both close-on-exec: `(ours, theirs)`. Ours is non-blocking, for the loop to
/// write lines into; theirs, the shell's stdin, is shut for writing, which holds for every
/// copy of it: a program that reaches it writes nothing (`EPIPE`).
pub fn command_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    theirs.shutdown(std::net::Shutdown::Write)?;
    ours.set_nonblocking(true)?;
    Ok((OwnedFd::from(ours), OwnedFd::from(theirs)))
}

/// The step of a spawn that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedAt {
    /// Finding or executing the program (`ENOENT`, `EACCES`, `ENOEXEC`, ...).
    Program,
    /// Changing into the working directory.
    Cwd,
    /// Anything else between clone and exec (cgroup, session, limits, user, stdio).
    Setup,
    /// The program is not one an upgrade may run (`SpawnSpec::check_binary`).
    Binary(Unsafe),
    /// Applying the sandbox (PROTOCOL 16).
    Sandbox(SandboxStep),
}

/// The part of a sandbox a child could not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStep {
    /// Entering the mount namespace, dropping capabilities, `no_new_privs`, Landlock or
    /// seccomp: the kernel refused.
    Apply,
    /// Opening (or adding) root number N that a request named.
    Root(usize),
    /// Write root number N that a request named holds a protected name.
    Protect(usize),
    /// The directory it entered does not lie under its workspace's root.
    Outside,
}

/// Why a program may not be an upgrade's new binary (PROTOCOL 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsafe {
    /// It or a directory above it could not be looked at (the report's error says why).
    Unreadable,
    NotRegular,
    /// Owned by a user other than root or the daemon's.
    Owner,
    /// Writable by its group or others.
    Writable,
    /// A directory above it is owned by a user other than root or the daemon's.
    DirOwner,
    /// A directory above it is writable by its group or others, and is not a sticky
    /// directory of root's (`/tmp` is; a directory inside it is judged on its own).
    DirWritable,
}

impl Unsafe {
    /// What is wrong, in words.
    pub fn text(self) -> &'static str {
        match self {
            Unsafe::Unreadable => "cannot be looked at",
            Unsafe::NotRegular => "is not a regular file",
            Unsafe::Owner => "is owned by a user other than root or the daemon's",
            Unsafe::Writable => "may be written by its group or others",
            Unsafe::DirOwner => "is in a directory owned by a user other than root or the daemon's",
            Unsafe::DirWritable => {
                "is in a directory its group or others may write (and not a sticky one of root's)"
            }
        }
    }

    /// The report's step for this reason.
    const fn step(self) -> libc::c_int {
        FAILED_BINARY
            + match self {
                Unsafe::Unreadable => 0,
                Unsafe::NotRegular => 1,
                Unsafe::Owner => 2,
                Unsafe::Writable => 3,
                Unsafe::DirOwner => 4,
                Unsafe::DirWritable => 5,
            }
    }

    fn of_step(step: libc::c_int) -> Option<Unsafe> {
        Some(match step - FAILED_BINARY {
            0 => Unsafe::Unreadable,
            1 => Unsafe::NotRegular,
            2 => Unsafe::Owner,
            3 => Unsafe::Writable,
            4 => Unsafe::DirOwner,
            5 => Unsafe::DirWritable,
            _ => return None,
        })
    }
}

/// What is wrong with a file of `mode` owned by `uid` to be an upgrade's binary, for a
/// daemon running as `trusted` (root is always trusted).
pub const fn unsafe_file(mode: u32, uid: u32, trusted: u32) -> Option<Unsafe> {
    if mode & libc::S_IFMT != libc::S_IFREG {
        Some(Unsafe::NotRegular)
    } else if uid != 0 && uid != trusted {
        Some(Unsafe::Owner)
    } else if mode & 0o022 != 0 {
        Some(Unsafe::Writable)
    } else {
        None
    }
}

/// What is wrong with a directory of `mode` owned by `uid` to hold an upgrade's binary:
/// owned by root or `trusted`, and written by nobody else unless it is sticky and
/// root's (where nobody may replace another's file).
pub const fn unsafe_dir(mode: u32, uid: u32, trusted: u32) -> Option<Unsafe> {
    if uid != 0 && uid != trusted {
        Some(Unsafe::DirOwner)
    } else if mode & 0o022 != 0 && !(mode & libc::S_ISVTX != 0 && uid == 0) {
        Some(Unsafe::DirWritable)
    } else {
        None
    }
}

/// What a spawn's report pipe says.
#[derive(Debug)]
pub enum Report {
    /// Nothing yet: the child is between clone and exec.
    Pending,
    /// It exec'd: the command runs.
    Execd,
    /// A step before exec failed (the child has exited).
    Failed(FailedAt, io::Error),
}

/// A spawn under way: the child's pid, the parent's ends of its stdio, its report pipe,
/// and the memory the child reads until it execs.
pub struct Spawned {
    pub pid: i32,
    pub ends: ParentEnds,
    /// Non-blocking read end of the child's report pipe: watch it for `read_report`.
    pub report: OwnedFd,
    pub memory: InFlight,
}

/// What a child reads between clone and exec (its plan, the strings it points into, its
/// stack). Dropping it while the child may still run would pull that memory from under
/// it: keep it until the child exec'd or was reaped.
pub struct InFlight {
    prepared: Box<Prepared>,
    /// Where its child's stack goes back once the child is done with it.
    stacks: Stacks,
    /// The low descriptor numbers its child's descriptors were put in, while the child
    /// may still share the loop's table (`Slots`).
    lease: Option<Lease>,
    /// The spare that runs it, when one does: its stack and its gate.
    spare: Option<Box<Early>>,
}

/// Child stacks no child uses any more, for the next spawns: a spawn then costs no
/// allocation (and no `mmap`/`munmap` pair) for its stack. At most `STACKS_KEPT` are kept.
type Stacks = std::rc::Rc<std::cell::RefCell<Vec<Vec<u8>>>>;

/// The most idle child stacks kept (64 KiB each): as many as spawns commonly in flight at
/// once in a burst; a larger burst allocates the rest and lets them go.
const STACKS_KEPT: usize = 16;

impl Drop for InFlight {
    fn drop(&mut self) {
        self.unshared();
        let stack = std::mem::take(&mut self.prepared.stack);
        give_stack(&self.stacks, stack);
        if let Some(early) = self.spare.take() {
            give_stack(&self.stacks, early.stack);
        }
    }
}

/// Keeps `stack`, which no child uses any more, for the next spawns (`Stacks`).
fn give_stack(stacks: &Stacks, stack: Vec<u8>) {
    let mut kept = stacks.borrow_mut();
    if kept.len() < STACKS_KEPT && stack.len() == CHILD_STACK {
        kept.push(stack);
    }
}

impl InFlight {
    /// Its child has its own descriptor table now (it said so, or it is gone): the slots
    /// its descriptors were in get `/dev/null` back, which drops the loop's references
    /// to the child's ends (its report pipe's EOF waits for that).
    pub fn unshared(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.slots.borrow_mut().give_back(lease.taken);
        }
    }

    /// How root number `n` a request named was written (for a failed sandbox's error).
    pub fn sandbox_root(&self, n: usize) -> Option<String> {
        let c = self.prepared.confined.as_ref()?;
        let rule = c.rules.get(n)?;
        // SAFETY: `shown` points into a CString the `Confined` owns.
        let shown = unsafe { std::ffi::CStr::from_ptr(rule.shown) };
        Some(shown.to_string_lossy().into_owned())
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

/// Reads a spawn's report pipe; `memory` is the spawn's, whose slots go back when its
/// child says it has its own descriptor table.
pub fn read_report(fd: RawFd, memory: Option<&mut InFlight>) -> Report {
    let mut memory = memory;
    let mut buf = [0u8; 9];
    let msg = loop {
        // SAFETY: reading into a buffer we own from a descriptor we own.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Report::Pending,
                _ => Report::Failed(FailedAt::Setup, e),
            };
        }
        if n == 0 {
            return Report::Execd;
        }
        let mut msg = &buf[..n as usize];
        if msg[0] == UNSHARED {
            if let Some(m) = memory.as_deref_mut() {
                m.unshared();
            }
            msg = &msg[1..];
            if msg.is_empty() {
                // The EOF of its exec may be there already, now that ours is closed.
                continue;
            }
        }
        break msg;
    };
    if msg.len() != 8 {
        return Report::Failed(FailedAt::Setup, io::Error::other("a torn spawn report"));
    }
    let step = i32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
    let err = io::Error::from_raw_os_error(i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]));
    if let Some(u) = Unsafe::of_step(step) {
        let err = match u {
            Unsafe::Unreadable => err,
            u => io::Error::other(u.text()),
        };
        return Report::Failed(FailedAt::Binary(u), err);
    }
    let at = match (step & 0xff, (step >> 8) as usize) {
        (FAILED_CWD, _) => FailedAt::Cwd,
        (FAILED_EXEC, _) => FailedAt::Program,
        (FAILED_SANDBOX, _) => FailedAt::Sandbox(SandboxStep::Apply),
        (FAILED_ROOT, n) => FailedAt::Sandbox(SandboxStep::Root(n)),
        (FAILED_PROTECT, n) => FailedAt::Sandbox(SandboxStep::Protect(n)),
        (FAILED_OUTSIDE, _) => FailedAt::Sandbox(SandboxStep::Outside),
        _ => FailedAt::Setup,
    };
    Report::Failed(at, err)
}

/// Creates a pipe with both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Puts a descriptor in non-blocking mode.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // A pipe end we just made has no other status flag to keep (F_SETFL ignores the
    // access mode), so one call does.
    // SAFETY: fcntl on a descriptor we own, with plain integer arguments.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Grows a pipe's kernel buffer so a chatty command needs fewer wakeups. Best effort: the
/// system limit (`/proc/sys/fs/pipe-max-size`, or the user's pipe page budget) may refuse
/// it, and that is fine. Called only for pipes that filled up, so quiet commands do not
/// spend the user's pipe budget.
pub fn grow_pipe(fd: RawFd) {
    const PIPE_SIZE: libc::c_int = 1 << 20;
    // SAFETY: F_SETPIPE_SZ on a pipe descriptor we own; failure is ignored on purpose.
    unsafe {
        libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_SIZE);
    }
}

fn rlimit_resource(r: Rlimit) -> libc::__rlimit_resource_t {
    match r {
        Rlimit::Cpu => libc::RLIMIT_CPU,
        Rlimit::As => libc::RLIMIT_AS,
        Rlimit::Nofile => libc::RLIMIT_NOFILE,
        Rlimit::Nproc => libc::RLIMIT_NPROC,
        Rlimit::Fsize => libc::RLIMIT_FSIZE,
        Rlimit::Core => libc::RLIMIT_CORE,
    }
}

/// What a child writes on its report pipe once it has its own descriptor table (`Slots`):
/// one byte, which no step's report starts with.
const UNSHARED: u8 = 0xff;

/// How many low descriptor numbers are kept for children (`Slots`): a spawn takes one
/// per descriptor its child needs (five at most without a sandbox; a sandbox adds its
/// ruleset, its namespace and the bases of its roots), so a dozen plain spawns (fewer
/// sandboxed ones) can be between clone and unshare at once; more take the copying clone.
const SLOTS: usize = 64;

/// Slots above this are not worth it (a table that was full at start-up, after an
/// upgrade with many commands): each child would copy that many entries.
const SLOTS_BELOW: RawFd = 512;

/// Descriptor numbers near the bottom of the loop's table, reserved at start-up (each
/// holds `/dev/null` while free), that a spawn duplicates its child's descriptors into.
/// The child then shares the loop's table (`CLONE_FILES`: nothing is copied at the clone,
/// however many commands run) and its first system call, `close_range(FIRST, ~0,
/// CLOSE_RANGE_UNSHARE)`, gives it a table of its own with only the numbers below
/// `FIRST` (one past its highest slot): a handful, the same however many commands run.
/// It says so on its report pipe (`UNSHARED`), and the loop puts `/dev/null` back in
/// those slots. Without this, every clone copied the whole table (one entry per pipe
/// of every running command) and every child closed each copy again.
struct Slots {
    /// The slots' numbers, lowest first.
    numbers: [RawFd; SLOTS],
    /// Bit `i`: slot `i` is free.
    free: u64,
    /// What a free slot holds.
    null: OwnedFd,
}

/// The slots one spawn took.
struct Lease {
    slots: std::rc::Rc<std::cell::RefCell<Slots>>,
    taken: u64,
}

impl Slots {
    /// Reserves the slots: the lowest free numbers above 2. None when the kernel has no
    /// `close_range` (it came with `CLOSE_RANGE_UNSHARE`, Linux 5.9) or the numbers are
    /// not low.
    fn reserve() -> Option<Slots> {
        // close_range(1, 0) is refused with EINVAL by a kernel that has it; anything else
        // (ENOSYS, or EPERM from a seccomp filter that refuses calls it does not know)
        // means children could not unshare.
        // SAFETY: an invalid range closes nothing.
        let r = unsafe { libc::syscall(libc::SYS_close_range, 1u32, 0u32, 0u32) };
        if r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return None;
        }
        // Out of descriptors (a low limit): the copying clone needs none of these.
        let null = dev_null().ok()?;
        let mut numbers = [-1; SLOTS];
        let mut held = Vec::with_capacity(SLOTS);
        for n in &mut numbers {
            // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1.
            let fd = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
            if fd < 0 {
                return None; // `held` closes those made
            }
            // SAFETY: a descriptor just made, ours alone.
            held.push(unsafe { OwnedFd::from_raw_fd(fd) });
            *n = fd;
        }
        numbers.sort_unstable();
        if numbers[SLOTS - 1] >= SLOTS_BELOW {
            return None;
        }
        // From here the slots are closed only by `Drop`.
        for fd in held {
            std::mem::forget(fd);
        }
        Some(Slots {
            numbers,
            free: u64::MAX,
            null,
        })
    }

    /// Puts each of `fds` in a free slot, lowest first: their slot numbers
    /// and the lease, or None when not enough are free.
    fn take(&mut self, fds: &[RawFd]) -> io::Result<Option<(Vec<RawFd>, u64)>> {
        if (self.free.count_ones() as usize) < fds.len() {
            return Ok(None);
        }
        let mut taken = 0u64;
        let mut numbers = Vec::with_capacity(fds.len());
        for &fd in fds {
            let i = (self.free & !taken).trailing_zeros() as usize;
            let slot = self.numbers[i];
            // SAFETY: dup3 onto a slot we hold replaces its /dev/null atomically.
            if unsafe { libc::dup3(fd, slot, libc::O_CLOEXEC) } < 0 {
                let e = io::Error::last_os_error();
                self.give_back(taken);
                return Err(e);
            }
            taken |= 1 << i;
            numbers.push(slot);
        }
        self.free &= !taken;
        Ok(Some((numbers, taken)))
    }

    /// The slots spawns hold now.
    fn busy(&self) -> Vec<RawFd> {
        (0..SLOTS)
            .filter(|i| self.free & (1 << i) == 0 && self.numbers[*i] >= 0)
            .map(|i| self.numbers[i])
            .collect()
    }

    /// Slots `taken` hold `/dev/null` again and are free.
    fn give_back(&mut self, taken: u64) {
        for i in 0..SLOTS {
            if taken & (1 << i) == 0 {
                continue;
            }
            let slot = self.numbers[i];
            // SAFETY: dup3 onto a slot we hold replaces what it held atomically.
            if unsafe { libc::dup3(self.null.as_raw_fd(), slot, libc::O_CLOEXEC) } >= 0 {
                self.free |= 1 << i;
            } else {
                // It must not keep the child's end: closed, and never used again.
                // SAFETY: our slot, closed once; its number is forgotten here.
                unsafe { libc::close(slot) };
                self.numbers[i] = -1;
            }
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for fd in self.numbers.into_iter().filter(|fd| *fd >= 0) {
            // SAFETY: the slots are ours, closed once, here.
            unsafe { libc::close(fd) };
        }
    }
}

/// How many descriptor numbers the loop's table is grown to at start (`grow_table`).
const TABLE_AT_START: libc::c_int = 1024;

/// Grows the loop's descriptor table to `TABLE_AT_START` numbers now, while no child
/// shares it: the kernel grows a shared table only after an RCU grace period (it cannot
/// free the old one under a sharer), a stall of the loop, and a spare shares it nearly
/// always (`Spare`). Tables never shrink; this costs the kernel 8 KiB. Past it, growth
/// waits as it would.
fn grow_table() {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the copy is closed at once. Fails
    // harmlessly under a lower descriptor limit.
    unsafe {
        let fd = libc::fcntl(0, libc::F_DUPFD_CLOEXEC, TABLE_AT_START - 1);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

/// Size of the child's stack between clone and exec: it only makes system calls.
const CHILD_STACK: usize = 64 << 10;

/// What is the same for every spawn, prepared once.
struct Shared {
    /// The base environment's `PATH`, where a program is looked up unless the request
    /// sets its own.
    path_var: Option<OsString>,
    /// Signals the daemon catches (and SIGPIPE), to reset to their default in the child.
    reset: Vec<libc::c_int>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The daemon's pid: a child whose parent is another has lost it.
    parent: libc::pid_t,
}

/// One spawn as the loop prepared it: what the child reads, in memory that stays put
/// (`plan` points into the rest) until the child has exec'd.
struct Prepared {
    /// Where the program may be, in order: the program itself when it names a path, else
    /// each `PATH` entry joined with it. The child tries each, as `execvp` does.
    candidates: Vec<CString>,
    candidate_ptrs: Vec<*const libc::c_char>,
    argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    /// The base environment's entries this spawn keeps (pointers into `_base_env`, which
    /// this holds for them), then its own variables (the request's, the cookie's).
    base_ptrs: Vec<*const libc::c_char>,
    _base_env: Option<std::rc::Rc<[(OsString, CString)]>>,
    envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    groups: Vec<libc::gid_t>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    reset: Vec<libc::c_int>,
    /// The sandbox, when the command has one: what `plan.sandbox` points into.
    confined: Option<Confined>,
    /// Check the program first (`SpawnSpec::check_binary`), for this daemon uid.
    check_binary: Option<libc::uid_t>,
    stack: Vec<u8>,
    /// The slots other spawns hold (`Slots`), for a child that copies the table to close
    /// first: their children's ends are no business of this one.
    busy: Vec<RawFd>,
    plan: ChildPlan,
}

/// Everything the child needs between clone and exec, pointing into a `Job` that the
/// suspended thread keeps alive: the child may not allocate, lock or unwind.
struct ChildPlan {
    /// Candidate paths of the program (see `Prepared`).
    paths: *const *const libc::c_char,
    npaths: usize,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Descriptors to become 0, 1 and 2.
    stdio: [RawFd; 3],
    /// Descriptors to close first (`Prepared::busy`).
    busy: *const RawFd,
    nbusy: usize,
    limits: *const (libc::__rlimit_resource_t, libc::rlimit),
    nlimits: usize,
    reset: *const libc::c_int,
    nreset: usize,
    parent: libc::pid_t,
    /// Switch to this uid, gid and groups before exec, when set.
    user: Option<(libc::uid_t, libc::gid_t)>,
    groups: *const libc::gid_t,
    ngroups: usize,
    /// A `cgroup.procs` the parent opened: the child moves itself there first.
    cgroup_procs: RawFd,
    /// Its stdout is a PTY slave, to become its controlling terminal (a PTY command's, or
    /// a shell session's bash).
    tty: bool,
    /// The write end of the report pipe: `{step, errno}` when a step fails.
    report: RawFd,
    /// The child shares the loop's descriptor table, all it needs in slots below this
    /// (`Slots`): its first call unshares the table, keeping only what is below. -1: it
    /// has a copy of its own already.
    unshare_below: RawFd,
    /// Check the program first (`SpawnSpec::check_binary`), for this daemon uid.
    check_binary: Option<libc::uid_t>,
    sandbox: SandboxPlan,
}

/// The sandbox as the child applies it (PROTOCOL 16; prepared by `sys::sandbox`).
#[derive(Clone, Copy)]
struct SandboxPlan {
    on: bool,
    /// The command's own Landlock ruleset, or -1.
    ruleset: RawFd,
    /// A mount namespace to enter, or -1.
    mntns: RawFd,
    /// The user namespace that owns it, entered first, or -1.
    userns: RawFd,
    rules: *const ChildRule,
    nrules: usize,
    /// Protected names a root opened here must not hold.
    protect: *const *const libc::c_char,
    nprotect: usize,
    /// The workspace root (device, inode) its directory must lie under.
    verify: Option<(u64, u64)>,
    /// The seccomp program, or null.
    program: *const libc::sock_fprog,
    drop_bounding: bool,
    cap_last: u32,
}

impl SandboxPlan {
    const OFF: SandboxPlan = SandboxPlan {
        on: false,
        ruleset: -1,
        mntns: -1,
        userns: -1,
        rules: std::ptr::null(),
        nrules: 0,
        protect: std::ptr::null(),
        nprotect: 0,
        verify: None,
        program: std::ptr::null(),
        drop_bounding: false,
        cap_last: 0,
    };

    fn of(c: &Confined) -> SandboxPlan {
        SandboxPlan {
            on: true,
            ruleset: c.ruleset.as_ref().map_or(-1, |f| f.as_raw_fd()),
            mntns: c.mntns.as_ref().map_or(-1, |f| f.as_raw_fd()),
            userns: c.userns.as_ref().map_or(-1, |f| f.as_raw_fd()),
            rules: c.rules.as_ptr(),
            nrules: c.rules.len(),
            protect: c.protect_ptrs.as_ptr(),
            nprotect: c.protect_ptrs.len(),
            verify: c.verify,
            program: &c.program,
            drop_bounding: c.drop_bounding,
            cap_last: c.cap_last,
        }
    }
}

impl ChildPlan {
    /// A plan that points nowhere, replaced before any clone.
    const EMPTY: ChildPlan = ChildPlan {
        paths: std::ptr::null(),
        npaths: 0,
        argv: std::ptr::null(),
        envp: std::ptr::null(),
        cwd: std::ptr::null(),
        stdio: [-1; 3],
        busy: std::ptr::null(),
        nbusy: 0,
        limits: std::ptr::null(),
        nlimits: 0,
        reset: std::ptr::null(),
        nreset: 0,
        parent: 0,
        user: None,
        groups: std::ptr::null(),
        ngroups: 0,
        cgroup_procs: -1,
        tty: false,
        report: -1,
        unshare_below: -1,
        sandbox: SandboxPlan::OFF,
        check_binary: None,
    };
}

/// The steps a report names.
const FAILED_SETUP: libc::c_int = 1;
const FAILED_CWD: libc::c_int = 2;
const FAILED_EXEC: libc::c_int = 3;
const FAILED_SANDBOX: libc::c_int = 4;
/// With the root's number in the bits above the low eight.
const FAILED_ROOT: libc::c_int = 5;
const FAILED_PROTECT: libc::c_int = 6;
const FAILED_OUTSIDE: libc::c_int = 7;
/// The first of `Unsafe`'s steps (one each).
const FAILED_BINARY: libc::c_int = 10;

/// Raw system calls for the child between clone and exec. It shares the loop's memory,
/// thread-local storage included, while the loop runs on: the libc wrappers would write
/// `errno` into the loop's own (and glibc's `setuid` would signal the loop's threads), so
/// the child calls the kernel directly and gets `-errno` back, as glibc's `posix_spawn`
/// does. On an architecture without them here, the loop waits (`CLONE_VFORK`) instead.
mod raw {
    /// `nr(a...)`: the result, or `-errno`.
    ///
    /// # Safety
    /// A system call with the given arguments: the caller vouches for them.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn call(nr: libc::c_long, a: [usize; 6]) -> isize {
        let ret: isize;
        // SAFETY: the x86_64 syscall convention; rcx and r11 are clobbered by the kernel.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr as isize => ret,
                in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
                in("r10") a[3], in("r8") a[4], in("r9") a[5],
                lateout("rcx") _, lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// `nr(a...)`: the result, or `-errno`.
    ///
    /// # Safety
    /// A system call with the given arguments: the caller vouches for them.
    #[cfg(target_arch = "aarch64")]
    pub unsafe fn call(nr: libc::c_long, a: [usize; 6]) -> isize {
        let ret: isize;
        // SAFETY: the aarch64 syscall convention (x8 the number, x0..x5 the arguments).
        unsafe {
            std::arch::asm!(
                "svc 0",
                in("x8") nr,
                inlateout("x0") a[0] as isize => ret,
                in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
                options(nostack),
            );
        }
        ret
    }

    /// `nr(a...)` through libc: the result, or `-errno`. Only where the parent waits for
    /// the child (`CLONE_VFORK`), so the `errno` it writes is nobody's.
    ///
    /// # Safety
    /// A system call with the given arguments: the caller vouches for them.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub unsafe fn call(nr: libc::c_long, a: [usize; 6]) -> isize {
        // SAFETY: as the caller vouches; errno read right after, on this task.
        unsafe {
            let r = libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
            if r < 0 {
                -(*libc::__errno_location() as isize)
            } else {
                r as isize
            }
        }
    }

    /// The clone flags: the child shares memory and the loop goes on, where the child
    /// can make raw system calls.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub const CLONE: libc::c_int = libc::CLONE_VM;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const CLONE: libc::c_int = libc::CLONE_VM | libc::CLONE_VFORK;
}

/// A system call of the child with up to six arguments (see `raw`).
macro_rules! sys {
    ($nr:expr $(, $a:expr)* $(,)?) => {{
        let mut args = [0usize; 6];
        let given = [$($a as usize),*];
        args[..given.len()].copy_from_slice(&given);
        raw::call($nr, args)
    }};
}

/// Runs in the cloned child, on its own stack, sharing the daemon's memory while the loop
/// goes on: signals, stdio (and nothing else open but its report pipe), cgroup, session,
/// limits, user, parent-death signal, directory, then exec of the first candidate path
/// that runs. Only raw system calls (see `raw`); a failed step is reported and the child
/// exits.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` of a `Prepared` the loop keeps, unmoved and
    // untouched, until this child has exec'd or been reaped.
    let plan = unsafe { &*arg.cast::<ChildPlan>() };
    // SAFETY: as `run_plan` asks: the plan and its memory stay put, this is the child.
    unsafe { run_plan(plan, Done::NOTHING) }
}

/// A spare's gate (`Early::gate`): it is doing its early steps; they are done and it
/// waits; the loop handed it a plan; an early step failed before any plan came.
const STARTING: u32 = 0;
const READY: u32 = 1;
const GO: u32 = 2;
const FAILED: u32 = 3;

/// What a spare child reads: the loop clones it ahead of the spawn that takes it, and it
/// does what is the same for every command it could be (`early_steps`), then waits on
/// `gate` until the loop has put a plan in `plan` and opened the gate.
struct Early {
    gate: std::sync::atomic::AtomicU32,
    plan: std::sync::atomic::AtomicPtr<ChildPlan>,
    /// As `Prepared::reset`, the same for every command.
    reset: Vec<libc::c_int>,
    parent: libc::pid_t,
    /// The sandbox's common part, for a spare of sandboxed commands.
    confine: Option<super::sandbox::Common>,
    stack: Vec<u8>,
}

/// Runs in a spare child: the early steps, then the plan the loop hands it. Shares the
/// loop's memory and descriptor table (`CLONE_FILES`) and touches neither until it has
/// its plan, whose first step gives it a table of its own.
extern "C" fn spare_main(arg: *mut libc::c_void) -> libc::c_int {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    // SAFETY: `arg` is the `Early` of a spare the loop keeps, unmoved, until this child
    // has exec'd or been reaped.
    let early = unsafe { &*arg.cast::<Early>() };
    // SAFETY: raw system calls on memory prepared before the clone and this stack.
    unsafe {
        let failed = early_steps(early).err();
        let parked = if failed.is_some() { FAILED } else { READY };
        if early
            .gate
            .compare_exchange(STARTING, parked, AcqRel, Acquire)
            .is_ok()
            && failed.is_some()
        {
            // No plan yet, so no report pipe: the loop sees the gate, or the reap.
            sys!(libc::SYS_exit_group, 126);
        }
        while early.gate.load(Acquire) != GO {
            sys!(
                libc::SYS_futex,
                early.gate.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                READY,
                0
            );
        }
        let done = Done {
            common: true,
            confined: early.confine.is_some(),
            failed,
        };
        run_plan(&*early.plan.load(Acquire), done)
    }
}

/// What every spare does first, and a spare of sandboxed commands then applies the
/// sandbox's common part (`Done`). Returns the failed step and `-errno`.
///
/// # Safety
/// Raw system calls on `early`'s memory; for the spare child before it has its plan.
unsafe fn early_steps(early: &Early) -> Result<(), (libc::c_int, isize)> {
    // SAFETY: raw system calls on memory the loop keeps and this stack.
    unsafe {
        sys!(
            libc::SYS_prctl,
            libc::PR_SET_NAME,
            SPARE_NAME.as_ptr(),
            0,
            0,
            0
        );
        reset_signals(early.reset.as_ptr(), early.reset.len());
        let r = sys!(libc::SYS_setsid);
        if r < 0 {
            return Err((FAILED_SETUP, r));
        }
        // Cleared again by the user switch, and set again after it (`run_plan`).
        let r = sys!(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL,
            0,
            0,
            0
        );
        if r < 0 {
            return Err((FAILED_SETUP, r));
        }
        if sys!(libc::SYS_getppid) != early.parent as isize {
            sys!(libc::SYS_exit_group, 137);
        }
        if let Some(c) = &early.confine {
            if c.drop_bounding {
                drop_privileges(c.cap_last).map_err(|r| (FAILED_SANDBOX, r))?;
            }
            // Before the program: without `CAP_SYS_ADMIN` it loads only with this set.
            let r = sys!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if r < 0 {
                return Err((FAILED_SANDBOX, r));
            }
            // seccomp(SECCOMP_SET_MODE_FILTER, 0, program): every later step is a call
            // it allows.
            let r = sys!(
                libc::SYS_seccomp,
                1,
                0,
                &c.program as *const libc::sock_fprog
            );
            if r < 0 {
                return Err((FAILED_SANDBOX, r));
            }
        }
    }
    Ok(())
}

/// What `ps` shows for a spare until it execs its command.
pub const SPARE_NAME: &std::ffi::CStr = c"execd-spare";

/// What a spare child did before it was handed its plan (`Early`): the steps that are the
/// same for every command it could be.
#[derive(Clone, Copy)]
struct Done {
    /// Signals reset, its own session, the parent-death signal.
    common: bool,
    /// The sandbox's part that is the same for every command of its kind: the bounding
    /// set emptied, `SECBIT_NOROOT` locked, `no_new_privs`, the seccomp program loaded.
    confined: bool,
    /// A step of those that failed (step, `-errno`): reported as the plan's first thing.
    failed: Option<(libc::c_int, isize)>,
}

impl Done {
    const NOTHING: Done = Done {
        common: false,
        confined: false,
        failed: None,
    };
}

/// The child's steps from `plan` to exec, less what `done` says is done.
///
/// # Safety
/// For the child between clone and exec, on its own stack: `plan` and everything it points
/// into stay put and untouched by the loop until the child has exec'd or been reaped.
unsafe fn run_plan(plan: &ChildPlan, done: Done) -> libc::c_int {
    // SAFETY: raw system calls on memory prepared before the clone and this stack.
    unsafe {
        let fail = |step: libc::c_int, ret: isize| -> libc::c_int {
            let err = (-ret) as i32;
            let mut msg = [0u8; 8];
            msg[..4].copy_from_slice(&step.to_ne_bytes());
            msg[4..].copy_from_slice(&err.to_ne_bytes());
            // Eight bytes into an empty pipe: whole, at once.
            sys!(libc::SYS_write, plan.report, msg.as_ptr(), msg.len());
            sys!(libc::SYS_exit_group, 127);
            127
        };
        // A child sharing the loop's table touches nothing of it but its report pipe
        // before it has its own: the slots below `unshare_below`, nothing above.
        if plan.unshare_below >= 0 {
            let r = sys!(
                libc::SYS_close_range,
                plan.unshare_below as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_UNSHARE
            );
            if r < 0 {
                return fail(FAILED_SETUP, r);
            }
            sys!(libc::SYS_write, plan.report, [UNSHARED].as_ptr(), 1);
        }
        if let Some((step, r)) = done.failed {
            return fail(step, r);
        }
        if done.common {
            // What was sent to the spare while it waited (blocked: all of it stays pending,
            // `systemctl kill` reaches every process of the unit) was not sent to this
            // command: dropped, each signal's disposition as it was.
            discard_pending_signals();
        }
        for &fd in std::slice::from_raw_parts(plan.busy, plan.nbusy) {
            sys!(libc::SYS_close, fd);
        }
        if !done.common {
            reset_signals(plan.reset, plan.nreset);
        }
        for (target, &fd) in plan.stdio.iter().enumerate() {
            // dup3 clears close-on-exec on the copy. The daemon keeps 0, 1 and 2 open, so
            // a pipe is never already at its target.
            let r = sys!(libc::SYS_dup3, fd, target, 0);
            if r < 0 {
                return fail(FAILED_SETUP, r);
            }
        }
        // The roots a request named join the command's own ruleset, opened here (never
        // by the loop) from the bases that are about to be closed.
        let sb = &plan.sandbox;
        if sb.on {
            if let Err((step, r)) = sandbox_rules(sb) {
                return fail(step, r);
            }
        }
        // Every other descriptor goes now rather than at exec (all are close-on-exec):
        // nothing of the daemon's stays open here while a slow step runs.
        close_all_but(
            3,
            [
                plan.cgroup_procs,
                plan.report,
                sb.ruleset,
                sb.mntns,
                sb.userns,
            ],
        );
        // Into the command's cgroup before anything else, and before the user switch:
        // writing "0" moves the writer, checked against who opened the file (the daemon).
        if plan.cgroup_procs >= 0 {
            let r = sys!(libc::SYS_write, plan.cgroup_procs, b"0".as_ptr(), 1);
            if r != 1 {
                return fail(FAILED_SETUP, r.min(-libc::EIO as isize));
            }
            sys!(libc::SYS_close, plan.cgroup_procs);
        }
        if !done.common {
            let r = sys!(libc::SYS_setsid);
            if r < 0 {
                return fail(FAILED_SETUP, r);
            }
        }
        // A new session has no controlling terminal: its PTY becomes it (descriptor 1
        // is the slave for a PTY command and for a shell, whose stdin is a socket).
        if plan.tty {
            let r = sys!(libc::SYS_ioctl, 1, libc::TIOCSCTTY, 0);
            if r < 0 {
                return fail(FAILED_SETUP, r);
            }
        }
        // Never early: a low descriptor limit must not be in force while the roots above
        // are opened (the lowest free numbers here are above the slots).
        if let Err(r) = set_limits(plan.limits, plan.nlimits) {
            return fail(FAILED_SETUP, r);
        }
        // The sandbox's mount namespace and the bounding set need privileges the user
        // switch gives up.
        if sb.on {
            if let Err(r) = sandbox_enter(sb, done.confined) {
                return fail(FAILED_SANDBOX, r);
            }
        }
        if let Some((uid, gid)) = plan.user {
            for r in [
                sys!(libc::SYS_setgroups, plan.ngroups, plan.groups),
                sys!(libc::SYS_setgid, gid),
                sys!(libc::SYS_setuid, uid),
            ] {
                if r < 0 {
                    return fail(FAILED_SETUP, r);
                }
            }
        }
        // After the user switch: the kernel clears the parent-death signal when
        // credentials change.
        let r = sys!(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL,
            0,
            0,
            0
        );
        if r < 0 {
            return fail(FAILED_SETUP, r);
        }
        // The daemon may have died before prctl: then nobody would ever kill this child.
        if sys!(libc::SYS_getppid) != plan.parent as isize {
            sys!(libc::SYS_exit_group, 137);
        }
        let r = sys!(libc::SYS_chdir, plan.cwd);
        if r < 0 {
            return fail(FAILED_CWD, r);
        }
        // Last before exec: nothing after this may need what the sandbox takes away.
        if sb.on {
            if let Err((step, r)) = sandbox_apply(sb, done.confined) {
                return fail(step, r);
            }
        }
        // Commands start with no signal blocked, whatever the daemon inherited.
        let none = 0u64;
        sys!(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const u64,
            0,
            8
        );
        // Before anything of the program runs (an upgrade's new binary, PROTOCOL 13).
        if let Some(trusted) = plan.check_binary {
            let first = std::slice::from_raw_parts(plan.paths, plan.npaths).first();
            let checked = match first {
                Some(&path) => check_binary(path, trusted),
                None => Err((Unsafe::Unreadable, -(libc::ENOENT as isize))),
            };
            if let Err((u, r)) = checked {
                return fail(u.step(), r);
            }
        }
        // As execvp searches PATH: a path that is not there (or not a directory) passes
        // to the next; one that may not be run is remembered; anything else is the answer.
        // A directory is remembered apart (the kernel says EACCES for it too): when
        // nothing else was found, the answer is that it is one (`run -- /tmp`).
        let (mut denied, mut directory) = (false, false);
        for &path in std::slice::from_raw_parts(plan.paths, plan.npaths) {
            let r = sys!(libc::SYS_execve, path, plan.argv, plan.envp);
            match (-r) as i32 {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES if is_directory(path) => directory = true,
                libc::EACCES => denied = true,
                _ => return fail(FAILED_EXEC, r),
            }
        }
        let err = match (denied, directory) {
            (true, _) => libc::EACCES,
            (false, true) => libc::EISDIR,
            (false, false) => libc::ENOENT,
        };
        fail(FAILED_EXEC, -(err as isize))
    }
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens each root a request named (beneath the trusted root it lies in) and adds it to
/// the command's ruleset; a write root must not hold a protected name (no namespace is
/// made per spawn to keep it read-only). Returns the failed step and `-errno`.
///
/// # Safety
/// Raw system calls on the plan's memory; for the child between clone and exec.
unsafe fn sandbox_rules(sb: &SandboxPlan) -> Result<(), (libc::c_int, isize)> {
    // SAFETY: the plan's arrays live in the `Confined` the loop keeps.
    let (rules, protect) = unsafe {
        (
            std::slice::from_raw_parts(sb.rules, sb.nrules),
            std::slice::from_raw_parts(sb.protect, sb.nprotect),
        )
    };
    for (i, rule) in rules.iter().enumerate() {
        let step = |s: libc::c_int| s | ((i as libc::c_int) << 8);
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: rule.resolve,
        };
        // SAFETY: a NUL-terminated path and an open_how on this stack.
        let fd = unsafe {
            sys!(
                libc::SYS_openat2,
                rule.base,
                rule.path,
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>()
            )
        };
        if fd < 0 {
            return Err((step(FAILED_ROOT), fd));
        }
        // SAFETY: stat is plain old data the kernel fills.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of the descriptor just opened, into `st`.
        let r = unsafe { sys!(libc::SYS_fstat, fd, &mut st as *mut libc::stat) };
        let dir = r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if rule.write && dir {
            for &name in protect {
                // SAFETY: fstatat of a name in the opened root, into `st`.
                let r = unsafe {
                    sys!(
                        libc::SYS_newfstatat,
                        fd,
                        name,
                        &mut st as *mut libc::stat,
                        libc::AT_SYMLINK_NOFOLLOW
                    )
                };
                if r == 0 {
                    // SAFETY: closing what this function opened.
                    unsafe { sys!(libc::SYS_close, fd) };
                    return Err((step(FAILED_PROTECT), -(libc::EEXIST as isize)));
                }
            }
        }
        let attr = super::sandbox::PathBeneathAttr {
            allowed_access: if dir { rule.access } else { rule.file_access },
            parent_fd: fd as i32,
        };
        // SAFETY: landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, &attr, 0).
        let r = unsafe {
            sys!(
                libc::SYS_landlock_add_rule,
                sb.ruleset,
                1,
                &attr as *const super::sandbox::PathBeneathAttr,
                0
            )
        };
        // SAFETY: closing what this function opened.
        unsafe { sys!(libc::SYS_close, fd) };
        if r < 0 {
            return Err((step(FAILED_ROOT), r));
        }
    }
    Ok(())
}

/// Before the user switch: enters the mount namespace, empties the bounding set and
/// locks `SECBIT_NOROOT` (root inside a sandbox is not root: after exec it holds no
/// capability), with `CAP_SETPCAP`, which the switch gives up.
///
/// # Safety
/// Raw system calls only; for the child between clone and exec.
unsafe fn sandbox_enter(sb: &SandboxPlan, done: bool) -> Result<(), isize> {
    let ok = |r: isize| if r < 0 { Err(r) } else { Ok(()) };
    if sb.userns >= 0 {
        // The user namespace first: it owns the mount namespace (a daemon not root makes
        // both). The command is who it was in it; files of other owners show as the
        // overflow id.
        // SAFETY: setns with a namespace descriptor the plan holds.
        ok(unsafe { sys!(libc::SYS_setns, sb.userns, libc::CLONE_NEWUSER) })?;
        // SAFETY: it is ours, and done with.
        unsafe { sys!(libc::SYS_close, sb.userns) };
    }
    if sb.mntns >= 0 {
        // SAFETY: setns with a namespace descriptor the plan holds.
        ok(unsafe { sys!(libc::SYS_setns, sb.mntns, libc::CLONE_NEWNS) })?;
        // SAFETY: it is ours, and done with.
        unsafe { sys!(libc::SYS_close, sb.mntns) };
    }
    if sb.drop_bounding && !done {
        // SAFETY: raw system calls only, as this function's.
        unsafe { drop_privileges(sb.cap_last) }?;
    }
    Ok(())
}

/// Empties the bounding set and locks `SECBIT_NOROOT` (with `CAP_SETPCAP`).
///
/// # Safety
/// Raw system calls only; for the child between clone and exec.
unsafe fn drop_privileges(cap_last: u32) -> Result<(), isize> {
    let ok = |r: isize| if r < 0 { Err(r) } else { Ok(()) };
    for cap in 0..=cap_last {
        // SAFETY: prctl with integer arguments.
        let r = unsafe { sys!(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        // A capability this kernel does not know is not in the set.
        if r < 0 && r != -(libc::EINVAL as isize) {
            return Err(r);
        }
    }
    // SECBIT_NOROOT, _LOCKED, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, _LOCKED, on top of
    // whatever is set already.
    // SAFETY: prctl with integer arguments.
    let cur = unsafe { sys!(libc::SYS_prctl, libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    ok(cur)?;
    // SAFETY: prctl with integer arguments.
    ok(unsafe {
        sys!(
            libc::SYS_prctl,
            libc::PR_SET_SECUREBITS,
            cur | 0xe3,
            0,
            0,
            0
        )
    })
}

/// Puts every signal of `reset` back to its default: no handler of the daemon may ever
/// run in a child, and signals are unblocked only after this. SIGPIPE, which Rust
/// ignores, too. (The kernel's sigaction: handler, flags, [restorer,] mask: all zero is
/// SIG_DFL.)
///
/// # Safety
/// `reset` points to `n` signal numbers; for the child between clone and exec.
unsafe fn reset_signals(reset: *const libc::c_int, n: usize) {
    let dfl = [0usize; 4];
    // SAFETY: as the caller vouches.
    for &sig in unsafe { std::slice::from_raw_parts(reset, n) } {
        // SAFETY: rt_sigaction with a zeroed action on this stack.
        unsafe { sys!(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), 0, 8) };
    }
}

/// Drops every signal pending on this process: setting a signal ignored discards it, and
/// its disposition is then put back as it was.
///
/// # Safety
/// Raw system calls only; for the child between clone and exec.
unsafe fn discard_pending_signals() {
    let mut pending = 0u64;
    // SAFETY: rt_sigpending into a local of the kernel's sigset size.
    if unsafe { sys!(libc::SYS_rt_sigpending, &mut pending as *mut u64, 8) } < 0 {
        return;
    }
    // The kernel's sigaction (see `reset_signals`): SIG_IGN is handler 1.
    let ignore = [1usize, 0, 0, 0];
    for sig in 1..=64usize {
        if pending & (1 << (sig - 1)) == 0 {
            continue;
        }
        let mut old = [0usize; 4];
        // SAFETY: rt_sigaction with actions on this stack.
        unsafe {
            sys!(
                libc::SYS_rt_sigaction,
                sig,
                ignore.as_ptr(),
                old.as_mut_ptr(),
                8
            );
            sys!(libc::SYS_rt_sigaction, sig, old.as_ptr(), 0, 8);
        }
    }
}

/// Sets the `n` resource limits at `limits` on this process.
///
/// # Safety
/// `limits` points to `n` pairs; for the child between clone and exec.
unsafe fn set_limits(
    limits: *const (libc::__rlimit_resource_t, libc::rlimit),
    n: usize,
) -> Result<(), isize> {
    // SAFETY: as the caller vouches.
    for (res, lim) in unsafe { std::slice::from_raw_parts(limits, n) } {
        // SAFETY: prlimit64 on ourselves with a limit the caller's memory holds.
        let r = unsafe { sys!(libc::SYS_prlimit64, 0, *res, lim as *const libc::rlimit, 0) };
        if r < 0 {
            return Err(r);
        }
    }
    Ok(())
}

/// After the user switch and `chdir`, last before exec: checks the directory lies under
/// its workspace's root, clears inheritable and ambient capabilities, sets
/// `no_new_privs`, restricts itself with its ruleset and loads the seccomp program.
///
/// # Safety
/// Raw system calls on the plan's memory; for the child between clone and exec.
unsafe fn sandbox_apply(sb: &SandboxPlan, done: bool) -> Result<(), (libc::c_int, isize)> {
    let ok = |r: isize| {
        if r < 0 {
            Err((FAILED_SANDBOX, r))
        } else {
            Ok(())
        }
    };
    if let Some(root) = sb.verify {
        // SAFETY: raw system calls on this stack.
        unsafe { under(root) }?;
    }
    let mut hdr = super::sandbox::CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [super::sandbox::CapData::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data words on this stack.
    unsafe {
        ok(sys!(
            libc::SYS_capget,
            &mut hdr as *mut _,
            data.as_mut_ptr()
        ))?;
        data[0].inheritable = 0;
        data[1].inheritable = 0;
        ok(sys!(libc::SYS_capset, &mut hdr as *mut _, data.as_ptr()))?;
        // PR_CAP_AMBIENT_CLEAR_ALL
        ok(sys!(libc::SYS_prctl, libc::PR_CAP_AMBIENT, 4, 0, 0, 0))?;
        ok(sys!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        if sb.ruleset >= 0 {
            ok(sys!(libc::SYS_landlock_restrict_self, sb.ruleset, 0))?;
            sys!(libc::SYS_close, sb.ruleset);
        }
        if !sb.program.is_null() && !done {
            // seccomp(SECCOMP_SET_MODE_FILTER, 0, program)
            ok(sys!(libc::SYS_seccomp, 1, 0, sb.program))?;
        }
    }
    Ok(())
}

/// Whether the working directory lies under the directory `root` (device, inode): walks
/// `..` up from `.` until it meets it, or the top.
///
/// # Safety
/// Raw system calls only; for the child between clone and exec.
unsafe fn under(root: (u64, u64)) -> Result<(), (libc::c_int, isize)> {
    const MAX_DEPTH: usize = 4096;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: openat of "." with plain flags.
    let mut cur = unsafe { sys!(libc::SYS_openat, libc::AT_FDCWD, c".".as_ptr(), flags) };
    if cur < 0 {
        return Err((FAILED_SANDBOX, cur));
    }
    // SAFETY: stat is plain old data the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let mut last = (u64::MAX, u64::MAX);
    for _ in 0..MAX_DEPTH {
        // SAFETY: fstat of a descriptor this function opened.
        let r = unsafe { sys!(libc::SYS_fstat, cur, &mut st as *mut libc::stat) };
        if r < 0 {
            // SAFETY: closing what this function opened.
            unsafe { sys!(libc::SYS_close, cur) };
            return Err((FAILED_SANDBOX, r));
        }
        let here = (st.st_dev, st.st_ino);
        if here == root {
            // SAFETY: closing what this function opened.
            unsafe { sys!(libc::SYS_close, cur) };
            return Ok(());
        }
        if here == last {
            break; // `..` of the top is the top
        }
        last = here;
        // SAFETY: openat of ".." beneath a descriptor this function opened.
        let up = unsafe { sys!(libc::SYS_openat, cur, c"..".as_ptr(), flags) };
        // SAFETY: closing what this function opened.
        unsafe { sys!(libc::SYS_close, cur) };
        if up < 0 {
            return Err((FAILED_SANDBOX, up));
        }
        cur = up;
    }
    // SAFETY: closing what this function opened.
    unsafe { sys!(libc::SYS_close, cur) };
    Err((FAILED_OUTSIDE, -(libc::EXDEV as isize)))
}

/// Whether `path` (a NUL-terminated path) names a directory, by a raw `newfstatat`.
///
/// # Safety
/// Raw system calls only, allocation-free (the stat buffer is on the stack); for the
/// child between clone and exec. `path` must point to a NUL-terminated string.
unsafe fn is_directory(path: *const libc::c_char) -> bool {
    // SAFETY: `st` is a plain C struct the kernel fills; zeroed is a valid value of it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a raw system call on a NUL-terminated path and a buffer of the right size.
    let r = unsafe {
        sys!(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            path,
            &mut st as *mut libc::stat,
            0
        )
    };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Checks `path` as an upgrade's binary for a daemon of uid `trusted` (PROTOCOL 13): the
/// file it names (symlinks followed) must pass `unsafe_file`, and every directory of its
/// real path (read back from `/proc/self/fd`) `unsafe_dir`. The reason and the (negative)
/// error when not.
///
/// # Safety
/// Raw system calls on the child's own stack only; for the child between clone and exec.
unsafe fn check_binary(path: *const libc::c_char, trusted: u32) -> Result<(), (Unsafe, isize)> {
    const MASK: u32 = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_UID;
    let unreadable = |r: isize| Err((Unsafe::Unreadable, r.min(-1)));
    // SAFETY: raw system calls with pointers into this stack frame and the plan.
    unsafe {
        let fd = sys!(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path,
            libc::O_PATH | libc::O_CLOEXEC
        );
        if fd < 0 {
            return unreadable(fd);
        }
        let mut stx: libc::statx = std::mem::zeroed();
        let r = sys!(
            libc::SYS_statx,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            MASK,
            &mut stx as *mut libc::statx
        );
        if r < 0 {
            return unreadable(r);
        }
        if let Some(u) = unsafe_file(stx.stx_mode as u32, stx.stx_uid, trusted) {
            return Err((u, 0));
        }
        // "/proc/self/fd/N": where the file really is, every symlink resolved.
        let mut link = [0u8; 32];
        let prefix = b"/proc/self/fd/";
        link[..prefix.len()].copy_from_slice(prefix);
        let mut digits = [0u8; 12];
        let (mut n, mut v) = (0, fd as usize);
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for i in 0..n {
            link[prefix.len() + i] = digits[n - 1 - i];
        }
        let mut real = [0u8; 4096];
        let len = sys!(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            link.as_ptr(),
            real.as_mut_ptr(),
            real.len() - 1
        );
        sys!(libc::SYS_close, fd);
        if len < 0 {
            return unreadable(len);
        }
        let len = len as usize;
        if len >= real.len() - 1 {
            return unreadable(-(libc::ENAMETOOLONG as isize));
        }
        if real[0] != b'/' {
            return unreadable(-(libc::ENOENT as isize));
        }
        // Each directory above it, from `/` down: the path up to each `/` but the first
        // (which is `/` itself).
        for i in 0..len {
            if real[i] != b'/' {
                continue;
            }
            let end = if i == 0 { 1 } else { i };
            let kept = real[end];
            real[end] = 0;
            let r = sys!(
                libc::SYS_statx,
                libc::AT_FDCWD,
                real.as_ptr(),
                0,
                MASK,
                &mut stx as *mut libc::statx
            );
            real[end] = kept;
            if r < 0 {
                return unreadable(r);
            }
            if let Some(u) = unsafe_dir(stx.stx_mode as u32, stx.stx_uid, trusted) {
                return Err((u, 0));
            }
        }
        Ok(())
    }
}

/// Closes every descriptor from `first` up except the ones in `keep` (`-1` keeps nothing),
/// with `close_range(2)`: a few system calls; on a kernel without it they stay until exec
/// closes them, being close-on-exec.
///
/// # Safety
/// Raw system calls only, allocation-free; for the child between clone and exec.
unsafe fn close_all_but<const N: usize>(first: RawFd, mut keep: [RawFd; N]) {
    let close_range = |lo: RawFd, hi: RawFd| {
        if lo <= hi {
            // SAFETY: close_range takes plain integers; closing descriptors nobody here uses.
            unsafe {
                sys!(
                    libc::SYS_close_range,
                    lo as libc::c_uint,
                    hi as libc::c_uint,
                    0
                )
            };
        }
    };
    keep.sort_unstable();
    let mut lo = first;
    for k in keep {
        if k >= lo {
            close_range(lo, k - 1);
            lo = k + 1;
        }
    }
    close_range(lo, RawFd::MAX);
}

/// Where `program` may be, in the order `execvp` tries: itself when it holds a `/`, else
/// each entry of `path_var` (or the default path) joined with it, an empty entry meaning
/// the working directory. Nothing is looked at here: the child tries each.
fn candidates(program: &[u8], path_var: Option<&OsStr>) -> io::Result<Vec<CString>> {
    if program.contains(&b'/') {
        return Ok(vec![cstring(program)?]);
    }
    let dirs = path_var.unwrap_or_else(|| OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(dirs)
        .map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            cstring(
                dir.join(OsStr::from_bytes(program))
                    .into_os_string()
                    .into_vec(),
            )
        })
        .collect()
}

/// Opens `/dev/null` close-on-exec.
fn dev_null() -> io::Result<OwnedFd> {
    // SAFETY: a valid NUL-terminated path and plain flags.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open succeeded; we own the descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Signals a child must reset before it runs anything: those the daemon catches, and
/// SIGPIPE, which the Rust runtime ignores. Signals ignored by whoever started the daemon
/// (`nohup`'s SIGHUP) stay ignored, as exec keeps them; but for SIGCHLD, which the daemon
/// itself puts back to the default (`reap::ExitSignals`).
fn signals_to_reset() -> Vec<libc::c_int> {
    (1..libc::SIGRTMAX())
        .filter(|&sig| {
            // SAFETY: sigaction with a null new action only reads the current one.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a pointer to a live sigaction.
            let ok = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0;
            let caught = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            ok && (caught || sig == libc::SIGPIPE)
        })
        .collect()
}

/// Starts commands. Holds what is the same for every spawn (the base environment, the
/// signals a child resets, the resource limits).
pub struct Spawner {
    /// The base environment: names, and `NAME=value` ready for `execve`. Shared with each
    /// spawn in flight, whose `envp` points into it rather than copying it.
    base_env: std::rc::Rc<[(OsString, CString)]>,
    /// `/dev/null`, the stdin of every terminal.
    null: OwnedFd,
    shared: Shared,
    stacks: Stacks,
    /// None: every child gets a copy of the table at its clone (`Slots`).
    slots: Option<std::rc::Rc<std::cell::RefCell<Slots>>>,
    spares: Spares,
}

/// A child cloned ahead of the spawn that takes it (`spare_main`).
struct Spare {
    pid: i32,
    early: Box<Early>,
}

/// The spares: at most one for commands without a sandbox and one for sandboxed commands
/// of one kind (`sandbox::Common`), made at the end of a turn in which a spawn of that
/// kind asked for one (`Spawner::replenish`), killed when the daemon stops or upgrades
/// (`Spawner::quit_spares`). An idle daemon keeps them, asleep.
struct Spares {
    allowed: bool,
    plain: Option<Spare>,
    confined: Option<Spare>,
    /// Kinds spawns asked for since the last `replenish`.
    want_plain: bool,
    want_confined: Option<super::sandbox::Common>,
    /// Spares sent SIGKILL: their memory stays until they are reaped.
    quitting: Vec<Spare>,
}

impl Spawner {
    /// A child stack: one a finished spawn gave back, else a new one. Its contents do not
    /// matter (a stack is written before it is read).
    fn stack(&self) -> Vec<u8> {
        self.stacks
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| vec![0u8; CHILD_STACK])
    }

    /// Build this after the daemon's signal handlers are installed: they are what a child
    /// must reset. `child_nofile` is the descriptor limit to give back (see `raise_nofile`).
    /// `withheld` names variables of the daemon's environment no command may see.
    pub fn new(
        clean_env: bool,
        withheld: &[&str],
        rlimits: &[(Rlimit, u64)],
        child_nofile: Option<(u64, u64)>,
    ) -> io::Result<Spawner> {
        // The daemon's own cookie (when an execd command started it) is never passed on:
        // each command gets its own, last.
        let vars: Vec<(OsString, OsString)> = if clean_env {
            Vec::new()
        } else {
            std::env::vars_os()
                .filter(|(k, _)| {
                    !withheld.iter().any(|w| k == *w) && k != cookie::VAR && k != cookie::TAG_VAR
                })
                .collect()
        };
        let path_var = vars
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let base_env = vars
            .into_iter()
            .map(|(k, v)| Ok((k.clone(), env_entry(k.as_bytes(), v.as_bytes())?)))
            .collect::<io::Result<Vec<_>>>()?
            .into();
        let as_rlim = |v: u64| {
            if v == u64::MAX {
                libc::RLIM_INFINITY
            } else {
                v as libc::rlim_t
            }
        };
        // The daemon's raised descriptor limit goes back to what the child would have had;
        // the configured limits apply on top.
        let restore = child_nofile.map(|(soft, hard)| {
            (
                libc::RLIMIT_NOFILE,
                libc::rlimit {
                    rlim_cur: as_rlim(soft),
                    rlim_max: as_rlim(hard),
                },
            )
        });
        check_limits(rlimits)?;
        let limits = restore
            .into_iter()
            .chain(rlimits.iter().map(|&(r, v)| {
                (
                    rlimit_resource(r),
                    libc::rlimit {
                        rlim_cur: as_rlim(v),
                        rlim_max: as_rlim(v),
                    },
                )
            }))
            .collect();
        let shared = Shared {
            path_var,
            reset: signals_to_reset(),
            limits,
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
        };
        Ok(Spawner {
            base_env,
            null: dev_null()?,
            shared,
            stacks: Stacks::default(),
            slots: Slots::reserve().map(|s| {
                grow_table();
                std::rc::Rc::new(std::cell::RefCell::new(s))
            }),
            spares: Spares {
                allowed: true,
                plain: None,
                confined: None,
                want_plain: false,
                want_confined: None,
                quitting: Vec::new(),
            },
        })
    }

    /// Starts a command: prepares everything its child needs (nothing here looks at the
    /// file system) and clones it, without waiting for it. Errors are the daemon's own (out
    /// of descriptors or processes, a NUL in an argument): nothing is left behind. What the
    /// child meets later (no such program, a bad directory) comes on its report pipe.
    pub fn spawn(&mut self, spec: &SpawnSpec, confined: Option<Confined>) -> io::Result<Spawned> {
        self.spawn_with(spec, confined, true)
    }

    fn spawn_with(
        &mut self,
        spec: &SpawnSpec,
        confined: Option<Confined>,
        share: bool,
    ) -> io::Result<Spawned> {
        let (program, args): (&OsStr, Vec<&str>) = match spec.program {
            Program::Direct { program, args } => (
                OsStr::new(program.as_str()),
                args.iter().map(String::as_str).collect(),
            ),
            Program::Shell { shell, line } => (shell.as_os_str(), vec!["-c", line]),
        };
        // The request's variables override the base environment's of the same name; a
        // name the request gives twice takes its last value. Indexed by name, so a request
        // with many variables costs linear time on the loop. The cookie comes last, and a
        // request that names it is overridden: no request removes or changes it.
        let last: HashMap<&[u8], usize> = spec
            .env
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.as_bytes(), i))
            .collect();
        // A sandboxed command gets no way to the Unix sockets these name, and its
        // `TMPDIR` is the daemon's (`--tmpdir`, the one its sandbox may write), never the
        // request's (PROTOCOL 16).
        let tmpdir = confined.as_ref().and_then(|c| c.tmpdir.as_ref());
        let sandboxed = confined.is_some();
        let withheld = |name: &[u8]| {
            sandboxed && (DROPPED_ENV.iter().any(|d| d.as_bytes() == name) || name == b"TMPDIR")
        };
        let extra: Vec<CString> = spec
            .env
            .iter()
            .enumerate()
            .filter(|(i, (k, _))| {
                last.get(k.as_bytes()) == Some(i)
                    && k != cookie::VAR
                    && k != cookie::TAG_VAR
                    && !withheld(k.as_bytes())
            })
            .map(|(_, (k, v))| env_entry(k.as_bytes(), v.as_bytes()))
            .chain(tmpdir.map(|t| env_entry(b"TMPDIR", t.as_os_str().as_bytes())))
            .chain(
                spec.tag
                    .map(|t| env_entry(cookie::TAG_VAR.as_bytes(), t.as_bytes())),
            )
            .chain(std::iter::once(env_entry(
                cookie::VAR.as_bytes(),
                spec.cookie.as_bytes(),
            )))
            .collect::<io::Result<_>>()?;
        let overridden =
            |name: &OsStr| last.contains_key(name.as_bytes()) || withheld(name.as_bytes());
        // The base entries are pointed at, not copied: `Prepared` holds `base_env`.
        let base_env = std::rc::Rc::clone(&self.base_env);
        let base_ptrs: Vec<*const libc::c_char> = base_env
            .iter()
            .filter(|(name, _)| !overridden(name))
            .map(|(_, entry)| entry.as_ptr())
            .collect();
        let path = spec
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| OsString::from(v));
        let argv: Vec<CString> = std::iter::once(cstring(program.as_bytes())?)
            .chain(
                args.iter()
                    .map(|a| cstring(*a))
                    .collect::<io::Result<Vec<_>>>()?,
            )
            .collect();
        let wired = match spec.stdio {
            Stdio3::Pty(size) => Wired::pty(size)?,
            Stdio3::Shell(size) => Wired::shell(size, spec.user.map(|u| u.uid))?,
            stdio => Wired::pipes(stdio)?,
        };
        let user = spec.user.map(|u| (u.uid, u.gid, u.groups.clone()));
        let candidates = candidates(
            program.as_bytes(),
            path.as_deref().or(self.shared.path_var.as_deref()),
        )?;
        let prepared = Box::new(Prepared {
            candidate_ptrs: Vec::new(),
            candidates,
            argv_ptrs: Vec::new(),
            argv,
            base_ptrs,
            _base_env: Some(base_env),
            envp: extra,
            envp_ptrs: Vec::new(),
            cwd: cstring(spec.cwd.as_os_str().as_bytes())?,
            groups: user.as_ref().map(|u| u.2.clone()).unwrap_or_default(),
            limits: self.shared.limits.clone(),
            reset: self.shared.reset.clone(),
            confined,
            check_binary: spec.check_binary,
            stack: self.stack(),
            busy: Vec::new(),
            plan: ChildPlan::EMPTY,
        });
        self.clone_child(
            prepared,
            wired,
            user.map(|u| (u.0, u.1)),
            spec.cgroup_procs,
            share,
        )
    }

    /// Reserves the slots (`Slots`) again, as low as the table allows now: an upgrade's
    /// new image reserved its first while the numbers its state came under were still
    /// open, below them. Kept as they are while a spawn holds one.
    pub fn reserve_slots_again(&mut self) {
        if self
            .slots
            .as_ref()
            .is_some_and(|s| std::rc::Rc::strong_count(s) > 1)
        {
            return;
        }
        self.slots = None;
        self.slots = Slots::reserve().map(|s| std::rc::Rc::new(std::cell::RefCell::new(s)));
    }

    /// As `spawn`, with the copying clone and no slot (`Slots`): for an upgrade's
    /// pre-flight, rare, whose end is watched apart from commands'.
    pub fn spawn_copying(&mut self, spec: &SpawnSpec) -> io::Result<Spawned> {
        self.spawn_with(spec, None, false)
    }

    /// Starts the off-loop reader (`sys::reader`): this executable, `/proc/self/exe`, with
    /// `--reader`, cloned as a command is (its own session, signals reset, every other
    /// descriptor closed, the parent-death signal) but with nothing of one: an empty
    /// environment (no cookie), no resource limit, the daemon's own user and cgroup, `/`
    /// as its directory, its stdin and stdout two pipes (the parent's ends non-blocking)
    /// and its stderr `/dev/null`. `ends.stdin` takes requests; `ends.out` gives answers.
    pub fn spawn_reader(&mut self) -> io::Result<Spawned> {
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        set_nonblocking(in_w.as_raw_fd())?;
        set_nonblocking(out_r.as_raw_fd())?;
        let wired = Wired {
            child: [Some(in_r), Some(out_w), Some(dev_null()?)],
            tty: false,
            ctty: false,
            parent: ParentEnds {
                out: out_r,
                err: None,
                stdin: Some(in_w),
                input: None,
                commands: None,
                tty_path: None,
            },
        };
        let prepared = Box::new(Prepared {
            candidate_ptrs: Vec::new(),
            candidates: vec![cstring("/proc/self/exe")?],
            argv_ptrs: Vec::new(),
            argv: vec![cstring("execd")?, cstring(super::reader::FLAG)?],
            base_ptrs: Vec::new(),
            _base_env: None,
            envp: Vec::new(),
            envp_ptrs: Vec::new(),
            cwd: cstring("/")?,
            groups: Vec::new(),
            limits: Vec::new(),
            reset: self.shared.reset.clone(),
            confined: None,
            check_binary: None,
            stack: self.stack(),
            busy: Vec::new(),
            plan: ChildPlan::EMPTY,
        });
        // Its report is read only when it ends: it takes no slot (`Slots`).
        self.clone_child(prepared, wired, None, None, false)
    }

    /// Clones the child that runs `prepared`'s plan with `wired`'s stdio, as `user` (uid,
    /// gid; the groups are in `prepared`) and into the cgroup of `cgroup_procs`.
    fn clone_child(
        &mut self,
        mut prepared: Box<Prepared>,
        wired: Wired,
        user: Option<(libc::uid_t, libc::gid_t)>,
        cgroup_procs: Option<RawFd>,
        share: bool,
    ) -> io::Result<Spawned> {
        let (report, report_w) = pipe()?;
        set_nonblocking(report.as_raw_fd())?;
        let p = &mut *prepared;
        let nul_ended = |strings: &[CString]| -> Vec<*const libc::c_char> {
            strings
                .iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        p.candidate_ptrs = nul_ended(&p.candidates);
        p.argv_ptrs = nul_ended(&p.argv);
        p.envp_ptrs = p
            .base_ptrs
            .iter()
            .copied()
            .chain(nul_ended(&p.envp))
            .collect();
        let fd = |i: usize| {
            wired.child[i]
                .as_ref()
                .map_or(self.null.as_raw_fd(), |f| f.as_raw_fd())
        };
        // The merged pipe is both stdout and stderr; a PTY slave is all three.
        let stdio = if wired.tty {
            [fd(0); 3]
        } else {
            [
                fd(0),
                fd(1),
                wired.child[2].as_ref().map_or(fd(1), |f| f.as_raw_fd()),
            ]
        };
        let mut report_fd = report_w.as_raw_fd();
        let mut cgroup_fd = cgroup_procs.unwrap_or(-1);
        let mut stdio = stdio;
        let mut unshare_below = -1;
        let mut sandbox = p
            .confined
            .as_ref()
            .map_or(SandboxPlan::OFF, SandboxPlan::of);
        let lease = match &self.slots {
            Some(slots) if share => {
                let mut fds: Vec<RawFd> = stdio.to_vec();
                fds.push(report_fd);
                fds.extend((cgroup_fd >= 0).then_some(cgroup_fd));
                // A sandboxed child also needs its ruleset, its namespaces and the bases it
                // opens its roots from.
                fds.extend([sandbox.ruleset, sandbox.mntns, sandbox.userns]);
                if let Some(c) = &p.confined {
                    fds.extend(c.rules.iter().map(|r| r.base));
                }
                fds.retain(|fd| *fd >= 0);
                fds.sort_unstable();
                fds.dedup();
                let taken = slots.borrow_mut().take(&fds)?;
                taken.map(|(numbers, taken)| {
                    let slot =
                        |fd: RawFd| fds.iter().position(|f| *f == fd).map_or(fd, |i| numbers[i]);
                    stdio = stdio.map(slot);
                    report_fd = slot(report_fd);
                    cgroup_fd = slot(cgroup_fd);
                    sandbox.ruleset = slot(sandbox.ruleset);
                    sandbox.mntns = slot(sandbox.mntns);
                    sandbox.userns = slot(sandbox.userns);
                    if let Some(c) = &mut p.confined {
                        for rule in &mut c.rules {
                            rule.base = slot(rule.base);
                        }
                    }
                    unshare_below = numbers.iter().max().map_or(-1, |n| n + 1);
                    Lease {
                        slots: slots.clone(),
                        taken,
                    }
                })
            }
            _ => None,
        };
        if lease.is_none() {
            if let Some(slots) = &self.slots {
                p.busy = slots.borrow().busy();
            }
        }
        p.plan = ChildPlan {
            paths: p.candidate_ptrs.as_ptr(),
            npaths: p.candidates.len(),
            argv: p.argv_ptrs.as_ptr(),
            envp: p.envp_ptrs.as_ptr(),
            cwd: p.cwd.as_ptr(),
            stdio,
            busy: p.busy.as_ptr(),
            nbusy: p.busy.len(),
            limits: p.limits.as_ptr(),
            nlimits: p.limits.len(),
            reset: p.reset.as_ptr(),
            nreset: p.reset.len(),
            parent: self.shared.parent,
            user,
            groups: p.groups.as_ptr(),
            ngroups: p.groups.len(),
            cgroup_procs: cgroup_fd,
            tty: wired.ctty,
            report: report_fd,
            unshare_below,
            sandbox,
            check_binary: p.check_binary,
        };
        let plan: *mut ChildPlan = &mut p.plan;
        // A spare of its kind, cloned ahead, runs the plan when the child would share the
        // table anyway; else a child is cloned for it.
        let spare = match lease.is_some() {
            true => self.take_spare(p.confined.as_ref()),
            false => None,
        };
        let handed = spare.and_then(|spare| self.hand(spare, plan));
        let pid = match &handed {
            Some(early) => {
                // Its own stack goes unused.
                give_stack(&self.stacks, std::mem::take(&mut p.stack));
                early.pid
            }
            // SAFETY: the child runs `child_main` on its own stack with `plan`; both live
            // in `prepared`, a heap allocation that does not move, which the caller keeps
            // (`InFlight`) until the child has exec'd or been reaped.
            None => match unsafe {
                clone_child_of(child_main, &mut p.stack, unshare_below >= 0, plan.cast())
            } {
                Ok(pid) => pid,
                Err(e) => {
                    if let Some(lease) = lease {
                        lease.slots.borrow_mut().give_back(lease.taken);
                    }
                    return Err(e);
                }
            },
        };
        // The child has its own copies now, or uses the slots' until it has: ours of its
        // ends and of the report's write end close here (the slots' once it says it has
        // its own table), so its exec (or exit) is the report pipe's EOF.
        drop(wired.child);
        drop(report_w);
        Ok(Spawned {
            pid,
            ends: wired.parent,
            report,
            memory: InFlight {
                prepared,
                stacks: self.stacks.clone(),
                lease,
                spare: handed.map(|spare| spare.early),
            },
        })
    }

    /// Whether spares can be made here: allowed (`allow_spares`), children share the
    /// loop's table (`Slots`) and the loop does not wait for them (`raw::CLONE`).
    fn spares_possible(&self) -> bool {
        self.spares.allowed && self.slots.is_some() && raw::CLONE & libc::CLONE_VFORK == 0
    }

    /// Whether spares may be made (they are by default); killed when not.
    pub fn allow_spares(&mut self, allowed: bool) {
        if !allowed {
            self.quit_spares();
        }
        self.spares.allowed = allowed;
    }

    /// Takes the spare of the kind a spawn needs (`confined`'s common part, or none), if
    /// one is made, and asks for one at the end of the turn (`replenish`). None for a
    /// sandbox no spare can serve.
    fn take_spare(&mut self, confined: Option<&Confined>) -> Option<Spare> {
        if !self.spares_possible() {
            return None;
        }
        let spares = &mut self.spares;
        match confined {
            None => {
                spares.want_plain = true;
                spares.plain.take()
            }
            Some(c) => {
                let kind = c.common()?;
                let fits = spares
                    .confined
                    .as_ref()
                    .and_then(|s| s.early.confine.as_ref())
                    .is_some_and(|k| k.same(&kind));
                spares.want_confined = Some(kind);
                if fits {
                    spares.confined.take()
                } else {
                    None
                }
            }
        }
    }

    /// Hands `plan` to `spare` and opens its gate. None (the spare killed) when its early
    /// steps failed: the spawn then clones a child of its own.
    fn hand(&mut self, spare: Spare, plan: *mut ChildPlan) -> Option<Spare> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
        spare.early.plan.store(plan, Release);
        let mut seen = spare.early.gate.load(Acquire);
        loop {
            if seen == FAILED {
                self.quit(spare);
                return None;
            }
            match spare.early.gate.compare_exchange(seen, GO, AcqRel, Acquire) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        // SAFETY: a futex wake on the gate, which the spare may be waiting on.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                spare.early.gate.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
        Some(spare)
    }

    /// Makes the spares spawns asked for since the last call, one per kind, and kills a
    /// sandboxed spare of another kind than the last asked for. For the end of a turn:
    /// the clone then costs no spawn its wait.
    pub fn replenish(&mut self) {
        if !self.spares_possible() {
            return;
        }
        if std::mem::take(&mut self.spares.want_plain) && self.spares.plain.is_none() {
            self.spares.plain = self.make_spare(None);
        }
        if let Some(kind) = self.spares.want_confined.take() {
            let fits = |s: &Spare| s.early.confine.as_ref().is_some_and(|k| k.same(&kind));
            if !self.spares.confined.as_ref().is_some_and(fits) {
                if let Some(old) = self.spares.confined.take() {
                    self.quit(old);
                }
                self.spares.confined = self.make_spare(Some(kind));
            }
        }
    }

    /// Clones a spare (`spare_main`). None when it cannot be made now (out of processes
    /// or memory): spawns clone their own children meanwhile.
    fn make_spare(&mut self, confine: Option<super::sandbox::Common>) -> Option<Spare> {
        let mut early = Box::new(Early {
            gate: std::sync::atomic::AtomicU32::new(STARTING),
            plan: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            reset: self.shared.reset.clone(),
            parent: self.shared.parent,
            confine,
            stack: self.stack(),
        });
        let arg: *mut Early = &mut *early;
        // SAFETY: the spare runs `spare_main` on the stack in `early`, a heap allocation
        // that does not move, kept until the spare has exec'd a command or been reaped.
        let stack = unsafe { &mut (*arg).stack };
        // SAFETY: as above.
        match unsafe { clone_child_of(spare_main, stack, true, arg.cast()) } {
            Ok(pid) => Some(Spare { pid, early }),
            Err(_) => {
                give_stack(&self.stacks, std::mem::take(&mut early.stack));
                None
            }
        }
    }

    /// Kills `spare`; its memory stays until it is reaped (`reaped`).
    fn quit(&mut self, spare: Spare) {
        // SAFETY: kill with our child's pid, not reaped yet, so still its.
        unsafe { libc::kill(spare.pid, libc::SIGKILL) };
        self.spares.quitting.push(spare);
    }

    /// Kills every spare and asks for none: for a daemon that stops or upgrades.
    pub fn quit_spares(&mut self) {
        self.spares.want_plain = false;
        self.spares.want_confined = None;
        for spare in [self.spares.plain.take(), self.spares.confined.take()]
            .into_iter()
            .flatten()
        {
            self.quit(spare);
        }
    }

    /// A child was reaped. A spare is forgotten: `Some(true)` for one that was killed,
    /// `Some(false)` for one that ended unused on its own (its early steps failed, or
    /// something killed it); None for any other child.
    pub fn reaped(&mut self, pid: i32) -> Option<bool> {
        let spares = &mut self.spares;
        let (spare, killed) = if spares.plain.as_ref().is_some_and(|s| s.pid == pid) {
            (spares.plain.take(), false)
        } else if spares.confined.as_ref().is_some_and(|s| s.pid == pid) {
            (spares.confined.take(), false)
        } else {
            let i = spares.quitting.iter().position(|s| s.pid == pid);
            (i.map(|i| spares.quitting.swap_remove(i)), true)
        };
        let spare = spare?;
        give_stack(&self.stacks, spare.early.stack);
        Some(killed)
    }

    /// Whether `pid` is a spare not yet reaped.
    pub fn is_spare(&self, pid: i32) -> bool {
        let s = &self.spares;
        [&s.plain, &s.confined]
            .into_iter()
            .flatten()
            .chain(&s.quitting)
            .any(|s| s.pid == pid)
    }

    /// Spares killed and not yet reaped (an upgrade and a shutdown wait for them).
    pub fn spares_quitting(&self) -> usize {
        self.spares.quitting.len()
    }
}

impl Drop for Spawner {
    /// Spares die with the spawner; their memory goes with the process, or stays with the
    /// spare until it is dead (`Spares::quitting` is forgotten, not freed).
    fn drop(&mut self) {
        self.quit_spares();
        for spare in std::mem::take(&mut self.spares.quitting) {
            std::mem::forget(spare.early);
        }
    }
}

/// Clones a child that runs `entry(arg)` on `stack` (sharing the loop's descriptor table
/// when `share_files`), with every signal blocked around the clone so that no handler
/// runs in the child before it resets them.
///
/// # Safety
/// `stack` and whatever `arg` points to must stay put and alive until the child has
/// exec'd or been reaped.
unsafe fn clone_child_of(
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack: &mut [u8],
    share_files: bool,
    arg: *mut libc::c_void,
) -> io::Result<i32> {
    // The stack grows down: hand clone its 16-byte-aligned top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let files = if share_files { libc::CLONE_FILES } else { 0 };
    // SAFETY: sigsets are plain data; clone as the caller vouches.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            entry,
            top as *mut libc::c_void,
            raw::CLONE | files | libc::SIGCHLD,
            arg,
        );
        let clone_err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_err);
        }
        Ok(pid)
    }
}

/// Refuses limits a child could never set, so a bad `--rlimit` fails once at startup rather
/// than every spawn: above the hard limit without root, or `nofile` above `fs.nr_open`.
fn check_limits(rlimits: &[(Rlimit, u64)]) -> io::Result<()> {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    for &(r, v) in rlimits {
        // SAFETY: rlimit is plain old data for getrlimit to fill.
        let mut cur: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: a pointer to a live rlimit.
        if unsafe { libc::getrlimit(rlimit_resource(r), &mut cur) } != 0 {
            continue;
        }
        let hard = cur.rlim_max as u64;
        let too_high = |limit: u64| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "--rlimit {}={v} is above what commands may have ({limit})",
                    r.name()
                ),
            )
        };
        if !root && hard != libc::RLIM_INFINITY && v > hard {
            return Err(too_high(hard));
        }
        if r == Rlimit::Nofile {
            let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if let Some(max) = nr_open.filter(|&max| v > max) {
                return Err(too_high(max));
            }
        }
    }
    Ok(())
}

/// `NAME=value` for `execve`.
fn env_entry(name: &[u8], value: &[u8]) -> io::Result<CString> {
    let mut kv = Vec::with_capacity(name.len() + value.len() + 1);
    kv.extend_from_slice(name);
    kv.push(b'=');
    kv.extend_from_slice(value);
    cstring(kv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_upgrade_binary_and_its_directories_are_judged_by_owner_and_write_bits() {
        let reg = libc::S_IFREG;
        let dir = libc::S_IFDIR;
        assert_eq!(unsafe_file(reg | 0o755, 0, 1000), None);
        assert_eq!(unsafe_file(reg | 0o700, 1000, 1000), None);
        assert_eq!(unsafe_file(reg | 0o755, 1001, 1000), Some(Unsafe::Owner));
        assert_eq!(unsafe_file(reg | 0o775, 0, 0), Some(Unsafe::Writable));
        assert_eq!(unsafe_file(reg | 0o757, 0, 0), Some(Unsafe::Writable));
        assert_eq!(unsafe_file(dir | 0o755, 0, 0), Some(Unsafe::NotRegular));
        assert_eq!(unsafe_dir(dir | 0o755, 0, 1000), None);
        assert_eq!(unsafe_dir(dir | 0o755, 1000, 1000), None);
        assert_eq!(unsafe_dir(dir | 0o755, 7, 1000), Some(Unsafe::DirOwner));
        assert_eq!(unsafe_dir(dir | 0o1777, 0, 1000), None, "/tmp");
        assert_eq!(
            unsafe_dir(dir | 0o1777, 1000, 1000),
            Some(Unsafe::DirWritable),
            "sticky, but not root's"
        );
        assert_eq!(unsafe_dir(dir | 0o777, 0, 0), Some(Unsafe::DirWritable));
        assert_eq!(unsafe_dir(dir | 0o775, 0, 0), Some(Unsafe::DirWritable));
        for u in [
            Unsafe::Unreadable,
            Unsafe::NotRegular,
            Unsafe::Owner,
            Unsafe::Writable,
            Unsafe::DirOwner,
            Unsafe::DirWritable,
        ] {
            assert_eq!(Unsafe::of_step(u.step()), Some(u));
        }
        assert_eq!(Unsafe::of_step(FAILED_EXEC), None);
    }

    /// Spawns `program args` with merged output, its binary checked as an upgrade's when
    /// `check` names the daemon's uid.
    fn spawn_merged(
        spawner: &mut Spawner,
        program: &str,
        args: &[&str],
        check: Option<u32>,
    ) -> Spawned {
        let prog = Program::Direct {
            program: program.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        let spec = SpawnSpec {
            program: &prog,
            env: &[],
            cwd: Path::new("/"),
            stdio: Stdio3::Merged,
            user: None,
            cgroup_procs: None,
            cookie: "test:spawn",
            tag: None,
            check_binary: check,
        };
        spawner.spawn(&spec, None).unwrap()
    }

    /// Spawns `sh -c script`; whether the spawn took slots, looked at before anything is
    /// read.
    fn spawn_sh(spawner: &mut Spawner, script: &str) -> (Spawned, bool) {
        let s = spawn_merged(spawner, "/bin/sh", &["-c", script], None);
        let leased = s.memory.lease.is_some();
        (s, leased)
    }

    /// Waits (bounded) for a spawn's report.
    fn wait_report(s: &mut Spawned) -> Report {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            match read_report(s.report.as_raw_fd(), Some(&mut s.memory)) {
                Report::Pending if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(2))
                }
                r => break r,
            }
        }
    }

    /// Waits (bounded) for a spawn's report, then for its output's end and its exit.
    fn finish(mut s: Spawned) -> (Report, String) {
        let report = wait_report(&mut s);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut out = Vec::new();
        let mut f = std::fs::File::from(s.ends.out);
        let mut buf = [0u8; 4096];
        while std::time::Instant::now() < deadline {
            use std::io::Read;
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(2))
                }
                Err(e) => panic!("reading the output: {e}"),
            }
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child, into a local.
        unsafe { libc::waitpid(s.pid, &mut status, 0) };
        drop(s.memory);
        (report, String::from_utf8_lossy(&out).into_owned())
    }

    /// A child shares the table until its first call and leaves with only what it needs:
    /// the two hundred descriptors open here (a daemon's running commands) are neither
    /// copied nor seen, its output's EOF comes at its exit, and the slots are free again.
    #[test]
    fn a_child_takes_its_descriptors_from_slots_and_sees_nothing_else() {
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        let Some(slots) = spawner.slots.clone() else {
            eprintln!("skipped: no slots (no close_range, or this process's table is full)");
            return;
        };
        let held: Vec<OwnedFd> = (0..200).map(|_| dev_null().unwrap()).collect();
        let (s, leased) = spawn_sh(&mut spawner, "ls /proc/self/fd; echo done");
        assert!(leased, "the spawn took slots");
        let (report, out) = finish(s);
        assert!(matches!(report, Report::Execd), "{report:?}");
        // ls's own descriptor (3) is the directory it lists.
        let fds: Vec<&str> = out.lines().collect();
        assert_eq!(fds, ["0", "1", "2", "3", "done"], "{out}");
        assert_eq!(slots.borrow().free, u64::MAX, "every slot is free again");
        drop(held);
    }

    /// More spawns between clone and unshare than the slots hold: the rest take the
    /// copying clone, and every one runs.
    #[test]
    fn spawns_beyond_the_slots_copy_the_table_and_run() {
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        let Some(slots) = spawner.slots.clone() else {
            eprintln!("skipped: no slots (no close_range, or this process's table is full)");
            return;
        };
        // Each takes three slots (stdin, the merged output, the report) until it is read.
        let spawned: Vec<(Spawned, bool)> = (0..SLOTS / 3 + 4)
            .map(|n| spawn_sh(&mut spawner, &format!("echo {n}")))
            .collect();
        let leased = spawned.iter().filter(|(_, l)| *l).count();
        assert_eq!(leased, SLOTS / 3, "as many as the slots hold");
        for (n, (s, _)) in spawned.into_iter().enumerate() {
            let (report, out) = finish(s);
            assert!(matches!(report, Report::Execd), "{n}: {report:?}");
            assert_eq!(out, format!("{n}\n"));
        }
        assert_eq!(slots.borrow().free, u64::MAX);
    }

    /// Spawns `program --upgrade-check` checked as an upgrade's binary and waits (bounded)
    /// for its report.
    fn checked_spawn(program: &Path) -> Report {
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let program = program.to_str().unwrap();
        let mut s = spawn_merged(&mut spawner, program, &["--upgrade-check"], Some(uid));
        let report = wait_report(&mut s);
        let mut status = 0;
        // SAFETY: waitpid on our own child, into a local.
        unsafe { libc::waitpid(s.pid, &mut status, 0) };
        drop(s.memory);
        report
    }

    /// The child checks the binary before it runs anything of it: a script in a directory
    /// others may write, reached through a symlink from a safe one, never runs (its
    /// marker never appears); the same script in a safe directory does.
    #[test]
    fn a_child_refuses_an_upgrade_binary_others_could_have_written() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // the files below must be root's to be judged on their directory
        }
        let base = std::env::temp_dir().join(format!("execd-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (safe, open) = (base.join("safe"), base.join("open"));
        std::fs::create_dir_all(&safe).unwrap();
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let marker = base.join("ran");
        let script = format!("#!/bin/sh\necho ran > {}\n", marker.display());
        for d in [&safe, &open] {
            std::fs::write(d.join("x"), &script).unwrap();
            std::fs::set_permissions(d.join("x"), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(open.join("x"), safe.join("link")).unwrap();
        for (path, want) in [
            (open.join("x"), Unsafe::DirWritable),
            (safe.join("link"), Unsafe::DirWritable),
            (safe.join("missing"), Unsafe::Unreadable),
            (safe.clone(), Unsafe::NotRegular),
        ] {
            match checked_spawn(&path) {
                Report::Failed(FailedAt::Binary(u), _) => assert_eq!(u, want, "{path:?}"),
                other => panic!("{path:?}: {other:?}"),
            }
        }
        std::fs::set_permissions(safe.join("x"), std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(matches!(
            checked_spawn(&safe.join("x")),
            Report::Failed(FailedAt::Binary(Unsafe::Writable), _)
        ));
        assert!(!marker.exists(), "nothing of a refused binary ran");
        std::fs::set_permissions(safe.join("x"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(checked_spawn(&safe.join("x")), Report::Execd));
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Waits (bounded) until `pid`, our child, has exited, and reaps it.
    fn reap(pid: i32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: waitpid on our own child, into a local.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        panic!("{pid} did not exit");
    }

    /// Waits (bounded) until `f` holds.
    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// A spawn asks for a spare; made at the turn's end, it waits as `execd-spare` in a
    /// session of its own, and the next spawn runs in it as in a child of its own: its
    /// pid, its own table with only its stdio, its output, its exit; then the next spare.
    #[test]
    fn a_spare_made_ahead_runs_the_next_spawn() {
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        if !spawner.spares_possible() {
            eprintln!("skipped: no spares here (no slots, or the loop waits for children)");
            return;
        }
        let (s, _) = spawn_sh(&mut spawner, "true");
        assert!(s.memory.spare.is_none(), "no spare was made yet");
        assert!(matches!(finish(s).0, Report::Execd));
        spawner.replenish();
        let spare = spawner.spares.plain.as_ref().expect("a spare").pid;
        assert!(spawner.is_spare(spare));
        let gate = &spawner.spares.plain.as_ref().expect("a spare").early.gate;
        wait_for("the spare's early steps", || {
            gate.load(std::sync::atomic::Ordering::Acquire) == READY
        });
        let comm = std::fs::read_to_string(format!("/proc/{spare}/comm")).unwrap_or_default();
        assert_eq!(comm, "execd-spare\n");
        // SAFETY: getsid with a pid.
        assert_eq!(unsafe { libc::getsid(spare) }, spare, "its own session");
        let (s, leased) = spawn_sh(&mut spawner, "echo $$; ls /proc/self/fd; echo done");
        assert!(leased && s.memory.spare.is_some(), "the spare ran it");
        assert_eq!(s.pid, spare);
        assert!(!spawner.is_spare(spare), "handed out, no spare any more");
        let (report, out) = finish(s);
        assert!(matches!(report, Report::Execd), "{report:?}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [&*spare.to_string(), "0", "1", "2", "3", "done"],
            "{out}"
        );
        spawner.replenish();
        let next = spawner.spares.plain.as_ref().expect("the next spare").pid;
        assert_ne!(next, spare);
        spawner.quit_spares();
        assert_eq!(spawner.spares_quitting(), 1);
        reap(next);
        assert_eq!(
            spawner.reaped(next),
            Some(true),
            "a killed spare, known when reaped"
        );
        assert_eq!(spawner.spares_quitting(), 0);
        let slots = spawner.slots.clone().expect("slots");
        assert_eq!(slots.borrow().free, u64::MAX, "every slot is free again");
    }

    /// A spawner with a spare for plain commands made, or None (said) where none can be.
    fn with_spare() -> Option<Spawner> {
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        if !spawner.spares_possible() {
            eprintln!("skipped: no spares here (no slots, or the loop waits for children)");
            return None;
        }
        spawner.spares.want_plain = true;
        spawner.replenish();
        Some(spawner)
    }

    /// A signal sent to a spare while it waits (`systemctl kill` signals every process
    /// of the unit) is not the next command's: it runs and exits as it would.
    #[test]
    fn a_signal_sent_to_a_waiting_spare_does_not_reach_its_command() {
        let Some(mut spawner) = with_spare() else {
            return;
        };
        let spare = spawner.spares.plain.as_ref().expect("a spare");
        let (pid, gate) = (spare.pid, &spare.early.gate);
        wait_for("the spare waits", || {
            gate.load(std::sync::atomic::Ordering::Acquire) == READY
        });
        // SAFETY: kill with our child's pid.
        unsafe { libc::kill(pid, libc::SIGHUP) };
        let pending = || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let shdpnd = status
                .lines()
                .find_map(|l| l.strip_prefix("ShdPnd:\t"))
                .unwrap();
            u64::from_str_radix(shdpnd.trim(), 16).unwrap() & (1 << (libc::SIGHUP - 1)) != 0
        };
        wait_for("SIGHUP pending on the spare", pending);
        let (s, _) = spawn_sh(&mut spawner, "echo alive");
        assert_eq!(s.pid, pid, "the spare ran it");
        // Delivered, SIGHUP would have ended it as signals were unblocked, before exec.
        let (report, out) = finish(s);
        assert!(matches!(report, Report::Execd), "{report:?}");
        assert_eq!(out, "alive\n");
    }

    /// A spare killed while it waits is forgotten at its reap, and the spawn after it
    /// clones a child of its own.
    #[test]
    fn a_spare_that_died_is_forgotten_and_spawns_go_on() {
        let Some(mut spawner) = with_spare() else {
            return;
        };
        let spare = spawner.spares.plain.as_ref().expect("a spare").pid;
        // SAFETY: kill with our child's pid.
        unsafe { libc::kill(spare, libc::SIGKILL) };
        reap(spare);
        assert_eq!(spawner.reaped(spare), Some(false), "it ended on its own");
        assert!(!spawner.is_spare(spare));
        let (s, _) = spawn_sh(&mut spawner, "echo ran");
        assert!(s.memory.spare.is_none());
        assert_ne!(s.pid, spare);
        assert_eq!(finish(s).1, "ran\n");
    }

    /// A spare whose early steps fail (a seccomp program the kernel refuses) says so on
    /// its gate and exits; it is never handed a plan, and is reaped as a spare.
    #[test]
    fn a_spare_whose_early_steps_failed_is_never_handed_a_plan() {
        use std::sync::atomic::Ordering::Acquire;
        let mut spawner = Spawner::new(false, &[], &[], None).unwrap();
        if !spawner.spares_possible() {
            eprintln!("skipped: no spares here (no slots, or the loop waits for children)");
            return;
        }
        let spare = spawner
            .make_spare(Some(super::super::sandbox::Common::refused()))
            .expect("a spare");
        let pid = spare.pid;
        wait_for("the gate says failed", || {
            spare.early.gate.load(Acquire) == FAILED
        });
        let mut plan = ChildPlan::EMPTY;
        assert!(spawner.hand(spare, &mut plan).is_none(), "not handed");
        assert_eq!(spawner.spares_quitting(), 1);
        reap(pid);
        assert_eq!(spawner.reaped(pid), Some(true));
    }
}
