//! Starting a command without holding the loop. The loop prepares everything a spawn needs
//! without touching the file system (argv, environment, pipes) and hands it to a spawner
//! thread, which looks the program up in `PATH` (a `stat` of a peer-chosen path may hang
//! on a dead network mount: never on the loop) and starts it the way `posix_spawn` does:
//! `clone(CLONE_VM | CLONE_VFORK)` into a child that only makes system calls (cgroup,
//! session, limits, user, parent-death signal, stdio, directory, exec). The thread is
//! suspended until the child has exec'd or failed; the child writes the step that failed
//! and its errno into the plan they share, and the thread reports the outcome on a channel
//! whose `Waker` wakes the loop. Meanwhile the loop serves everyone else, and with more
//! than one thread, spawns run side by side on every core.
//!
//! Invariants:
//! - Every descriptor execd opens is close-on-exec (std, mio and `pipe2(O_CLOEXEC)` ensure
//!   it), so a command inherits exactly its three stdio descriptors.
//! - A spawned command leads its own session and process group (`setsid`), so signalling
//!   `-pid` reaches it and everything it started that did not leave the group.
//! - The child never allocates, locks or unwinds: everything it needs is prepared first,
//!   and it shares memory only with a suspended spawner thread, whose errno it may clobber.
//! - A spawner thread lives as long as the daemon: the parent-death signal a child sets
//!   follows the thread that cloned it.
//! - A child's own ends of its pipes stay open until it has them (the spawner thread drops
//!   them after the clone); the loop holds the parent's ends from the start.
//! - A command's environment ends with its `EXECD_TREE` cookie (`sys::cookie`), after the
//!   base environment and the request's variables: it holds exactly one, its own.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use super::cookie;
use super::cstring;
use super::ids::Identity;
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
    /// A shell session's command pipe (`Stdio3::Shell`): what the shell reads its
    /// command lines from.
    pub commands: Option<OwnedFd>,
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
            },
        })
    }

    /// A shell session's bash (`Stdio3::Shell`): a pseudo-terminal of `size` whose slave
    /// is the child's stdout, stderr and controlling terminal, as for `pty`, and a pipe
    /// as its stdin, which the parent writes command lines to. The shell reads commands
    /// only from the pipe, so nothing typed into the terminal reaches it as a command.
    fn shell(size: WinSize) -> io::Result<Wired> {
        let (master, slave) = crate::sys::pty::open(size)?;
        set_nonblocking(master.as_raw_fd())?;
        let writer = master.try_clone()?;
        // Programs read the terminal; the shell itself reads only the pipe, so it never
        // counts as waiting for input at its prompt.
        let input = InputFile::of_fd(slave.as_raw_fd()).ok();
        let (cmd_r, cmd_w) = pipe()?;
        set_nonblocking(cmd_w.as_raw_fd())?;
        Ok(Wired {
            child: [Some(cmd_r), Some(slave), None],
            tty: false,
            ctty: true,
            parent: ParentEnds {
                out: master,
                err: None,
                stdin: Some(writer),
                input,
                commands: Some(cmd_w),
            },
        })
    }
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
}

/// How a spawn ended.
#[derive(Debug)]
pub struct Done {
    /// The number `submit` returned.
    pub job: u64,
    /// The command's pid (also its process group and session id), or what failed.
    pub result: Result<i32, (FailedAt, io::Error)>,
    /// Just before the clone: a child reaped before this cannot be this one.
    pub cloned_at: Instant,
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

/// Size of the child's stack between clone and exec: it only makes system calls.
const CHILD_STACK: usize = 64 << 10;

/// What is the same for every spawn, prepared once and shared with the threads.
struct Shared {
    /// The base environment's `PATH`, where a program is looked up unless the request
    /// sets its own.
    path_var: Option<OsString>,
    /// Signals the daemon catches (and SIGPIPE), to reset to their default in the child.
    reset: Vec<libc::c_int>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The daemon's pid: a child whose parent is another has lost it.
    parent: libc::pid_t,
    /// Held from a clone until its child has closed what it copied (see `CloneGuard`).
    guard: CloneGuard,
}

/// Keeps the spawner threads' children from holding each other's pipes. A child gets a
/// copy of every descriptor the daemon holds at its clone, among them the child ends of
/// commands being started at the same time; one held until its exec (after a chdir that
/// may be slow, or a wait for a busy CPU) would keep another command's output pipe open
/// after that command exited, so the drain at its exit would miss the EOF. So a thread
/// takes the guard before it clones and the child lets it go once it has closed every
/// descriptor but its own stdio: no clone happens while another child still holds copies.
/// The child cannot be relied on to let go (it may be killed first), so the thread lets
/// go too once the clone returns; each lets go only if it is still its holder's. Before a
/// thread reports a spawn it takes and lets go the guard once more, after closing the
/// command's child ends: a child cloned meanwhile has closed its copies by then.
struct CloneGuard(AtomicU32);

impl CloneGuard {
    /// Takes the guard for holder `me` (non-zero), waiting while another holds it.
    fn take(&self, me: u32) {
        loop {
            match self
                .0
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return,
                // SAFETY: FUTEX_WAIT on a live aligned u32; returns at once if it changed.
                Err(held) => unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        self.0.as_ptr(),
                        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                        held,
                        std::ptr::null::<libc::timespec>(),
                    );
                },
            }
        }
    }

    /// Lets the guard go if `me` still holds it. Async-signal-safe: the child calls it
    /// (sharing the daemon's memory until it execs).
    fn let_go(&self, me: u32) {
        if self
            .0
            .compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: FUTEX_WAKE on a live aligned u32.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.0.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    1,
                );
            }
        }
    }
}

/// One spawn as the loop prepared it: owned strings and the child's descriptors.
struct Job {
    id: u64,
    /// The program as the request named it (looked up in `path` by the thread).
    program: CString,
    path: Option<OsString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    /// The child's ends, to become 0, 1 and 2 (the merged pipe twice for 1 and 2, and
    /// `/dev/null` for a stdin nobody writes).
    stdio: [Option<OwnedFd>; 3],
    /// `stdio[0]` is a PTY slave, to be 0, 1 and 2 and the controlling terminal.
    tty: bool,
    /// Descriptor 1 is a PTY slave, to become the controlling terminal.
    ctty: bool,
    null: RawFd,
    user: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
    cgroup_procs: RawFd,
}

/// Everything the child needs between clone and exec, pointing into a `Job` that the
/// suspended thread keeps alive: the child may not allocate, lock or unwind.
struct ChildPlan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Descriptors to become 0, 1 and 2.
    stdio: [RawFd; 3],
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
    /// Its stdout is a PTY slave, to become its controlling terminal.
    ctty: bool,
    /// The guard the thread took for this clone, and as whom.
    guard: *const CloneGuard,
    holder: u32,
    /// Written by the child when a step fails: which one, and its errno.
    failed: libc::c_int,
    err: libc::c_int,
}

/// `ChildPlan::failed` values.
const FAILED_SETUP: libc::c_int = 1;
const FAILED_CWD: libc::c_int = 2;
const FAILED_EXEC: libc::c_int = 3;

/// Runs in the cloned child, on its own stack, while the spawner thread is suspended
/// (CLONE_VFORK): signals, stdio (and nothing else open), cgroup, session, limits, user,
/// parent-death signal, directory, then exec. Only system calls.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the thread's `ChildPlan`, alive and untouched while the thread is
    // suspended until this child execs or exits.
    let plan = unsafe { &mut *arg.cast::<ChildPlan>() };
    // SAFETY: async-signal-safe system calls on memory prepared before the clone.
    unsafe {
        let guard = &*plan.guard;
        let fail = |plan: &mut ChildPlan, step: libc::c_int| -> libc::c_int {
            plan.err = *libc::__errno_location();
            plan.failed = step;
            guard.let_go(plan.holder);
            libc::_exit(127)
        };
        // No handler of the daemon may ever run here: every caught signal goes back to
        // its default before signals are unblocked. SIGPIPE, which Rust ignores, too.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for &sig in std::slice::from_raw_parts(plan.reset, plan.nreset) {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        for (target, &fd) in plan.stdio.iter().enumerate() {
            // dup2 clears close-on-exec on the copy. The daemon keeps 0, 1 and 2 open, so
            // a pipe is never already at its target.
            if libc::dup2(fd, target as RawFd) < 0 {
                return fail(plan, FAILED_SETUP);
            }
        }
        // Every other descriptor goes now, not at exec: this child got copies of whatever
        // the daemon held when it was cloned, among them the pipes of commands another
        // spawner thread is starting. Held until exec (after a chdir that may be slow),
        // such a copy would hide that command's EOF from the drain at its exit.
        close_from(3, plan.cgroup_procs);
        guard.let_go(plan.holder);
        // Into the command's cgroup before anything else, and before the user switch:
        // writing "0" moves the writer, checked against who opened the file (the daemon).
        if plan.cgroup_procs >= 0 && libc::write(plan.cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            return fail(plan, FAILED_SETUP);
        }
        if libc::setsid() < 0 {
            return fail(plan, FAILED_SETUP);
        }
        // A new session has no controlling terminal: its PTY becomes it (descriptor 1
        // is the slave for a PTY command and for a shell, whose stdin is a pipe).
        if plan.ctty && libc::ioctl(1, libc::TIOCSCTTY, 0) < 0 {
            return fail(plan, FAILED_SETUP);
        }
        for (res, lim) in std::slice::from_raw_parts(plan.limits, plan.nlimits) {
            if libc::setrlimit(*res, lim) < 0 {
                return fail(plan, FAILED_SETUP);
            }
        }
        if let Some((uid, gid)) = plan.user {
            if libc::setgroups(plan.ngroups, plan.groups) < 0
                || libc::setgid(gid) < 0
                || libc::setuid(uid) < 0
            {
                return fail(plan, FAILED_SETUP);
            }
        }
        // After the user switch: the kernel clears the parent-death signal when
        // credentials change.
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            return fail(plan, FAILED_SETUP);
        }
        // The daemon may have died before prctl: then nobody would ever kill this child.
        if libc::getppid() != plan.parent {
            libc::_exit(137);
        }
        if libc::chdir(plan.cwd) < 0 {
            return fail(plan, FAILED_CWD);
        }
        // Commands start with no signal blocked, whatever the daemon inherited.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(plan.path, plan.argv, plan.envp);
        fail(plan, FAILED_EXEC)
    }
}

/// Closes every descriptor from `first` up except `keep` (`close_range(2)`, one system
/// call; on a kernel without it they stay until exec closes them, being close-on-exec).
///
/// # Safety
/// Async-signal-safe; for the child between clone and exec.
unsafe fn close_from(first: RawFd, keep: RawFd) {
    let close_range = |lo: RawFd, hi: libc::c_uint| {
        // SAFETY: close_range takes plain integers; closing descriptors nobody here uses.
        unsafe { libc::syscall(libc::SYS_close_range, lo as libc::c_uint, hi, 0) };
    };
    if keep >= first {
        if keep > first {
            close_range(first, (keep - 1) as libc::c_uint);
        }
        close_range(keep + 1, libc::c_uint::MAX);
    } else {
        close_range(first, libc::c_uint::MAX);
    }
}

/// Finds `program` as execvp would: as given when it holds a `/`, else in `path_var`.
fn resolve_program(program: &OsStr, path_var: Option<&OsStr>) -> io::Result<CString> {
    if program.as_bytes().contains(&b'/') {
        return cstring(program.as_bytes());
    }
    let dirs = path_var.unwrap_or_else(|| OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    let mut denied = false;
    for dir in std::env::split_paths(dirs) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let c = cstring(candidate.into_os_string().into_vec())?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
            return Ok(c);
        }
        denied = true;
    }
    Err(io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
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
/// (`nohup`'s SIGHUP) stay ignored, as exec keeps them.
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

/// Starts a prepared job: looks the program up, clones the child and waits (suspended by
/// CLONE_VFORK) until it has exec'd or failed. The job's descriptors are closed when it
/// returns: the child has its copies.
fn run(
    shared: &Shared,
    job: &Job,
    stack: &mut [u8],
    holder: u32,
) -> Result<i32, (FailedAt, io::Error)> {
    let program = OsStr::from_bytes(job.program.as_bytes());
    let path = resolve_program(program, job.path.as_deref().or(shared.path_var.as_deref()))
        .map_err(|e| (FailedAt::Program, e))?;
    let argv: Vec<*const libc::c_char> = job
        .argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = job
        .envp
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let fd = |i: usize| job.stdio[i].as_ref().map_or(job.null, |f| f.as_raw_fd());
    // The merged pipe is both stdout and stderr; a PTY slave is all three.
    let stdio = if job.tty {
        [fd(0); 3]
    } else {
        [
            fd(0),
            fd(1),
            job.stdio[2].as_ref().map_or(fd(1), |f| f.as_raw_fd()),
        ]
    };
    let mut plan = ChildPlan {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: job.cwd.as_ptr(),
        stdio,
        limits: shared.limits.as_ptr(),
        nlimits: shared.limits.len(),
        reset: shared.reset.as_ptr(),
        nreset: shared.reset.len(),
        parent: shared.parent,
        user: job.user.as_ref().map(|u| (u.0, u.1)),
        groups: job.user.as_ref().map_or(std::ptr::null(), |u| u.2.as_ptr()),
        ngroups: job.user.as_ref().map_or(0, |u| u.2.len()),
        cgroup_procs: job.cgroup_procs,
        ctty: job.ctty,
        guard: &shared.guard,
        holder,
        failed: 0,
        err: 0,
    };
    // The stack grows down: hand clone its 16-byte-aligned top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    // SAFETY: signals are blocked around the clone so no handler runs in the child before
    // it resets them; the child runs `child_main` on its own stack with `plan`, which
    // stays alive and unmoved until clone returns (CLONE_VFORK suspends this thread until
    // the child execs or exits).
    shared.guard.take(holder);
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut plan as *mut ChildPlan).cast(),
        );
        let clone_err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        // The child has exec'd or exited: it holds no copies of the daemon's any more.
        shared.guard.let_go(holder);
        if pid < 0 {
            return Err((FailedAt::Setup, clone_err));
        }
        pid
    };
    // SAFETY: the child wrote these before exiting; read them as memory another task wrote.
    let (failed, err) = unsafe {
        (
            std::ptr::read_volatile(&plan.failed),
            std::ptr::read_volatile(&plan.err),
        )
    };
    // A child that failed has exited; the loop reaps it like any other.
    match failed {
        0 => Ok(pid),
        FAILED_CWD => Err((FailedAt::Cwd, io::Error::from_raw_os_error(err))),
        FAILED_EXEC => Err((FailedAt::Program, io::Error::from_raw_os_error(err))),
        _ => Err((FailedAt::Setup, io::Error::from_raw_os_error(err))),
    }
}

/// A spawner thread (`holder`, from 1, as the clone guard knows it): runs jobs until the
/// daemon's side of the channel is gone.
fn serve(
    shared: Arc<Shared>,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    done: mpsc::Sender<Done>,
    waker: Arc<mio::Waker>,
    holder: u32,
) {
    let mut stack = vec![0u8; CHILD_STACK];
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let cloned_at = Instant::now();
        let result = run(&shared, &job, &mut stack, holder);
        let id = job.id;
        // The child's ends close here: it has its own copies (or has exited). A child
        // another thread cloned meanwhile may hold copies too until it has closed them,
        // which it does before it lets the guard go: once the guard is free, nobody but
        // this command holds its pipes, and the drain at its exit sees their EOF.
        drop(job);
        shared.guard.take(holder);
        shared.guard.let_go(holder);
        if done
            .send(Done {
                job: id,
                result,
                cloned_at,
            })
            .is_err()
        {
            return;
        }
        let _ = waker.wake();
    }
}

/// Starts commands. Holds what is the same for every spawn (the base environment, the
/// signals a child resets, the resource limits) and the threads that clone.
pub struct Spawner {
    /// The base environment: names, and `NAME=value` ready for `execve`.
    base_env: Vec<(OsString, CString)>,
    /// `/dev/null`, the stdin of every terminal.
    null: OwnedFd,
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Done>,
    next_job: u64,
    /// Jobs handed over and not reported yet.
    in_flight: usize,
    /// What a new thread needs, and how many run: more start (up to `MAX_THREADS`) when
    /// every thread is busy, so a spawn stuck on a hung file system holds only its own.
    crew: Crew,
}

/// The spawner threads, and what each new one is given.
struct Crew {
    running: usize,
    shared: Arc<Shared>,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    done: mpsc::Sender<Done>,
    waker: Arc<mio::Waker>,
}

/// The most spawner threads: past this many spawns stuck at once, further spawns wait.
pub const MAX_THREADS: usize = 16;

impl Crew {
    /// Starts one more spawner thread.
    fn hire(&mut self) -> io::Result<()> {
        let (shared, jobs, done, waker) = (
            self.shared.clone(),
            self.jobs.clone(),
            self.done.clone(),
            self.waker.clone(),
        );
        let holder = self.running as u32 + 1;
        std::thread::Builder::new()
            .name(format!("execd-spawn-{}", self.running))
            .stack_size(256 << 10)
            .spawn(move || serve(shared, jobs, done, waker, holder))?;
        self.running += 1;
        Ok(())
    }
}

impl Spawner {
    /// Build this after the daemon's signal handlers are installed: they are what a child
    /// must reset. `child_nofile` is the descriptor limit to give back (see `raise_nofile`).
    /// `withheld` names variables of the daemon's environment no command may see. Starts
    /// `threads` spawner threads, which wake the loop through `waker` when a spawn is done.
    pub fn new(
        clean_env: bool,
        withheld: &[&str],
        rlimits: &[(Rlimit, u64)],
        child_nofile: Option<(u64, u64)>,
        waker: mio::Waker,
        threads: usize,
    ) -> io::Result<Spawner> {
        // The daemon's own cookie (when an execd command started it) is never passed on:
        // each command gets its own, last.
        let vars: Vec<(OsString, OsString)> = if clean_env {
            Vec::new()
        } else {
            std::env::vars_os()
                .filter(|(k, _)| !withheld.iter().any(|w| k == *w) && k != cookie::VAR)
                .collect()
        };
        let path_var = vars
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let base_env = vars
            .into_iter()
            .map(|(k, v)| Ok((k.clone(), env_entry(k.as_bytes(), v.as_bytes())?)))
            .collect::<io::Result<_>>()?;
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
        let shared = Arc::new(Shared {
            path_var,
            reset: signals_to_reset(),
            limits,
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
            guard: CloneGuard(AtomicU32::new(0)),
        });
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel();
        let mut crew = Crew {
            running: 0,
            shared,
            jobs: Arc::new(Mutex::new(job_rx)),
            done: done_tx,
            waker: Arc::new(waker),
        };
        for _ in 0..threads.clamp(1, MAX_THREADS) {
            crew.hire()?;
        }
        Ok(Spawner {
            base_env,
            null: dev_null()?,
            jobs,
            done,
            next_job: 0,
            in_flight: 0,
            crew,
        })
    }

    /// Prepares a command and hands it to a spawner thread; returns the job's number and
    /// the parent's ends of its stdio. Nothing here looks at the file system. Errors are
    /// the daemon's own (out of descriptors, a NUL in an argument): nothing is left behind.
    pub fn submit(&mut self, spec: &SpawnSpec) -> io::Result<(u64, ParentEnds)> {
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
        let extra: Vec<CString> = spec
            .env
            .iter()
            .enumerate()
            .filter(|(i, (k, _))| last.get(k.as_bytes()) == Some(i) && k != cookie::VAR)
            .map(|(_, (k, v))| env_entry(k.as_bytes(), v.as_bytes()))
            .chain(std::iter::once(env_entry(
                cookie::VAR.as_bytes(),
                spec.cookie.as_bytes(),
            )))
            .collect::<io::Result<_>>()?;
        let overridden = |name: &OsStr| last.contains_key(name.as_bytes());
        let envp: Vec<CString> = self
            .base_env
            .iter()
            .filter(|(name, _)| !overridden(name))
            .map(|(_, entry)| entry.clone())
            .chain(extra)
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
            Stdio3::Shell(size) => Wired::shell(size)?,
            stdio => Wired::pipes(stdio)?,
        };
        let id = self.next_job;
        self.next_job += 1;
        let job = Job {
            id,
            program: cstring(program.as_bytes())?,
            path,
            argv,
            envp,
            cwd: cstring(spec.cwd.as_os_str().as_bytes())?,
            stdio: wired.child,
            tty: wired.tty,
            ctty: wired.ctty,
            null: self.null.as_raw_fd(),
            user: spec.user.map(|u| (u.uid, u.gid, u.groups.clone())),
            cgroup_procs: spec.cgroup_procs.unwrap_or(-1),
        };
        self.jobs
            .send(job)
            .map_err(|_| io::Error::other("the spawner threads are gone"))?;
        self.in_flight += 1;
        // Every thread busy (most spawns take a millisecond; one may hang on a cwd that
        // never answers): another takes this job rather than let it wait behind them.
        if self.in_flight > self.crew.running && self.crew.running < MAX_THREADS {
            let _ = self.crew.hire(); // without it the job waits for a free thread
        }
        Ok((id, wired.parent))
    }

    /// The spawns done since the last call (the loop calls it when the waker fires).
    pub fn finished(&mut self) -> Vec<Done> {
        let done: Vec<Done> = self.done.try_iter().collect();
        self.in_flight = self.in_flight.saturating_sub(done.len());
        done
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
