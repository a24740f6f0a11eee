//! Processes at the syscall level: spawn (new session, parent-death signal, rlimits), group
//! signals, `wait4` reaping with rusage, pipes, and peer credentials. Every `unsafe` block
//! of the crate lives here.
//!
//! Invariants:
//! - Every descriptor execd opens is close-on-exec (std, mio and `pipe2(O_CLOEXEC)` ensure
//!   it), so a command inherits exactly its three stdio descriptors.
//! - A spawned command leads its own session and process group (`setsid`), so signalling
//!   `-pid` reaches it and everything it started that did not leave the group.
//! - Nothing here ever waits: reaping is `wait4(-1, WNOHANG)`, driven by SIGCHLD.

pub mod cgroup;
pub mod contain;
pub mod sinks;
pub mod systemd;

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A resource limit `--rlimit` may set for commands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rlimit {
    Cpu,
    As,
    Nofile,
    Nproc,
    Fsize,
    Core,
}

impl Rlimit {
    /// The name `--rlimit` takes.
    pub fn name(self) -> &'static str {
        match self {
            Rlimit::Cpu => "cpu",
            Rlimit::As => "as",
            Rlimit::Nofile => "nofile",
            Rlimit::Nproc => "nproc",
            Rlimit::Fsize => "fsize",
            Rlimit::Core => "core",
        }
    }

    /// The resource `--rlimit` names.
    pub fn parse(name: &str) -> Option<Rlimit> {
        Some(match name {
            "cpu" => Rlimit::Cpu,
            "as" => Rlimit::As,
            "nofile" => Rlimit::Nofile,
            "nproc" => Rlimit::Nproc,
            "fsize" => Rlimit::Fsize,
            "core" => Rlimit::Core,
            _ => return None,
        })
    }
}

/// What to execute.
#[derive(Debug, Clone)]
pub enum Program {
    /// `program` looked up in PATH, with these arguments.
    Direct { program: String, args: Vec<String> },
    /// `shell -c line`.
    Shell {
        shell: std::path::PathBuf,
        line: String,
    },
}

/// How the command's stdio is wired.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stdio3 {
    /// stdin `/dev/null`; stdout and stderr share one pipe, so their order is kept.
    Merged,
    /// stdin a pipe; stdout and stderr share one pipe (a terminal fed by its client).
    MergedWithStdin,
    /// stdin a pipe; stdout and stderr each their own pipe.
    Separate,
}

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
}

/// A user to run commands as: uid, primary gid and supplementary groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The passwd entry of `uid` or of `name`: `(name, uid, gid)`.
fn passwd_entry(uid: Option<u32>, name: Option<&str>) -> io::Result<Option<(CString, u32, u32)>> {
    // SAFETY: passwd is plain old data that getpw*_r fills, pointing into `buf`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let cname = name.map(cstring).transpose()?;
    // SAFETY: every pointer is to live, correctly sized storage.
    let rc = unsafe {
        match (&cname, uid) {
            (Some(n), _) => {
                libc::getpwnam_r(n.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
            }
            (None, Some(u)) => {
                libc::getpwuid_r(u, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
            }
            (None, None) => return Ok(None),
        }
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if found.is_null() {
        return Ok(None);
    }
    // SAFETY: getpw*_r succeeded: pw_name points to a NUL-terminated string in `buf`.
    let user = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_owned();
    Ok(Some((user, pw.pw_uid, pw.pw_gid)))
}

/// Supplementary groups of `user` with primary group `gid`.
fn group_list(user: &CString, gid: u32) -> Vec<u32> {
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let before = n;
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most that many and
        // sets `n` to the number it needs.
        let rc = unsafe { libc::getgrouplist(user.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        if n <= before {
            return vec![gid];
        }
    }
}

impl Identity {
    /// The identity of a user named in `--run-as` (a name or a numeric uid).
    pub fn of_user(user: &str) -> io::Result<Identity> {
        let entry = match user.parse::<u32>() {
            Ok(uid) => passwd_entry(Some(uid), None)?,
            Err(_) => passwd_entry(None, Some(user))?,
        };
        let (name, uid, gid) = entry.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no such user: {user}"))
        })?;
        Ok(Identity {
            uid,
            gid,
            groups: group_list(&name, gid),
        })
    }
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

fn cstring(s: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument"))
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
        let vars: Vec<(OsString, OsString)> = if clean_env {
            Vec::new()
        } else {
            std::env::vars_os()
                .filter(|(k, _)| !withheld.iter().any(|w| k == *w))
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
        // with many variables costs linear time on the loop.
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
            .filter(|(i, (k, _))| last.get(k.as_bytes()) == Some(i))
            .map(|(_, (k, v))| env_entry(k.as_bytes(), v.as_bytes()))
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

/// Marks every descriptor above stderr close-on-exec: whatever the daemon inherited from
/// whoever started it must not leak into commands. (Rust's runtime already made sure 0, 1
/// and 2 are open, so no pipe of ours can land on them.)
pub fn cloexec_inherited() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number; one that closed meanwhile fails harmlessly.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// Sends `sig` to process group `pgid`. A group that no longer exists is not an error.
pub fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        return; // never signal -1 (everything) or -0 (our own group)
    }
    // SAFETY: kill takes plain integers; a negative pid addresses a process group.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// How a reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

/// Resource use from `wait4`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub user: Duration,
    pub system: Duration,
    pub max_rss_kb: u64,
}

/// One reaped child.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    pub pid: i32,
    pub ended: Ended,
    pub usage: Usage,
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64)
}

/// Reaps one exited child, ours or a re-parented orphan, without blocking.
pub fn reap_one() -> Option<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: status and ru are valid for writes; WNOHANG makes this return at once.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru) };
        if pid > 0 {
            let ended = if libc::WIFSIGNALED(status) {
                Ended::Signal(libc::WTERMSIG(status))
            } else {
                Ended::Code(libc::WEXITSTATUS(status))
            };
            let usage = Usage {
                user: timeval(ru.ru_utime),
                system: timeval(ru.ru_stime),
                max_rss_kb: ru.ru_maxrss.max(0) as u64,
            };
            return Some(Reaped { pid, ended, usage });
        }
        if pid < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None; // 0: children remain but none has exited; ECHILD: no children
    }
}

/// Raises the daemon's soft descriptor limit to its hard limit (a service started with
/// the common soft limit of 1024 would otherwise run out at about a thousand commands).
/// Returns the limits as they were, to restore in children, or `None` if nothing changed.
pub fn raise_nofile() -> Option<(u64, u64)> {
    // SAFETY: rlimit is plain old data for getrlimit to fill.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return None;
    }
    let before = (lim.rlim_cur as u64, lim.rlim_max as u64);
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: a pointer to a live rlimit; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return None;
    }
    Some(before)
}

/// Unblocks signals the daemon handles, in case whoever started it had them blocked.
pub fn unblock_signals(sigs: &[i32]) {
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Has the allocator give large freed buffers back to the system at once. glibc raises
/// its mmap threshold as large blocks are freed, and then serves later output rings from
/// its heap, where freed ones stay: after a churn of commands the daemon would sit at
/// tens of megabytes with nothing running. A fixed threshold keeps every ring's storage
/// past 64 KiB in its own mapping, unmapped when freed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; called before any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

/// Hands freed heap memory back to the system (glibc keeps freed blocks, and after a
/// churn of commands whose output rings came and went the daemon would otherwise sit at
/// many times its idle size with nothing running). Called after large frees.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory at the heap's top and in its arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes the daemon the reaper of orphaned descendants, so they are reaped here too.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Debug, Clone, Copy)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Reads `SO_PEERCRED`.
pub fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
    // SAFETY: ucred is plain old data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: pointers to live locals with the length that describes them.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The supplementary groups of a Unix socket's peer as they were when it connected
/// (`SO_PEERGROUPS`): what the peer holds, not what its user entry lists, so a peer that
/// dropped groups does not get them back through the daemon.
pub fn peer_groups(fd: RawFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes; getsockopt writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // Too small: `len` now says how much is needed.
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() {
            return Err(e);
        }
        groups.resize(n, 0);
    }
}

/// The daemon's real uid.
pub fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The daemon's real gid.
pub fn current_gid() -> u32 {
    // SAFETY: getgid cannot fail.
    unsafe { libc::getgid() }
}

/// The daemon's supplementary groups.
pub fn current_groups() -> Vec<u32> {
    // SAFETY: with a size of 0 getgroups only counts, writing nothing.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
    // SAFETY: `groups` holds `n` entries, the most getgroups writes.
    let got = unsafe { libc::getgroups(n.max(0), groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    groups
}

/// Changes the owner group of a path (the socket file, for `--socket-group`).
pub fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Checks that `fd` is a listening Unix stream socket (what systemd socket activation
/// must pass).
pub fn check_listening_unix_socket(fd: RawFd) -> io::Result<()> {
    let option = |name: libc::c_int| -> io::Result<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointers to a live int and its length; getsockopt writes at most `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(value)
    };
    let what = |s: &str| io::Error::new(io::ErrorKind::InvalidInput, s.to_string());
    if option(libc::SO_DOMAIN)? != libc::AF_UNIX {
        return Err(what("not an AF_UNIX socket"));
    }
    if option(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(what("not a stream socket"));
    }
    if option(libc::SO_ACCEPTCONN)? == 0 {
        return Err(what("not listening"));
    }
    Ok(())
}

/// Takes ownership of a listening socket passed at `fd` (checked by
/// `check_listening_unix_socket`), close-on-exec from now on.
pub fn take_listener(fd: RawFd) -> std::os::unix::net::UnixListener {
    // SAFETY: setting FD_CLOEXEC on a descriptor number has no memory effects.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: the caller checked that `fd` is a listening socket passed to exactly this
    // process; nothing else in the process owns it.
    unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) }
}

/// Writes to a stream socket without blocking and without SIGPIPE, whatever the
/// descriptor's own mode (the journal's stream, shared with no one, is left as it was).
pub fn send_nonblocking(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of reading.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Every signal by its conventional name.
const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("SIGHUP", libc::SIGHUP),
    ("SIGINT", libc::SIGINT),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGILL", libc::SIGILL),
    ("SIGTRAP", libc::SIGTRAP),
    ("SIGABRT", libc::SIGABRT),
    ("SIGBUS", libc::SIGBUS),
    ("SIGFPE", libc::SIGFPE),
    ("SIGKILL", libc::SIGKILL),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGPIPE", libc::SIGPIPE),
    ("SIGALRM", libc::SIGALRM),
    ("SIGTERM", libc::SIGTERM),
    ("SIGSTKFLT", libc::SIGSTKFLT),
    ("SIGCHLD", libc::SIGCHLD),
    ("SIGCONT", libc::SIGCONT),
    ("SIGSTOP", libc::SIGSTOP),
    ("SIGTSTP", libc::SIGTSTP),
    ("SIGTTIN", libc::SIGTTIN),
    ("SIGTTOU", libc::SIGTTOU),
    ("SIGURG", libc::SIGURG),
    ("SIGXCPU", libc::SIGXCPU),
    ("SIGXFSZ", libc::SIGXFSZ),
    ("SIGVTALRM", libc::SIGVTALRM),
    ("SIGPROF", libc::SIGPROF),
    ("SIGWINCH", libc::SIGWINCH),
    ("SIGIO", libc::SIGIO),
    ("SIGPWR", libc::SIGPWR),
    ("SIGSYS", libc::SIGSYS),
];

/// Signals `bash/kill` accepts.
const KILL_SIGNALS: &[i32] = &[
    libc::SIGTERM,
    libc::SIGKILL,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGSTOP,
    libc::SIGCONT,
];

/// The number of a signal named with or without `SIG`, in any case.
fn named_signal(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNAL_NAMES
        .iter()
        .find(|(n, _)| n[3..] == *bare)
        .map(|&(_, s)| s)
}

/// The number of a signal as `signal_name` writes it: a name, or `SIG<n>`.
pub fn signal_number(name: &str) -> Option<i32> {
    named_signal(name).or_else(|| name.strip_prefix("SIG")?.parse().ok())
}

/// The signal a client may send with `bash/kill`: by name only, from the allowed list.
pub fn signal_by_name(name: &str) -> Option<i32> {
    named_signal(name).filter(|s| KILL_SIGNALS.contains(s))
}

/// The conventional name of a signal number, e.g. `"SIGKILL"` (`"SIG40"` when it has none).
pub fn signal_name(sig: i32) -> String {
    SIGNAL_NAMES
        .iter()
        .find(|&&(_, s)| s == sig)
        .map_or_else(|| format!("SIG{sig}"), |(n, _)| n.to_string())
}

/// Columns of the terminal on stdout, if stdout is one.
pub fn terminal_width() -> Option<usize> {
    // SAFETY: winsize is plain old data; TIOCGWINSZ writes at most its size into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on fd 1 with a pointer to a live winsize.
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// The symbolic name of an errno value a spawn can fail with (`"ENOENT"`), for clients
/// that map it to an exit status; `"E<n>"` for others.
pub fn errno_name(code: i32) -> String {
    let name = match code {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOEXEC => "ENOEXEC",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::ELOOP => "ELOOP",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::ETXTBSY => "ETXTBSY",
        libc::EAGAIN => "EAGAIN",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::EINVAL => "EINVAL",
        _ => return format!("E{code}"),
    };
    name.to_string()
}

/// Whether process group `pgid` still has a member.
pub fn group_exists(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    pgid > 1 && unsafe { libc::kill(-pgid, 0) == 0 }
}

// ---- cgroup support: permission checks, single-pid signals, inotify -----------------------
//
// - Every descriptor opened here is close-on-exec, so no command inherits it.
// - Nothing here blocks: the inotify descriptor is non-blocking and reading it stops at
//   `EAGAIN`.
// - A signal never goes to a pid that is not a single positive process id: `kill(0)`,
//   `kill(-1)` and negative numbers address groups or everything, never what a
//   `cgroup.procs` line meant.

pub use libc::IN_MODIFY;

/// The wd `read_events` reports for a queue overflow (`IN_Q_OVERFLOW`): events were lost,
/// so every watched file must be rechecked.
pub const OVERFLOW_WD: i32 = -1;

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// Whether the effective user may write `path` (`faccessat(W_OK, AT_EACCESS)`), which
/// also sees a read-only mount and the immutable attribute, unlike the mode bits. Missing
/// files and other failures are errors, so "no" means only "refused".
pub fn writable(path: &Path) -> io::Result<bool> {
    let c = path_cstring(path)?;
    // SAFETY: `c` is a NUL-terminated string that lives across the call; the other
    // arguments are plain integers.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => Ok(false),
        _ => Err(err),
    }
}

/// Sends `sig` to the one process `pid`. Refuses 0 and anything that would not fit a
/// positive `pid_t`, since `kill` reads those as "my group", "every process" or a group.
pub fn signal_pid(pid: u32, sig: i32) -> io::Result<()> {
    let pid = match i32::try_from(pid) {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("refusing to signal pid {pid}"),
            ))
        }
    };
    // SAFETY: kill with a positive pid and a plain signal number touches no memory.
    if unsafe { libc::kill(pid, sig) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new inotify instance, non-blocking and close-on-exec, ready to register with mio.
pub fn inotify_init() -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes only flags.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: inotify_init1 succeeded, so `fd` is open and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `path` for `mask` (e.g. `IN_MODIFY` on a `cgroup.events`); returns the watch
/// descriptor `read_events` reports. Watching the same file again returns the same wd.
pub fn inotify_add_watch(fd: impl AsFd, path: &Path, mask: u32) -> io::Result<i32> {
    let c = path_cstring(path)?;
    // SAFETY: `fd` is a live descriptor borrowed for the call and `c` a NUL-terminated
    // string that outlives it.
    let wd = unsafe { libc::inotify_add_watch(fd.as_fd().as_raw_fd(), c.as_ptr(), mask) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

/// Stops watch `wd`. The kernel drops a watch by itself when its file goes away (an
/// `rmdir` of the cgroup), so `EINVAL` (no such watch any more) is not an error.
pub fn inotify_rm_watch(fd: impl AsFd, wd: i32) -> io::Result<()> {
    // SAFETY: plain integers; the descriptor is borrowed and live for the call.
    if unsafe { libc::inotify_rm_watch(fd.as_fd().as_raw_fd(), wd) } < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err);
        }
    }
    Ok(())
}

/// Drains the inotify descriptor without blocking and returns the wd of every event read,
/// in order, duplicates kept. `OVERFLOW_WD` stands for a queue overflow. Removal notices
/// (`IN_IGNORED`, sent when a watched cgroup is removed) are left out: the caller removed
/// it and knows.
pub fn read_events(fd: impl AsFd) -> io::Result<Vec<i32>> {
    // Large enough for many events and for the largest one (a header plus NAME_MAX + 1),
    // which a buffer must hold or read fails with EINVAL.
    let mut buf = [0u8; 4096];
    let mut wds = Vec::new();
    loop {
        // SAFETY: `buf` is writable for its whole length and outlives the call.
        let n = unsafe {
            libc::read(
                fd.as_fd().as_raw_fd(),
                buf.as_mut_ptr().cast::<libc::c_void>(),
                buf.len(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(wds),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        }
        if n == 0 {
            return Ok(wds);
        }
        parse_events(&buf[..n as usize], &mut wds);
    }
}

/// Splits one read's bytes into events: `wd i32, mask u32, cookie u32, len u32`, then
/// `len` bytes of name (always empty for a watched file). Read as bytes, so the buffer
/// needs no alignment.
fn parse_events(mut bytes: &[u8], wds: &mut Vec<i32>) {
    const HEADER: usize = 16;
    while bytes.len() >= HEADER {
        let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
        let wd = i32::from_ne_bytes(word(0));
        let mask = u32::from_ne_bytes(word(4));
        let len = u32::from_ne_bytes(word(12)) as usize;
        if mask & libc::IN_Q_OVERFLOW != 0 {
            wds.push(OVERFLOW_WD);
        } else if mask & libc::IN_IGNORED == 0 {
            wds.push(wd);
        }
        bytes = bytes.get(HEADER + len..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_round_trip() {
        assert_eq!(signal_by_name("SIGINT"), Some(libc::SIGINT));
        assert_eq!(signal_by_name("term"), Some(libc::SIGTERM));
        assert_eq!(signal_by_name("SIGSEGV"), None, "not one bash/kill sends");
        assert_eq!(signal_number("SIGSEGV"), Some(libc::SIGSEGV));
        assert_eq!(signal_number("SIG40"), Some(40));
        assert_eq!(signal_number("nope"), None);
        assert_eq!(signal_by_name("9"), None, "names only");
        assert_eq!(signal_by_name(""), None);
        assert_eq!(signal_by_name("SIG"), None);
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(200), "SIG200");
    }

    fn event(wd: i32, mask: u32, name_len: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&wd.to_ne_bytes());
        v.extend_from_slice(&mask.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&name_len.to_ne_bytes());
        v.resize(v.len() + name_len as usize, 0);
        v
    }

    #[test]
    fn parses_events_skipping_names_and_ignored() {
        let mut bytes = event(3, libc::IN_MODIFY, 0);
        bytes.extend(event(4, libc::IN_MODIFY, 16));
        bytes.extend(event(3, libc::IN_IGNORED, 0));
        bytes.extend(event(-1, libc::IN_Q_OVERFLOW, 0));
        bytes.extend(event(5, libc::IN_MODIFY, 0));
        let mut wds = Vec::new();
        parse_events(&bytes, &mut wds);
        assert_eq!(wds, vec![3, 4, OVERFLOW_WD, 5]);
    }

    #[test]
    fn refuses_group_and_broadcast_pids() {
        for pid in [0, u32::MAX, i32::MAX as u32 + 1] {
            let err = signal_pid(pid, 0).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "pid {pid}");
        }
        signal_pid(std::process::id(), 0).expect("signal 0 to ourselves");
    }

    #[test]
    fn inotify_reports_a_modified_file() {
        let dir = std::env::temp_dir().join(format!("execd-cgsys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cgroup.events");
        std::fs::write(&file, "populated 1\n").unwrap();
        let fd = inotify_init().unwrap();
        assert_eq!(
            read_events(&fd).unwrap(),
            Vec::<i32>::new(),
            "empty, not blocking"
        );
        let wd = inotify_add_watch(&fd, &file, IN_MODIFY).unwrap();
        std::fs::write(&file, "populated 0\n").unwrap();
        let got = read_events(&fd).unwrap();
        assert!(!got.is_empty() && got.iter().all(|&w| w == wd), "{got:?}");
        inotify_rm_watch(&fd, wd).unwrap();
        inotify_rm_watch(&fd, wd).expect("a second removal is not an error");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
