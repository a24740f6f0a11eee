//! The sandbox on the kernel's side (PROTOCOL 16): what the kernel offers (probed once at
//! start), what is the same for every sandboxed spawn (its seccomp program, the descriptors
//! of the roots the operator named, a mount namespace per set of protected entries), and
//! what one spawn needs (`Confined`: its own Landlock ruleset and the rest, handed to
//! the child, which only applies them with raw system calls: `sys::spawn`).
//!
//! Choices:
//! - Nothing here opens or looks at a path a peer chose. The roots execd trusts (the
//!   workspaces, `--tmpdir`, homes, the devices every sandbox allows, each absolute path
//!   the operator's sandboxes name) are resolved at start (and at a policy reload) and
//!   opened `O_PATH` at the first sandboxed spawn after that, and a spawn's ruleset is
//!   built from those descriptors. A root a
//!   request named is opened by the child: `openat2` beneath the trusted root it lies in
//!   (`RESOLVE_BENEATH`, so a symlink cannot lead it out), or as named when an approver
//!   let it run wider than in force.
//! - `$CWD` is the workspace the command's directory lies in by its words (the core
//!   chooses it without looking); the child checks the directory it entered really lies
//!   under that workspace's root by walking `..` up to it by device and inode, and
//!   fails the start otherwise.
//! - A ruleset is never changed once built and never shared: each spawn gets its own,
//!   built here from the trusted descriptors (a handful of system calls), plus whatever
//!   the child adds to it for roots a request named, before it restricts itself. The
//!   loop builds the next one ahead, once no spawn is in flight, from what the last
//!   sandboxed spawn's was built from (`prepare`); a spawn whose sandbox gives the same
//!   rules takes it, any other closes it unused.
//! - `protect`: the entries named directly in a write root, looked up on the loop by
//!   `fstatat` on the trusted root's descriptor (a root the operator named; a name in it
//!   that a hung mount covered would hold the loop, which only a privileged process
//!   outside every sandbox could arrange), are kept read-only by read-only bind mounts
//!   in a mount namespace shared by every spawn with the same protected entries, made
//!   once by a short-lived thread and entered by the child with `setns`. A namespace is
//!   made again when an entry was replaced (its device and inode changed: a bind mount
//!   over a removed directory goes away with it). The namespace also hides
//!   `/run/user/*` and `/tmp/.X11-unix` under empty read-only directories. With nothing
//!   to protect (no such entry at spawn) there is no namespace, and nothing is hidden. A root a
//!   request named in which a protected name exists is refused (fail closed): no
//!   namespace is made per spawn.
//! - Capabilities: the bounding set is emptied and `SECBIT_NOROOT` locked before the
//!   user switch (once a root daemon's child becomes another user it no longer holds
//!   `CAP_SETPCAP`); this needs `CAP_SETPCAP`, so a daemon without it (not root) skips
//!   it, and its commands (its own uid, not root) gain nothing at exec anyway with
//!   `no_new_privs`. Inheritable and ambient capabilities are cleared after the switch.
//!
//! Invariants:
//! - A sandbox the kernel cannot give is refused with the reason (`unavailable`), never
//!   run weaker: no Landlock, or an ABI below 3 for a sandbox that restricts writes;
//!   `protect` where no mount namespace can be made.
//! - Descriptors a child reads stay open until it exec'd: `Confined` owns them (the
//!   bases it opens beneath are duplicates, the seccomp program is shared by `Arc`).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope, ABI,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::policy::sandbox::{needs_namespace, Given, Kernel, Network, Paths};

/// The newest Landlock ABI whose rights execd knows how to use. Later ABIs mediate more
/// (Unix sockets by path in 9), which the README does not promise; they are used as 8.
pub const ABI_USED_MAX: u8 = 8;
/// Devices every sandbox may read and write (a new PTY is no way out).
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];
/// Writable wherever `$TMPDIR` is (POSIX shared memory, `multiprocessing`).
const SHM: &str = "/dev/shm";
/// Variables a sandboxed command does not get: ways to Unix sockets outside it.
pub const DROPPED_ENV: [&str; 6] = [
    "DBUS_SESSION_BUS_ADDRESS",
    "SSH_AUTH_SOCK",
    "TMUX",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
];
/// Mount namespaces kept at once (one per set of protected entries).
const NAMESPACES: usize = 32;
/// The most bytes of a `.git` or `commondir` file read.
const GITFILE_MAX: usize = 4096;

/// Probes what the kernel offers. `abi_max`: `--landlock-abi-max`.
pub fn probe(abi_max: Option<u8>) -> Kernel {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only reports the ABI.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    let kernel_abi = u8::try_from(v.max(0)).unwrap_or(u8::MAX);
    let abi = kernel_abi.min(ABI_USED_MAX).min(abi_max.unwrap_or(u8::MAX));
    Kernel {
        abi,
        kernel_abi,
        no_namespace: probe_namespace().err(),
        setpcap: has_setpcap(),
    }
}

/// Whether the daemon holds `CAP_SETPCAP` in its effective set.
fn has_setpcap() -> bool {
    let mut hdr = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a v3 header and room for its two data words.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    const CAP_SETPCAP: u32 = 8;
    rc == 0 && data[0].effective & (1 << CAP_SETPCAP) != 0
}

/// The kernel's capability header (`capget(2)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CapHeader {
    pub version: u32,
    pub pid: i32,
}

/// One word of the kernel's capability sets (`capget(2)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CapData {
    pub effective: u32,
    pub permitted: u32,
    pub inheritable: u32,
}

/// The highest capability number this kernel knows.
fn cap_last() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Whether a mount namespace can be made and entered: as root (`CAP_SYS_ADMIN`) one of
/// its own; otherwise inside a user namespace of the daemon's own (which the kernel may
/// forbid: `user.max_user_namespaces` 0, an AppArmor or seccomp rule); and the kernel and
/// any seccomp filter the daemon runs under let `unshare` pass.
fn probe_namespace() -> Result<(), String> {
    make_namespace(&[], &[])
        .map(drop)
        .map_err(|e| format!("one cannot be made here ({e})"))
}

/// A mount namespace made for `protect`, and the user namespace that owns it when the
/// daemon is not root (entered first).
#[derive(Debug)]
pub struct Made {
    pub mnt: OwnedFd,
    pub user: Option<OwnedFd>,
}

impl Made {
    fn dup(&self) -> io::Result<Made> {
        Ok(Made {
            mnt: self.mnt.try_clone()?,
            user: self.user.as_ref().map(OwnedFd::try_clone).transpose()?,
        })
    }
}

/// Makes a mount namespace in which every path of `protect` is a read-only bind of
/// itself and every directory of `hide` an empty read-only directory; returns it. As
/// root, on a thread of its own (which ends at once: the daemon's own threads stay where
/// they are); otherwise in a helper process that makes a user namespace first
/// (`make_user_namespace`).
fn make_namespace(protect: &[PathBuf], hide: &[PathBuf]) -> io::Result<Made> {
    let protect: Vec<CString> = protect
        .iter()
        .map(|p| super::path_cstring(p))
        .collect::<io::Result<_>>()?;
    let hide: Vec<CString> = hide
        .iter()
        .map(|p| super::path_cstring(p))
        .collect::<io::Result<_>>()?;
    // The flags each protected mount is kept with (a user namespace may not drop them).
    let kept: Vec<libc::c_ulong> = protect.iter().map(|p| locked_flags(p)).collect();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return make_user_namespace(&protect, &kept, &hide);
    }
    let made = std::thread::Builder::new()
        .name("execd-mntns".into())
        .spawn(move || -> io::Result<Made> {
            let check = |rc: libc::c_int, what: &str| {
                if rc < 0 {
                    let e = io::Error::last_os_error();
                    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
                } else {
                    Ok(())
                }
            };
            // SAFETY: unshare and mount with valid NUL-terminated strings; they change
            // this thread's mount namespace only (CLONE_NEWNS implies CLONE_FS).
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNS), "unshare")?;
                if let Err((step, errno)) = mount_protected(&protect, &kept, &hide) {
                    let e = io::Error::from_raw_os_error(errno);
                    return Err(io::Error::new(e.kind(), format!("{step}: {e}")));
                }
                let fd = libc::open(
                    c"/proc/thread-self/ns/mnt".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                check(fd, "opening the namespace")?;
                Ok(Made {
                    mnt: OwnedFd::from_raw_fd(fd),
                    user: None,
                })
            }
        })?;
    made.join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// The mount flags of the mount `path` lies on that a read-only remount of a bind of it
/// must keep: in a user namespace the kernel refuses to drop them (they are locked).
fn locked_flags(path: &CStr) -> libc::c_ulong {
    // SAFETY: statvfs fills a struct we own from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    // Neither relatime nor noatime: the mount is strictatime, which is locked too.
    let strict = st.f_flag & (libc::ST_RELATIME | libc::ST_NOATIME) == 0;
    [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
    .fold(
        if strict { libc::MS_STRICTATIME } else { 0 },
        |acc, (_, ms)| acc | ms,
    )
}

/// In a new mount namespace (already entered): `/` made a slave (mounts made outside
/// still appear inside; none made here leaks out), each path of `protect` bound over
/// itself read-only (keeping `kept`, its mount's locked flags), each of `hide` covered by
/// an empty read-only tmpfs (best effort: a directory that went away has nothing to
/// hide). The step that failed and its errno.
///
/// # Safety
/// System calls on NUL-terminated strings; no allocation, so a forked helper may run it.
unsafe fn mount_protected(
    protect: &[CString],
    kept: &[libc::c_ulong],
    hide: &[CString],
) -> Result<(), (&'static str, i32)> {
    let check = |rc: libc::c_int, step: &'static str| {
        if rc < 0 {
            Err((step, io::Error::last_os_error().raw_os_error().unwrap_or(0)))
        } else {
            Ok(())
        }
    };
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: mount with NUL-terminated strings and null pointers where allowed.
    unsafe {
        check(
            libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ),
            "making / a slave",
        )?;
        for (p, &kept) in protect.iter().zip(kept) {
            let bind = libc::MS_BIND | libc::MS_REC;
            check(
                libc::mount(p.as_ptr(), p.as_ptr(), none, bind, std::ptr::null()),
                "bind",
            )?;
            let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept;
            check(
                libc::mount(none, p.as_ptr(), none, ro, std::ptr::null()),
                "read-only remount",
            )?;
        }
        for h in hide {
            libc::mount(
                c"tmpfs".as_ptr(),
                h.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=4k,mode=0755".as_ptr().cast(),
            );
        }
    }
    Ok(())
}

/// A daemon that is not root makes its mount namespace inside a user namespace of its
/// own, mapping only its own uid and gid (so a command in it is who it was, and files of
/// other owners show as the overflow id): a helper process (a user namespace cannot be
/// made by a process with threads, nor entered by one) `unshare`s both, writes its maps,
/// mounts, and says so on a pipe; the daemon opens both namespaces through `/proc/PID/ns`
/// and lets it go. The helper is forked from the loop's thread and makes only system
/// calls on memory prepared before the fork; it waits at most `HELPER_WAIT`.
fn make_user_namespace(
    protect: &[CString],
    kept: &[libc::c_ulong],
    hide: &[CString],
) -> io::Result<Made> {
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let uid_map = format!("{uid} {uid} 1\n");
    let gid_map = format!("{gid} {gid} 1\n");
    let (ready_r, ready_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    // SAFETY: the daemon's loop thread forks; the child runs `helper` only (system calls
    // on memory prepared above, then `_exit`).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: the forked child, which never returns from here. Its copies of the
        // daemon's ends go first: the end of `go` it waits on must be the daemon's only.
        unsafe {
            libc::close(go_w.as_raw_fd());
            libc::close(ready_r.as_raw_fd());
            helper(
                (protect, kept, hide),
                (uid_map.as_bytes(), gid_map.as_bytes()),
                ready_w.as_raw_fd(),
                go_r.as_raw_fd(),
            )
        }
    }
    drop((ready_w, go_r));
    let result = helper_answer(pid, &ready_r);
    // Lets the helper go (its read of `go` ends), then reaps it; it exits at once.
    drop(go_w);
    let mut status = 0;
    // SAFETY: waits for the child forked above, which is about to exit. One killed
    // while stuck in a mount on a hung file system is left to the loop's reaping rather
    // than waited for here.
    let flags = if result.is_ok() { 0 } else { libc::WNOHANG };
    unsafe { libc::waitpid(pid, &mut status, flags) };
    result
}

/// How long the daemon waits for the helper's word.
const HELPER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The helper's word on `ready` (its failed step and errno, or that it is ready), and
/// then its namespaces.
fn helper_answer(pid: libc::pid_t, ready: &OwnedFd) -> io::Result<Made> {
    let mut pfd = libc::pollfd {
        fd: ready.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let until = std::time::Instant::now() + HELPER_WAIT;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        // SAFETY: poll on one descriptor we own.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
        // A signal is no answer: wait for the rest of the time.
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n > 0 {
            break;
        }
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the user namespace helper did not answer",
        ));
    }
    let mut word = [0u8; 5];
    // SAFETY: reads at most 5 bytes into our buffer.
    let got = unsafe { libc::read(ready.as_raw_fd(), word.as_mut_ptr().cast(), word.len()) };
    if got != 5 {
        return Err(io::Error::other("the user namespace helper died"));
    }
    let errno = i32::from_ne_bytes([word[1], word[2], word[3], word[4]]);
    if word[0] != 0 {
        let step = HELPER_STEPS
            .get(usize::from(word[0]))
            .copied()
            .unwrap_or("a step");
        let e = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(e.kind(), format!("{step}: {e}")));
    }
    let open = |ns: &str| -> io::Result<OwnedFd> {
        let path = CString::new(format!("/proc/{pid}/ns/{ns}"))
            .map_err(|_| io::Error::other("a path with a NUL"))?;
        // SAFETY: a NUL-terminated path; the descriptor is ours.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    Ok(Made {
        user: Some(open("user")?),
        mnt: open("mnt")?,
    })
}

/// The helper's steps, by the number it reports (0: ready).
const HELPER_STEPS: [&str; 6] = [
    "ready",
    "unshare(CLONE_NEWUSER | CLONE_NEWNS)",
    "writing setgroups",
    "writing uid_map",
    "writing gid_map",
    "mounting",
];

/// The helper, in the forked child: never returns.
///
/// # Safety
/// Only in the child of `fork`, with the arguments prepared before it.
unsafe fn helper(
    (protect, kept, hide): (&[CString], &[libc::c_ulong], &[CString]),
    (uid_map, gid_map): (&[u8], &[u8]),
    ready: RawFd,
    go: RawFd,
) -> ! {
    let say = |step: u8, errno: i32| {
        let e = errno.to_ne_bytes();
        let word = [step, e[0], e[1], e[2], e[3]];
        // SAFETY: writes our 5 bytes to the pipe.
        unsafe { libc::write(ready, word.as_ptr().cast(), word.len()) };
    };
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let write_file = |path: &CStr, text: &[u8]| -> bool {
        // SAFETY: open, write and close on a NUL-terminated path and our bytes.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return false;
            }
            let n = libc::write(fd, text.as_ptr().cast(), text.len());
            libc::close(fd);
            n == text.len() as isize
        }
    };
    // SAFETY: system calls on prepared memory, then `_exit`.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) < 0 {
            say(1, errno());
            libc::_exit(1);
        }
        let maps: [(&CStr, &[u8], u8); 3] = [
            (c"/proc/self/setgroups", b"deny", 2),
            (c"/proc/self/uid_map", uid_map, 3),
            (c"/proc/self/gid_map", gid_map, 4),
        ];
        for (path, text, step) in maps {
            if !write_file(path, text) {
                say(step, errno());
                libc::_exit(1);
            }
        }
        if let Err((_, e)) = mount_protected(protect, kept, hide) {
            say(5, e);
            libc::_exit(1);
        }
        say(0, 0);
        let mut b = 0u8;
        libc::read(go, (&mut b as *mut u8).cast(), 1);
        libc::_exit(0);
    }
}

/// A pipe, both ends close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into our array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both just made, owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The seccomp program of every kind of sandbox, compiled once. A spawn loads one
/// program, never several: the kernel JIT-compiles each program it is given and, for
/// each, runs it over every call number of both ABIs (about 900) to learn which calls
/// it may let through without running filters at all, so each program loaded costs
/// the spawn, and each instruction on a plain call's way to "allow" costs it 900 steps.
///
/// The program has two parts, chained (the first that does not allow decides):
/// - `first` (written here, not by seccompiler, which checks the architecture again in
///   every filter and gives one action per filter): kills a foreign architecture's
///   calls (i386 `int 0x80`, x32); for `network: none`, `socket()` of any family but
///   `AF_UNIX` is `EACCES` and `io_uring_setup` is `ENOSYS` (io_uring's operations never
///   pass seccomp). A plain call takes five instructions to "allow", seven with the
///   network's.
/// - where Landlock cannot scope signals, signals and pidfds aimed at the daemon, its
///   group or every process: `EPERM` (seccompiler, for its argument comparisons).
#[derive(Debug)]
pub struct Filters {
    /// Indexed by `network: none` (1) + 2 * (signals need the filter).
    programs: [Vec<libc::sock_filter>; 4],
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;

/// `seccomp_data`: where the call number, the architecture and the low word of the
/// first argument are (every architecture execd builds for is little-endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
/// No guard known: every call is killed, so sandboxes fail closed.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: u32 = 0;
/// x32 shares x86_64's architecture and is told apart by bit 30 of the call number.
#[cfg(target_arch = "x86_64")]
const X32: u32 = 0x4000_0000;
#[cfg(not(target_arch = "x86_64"))]
const X32: u32 = u32::MAX;

/// The first part of every program (see `Filters`).
fn first(network_none: bool) -> Vec<libc::sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let mut p = vec![
        op(LD_W_ABS, 0, 0, ARCH),
        op(JEQ_K, 1, 0, AUDIT_ARCH),
        op(RET_K, 0, 0, kill),
        op(LD_W_ABS, 0, 0, NR),
        op(JGE_K, 0, 1, X32),
        op(RET_K, 0, 0, kill),
    ];
    if network_none {
        // The family is an int: the kernel reads the low word only, and so does this.
        p.extend([
            op(JEQ_K, 0, 3, libc::SYS_socket as u32),
            op(LD_W_ABS, 0, 0, ARG0_LOW),
            op(JEQ_K, 3, 0, libc::AF_UNIX as u32),
            op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EACCES as u32),
            op(JEQ_K, 0, 1, libc::SYS_io_uring_setup as u32),
            op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ]);
    }
    p.push(op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW));
    p
}

/// One program that runs `parts` one after another: every "allow" of a part but the
/// last becomes a jump to the next part's first instruction. Every other return stays,
/// so the first part that does not allow a call decides, as the kernel decides among
/// separately loaded programs when only one of them does not allow it.
fn chain(parts: &[&[libc::sock_filter]]) -> Vec<libc::sock_filter> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for (n, part) in parts.iter().enumerate() {
        let last = n + 1 == parts.len();
        for (i, f) in part.iter().enumerate() {
            if !last && f.code == RET_K && f.k == libc::SECCOMP_RET_ALLOW {
                let k = (part.len() - i - 1) as u32;
                out.push(libc::sock_filter {
                    code: JA,
                    jt: 0,
                    jf: 0,
                    k,
                });
            } else {
                out.push(*f);
            }
        }
    }
    out
}

fn bpf(p: seccompiler::BpfProgram) -> Vec<libc::sock_filter> {
    p.into_iter()
        .map(|f| libc::sock_filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        })
        .collect()
}

fn compile(
    rules: Vec<(i64, Vec<SeccompRule>)>,
    action: SeccompAction,
) -> Result<Vec<libc::sock_filter>, String> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        action,
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let prog: seccompiler::BpfProgram = filter.try_into().map_err(|e| format!("seccomp: {e}"))?;
    Ok(bpf(prog))
}

fn cond(arg: u8, value: u64, op: SeccompCmpOp) -> Result<SeccompRule, String> {
    all_of(&[(arg, value, op)])
}

/// A rule that holds when every `(arg, value, op)` does.
fn all_of(conds: &[(u8, u64, SeccompCmpOp)]) -> Result<SeccompRule, String> {
    conds
        .iter()
        .map(|(arg, value, op)| {
            SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, op.clone(), *value)
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(SeccompRule::new)
        .map_err(|e| format!("seccomp: {e}"))
}

/// `fcntl` and `ioctl` numbers the libc crate does not name (asm-generic, every
/// architecture execd builds for).
const F_SETOWN_EX: i32 = 15;
const FIOSETOWN: i32 = 0x8901;
const SIOCSPGRP: i32 = 0x8902;

/// The signals part of `Filters`; `pid` and `pgrp` are the daemon's.
fn signals(pid: i32, pgrp: i32) -> Result<Vec<libc::sock_filter>, String> {
    let eq = |arg: u8, v: i32| cond(arg, v as u32 as u64, SeccompCmpOp::Eq);
    let aimed = |arg: u8| -> Result<Vec<SeccompRule>, String> {
        Ok(vec![eq(arg, pid)?, eq(arg, -pgrp)?, eq(arg, -1)?])
    };
    compile(
        vec![
            (libc::SYS_kill, aimed(0)?),
            (libc::SYS_tkill, vec![eq(0, pid)?]),
            (libc::SYS_tgkill, vec![eq(0, pid)?]),
            (libc::SYS_rt_sigqueueinfo, vec![eq(0, pid)?]),
            (libc::SYS_rt_tgsigqueueinfo, vec![eq(0, pid)?]),
            (libc::SYS_pidfd_open, vec![eq(0, pid)?]),
            // A `/proc/PID` directory is a pidfd too, and whose it is cannot be seen
            // here: no pidfd signals at all.
            (libc::SYS_pidfd_send_signal, vec![]),
            // The daemon as the owner of a descriptor's I/O signals (`SIGIO`, or any
            // signal `F_SETSIG` names): by pid or group; `F_SETOWN_EX` and the
            // socket ioctls take a pointer, so they are refused whatever they name.
            (
                libc::SYS_fcntl,
                vec![
                    all_of(&[
                        (1, libc::F_SETOWN as u64, SeccompCmpOp::Eq),
                        (2, pid as u32 as u64, SeccompCmpOp::Eq),
                    ])?,
                    all_of(&[
                        (1, libc::F_SETOWN as u64, SeccompCmpOp::Eq),
                        (2, (-pgrp) as u32 as u64, SeccompCmpOp::Eq),
                    ])?,
                    eq(1, F_SETOWN_EX)?,
                ],
            ),
            (libc::SYS_ioctl, vec![eq(1, FIOSETOWN)?, eq(1, SIOCSPGRP)?]),
        ],
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

impl Filters {
    /// Compiles every program; `pid` and `pgrp` are the daemon's.
    pub fn compile(pid: i32, pgrp: i32) -> Result<Filters, String> {
        let signals = signals(pid, pgrp)?;
        let programs = [(false, false), (true, false), (false, true), (true, true)].map(
            |(network_none, signals_too)| {
                let first = first(network_none);
                if signals_too {
                    chain(&[&first, &signals])
                } else {
                    first
                }
            },
        );
        // The kernel's limit on one program (BPF_MAXINSNS).
        if programs.iter().any(|p| p.len() > 4096) {
            return Err("seccomp: the program is longer than the kernel takes".into());
        }
        Ok(Filters { programs })
    }

    /// The program for a sandbox: with or without `network: none`'s part, with or
    /// without the signals' part.
    fn program(&self, network_none: bool, signals_too: bool) -> &[libc::sock_filter] {
        &self.programs[usize::from(network_none) + 2 * usize::from(signals_too)]
    }
}

/// `struct landlock_path_beneath_attr`.
#[repr(C, packed)]
pub struct PathBeneathAttr {
    pub allowed_access: u64,
    pub parent_fd: i32,
}

/// Adds the rule "`access` beneath `root`" to `ruleset`. By hand rather than the
/// landlock crate's `add_rule`, which looks at the descriptor with `fstatat` on every
/// rule to learn whether it is a directory; execd knows it for every root it opened,
/// and a spawn adds about ten rules.
fn add_rule(ruleset: &OwnedFd, root: &OwnedFd, access: u64) -> io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: root.as_raw_fd(),
    };
    // SAFETY: landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, &attr, 0) with
    // two descriptors this process holds and an attribute on this stack.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            1,
            &attr as *const PathBeneathAttr,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A root execd trusts, opened at start.
#[derive(Debug)]
struct Trusted {
    fd: OwnedFd,
    dir: bool,
}

/// A mount namespace kept for a set of protected entries.
#[derive(Debug)]
struct Namespace {
    made: Made,
}

/// What the loop holds for sandboxed spawns.
#[derive(Debug)]
pub struct Sandboxer {
    pub kernel: Kernel,
    filters: Arc<Filters>,
    cap_last: u32,
    trusted: HashMap<PathBuf, Trusted>,
    /// Each workspace's real path -> its root's device and inode (for the child's check).
    roots: HashMap<PathBuf, (u64, u64)>,
    namespaces: HashMap<Vec<(PathBuf, u64, u64)>, Namespace>,
    /// Directories hidden in every namespace.
    hide: Vec<PathBuf>,
    /// The real `--tmpdir`.
    tmpdir: Option<PathBuf>,
    /// Roots to trust, opened at the first sandboxed spawn (`trust`).
    pending: Option<(Vec<PathBuf>, Vec<PathBuf>)>,
    /// What the last sandboxed spawn's ruleset was built from.
    last: Option<RulesetKey>,
    /// A ruleset built from `last` ahead of the next spawn (`prepare`), unused.
    ahead: Option<OwnedFd>,
    /// How many rulesets were built, for the tests.
    #[cfg(test)]
    builds: std::cell::Cell<u32>,
}

/// What the loop builds a spawn's Landlock ruleset from: the rights it handles and the
/// rules on trusted roots (by path: `trusted` is only replaced by `trust`, which forgets
/// every key). Two spawns with equal keys get rulesets with the same rules before
/// their children add the roots their requests named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RulesetKey {
    handled: BitFlags<AccessFs>,
    net: bool,
    scoped: bool,
    rules: Vec<(PathBuf, u64)>,
}

/// A `Confined` child rule: a root the child opens and adds to its ruleset.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct ChildRule {
    /// Where `path` is opened from (a duplicate of a trusted root), or `AT_FDCWD`.
    pub base: RawFd,
    /// Relative to `base` (or absolute with `AT_FDCWD`), NUL-terminated.
    pub path: *const libc::c_char,
    /// `openat2` resolve flags: `RESOLVE_BENEATH` when opened beneath a trusted root.
    pub resolve: u64,
    /// Rights for a directory; `file_access` for anything else.
    pub access: u64,
    pub file_access: u64,
    /// A write root: the protected names must be absent in it.
    pub write: bool,
    /// How the root is written, for the error.
    pub shown: *const libc::c_char,
}

/// What one sandboxed spawn needs, owned until the child exec'd.
#[derive(Debug)]
pub struct Confined {
    /// Its own Landlock ruleset (none when nothing is mediated by Landlock).
    pub ruleset: Option<OwnedFd>,
    /// The mount namespace to enter (a duplicate), for `protect`.
    pub mntns: Option<OwnedFd>,
    /// The user namespace that owns it, entered first (a daemon that is not root).
    pub userns: Option<OwnedFd>,
    /// Roots the child opens and adds (pointers into `strings`, bases into `bases`).
    pub rules: Vec<ChildRule>,
    /// Protected names, for the child's check of the roots it opens.
    pub protect: Vec<CString>,
    pub protect_ptrs: Vec<*const libc::c_char>,
    /// The workspace root's device and inode the directory must lie under.
    pub verify: Option<(u64, u64)>,
    /// The seccomp program to load (`Filters`: one for the whole sandbox).
    pub program: libc::sock_fprog,
    /// Empty the bounding set and lock `SECBIT_NOROOT` (the daemon holds `CAP_SETPCAP`).
    pub drop_bounding: bool,
    pub cap_last: u32,
    /// `TMPDIR` for the command.
    pub tmpdir: Option<PathBuf>,
    strings: Vec<CString>,
    bases: Vec<OwnedFd>,
    /// What `program` points into, kept alive with it.
    _filters: Arc<Filters>,
}

/// The part of a sandbox that is the same for every command of its kind, which a spare
/// child applies before it knows its command (`sys::spawn`): the bounding set emptied and
/// `SECBIT_NOROOT` locked (where the daemon holds `CAP_SETPCAP`), `no_new_privs`, the
/// seccomp program.
#[derive(Clone)]
pub struct Common {
    pub program: libc::sock_fprog,
    pub drop_bounding: bool,
    pub cap_last: u32,
    /// What `program` points into, kept alive with it.
    _filters: Arc<Filters>,
}

impl Common {
    /// Whether a spare that applied `self` may run a command whose sandbox has `other`.
    pub fn same(&self, other: &Common) -> bool {
        std::ptr::eq(self.program.filter, other.program.filter)
            && self.program.len == other.program.len
            && self.drop_bounding == other.drop_bounding
            && self.cap_last == other.cap_last
    }
}

#[cfg(test)]
impl Common {
    /// A common part whose program the kernel refuses (no instruction): a spare that
    /// applies it fails its early steps.
    pub fn refused() -> Common {
        Common {
            program: libc::sock_fprog {
                len: 0,
                filter: std::ptr::null_mut(),
            },
            drop_bounding: false,
            cap_last: 0,
            _filters: Arc::new(Filters::compile(0, 0).expect("filters")),
        }
    }
}

impl Confined {
    /// The part a spare may apply ahead. None for a sandbox entered through a user
    /// namespace: entering one fills the bounding set again, so it is emptied after.
    pub fn common(&self) -> Option<Common> {
        if self.userns.is_some() {
            return None;
        }
        Some(Common {
            program: self.program,
            drop_bounding: self.drop_bounding,
            cap_last: self.cap_last,
            _filters: self._filters.clone(),
        })
    }
}

/// The Landlock ABI enum of a version number.
fn abi_of(n: u8) -> ABI {
    match n {
        0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        _ => ABI::V8,
    }
}

/// Opens `path` `O_PATH`, following symlinks: `(fd, is a directory, dev, ino)`.
fn open_path(path: &Path) -> io::Result<(OwnedFd, bool, u64, u64)> {
    let c = super::path_cstring(path)?;
    // SAFETY: a valid path and plain flags.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open succeeded; we own it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(fd.as_raw_fd())?;
    Ok((
        fd,
        st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        st.st_dev,
        st.st_ino,
    ))
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a pointer to `st`.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`, `None` when there is nothing there.
fn entry(dir: RawFd, name: &str) -> Option<libc::stat> {
    let c = CString::new(name).ok()?;
    // SAFETY: stat is plain old data for fstatat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor, a valid name and a pointer to `st`.
    let rc = unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    (rc == 0).then_some(st)
}

/// Reads at most `GITFILE_MAX` bytes of regular file `name` in `dir` (no symlink).
fn read_small(dir: RawFd, name: &str) -> Option<String> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid name and plain flags.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: openat succeeded; we own it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if fstat(fd.as_raw_fd()).ok()?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let mut buf = vec![0u8; GITFILE_MAX];
    // SAFETY: reading into a buffer we own.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    String::from_utf8(buf).ok()
}

/// `base` joined with `rel` read lexically (`..` drops a component).
fn lexical(base: &Path, rel: &str) -> PathBuf {
    let mut out = if rel.starts_with('/') {
        PathBuf::from("/")
    } else {
        base.to_path_buf()
    };
    for c in Path::new(rel).components() {
        match c {
            std::path::Component::Normal(w) => out.push(w),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

impl Sandboxer {
    /// Probes the kernel and compiles the seccomp programs.
    pub fn new(abi_max: Option<u8>) -> Result<Sandboxer, String> {
        // SAFETY: getpid and getpgrp cannot fail.
        let (pid, pgrp) = unsafe { (libc::getpid(), libc::getpgrp()) };
        let mut hide: Vec<PathBuf> = std::fs::read_dir("/run/user")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        if Path::new("/tmp/.X11-unix").is_dir() {
            hide.push(PathBuf::from("/tmp/.X11-unix"));
        }
        hide.sort();
        Ok(Sandboxer {
            kernel: probe(abi_max),
            filters: Arc::new(Filters::compile(pid, pgrp)?),
            cap_last: cap_last(),
            trusted: HashMap::new(),
            roots: HashMap::new(),
            namespaces: HashMap::new(),
            hide,
            tmpdir: None,
            pending: None,
            last: None,
            ahead: None,
            #[cfg(test)]
            builds: std::cell::Cell::new(0),
        })
    }

    /// Trusts these roots (their real paths, resolved by the caller), replacing what was
    /// trusted before; workspaces' roots are also remembered by device and inode. They
    /// are opened at the first sandboxed spawn: a daemon that never sandboxes holds none
    /// of their descriptors. Paths that do not exist then are left out (a root that is
    /// not there grants nothing).
    pub fn trust(&mut self, roots: &[PathBuf], workspaces: &[PathBuf], tmpdir: &Path) {
        self.tmpdir = Some(tmpdir.to_path_buf());
        let mut all = roots.to_vec();
        all.push(tmpdir.to_path_buf());
        self.pending = Some((all, workspaces.to_vec()));
        self.trusted.clear();
        self.roots.clear();
        self.last = None;
        self.ahead = None;
    }

    /// Builds, off any spawn's path, the ruleset the next spawn in the last one's sandbox
    /// will take: the loop calls it once no spawn is in flight. A new ruleset for one
    /// spawn, as `confine` would build it then; a spawn in another sandbox closes it
    /// unused and builds its own. One that cannot be built (no descriptor free, say) is
    /// not tried again before the next sandboxed spawn, which builds its own and says
    /// why it could not.
    pub fn prepare(&mut self) {
        if self.ahead.is_some() {
            return;
        }
        let Some(key) = &self.last else {
            return;
        };
        match self.build(key) {
            Ok(fd) => self.ahead = Some(fd),
            Err(_) => self.last = None,
        }
    }

    /// A new ruleset from `key`.
    fn build(&self, key: &RulesetKey) -> Result<OwnedFd, String> {
        #[cfg(test)]
        self.builds.set(self.builds.get() + 1);
        let fail = |e: landlock::RulesetError| format!("Landlock: {e}");
        let mut rs = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
        if !key.handled.is_empty() {
            rs = rs.handle_access(key.handled).map_err(fail)?;
        }
        if key.net {
            rs = rs
                .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
                .map_err(fail)?;
        }
        if key.scoped {
            rs = rs
                .scope(Scope::AbstractUnixSocket | Scope::Signal)
                .map_err(fail)?;
        }
        let ruleset: OwnedFd = Option::from(rs.create().map_err(fail)?)
            .ok_or_else(|| "Landlock: no ruleset was made".to_string())?;
        for (path, rights) in &key.rules {
            let t = self
                .trusted
                .get(path)
                .ok_or_else(|| format!("Landlock: {} is no longer open", path.display()))?;
            add_rule(&ruleset, &t.fd, *rights)
                .map_err(|e| format!("Landlock: {}: {e}", path.display()))?;
        }
        Ok(ruleset)
    }

    /// Opens what `trust` named, once.
    fn open_trusted(&mut self) {
        let Some((roots, workspaces)) = self.pending.take() else {
            return;
        };
        let mut trusted = HashMap::new();
        let mut ids = HashMap::new();
        let fixed = DEVICES
            .iter()
            .chain(std::iter::once(&SHM))
            .map(PathBuf::from);
        for p in roots
            .iter()
            .cloned()
            .chain(workspaces.iter().cloned())
            .chain(fixed)
        {
            if trusted.contains_key(&p) {
                continue;
            }
            if let Ok((fd, dir, dev, ino)) = open_path(&p) {
                if workspaces.contains(&p) {
                    ids.insert(p.clone(), (dev, ino));
                }
                trusted.insert(p, Trusted { fd, dir });
            }
        }
        self.trusted = trusted;
        self.roots = ids;
    }

    /// The trusted root `path` lies in (the longest), and the rest.
    fn trusted_of(&self, path: &Path) -> Option<(&Trusted, PathBuf)> {
        self.trusted
            .iter()
            .filter(|(root, t)| path.starts_with(root) && (t.dir || path == root.as_path()))
            .max_by_key(|(root, _)| root.as_os_str().len())
            .map(|(root, t)| {
                (
                    t,
                    path.strip_prefix(root)
                        .map(Path::to_path_buf)
                        .unwrap_or_default(),
                )
            })
    }

    /// Prepares one spawn in sandbox `g`: its ruleset (its own: the one built ahead when
    /// it has the same rules, else built here), its mount namespace, what its child
    /// opens, and the seccomp program it loads. The error is the reason the sandbox cannot
    /// be given (`sandbox unavailable: ...`).
    pub fn confine(&mut self, g: &Given) -> Result<Confined, String> {
        if let Some(why) = self.kernel.unavailable(g) {
            return Err(why);
        }
        self.open_trusted();
        let s = &g.sandbox;
        let abi = abi_of(self.kernel.abi);
        let write_rights = AccessFs::from_write(abi);
        let read_rights = AccessFs::ReadFile | AccessFs::ReadDir;
        let exec_rights: BitFlags<AccessFs> = AccessFs::Execute.into();
        let mut handled: BitFlags<AccessFs> = BitFlags::EMPTY;
        if s.write != Paths::All {
            handled |= write_rights;
        }
        if s.read != Paths::All {
            handled |= read_rights;
        }
        if s.exec != Paths::All {
            handled |= exec_rights;
        }
        let net = s.network == Network::None && self.kernel.abi >= 4;
        let scoped = self.kernel.abi >= 6;
        let file_rights = AccessFs::from_file(abi);

        let mut confined = Confined {
            ruleset: None,
            mntns: None,
            userns: None,
            rules: Vec::new(),
            protect: s
                .protect
                .iter()
                .map(|n| CString::new(n.as_str()).map_err(|_| "a NUL in protect".to_string()))
                .collect::<Result<_, _>>()?,
            protect_ptrs: Vec::new(),
            verify: None,
            program: libc::sock_fprog {
                len: 0,
                filter: std::ptr::null_mut(),
            },
            drop_bounding: self.kernel.setpcap,
            cap_last: self.cap_last,
            tmpdir: self.tmpdir.clone(),
            strings: Vec::new(),
            bases: Vec::new(),
            _filters: self.filters.clone(),
        };
        confined.protect_ptrs = confined.protect.iter().map(|c| c.as_ptr()).collect();

        // A sandbox that mediates no file access, TCP or scope still gets a Landlock
        // domain of its own, by a ruleset that only refuses making block devices (which
        // no process without capabilities may do anyway): ptrace, and with it reading
        // another command's environment (its cookie tag), stays within a domain.
        if handled.is_empty() && !net && !scoped {
            handled = AccessFs::MakeBlock.into();
        }
        {
            let mut key = RulesetKey {
                handled,
                net,
                scoped,
                rules: Vec::new(),
            };
            // Every root of every list, with its rights; devices; /dev/shm.
            let mut wanted: Vec<(PathBuf, BitFlags<AccessFs>, bool)> = Vec::new();
            for (paths, rights, write) in [
                (&s.write, write_rights | read_rights | exec_rights, true),
                (&s.read, read_rights, false),
                (&s.exec, exec_rights, false),
            ] {
                if let Paths::Only(roots) = paths {
                    wanted.extend(roots.iter().map(|r| (r.clone(), rights, write)));
                }
            }
            let device_rights = AccessFs::ReadFile
                | AccessFs::WriteFile
                | AccessFs::Truncate
                | AccessFs::IoctlDev
                | AccessFs::ReadDir;
            wanted.extend(
                DEVICES
                    .iter()
                    .map(|d| (PathBuf::from(d), device_rights, false)),
            );
            let tmp_writable = match &s.write {
                Paths::All => true,
                Paths::Only(roots) => self
                    .tmpdir
                    .as_ref()
                    .is_some_and(|t| roots.iter().any(|r| t.starts_with(r))),
            };
            if tmp_writable {
                wanted.push((PathBuf::from(SHM), write_rights | read_rights, false));
            }
            for (path, rights, write) in wanted {
                let rights = rights & handled;
                if rights.is_empty() {
                    continue;
                }
                match self.trusted.get(&path) {
                    Some(t) => {
                        let r = if t.dir { rights } else { rights & file_rights };
                        key.rules.push((path, r.bits()));
                    }
                    // A device or /dev/shm this machine lacks grants nothing.
                    None if DEVICES.contains(&path.to_str().unwrap_or(""))
                        || path == Path::new(SHM) => {}
                    None => {
                        let (base, rel, resolve) = match (self.trusted_of(&path), g.escalated) {
                            (Some((t, rel)), _) => {
                                let dup = t.fd.try_clone().map_err(|e| format!("dup: {e}"))?;
                                let fd = dup.as_raw_fd();
                                confined.bases.push(dup);
                                let rel = if rel.as_os_str().is_empty() {
                                    PathBuf::from(".")
                                } else {
                                    rel
                                };
                                // RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
                                (fd, rel, 0x08 | 0x02)
                            }
                            (None, true) => (libc::AT_FDCWD, path.clone(), 0x02),
                            (None, false) => {
                                return Err(format!(
                                    "{} lies in no root execd opened",
                                    path.display()
                                ))
                            }
                        };
                        let c = CString::new(rel.as_os_str().as_bytes())
                            .map_err(|_| "a NUL in a path".to_string())?;
                        let shown = CString::new(path.as_os_str().as_bytes())
                            .map_err(|_| "a NUL in a path".to_string())?;
                        confined.rules.push(ChildRule {
                            base,
                            path: c.as_ptr(),
                            resolve,
                            access: rights.bits(),
                            file_access: (rights & file_rights).bits(),
                            write,
                            shown: shown.as_ptr(),
                        });
                        confined.strings.push(c);
                        confined.strings.push(shown);
                    }
                }
            }
            // The one built ahead for exactly this base, else one built now.
            let ahead = self.ahead.take();
            let ruleset = match ahead {
                Some(fd) if self.last.as_ref() == Some(&key) => fd,
                // Closed unused.
                _ => self.build(&key)?,
            };
            self.last = Some(key);
            confined.ruleset = Some(ruleset);
        }

        if needs_namespace(g) {
            if let Some(made) = self.namespace_for(g)? {
                confined.mntns = Some(made.mnt);
                // Entering a user namespace gives every capability in it, the bounding
                // set included: the child, which then holds `CAP_SETPCAP` there, empties
                // it, so a program with file capabilities gains none at exec.
                confined.drop_bounding |= made.user.is_some();
                confined.userns = made.user;
            }
        }
        if let Some(root) = &g.cwd_root {
            if g.verify_cwd {
                confined.verify = self.roots.get(root).copied();
                if confined.verify.is_none() {
                    return Err(format!("the workspace {} is not open", root.display()));
                }
            }
        }
        let p = self
            .filters
            .program(s.network == Network::None, !self.kernel.signals_scoped());
        confined.program = libc::sock_fprog {
            len: p.len() as u16,
            filter: p.as_ptr() as *mut libc::sock_filter,
        };
        Ok(confined)
    }

    /// The mount namespace for `g`'s protected entries (a duplicate descriptor): the
    /// entries named in `protect` directly in each write root execd opened, a `.git`
    /// file's gitdir and commondir when they lie in a write root; made when no namespace
    /// for exactly these entries (by device and inode) is kept. None when there is
    /// nothing to protect (a name absent at spawn is not protected): the command then
    /// runs in the daemon's own mount namespace, its runtime directories not hidden.
    fn namespace_for(&mut self, g: &Given) -> Result<Option<Made>, String> {
        let Paths::Only(roots) = &g.sandbox.write else {
            return Err("protect with every path writable protects nothing".into());
        };
        let in_a_root = |p: &Path| roots.iter().any(|r| p.starts_with(r));
        let mut entries: Vec<(PathBuf, u64, u64)> = Vec::new();
        for root in roots {
            let Some(t) = self.trusted.get(root).filter(|t| t.dir) else {
                continue; // a root the child opens checks its own entries
            };
            let dir = t.fd.as_raw_fd();
            for name in &g.sandbox.protect {
                let Some(st) = entry(dir, name) else {
                    continue; // a name absent at spawn is not protected
                };
                let path = root.join(name);
                let is_file = st.st_mode & libc::S_IFMT == libc::S_IFREG;
                entries.push((path.clone(), st.st_dev, st.st_ino));
                // A worktree's `.git` file names its gitdir, which names the common one.
                if is_file && name == ".git" {
                    let Some(text) = read_small(dir, name) else {
                        continue;
                    };
                    let Some(gitdir) = text.lines().find_map(|l| l.strip_prefix("gitdir: ")) else {
                        continue;
                    };
                    let gitdir = lexical(root, gitdir.trim());
                    let mut named = vec![gitdir.clone()];
                    if let Ok((gfd, true, _, _)) = open_path(&gitdir) {
                        if let Some(common) = read_small(gfd.as_raw_fd(), "commondir") {
                            named.push(lexical(&gitdir, common.trim()));
                        }
                    }
                    for p in named.into_iter().filter(|p| in_a_root(p)) {
                        if let Ok((_, _, dev, ino)) = open_path(&p) {
                            entries.push((p, dev, ino));
                        }
                    }
                }
            }
        }
        entries.sort();
        entries.dedup();
        // An entry inside another is covered by it.
        let all = entries.clone();
        entries.retain(|(p, _, _)| !all.iter().any(|(o, _, _)| o != p && p.starts_with(o)));
        if entries.is_empty() {
            return Ok(None);
        }
        if let Some(ns) = self.namespaces.get(&entries) {
            return ns.made.dup().map(Some).map_err(|e| format!("dup: {e}"));
        }
        let paths: Vec<PathBuf> = entries.iter().map(|e| e.0.clone()).collect();
        let made = make_namespace(&paths, &self.hide)
            .map_err(|e| format!("making a mount namespace: {e}"))?;
        if self.namespaces.len() >= NAMESPACES {
            // Any one goes: those still wanted are made again.
            if let Some(k) = self.namespaces.keys().next().cloned() {
                self.namespaces.remove(&k);
            }
        }
        let dup = made.dup().map_err(|e| format!("dup: {e}"))?;
        self.namespaces.insert(entries, Namespace { made });
        Ok(Some(dup))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF program over `seccomp_data` words (nr, arch, ip, args) as the
    /// kernel does, for the instructions seccompiler and `first` emit: the answer, and
    /// how many instructions it took.
    fn run(p: &[libc::sock_filter], data: &[u32; 16]) -> (u32, usize) {
        let (mut pc, mut a, mut steps) = (0usize, 0u32, 0);
        loop {
            let f = p[pc];
            pc += 1;
            steps += 1;
            let class = u32::from(f.code) & 0x07;
            match class {
                c if c == libc::BPF_LD => a = data[f.k as usize / 4],
                c if c == libc::BPF_ALU => {
                    assert_eq!(
                        u32::from(f.code),
                        libc::BPF_ALU | libc::BPF_AND | libc::BPF_K
                    );
                    a &= f.k;
                }
                c if c == libc::BPF_RET => return (f.k, steps),
                c if c == libc::BPF_JMP => {
                    let op = u32::from(f.code) & 0xf0;
                    if op == libc::BPF_JA {
                        pc += f.k as usize;
                        continue;
                    }
                    let hit = match op {
                        o if o == libc::BPF_JEQ => a == f.k,
                        o if o == libc::BPF_JGT => a > f.k,
                        o if o == libc::BPF_JGE => a >= f.k,
                        o if o == libc::BPF_JSET => a & f.k != 0,
                        o => panic!("jump op {o:#x}"),
                    };
                    pc += usize::from(if hit { f.jt } else { f.jf });
                }
                c => panic!("class {c:#x}"),
            }
        }
    }

    #[test]
    fn each_program_answers_every_call_as_section_16_says() {
        let (pid, pgrp) = (4242, 4240);
        let f = Filters::compile(pid, pgrp).expect("compile");
        let alone = signals(pid, pgrp).expect("compile");
        let nrs = [
            libc::SYS_read,
            libc::SYS_socket,
            libc::SYS_io_uring_setup,
            libc::SYS_kill,
            libc::SYS_tkill,
            libc::SYS_fcntl,
            libc::SYS_ioctl,
            libc::SYS_pidfd_send_signal,
            libc::SYS_execve,
        ]
        .map(|n| n as u32);
        let args = [
            0u32,
            libc::AF_UNIX as u32,
            libc::AF_INET as u32,
            libc::AF_NETLINK as u32,
            libc::F_SETOWN as u32,
            pid as u32,
            (-pgrp) as u32,
            u32::MAX,
        ];
        let errno = |e: i32| libc::SECCOMP_RET_ERRNO | e as u32;
        let mut seen = std::collections::BTreeSet::new();
        for (network_none, signals_too) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let program = f.program(network_none, signals_too);
            for arch in [AUDIT_ARCH, 0x4000_0003] {
                for nr in nrs.into_iter().chain([X32 | libc::SYS_read as u32]) {
                    for &a0 in &args {
                        for &a1 in &args {
                            // seccomp_data: nr, arch, ip (2 words), args (2 words each);
                            // a high word set never changes an answer.
                            let mut d = [0u32; 16];
                            (d[0], d[1], d[4], d[5], d[6], d[8]) = (nr, arch, a0, 7, a1, a1);
                            let want = if arch != AUDIT_ARCH || nr >= X32 {
                                libc::SECCOMP_RET_KILL_PROCESS
                            } else if network_none
                                && nr == libc::SYS_socket as u32
                                && a0 != libc::AF_UNIX as u32
                            {
                                errno(libc::EACCES)
                            } else if network_none && nr == libc::SYS_io_uring_setup as u32 {
                                errno(libc::ENOSYS)
                            } else if signals_too {
                                run(&alone, &d).0
                            } else {
                                libc::SECCOMP_RET_ALLOW
                            };
                            let (got, steps) = run(program, &d);
                            assert_eq!(got, want, "nr {nr} arch {arch:#x} {a0} {a1}");
                            seen.insert(want);
                            // A plain call is let through in five instructions, seven
                            // with the network's.
                            if !signals_too && nrs[0] == nr && arch == AUDIT_ARCH {
                                assert_eq!(steps, if network_none { 7 } else { 5 });
                            }
                        }
                    }
                }
            }
        }
        // Every kind of answer was met, so the comparisons above could fail; the signals
        // part refuses what it names and nothing else.
        for k in [
            libc::SECCOMP_RET_ALLOW,
            libc::SECCOMP_RET_KILL_PROCESS,
            errno(libc::EACCES),
            errno(libc::ENOSYS),
            errno(libc::EPERM),
        ] {
            assert!(seen.contains(&k), "{k:#x} never answered");
        }
        let call = |nr: i64, a0: i32| {
            let mut d = [0u32; 16];
            (d[0], d[1], d[4]) = (nr as u32, AUDIT_ARCH, a0 as u32);
            run(f.program(true, true), &d).0
        };
        assert_eq!(call(libc::SYS_kill, pid), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_kill, -pgrp), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_kill, -1), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_kill, pid + 1), libc::SECCOMP_RET_ALLOW);
    }

    /// A directory removed when the test ends, however it ends.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Forks a child that restricts itself with `ruleset` (and `no_new_privs`) and
    /// creates each file: the errno of each creation, 0 where it was made.
    fn creations_under(ruleset: &OwnedFd, files: &[&Path]) -> Vec<i32> {
        let files: Vec<CString> = files
            .iter()
            .map(|f| CString::new(f.as_os_str().as_bytes()).expect("no NUL"))
            .collect();
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child makes only raw system calls on memory prepared before the
        // fork, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: as above; nothing here allocates or takes a lock.
            unsafe {
                libc::close(fds[0]);
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                let r = libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0);
                for f in &files {
                    let e: i32 = if r < 0 {
                        -1
                    } else {
                        let fd = libc::open(f.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600);
                        if fd < 0 {
                            *libc::__errno_location()
                        } else {
                            0
                        }
                    };
                    libc::write(fds[1], (&e as *const i32).cast(), 4);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the write end, once.
        unsafe { libc::close(fds[1]) };
        // SAFETY: fds[0] is ours alone from here.
        let mut read = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut read, &mut out).expect("read");
        // SAFETY: reaping the child we forked.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        out.chunks(4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn a_ruleset_built_ahead_goes_to_the_next_spawn_in_the_same_sandbox_only() {
        use crate::policy::sandbox::{Names, Template};
        let mut sb = Sandboxer::new(None).expect("sandboxer");
        if sb.kernel.abi < 3 {
            eprintln!(
                "skipped: this kernel's Landlock (ABI {}) mediates no writes",
                sb.kernel.abi
            );
            return;
        }
        let dir = Scratch(std::env::temp_dir().join(format!("execd-ahead-{}", std::process::id())));
        let (ws, other, tmp) = (dir.0.join("ws"), dir.0.join("other"), dir.0.join("tmp"));
        for d in [&ws, &other, &tmp] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let given = |preset: &str, cwd: &Path| {
            let names = Names {
                cwd: Some(cwd),
                home: None,
                tmpdir: Some(&tmp),
                real: None,
            };
            let (sandbox, _) = Template::preset(preset).expect("preset").resolve(&names);
            Given {
                name: preset.into(),
                sandbox,
                cwd_root: Some(cwd.to_path_buf()),
                verify_cwd: false,
                escalated: false,
            }
        };
        let workspace = given("workspace", &ws);
        let builds = |sb: &Sandboxer| sb.builds.get();
        sb.trust(&[], &[ws.clone(), other.clone()], &tmp);

        sb.prepare();
        assert_eq!(builds(&sb), 0, "nothing is built before a sandboxed spawn");
        let first = sb.confine(&workspace).expect("confine");
        assert_eq!(builds(&sb), 1);
        sb.prepare();
        assert_eq!(
            builds(&sb),
            2,
            "built ahead for the next spawn like the last"
        );
        sb.prepare();
        assert_eq!(builds(&sb), 2, "once");
        let second = sb.confine(&workspace).expect("confine");
        assert_eq!(builds(&sb), 2, "the next spawn in that sandbox takes it");
        assert!(sb.ahead.is_none());
        // What it takes is the sandbox's ruleset: writes in its workspace and its
        // temporary directory, none in another workspace.
        let taken = second.ruleset.as_ref().expect("a ruleset");
        assert_eq!(
            creations_under(taken, &[&ws.join("a"), &tmp.join("b"), &other.join("c")]),
            [0, 0, libc::EACCES]
        );

        // A sandbox that differs in any input of its ruleset builds its own, and the one
        // built ahead is closed unused: another workspace, another preset (other rights
        // handled), the network allowed (TCP not handled), the temporary directory not
        // writable (no /dev/shm rule).
        let mut network = workspace.clone();
        network.sandbox.network = Network::All;
        let mut no_tmp = workspace.clone();
        no_tmp.sandbox.write = Paths::Only(vec![ws.clone()]);
        for (n, g) in [
            given("workspace", &other),
            given("read-only", &ws),
            network,
            no_tmp,
        ]
        .iter()
        .enumerate()
        {
            sb.confine(&workspace).expect("confine");
            sb.prepare();
            let before = builds(&sb);
            let c = sb.confine(g).expect("confine");
            assert_eq!(builds(&sb), before + 1, "sandbox {n}: built its own");
            assert!(sb.ahead.is_none(), "sandbox {n}");
            if n == 0 {
                let own = c.ruleset.as_ref().expect("a ruleset");
                assert_eq!(
                    creations_under(own, &[&ws.join("d"), &other.join("e")]),
                    [libc::EACCES, 0]
                );
            }
        }

        // New trusted roots forget what was built from the old ones.
        sb.confine(&workspace).expect("confine");
        sb.prepare();
        assert!(sb.ahead.is_some());
        sb.trust(&[], std::slice::from_ref(&ws), &tmp);
        assert!(sb.ahead.is_none());
        let before = builds(&sb);
        sb.prepare();
        assert_eq!(builds(&sb), before, "nothing to build from");
        drop((first, second));
    }
}
