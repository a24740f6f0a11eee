//! Starting a command: `clone(CLONE_VM | CLONE_VFORK)` into a child that only makes
//! system calls (cgroup, session, limits, user, parent-death signal, stdio, directory,
//! exec), and the pipes that carry its stdio.
//!
//! Invariants:
//! - Every descriptor execd opens is close-on-exec (std, mio and `pipe2(O_CLOEXEC)` ensure
//!   it), so a command inherits exactly its three stdio descriptors.
//! - A spawned command leads its own session and process group (`setsid`), so signalling
//!   `-pid` reaches it and everything it started that did not leave the group.
//! - The child never allocates, locks or unwinds: everything it needs is prepared first.
//! - A command's environment ends with its `EXECD_TREE` cookie (`sys::cookie`), after the
//!   base environment and the request's variables: it holds exactly one, its own.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::cookie;
use super::cstring;
use super::ids::Identity;
use crate::types::{Program, Rlimit, Stdio3};

/// What one command needs; the daemon-wide rest is in `Spawner`.
pub struct SpawnSpec<'a> {
    pub program: &'a Program,
    /// Variables set on top of the base environment.
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    pub stdio: Stdio3,
    /// Run as this user instead of the daemon's own (the daemon must be root).
    pub user: Option<&'a Identity>,
    /// The `cgroup.procs` of the command's cgroup, opened by the parent.
    pub cgroup_procs: Option<RawFd>,
    /// The command's `EXECD_TREE` value (`sys::cookie`), set after every other variable.
    pub cookie: &'a str,
}

/// A started command: its pid (also its process group and session id) and the parent's
/// ends of its pipes, all non-blocking and close-on-exec.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    /// stdout (Separate) or the merged stdout+stderr pipe (Merged).
    pub out: OwnedFd,
    pub err: Option<OwnedFd>,
    pub stdin: Option<OwnedFd>,
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

/// Everything the child needs between clone and exec, prepared by the parent: the child
/// may not allocate, lock or unwind.
struct ChildPlan {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    /// Descriptors to become 0, 1 and 2.
    stdio: [RawFd; 3],
    limits: *const (libc::__rlimit_resource_t, libc::rlimit),
    nlimits: usize,
    /// Signals the daemon catches (and SIGPIPE), to reset to their default.
    reset: *const libc::c_int,
    nreset: usize,
    parent: libc::pid_t,
    /// Switch to this uid, gid and groups before exec, when set.
    user: Option<(libc::uid_t, libc::gid_t)>,
    groups: *const libc::gid_t,
    ngroups: usize,
    /// The parent's signal mask before it blocked everything for the clone.
    mask: libc::sigset_t,
    /// A `cgroup.procs` the parent opened: the child moves itself there first.
    cgroup_procs: RawFd,
    /// Written by the child when a step fails (an errno); read by the parent.
    err: libc::c_int,
}

/// Size of the child's stack between clone and exec: it only makes system calls.
const CHILD_STACK: usize = 64 << 10;

/// Runs in the cloned child, on its own stack, while the parent is suspended (CLONE_VFORK):
/// cgroup, session, limits, user, parent-death signal, stdio, directory, then exec. Only
/// system calls.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildPlan`, alive and untouched while the parent is
    // suspended until this child execs or exits.
    let plan = unsafe { &mut *arg.cast::<ChildPlan>() };
    // SAFETY: async-signal-safe system calls on memory prepared before the clone.
    unsafe {
        let fail = |plan: &mut ChildPlan| -> libc::c_int {
            plan.err = *libc::__errno_location();
            libc::_exit(127)
        };
        // No handler of the daemon may ever run here: every caught signal goes back to
        // its default before signals are unblocked. SIGPIPE, which Rust ignores, too.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for &sig in std::slice::from_raw_parts(plan.reset, plan.nreset) {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        // Into the command's cgroup before anything else, and before the user switch:
        // writing "0" moves the writer, checked against who opened the file (the daemon).
        if plan.cgroup_procs >= 0 && libc::write(plan.cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            return fail(plan);
        }
        if libc::setsid() < 0 {
            return fail(plan);
        }
        for (res, lim) in std::slice::from_raw_parts(plan.limits, plan.nlimits) {
            if libc::setrlimit(*res, lim) < 0 {
                return fail(plan);
            }
        }
        if let Some((uid, gid)) = plan.user {
            if libc::setgroups(plan.ngroups, plan.groups) < 0
                || libc::setgid(gid) < 0
                || libc::setuid(uid) < 0
            {
                return fail(plan);
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
            return fail(plan);
        }
        // The daemon may have died before prctl: then nobody would ever kill this child.
        if libc::getppid() != plan.parent {
            libc::_exit(137);
        }
        for (target, &fd) in plan.stdio.iter().enumerate() {
            // dup2 clears close-on-exec on the copy. The daemon keeps 0, 1 and 2 open, so
            // a pipe is never already at its target.
            if libc::dup2(fd, target as RawFd) < 0 {
                return fail(plan);
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) < 0 {
            return fail(plan);
        }
        // Commands start with no signal blocked, whatever the daemon inherited.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(plan)
    }
}

/// Finds `program` as execvp would: as given when it holds a `/`, else in `path_var`.
fn resolve_program(program: &str, path_var: Option<&OsStr>) -> io::Result<CString> {
    if program.contains('/') {
        return cstring(program);
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

/// Starts commands. Holds what is the same for every spawn, prepared once: the base
/// environment, the signals a child resets, the resource limits, and the child's stack.
pub struct Spawner {
    /// The base environment: names, and `NAME=value` ready for `execve`.
    base_env: Vec<(OsString, CString)>,
    path_var: Option<OsString>,
    reset: Vec<libc::c_int>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    stack: Vec<u8>,
    /// `/dev/null`, the stdin of every terminal.
    null: OwnedFd,
}

impl Spawner {
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
        Ok(Spawner {
            base_env,
            path_var,
            reset: signals_to_reset(),
            limits,
            stack: vec![0u8; CHILD_STACK],
            null: dev_null()?,
        })
    }

    /// Starts a command the way `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)` into
    /// `child_main`, which needs no copy of the daemon's memory (a `fork` of the daemon
    /// costs more than the whole rest of a spawn). Failures before exec (no such program,
    /// permission denied, a directory that vanished) come back as the OS error, with the
    /// failed child already reaped: nothing is left behind.
    pub fn spawn(&mut self, spec: &SpawnSpec) -> io::Result<Spawned> {
        let (program, args): (&str, Vec<&str>) = match spec.program {
            Program::Direct { program, args } => {
                (program, args.iter().map(String::as_str).collect())
            }
            Program::Shell { shell, line } => {
                let shell = shell.to_str().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "shell path is not UTF-8")
                })?;
                (shell, vec!["-c", line])
            }
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
        let envp: Vec<*const libc::c_char> = self
            .base_env
            .iter()
            .filter(|(name, _)| !overridden(name))
            .map(|(_, entry)| entry.as_ptr())
            .chain(extra.iter().map(|c| c.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let path_var = spec
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| OsStr::new(v.as_str()))
            .or(self.path_var.as_deref());
        let path = resolve_program(program, path_var)?;
        let argv_c: Vec<CString> = std::iter::once(program)
            .chain(args.iter().copied())
            .map(cstring)
            .collect::<io::Result<_>>()?;

        let (out_r, out_w) = pipe()?;
        // The child's ends of its pipes (ours to close once it has them); a terminal's
        // stdin is the daemon's one /dev/null.
        let (err_r, err_w) = match spec.stdio {
            Stdio3::Separate => {
                let (r, w) = pipe()?;
                (Some(r), Some(w))
            }
            Stdio3::Merged | Stdio3::MergedWithStdin => (None, None),
        };
        let (in_r, stdin_w) = match spec.stdio {
            Stdio3::Merged => (None, None),
            Stdio3::Separate | Stdio3::MergedWithStdin => {
                let (r, w) = pipe()?;
                (Some(r), Some(w))
            }
        };
        // Our ends are non-blocking before the child exists (each end of a pipe has its own
        // flags), so nothing can fail between the spawn and handing them back.
        for fd in [Some(&out_r), err_r.as_ref(), stdin_w.as_ref()]
            .into_iter()
            .flatten()
        {
            set_nonblocking(fd.as_raw_fd())?;
        }
        let stdin_fd = in_r
            .as_ref()
            .map_or(self.null.as_raw_fd(), |f| f.as_raw_fd());
        let err_fd = err_w.as_ref().map_or(out_w.as_raw_fd(), |f| f.as_raw_fd());

        let mut plan = ChildPlan {
            path,
            argv: argv_c
                .iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect(),
            envp,
            cwd: cstring(spec.cwd.as_os_str().as_bytes())?,
            stdio: [stdin_fd, out_w.as_raw_fd(), err_fd],
            limits: self.limits.as_ptr(),
            nlimits: self.limits.len(),
            reset: self.reset.as_ptr(),
            nreset: self.reset.len(),
            user: spec.user.map(|u| (u.uid, u.gid)),
            groups: spec.user.map_or(std::ptr::null(), |u| u.groups.as_ptr()),
            ngroups: spec.user.map_or(0, |u| u.groups.len()),
            // SAFETY: getpid cannot fail.
            parent: unsafe { libc::getpid() },
            // SAFETY: an all-zero sigset_t is valid storage for pthread_sigmask to fill.
            mask: unsafe { std::mem::zeroed() },
            cgroup_procs: spec.cgroup_procs.unwrap_or(-1),
            err: 0,
        };
        // The stack grows down: hand clone its 16-byte-aligned top.
        let top = (self.stack.as_mut_ptr() as usize + self.stack.len()) & !15;

        // SAFETY: signals are blocked around the clone so no handler runs in the child
        // before it resets them; the child runs `child_main` on its own stack with `plan`,
        // which stays alive and unmoved until clone returns (CLONE_VFORK suspends us until
        // the child execs or exits).
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut plan.mask);
            let pid = libc::clone(
                child_main,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (&mut plan as *mut ChildPlan).cast(),
            );
            let clone_err = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &plan.mask, std::ptr::null_mut());
            if pid < 0 {
                return Err(clone_err);
            }
            pid
        };
        // SAFETY: the child wrote `err` before exiting; read it as memory another task wrote.
        let err = unsafe { std::ptr::read_volatile(&plan.err) };
        if err != 0 {
            let mut status = 0;
            // SAFETY: our own child, which has exited (it reported a failure and called _exit).
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return Err(io::Error::from_raw_os_error(err));
        }
        // The child's copies are its own now; close ours of the ends it uses.
        drop((out_w, err_w, in_r));
        Ok(Spawned {
            pid,
            out: out_r,
            err: err_r,
            stdin: stdin_w,
        })
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
