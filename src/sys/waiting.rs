//! Whether a command is waiting for input (PROTOCOL.md 12.3), as the kernel tells it: a
//! task of the command's tree is asleep in a system call that waits for the command's
//! input file (its stdin pipe or its PTY slave) to become readable.
//!
//! What is read, cheapest first, and only what the previous step names:
//! - `/proc/PID/task/TID/syscall`: the system call a blocked task sleeps in and its
//!   arguments (`running` when it is not blocked in one).
//! - for `read`, `readv`, `pread64`, `preadv`, `preadv2` and `splice`: a `stat` of
//!   `/proc/PID/task/TID/fd/N` for the one descriptor the call names;
//! - for `poll`/`ppoll` and `select`/`pselect6`: the task's own `pollfd` array or read
//!   `fd_set`, copied out of its memory at the pointer in the arguments through
//!   `/proc/PID/task/TID/mem`, then a `stat` per descriptor it waits on for reading;
//! - for `epoll_wait`/`epoll_pwait`/`epoll_pwait2`: `/proc/PID/task/TID/fdinfo/EPFD`,
//!   whose `tfd:` lines give each watched file's event mask, inode and device, so no
//!   `stat` is needed.
//!
//! A file matches when its device and inode are the input file's. On a PTY, an open of
//! `/dev/tty` (how `sudo`, `ssh` and password prompts read) also matches when the task's
//! controlling terminal (`/proc/PID/task/TID/stat`) is the command's PTY.
//!
//! The tree is the leader (or each root given), its threads (`/proc/PID/task`, listed only
//! when its link count says there is more than one), and its descendants through
//! `/proc/PID/task/TID/children`, breadth first. Nothing scans all of `/proc`.
//!
//! Reading a task's memory waits for its process's memory lock, which a process with a
//! thread stuck in a page fault on a hung file system can hold (or have queued behind it)
//! for ever. So these looks run in the off-loop reader (`sys::reader`), never on the loop:
//! `look` asks its caller before anything of a process is read, so the reader can note
//! which process it is about to wait for and skip one whose memory did not answer before.
//! Memory is read through `/proc/PID/mem`, which waits for that lock killably (the reader
//! can be SIGKILLed out of the wait); `process_vm_readv` would wait uninterruptibly.
//!
//! Invariants:
//! - Nothing fails outward: a task whose files cannot be read (gone, not ours, a kernel
//!   without `children`, a seccomp filter) is a task not known to be waiting.
//! - Nothing waits and nothing is stopped: no ptrace, no signals, only reads of `/proc` and
//!   of the task's memory. (For a task caught just as it falls asleep, the kernel behind
//!   `syscall` spins until it is off its CPU, or sleeps a tick if it was preempted on the
//!   way; that is the only pause.)
//! - Bounded and allocation-free: at most `MAX_TASKS` tasks per call, `MAX_SET` entries of
//!   one poll, select or epoll set, `MAX_FD_CHECKS` descriptors looked up per set, in
//!   stack buffers (about 13 KiB). Past a bound the rest is not looked at: the answer is
//!   "not known to be waiting" unless a task already looked at was.
//! - The answer is as of the reads: a task that wakes a moment later is found awake at the
//!   next call, a pid reused in between is at worst one wrong answer.

use std::fmt;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most tasks (threads, over all the tree's processes) looked at in one call. The
/// leader's threads come first, then its children's, and so on down the tree.
pub const MAX_TASKS: usize = 64;

/// The most entries of one poll set, descriptors of one select set, or watches of one
/// epoll instance that are read; the rest of a larger set is not looked at.
pub const MAX_SET: usize = 1024;

/// The most descriptors of one poll or select set that are looked up (`stat`), lowest
/// numbers first: stdin and whatever a program duplicated it to early are low.
pub const MAX_FD_CHECKS: usize = 64;

/// `/dev/tty`, the controlling terminal of whoever opens it (major 5, minor 0).
const DEV_TTY: u64 = libc::makedev(5, 0);

/// The file a command's input is: what its stdin pipe or PTY slave is, by device and
/// inode. Both ends of a pipe are one inode, so the daemon's own write end names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputFile {
    pub dev: u64,
    pub ino: u64,
    /// The terminal's device number when the input is a terminal (a PTY slave), so that
    /// a task reading `/dev/tty` with it as controlling terminal matches too.
    pub tty: Option<u64>,
}

impl InputFile {
    /// The file `fd` refers to: a stdin pipe (either end) or a PTY slave.
    pub fn of_fd(fd: RawFd) -> io::Result<InputFile> {
        let mut st = MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `st` is writable stat-sized memory; fstat on a bad descriptor fails.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it filled `st`.
        Ok(InputFile::of_stat(&unsafe { st.assume_init() }))
    }

    fn of_stat(st: &libc::stat) -> InputFile {
        let is_chr = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
        InputFile {
            dev: st.st_dev,
            ino: st.st_ino,
            tty: is_chr.then_some(st.st_rdev),
        }
    }
}

/// How the reader waits for the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `read`, `readv`, `pread64`, `preadv`, `preadv2` or `splice` from it.
    Read,
    /// `poll` or `ppoll` with it among the descriptors polled for input.
    Poll,
    /// `select` or `pselect6` with it in the read set.
    Select,
    /// `epoll_wait`, `epoll_pwait` or `epoll_pwait2` on an instance watching it for input.
    Epoll,
}

/// The task found blocked reading the input, for a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reader {
    /// Its process.
    pub pid: i32,
    /// The thread that is blocked (equal to `pid` for a main thread).
    pub tid: i32,
    pub call: Call,
    /// The descriptor, in the reader's own table, that is the input (for epoll, the one
    /// the watch was added with).
    pub fd: i32,
}

/// Whether a task of the tree led by `leader` (the leader, its threads, and its
/// descendants, bounded as the module says) is blocked reading `input`: `Some(true)` or
/// `Some(false)`, or `None` when nothing was found and a process of the tree was skipped
/// (`read` said no: its memory did not answer before), so the answer is not known.
/// `read(pid)` is asked before anything of process `pid` is read.
pub fn look(leader: i32, input: InputFile, read: &mut dyn FnMut(i32) -> bool) -> Option<bool> {
    let mut skipped = false;
    let found = find_reader_with(&[leader], input, &mut |pid| {
        let yes = read(pid);
        skipped |= !yes;
        yes
    });
    match (found, skipped) {
        (Some(_), _) => Some(true),
        (None, true) => None,
        (None, false) => Some(false),
    }
}

/// The first task found blocked reading `input` in the trees of `roots`: a command's
/// leader, and also, where the command has a cgroup, the pids of its `cgroup.procs`, so a
/// reader that left the tree (a daemonised child, re-parented) is found too. Roots and
/// descendants seen twice are looked at once.
#[cfg(test)]
fn find_reader(roots: &[i32], input: InputFile) -> Option<Reader> {
    find_reader_with(roots, input, &mut |_| true)
}

/// `find_reader`, asking `read(pid)` before anything of process `pid` is read: a process
/// it says no to is not looked at, nor are the processes it started.
fn find_reader_with(
    roots: &[i32],
    input: InputFile,
    read: &mut dyn FnMut(i32) -> bool,
) -> Option<Reader> {
    let mut procs = Pids::default();
    for &pid in roots {
        procs.push(pid);
    }
    let mut tasks = 0;
    let mut next = 0;
    while next < procs.len {
        let pid = procs.items[next];
        next += 1;
        if !read(pid) {
            continue;
        }
        // The main thread first: in almost every program it is the one that reads.
        if let ControlFlow::Break(found) =
            visit(Task { pid, tid: pid }, input, &mut procs, &mut tasks)
        {
            return found;
        }
        if single_threaded(pid) {
            continue;
        }
        let mut found = None;
        for_each_tid(pid, |tid| {
            if tid == pid {
                return ControlFlow::Continue(());
            }
            visit(Task { pid, tid }, input, &mut procs, &mut tasks).map_break(|r| found = r)
        });
        if found.is_some() || tasks >= MAX_TASKS {
            return found;
        }
    }
    None
}

/// Looks at one task: `Break(Some)` when it reads the input, `Break(None)` when the task
/// bound is reached, else queues its children.
fn visit(
    task: Task,
    input: InputFile,
    procs: &mut Pids,
    tasks: &mut usize,
) -> ControlFlow<Option<Reader>> {
    if *tasks >= MAX_TASKS {
        return ControlFlow::Break(None);
    }
    *tasks += 1;
    if let Some(reader) = task.reading(input) {
        return ControlFlow::Break(Some(reader));
    }
    task.children(procs);
    ControlFlow::Continue(())
}

/// Process ids queued for a walk, each once. One task per process at the least, so no
/// more than `MAX_TASKS` processes can be looked at.
struct Pids {
    items: [i32; MAX_TASKS],
    len: usize,
}

impl Default for Pids {
    fn default() -> Pids {
        Pids {
            items: [0; MAX_TASKS],
            len: 0,
        }
    }
}

impl Pids {
    /// Queues `pid` unless it is not a process id, is queued already, or the queue is full.
    fn push(&mut self, pid: i32) {
        if pid > 0 && self.len < MAX_TASKS && !self.items[..self.len].contains(&pid) {
            self.items[self.len] = pid;
            self.len += 1;
        }
    }
}

/// One thread of a process of the tree.
#[derive(Debug, Clone, Copy)]
struct Task {
    pid: i32,
    tid: i32,
}

/// What `/proc/PID/task/TID/syscall` says of a task blocked in a system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocked {
    nr: i64,
    args: [u64; 6],
}

/// What a blocked task waits on, from its system call's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitsOn {
    Fd(i32),
    PollSet { fds: u64, nfds: u64 },
    SelectSet { nfds: u64, readfds: u64 },
    Epoll(i32),
}

impl Blocked {
    /// The calls that wait for a descriptor to be readable, by this architecture's
    /// numbers (aarch64 has only `ppoll`, `pselect6` and `epoll_pwait*`). A 32-bit task on
    /// a 64-bit kernel reports its own numbers and is not recognised.
    fn wait(&self) -> Option<(Call, WaitsOn)> {
        let [a0, a1, ..] = self.args;
        // Descriptors are C ints: the low 32 bits of the register.
        let fd = a0 as u32 as i32;
        let got = match self.nr {
            libc::SYS_read
            | libc::SYS_readv
            | libc::SYS_pread64
            | libc::SYS_preadv
            | libc::SYS_preadv2
            | libc::SYS_splice => (Call::Read, WaitsOn::Fd(fd)),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_poll => (Call::Poll, WaitsOn::PollSet { fds: a0, nfds: a1 }),
            libc::SYS_ppoll => (Call::Poll, WaitsOn::PollSet { fds: a0, nfds: a1 }),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_select => (
                Call::Select,
                WaitsOn::SelectSet {
                    nfds: a0,
                    readfds: a1,
                },
            ),
            libc::SYS_pselect6 => (
                Call::Select,
                WaitsOn::SelectSet {
                    nfds: a0,
                    readfds: a1,
                },
            ),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_epoll_wait => (Call::Epoll, WaitsOn::Epoll(fd)),
            libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => (Call::Epoll, WaitsOn::Epoll(fd)),
            _ => return None,
        };
        Some(got)
    }
}

/// Parses `/proc/PID/task/TID/syscall`: `NR ARG1..ARG6 SP PC` (decimal, then hex) for a
/// task blocked in a system call; `running`, or `-1 SP PC` when blocked outside one.
fn parse_syscall(text: &[u8]) -> Option<Blocked> {
    let text = std::str::from_utf8(text).ok()?;
    let mut words = text.split_ascii_whitespace();
    let nr: i64 = words.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let mut args = [0u64; 6];
    for arg in &mut args {
        let word = words.next()?;
        *arg = u64::from_str_radix(word.strip_prefix("0x")?, 16).ok()?;
    }
    Some(Blocked { nr, args })
}

impl Task {
    /// The system call this task is blocked in, if it is blocked in one.
    fn blocked(self) -> Option<Blocked> {
        let path = ProcPath::new(format_args!("/proc/{}/task/{}/syscall", self.pid, self.tid))?;
        // A number and eight hex words: under 200 bytes.
        let mut buf = [0u8; 256];
        let n = read_file(&path, &mut buf)?;
        parse_syscall(&buf[..n])
    }

    /// The reader this task is, if it is blocked waiting for `input` to be readable.
    fn reading(self, input: InputFile) -> Option<Reader> {
        let (call, wait) = self.blocked()?.wait()?;
        let mut look = Look::new(self, input);
        let fd = match wait {
            WaitsOn::Fd(fd) => look.is_input(fd).then_some(fd)?,
            WaitsOn::PollSet { fds, nfds } => look.first_input(&poll_set(self, fds, nfds)?)?,
            WaitsOn::SelectSet { nfds, readfds } => {
                look.first_input(&select_set(self, nfds, readfds)?)?
            }
            WaitsOn::Epoll(epfd) => look.epoll_input(epfd)?,
        };
        Some(Reader {
            pid: self.pid,
            tid: self.tid,
            call,
            fd,
        })
    }

    /// Queues the processes this thread started (`/proc/PID/task/TID/children`, Linux 3.5
    /// with `CONFIG_PROC_CHILDREN`). Past the first 1 KiB of the list (well over
    /// `MAX_TASKS` pids) the rest is not read.
    fn children(self, procs: &mut Pids) {
        let Some(path) = ProcPath::new(format_args!(
            "/proc/{}/task/{}/children",
            self.pid, self.tid
        )) else {
            return;
        };
        let mut buf = [0u8; 1024];
        let Some(n) = read_file(&path, &mut buf) else {
            return;
        };
        // A number cut off by the end of the buffer is not taken.
        let whole = if n == buf.len() {
            buf.iter().rposition(|&b| b == b' ').unwrap_or(0)
        } else {
            n
        };
        let text = std::str::from_utf8(&buf[..whole]).unwrap_or_default();
        for word in text.split_ascii_whitespace() {
            if let Ok(pid) = word.parse() {
                procs.push(pid);
            }
        }
    }

    /// The task's controlling terminal (`tty_nr`, the seventh field of its `stat`), 0 for
    /// none.
    fn controlling_tty(self) -> Option<u64> {
        let path = ProcPath::new(format_args!("/proc/{}/task/{}/stat", self.pid, self.tid))?;
        // The fields up to tty_nr come first; the name in parentheses is at most 64 bytes.
        let mut buf = [0u8; 512];
        let n = read_file(&path, &mut buf)?;
        let text = &buf[..n];
        let after_name = text.iter().rposition(|&b| b == b')')? + 1;
        let rest = std::str::from_utf8(&text[after_name..]).ok()?;
        // state, ppid, pgrp, session, tty_nr
        let tty: i64 = rest.split_ascii_whitespace().nth(4)?.parse().ok()?;
        Some(u64::from(tty as u32))
    }
}

/// Whether a process has one thread: its `task` directory's link count is two plus its
/// threads. When that cannot be read the threads are listed.
fn single_threaded(pid: i32) -> bool {
    let Some(path) = ProcPath::new(format_args!("/proc/{pid}/task")) else {
        return false;
    };
    stat_path(&path).is_some_and(|st| st.st_nlink == 3)
}

/// Calls `f` with each thread id of `pid` (a raw `getdents64` of `/proc/PID/task` into a
/// stack buffer) until it breaks.
fn for_each_tid(pid: i32, mut f: impl FnMut(i32) -> ControlFlow<()>) {
    let Some(path) = ProcPath::new(format_args!("/proc/{pid}/task")) else {
        return;
    };
    let Some(dir) = open_path(&path, libc::O_DIRECTORY) else {
        return;
    };
    // Aligned for the kernel's dirent records, which it writes at 8-byte boundaries.
    #[repr(C, align(8))]
    struct Buf([u8; 2048]);
    let mut buf = Buf([0; 2048]);
    loop {
        // SAFETY: `buf` is writable for its whole length and outlives the call; getdents64
        // writes at most that many bytes of whole records.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.0.as_mut_ptr(),
                buf.0.len(),
            )
        };
        if n <= 0 {
            return; // the end, or an error: either way, no more threads known
        }
        let mut records = &buf.0[..n as usize];
        // linux_dirent64: ino u64, off i64, reclen u16, type u8, then the NUL-ended name.
        const NAME: usize = 19;
        while records.len() > NAME {
            let reclen = usize::from(u16::from_ne_bytes([records[16], records[17]]));
            let Some(record) = records.get(..reclen).filter(|_| reclen > NAME) else {
                return;
            };
            let name = &record[NAME..];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            let tid = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok());
            if let Some(tid) = tid {
                if f(tid).is_break() {
                    return;
                }
            }
            records = &records[reclen..];
        }
    }
}

/// Descriptors of one set, ascending, each once.
struct FdSet {
    fds: [i32; MAX_SET],
    len: usize,
}

impl FdSet {
    fn new() -> FdSet {
        FdSet {
            fds: [0; MAX_SET],
            len: 0,
        }
    }

    fn push(&mut self, fd: i32) {
        if fd >= 0 && self.len < MAX_SET {
            self.fds[self.len] = fd;
            self.len += 1;
        }
    }

    fn finish(mut self) -> FdSet {
        let fds = &mut self.fds[..self.len];
        fds.sort_unstable();
        let mut kept = 0;
        for i in 0..fds.len() {
            if kept == 0 || fds[i] != fds[kept - 1] {
                fds[kept] = fds[i];
                kept += 1;
            }
        }
        self.len = kept;
        self
    }

    fn as_slice(&self) -> &[i32] {
        &self.fds[..self.len]
    }
}

/// The descriptors a task blocked in `poll`/`ppoll` waits on for reading, from its
/// `pollfd` array (`int fd; short events; short revents`), at most `MAX_SET` entries.
fn poll_set(task: Task, fds: u64, nfds: u64) -> Option<FdSet> {
    const ENTRY: usize = 8;
    let n = usize::try_from(nfds).ok()?.min(MAX_SET);
    let mut buf = [0u8; MAX_SET * ENTRY];
    let bytes = &mut buf[..n * ENTRY];
    if !read_memory(task, fds, bytes) {
        return None;
    }
    let readable = libc::POLLIN | libc::POLLRDNORM;
    let mut set = FdSet::new();
    for entry in bytes.chunks_exact(ENTRY) {
        let fd = i32::from_ne_bytes([entry[0], entry[1], entry[2], entry[3]]);
        let events = i16::from_ne_bytes([entry[4], entry[5]]);
        if events & readable != 0 {
            set.push(fd);
        }
    }
    Some(set.finish())
}

/// The descriptors a task blocked in `select`/`pselect6` waits on for reading: the bits
/// below `nfds` of its read `fd_set` (an array of longs, bit `fd % 64` of long `fd / 64`),
/// at most `MAX_SET` of them.
fn select_set(task: Task, nfds: u64, readfds: u64) -> Option<FdSet> {
    if readfds == 0 {
        return Some(FdSet::new()); // no read set: it waits for no input
    }
    let n = usize::try_from(nfds).ok()?.min(MAX_SET);
    let mut buf = [0u8; MAX_SET / 8];
    let bytes = &mut buf[..n.div_ceil(64) * 8];
    if !read_memory(task, readfds, bytes) {
        return None;
    }
    let mut set = FdSet::new();
    for (w, word) in bytes.chunks_exact(8).enumerate() {
        let mut bits = u64::from_ne_bytes(word.try_into().unwrap_or_default());
        while bits != 0 {
            let fd = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if fd < n {
                set.push(fd as i32);
            }
        }
    }
    Some(set)
}

/// Looks up descriptors of one task against the input, with its lookups counted.
struct Look {
    task: Task,
    input: InputFile,
    checks: usize,
    /// The task's controlling terminal, once read.
    ctty: Option<Option<u64>>,
}

impl Look {
    fn new(task: Task, input: InputFile) -> Look {
        Look {
            task,
            input,
            checks: 0,
            ctty: None,
        }
    }

    /// The first of `set` that is the input, looking up at most `MAX_FD_CHECKS`.
    fn first_input(&mut self, set: &FdSet) -> Option<i32> {
        let mut fds = set.as_slice().iter().copied().take(MAX_FD_CHECKS);
        fds.find(|&fd| self.is_input(fd))
    }

    /// Whether descriptor `fd` of the task is the input file, or `/dev/tty` with the
    /// input as the task's controlling terminal.
    fn is_input(&mut self, fd: i32) -> bool {
        if self.checks >= MAX_FD_CHECKS {
            return false;
        }
        self.checks += 1;
        let Some(path) = ProcPath::new(format_args!(
            "/proc/{}/task/{}/fd/{}",
            self.task.pid, self.task.tid, fd
        )) else {
            return false;
        };
        let Some(st) = stat_path(&path) else {
            return false;
        };
        let file = InputFile::of_stat(&st);
        if (file.dev, file.ino) == (self.input.dev, self.input.ino) {
            return true;
        }
        file.tty == Some(DEV_TTY) && self.is_controlling_tty()
    }

    /// Whether the input is a terminal and the task's controlling terminal.
    fn is_controlling_tty(&mut self) -> bool {
        let Some(tty) = self.input.tty else {
            return false;
        };
        let task = self.task;
        let ctty = *self.ctty.get_or_insert_with(|| task.controlling_tty());
        ctty == Some(tty)
    }

    /// The descriptor watching the input for reading in epoll instance `epfd`, from its
    /// `fdinfo` (`tfd: FD events: MASK data: DATA pos:P ino:INO sdev:DEV`, hex), at most
    /// `MAX_SET` watches read. On a PTY, watches of other files are looked up (within
    /// `MAX_FD_CHECKS`) in case they are `/dev/tty`.
    fn epoll_input(&mut self, epfd: i32) -> Option<i32> {
        let path = ProcPath::new(format_args!(
            "/proc/{}/task/{}/fdinfo/{}",
            self.task.pid, self.task.tid, epfd
        ))?;
        let file = open_path(&path, 0)?;
        let mut watches = 0;
        let mut found = None;
        for_each_line(&file, |line| {
            let Some(watch) = parse_watch(line) else {
                return ControlFlow::Continue(());
            };
            watches += 1;
            let readable = (libc::EPOLLIN | libc::EPOLLRDNORM) as u32;
            if watch.events & readable != 0 {
                let same = (watch.dev, watch.ino) == (self.input.dev, self.input.ino);
                if same || (self.input.tty.is_some() && self.is_input(watch.fd)) {
                    found = Some(watch.fd);
                    return ControlFlow::Break(());
                }
            }
            if watches >= MAX_SET {
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
        found
    }
}

/// One watch of an epoll instance, as its `fdinfo` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    fd: i32,
    events: u32,
    ino: u64,
    /// The device in `stat`'s encoding (the line has the kernel's: major << 20 | minor).
    dev: u64,
}

/// Parses a `tfd:` line of an epoll instance's `fdinfo`; other lines are `None`.
fn parse_watch(line: &[u8]) -> Option<Watch> {
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_ascii_whitespace();
    if words.next()? != "tfd:" {
        return None;
    }
    let fd = words.next()?.parse().ok()?;
    let mut events = None;
    let mut ino = None;
    let mut sdev = None;
    while let Some(word) = words.next() {
        match word {
            "events:" => events = u32::from_str_radix(words.next()?, 16).ok(),
            _ => {
                if let Some(hex) = word.strip_prefix("ino:") {
                    ino = u64::from_str_radix(hex, 16).ok();
                } else if let Some(hex) = word.strip_prefix("sdev:") {
                    sdev = u32::from_str_radix(hex, 16).ok();
                }
            }
        }
    }
    let sdev = sdev?;
    Some(Watch {
        fd,
        events: events?,
        ino: ino?,
        dev: libc::makedev(sdev >> 20, sdev & 0xf_ffff),
    })
}

/// Copies `buf.len()` bytes of task's memory at `addr` through `/proc/PID/task/TID/mem`
/// (offset = address), which needs what reading its `syscall` needed (ptrace access to
/// it) and waits for its memory lock killably. (`process_vm_readv` would save the open
/// and the close, but waits for that lock uninterruptibly: a reader stuck there on a
/// process whose memory hangs could not be killed.)
fn read_memory(task: Task, addr: u64, buf: &mut [u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let Some(path) = ProcPath::new(format_args!("/proc/{}/task/{}/mem", task.pid, task.tid)) else {
        return false;
    };
    let Some(file) = open_path(&path, 0) else {
        return false;
    };
    let Ok(offset) = libc::off64_t::try_from(addr) else {
        return false;
    };
    // SAFETY: `buf` is writable for its length and outlives the call.
    let n = unsafe { libc::pread64(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset) };
    usize::try_from(n) == Ok(buf.len())
}

/// A NUL-terminated `/proc` path formatted on the stack, so reading a file allocates
/// nothing. Long enough for `/proc/PID/task/TID/fdinfo/FD` with any numbers.
struct ProcPath {
    buf: [u8; 64],
}

impl ProcPath {
    fn new(args: fmt::Arguments) -> Option<ProcPath> {
        let mut buf = [0u8; 64];
        // The last byte stays 0: a path that does not fit with its NUL fails.
        let mut rest: &mut [u8] = &mut buf[..63];
        rest.write_fmt(args).ok()?;
        Some(ProcPath { buf })
    }

    fn as_ptr(&self) -> *const libc::c_char {
        self.buf.as_ptr().cast()
    }
}

fn open_path(path: &ProcPath, flags: libc::c_int) -> Option<OwnedFd> {
    let flags = flags | libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: the path is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags) };
    // SAFETY: open succeeded, so `fd` is a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_path(path: &ProcPath) -> Option<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the path is NUL-terminated; `st` is writable stat-sized memory.
    if unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: stat succeeded, so it filled `st`.
    Some(unsafe { st.assume_init() })
}

/// Reads a small `/proc` file into `buf` with one `read`: its length, `None` when it
/// cannot be opened or read. A seq file gives everything that fits in the first read (a
/// second one only to learn of the end would cost as much again), and what does not fit
/// is past a bound anyway.
fn read_file(path: &ProcPath, buf: &mut [u8]) -> Option<usize> {
    let file = open_path(path, 0)?;
    read_some(&file, buf)
}

/// One `read`, retried on `EINTR`.
fn read_some(file: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: `buf` is writable for its length and outlives the call.
        let n = unsafe { libc::read(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Some(n as usize);
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
}

/// Calls `f` with each line of `file` (without its newline) until it breaks, reading
/// through a 4 KiB stack buffer. A line longer than the buffer ends the reading.
fn for_each_line(file: &OwnedFd, mut f: impl FnMut(&[u8]) -> ControlFlow<()>) {
    let mut buf = [0u8; 4096];
    let mut end = 0;
    loop {
        let Some(n) = read_some(file, &mut buf[end..]) else {
            return;
        };
        if n == 0 {
            if end > 0 {
                let _ = f(&buf[..end]);
            }
            return;
        }
        end += n;
        let mut start = 0;
        while let Some(nl) = buf[start..end].iter().position(|&b| b == b'\n') {
            if f(&buf[start..start + nl]).is_break() {
                return;
            }
            start += nl + 1;
        }
        if start == 0 && end == buf.len() {
            return;
        }
        buf.copy_within(start..end, 0);
        end -= start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// A command in a process group of its own, killed (the whole group) and reaped when
    /// the test ends, however it ends.
    struct Kid(Child);

    impl Kid {
        #[track_caller]
        fn spawn(cmd: &mut Command) -> Kid {
            Kid(cmd.process_group(0).spawn().expect("spawn"))
        }

        fn pid(&self) -> i32 {
            self.0.id() as i32
        }
    }

    impl Drop for Kid {
        fn drop(&mut self) {
            // SAFETY: kill with plain integers; the group is the child's own (pgid = pid).
            unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }

    /// A pipe for a command's stdin: its read end for the command, the write end the test
    /// keeps (as the daemon does), and the input file named from the write end.
    fn stdin_pipe() -> (Stdio, OwnedFd, InputFile) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 succeeded: two new descriptors owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let input = InputFile::of_fd(w.as_raw_fd()).unwrap();
        assert_eq!(InputFile::of_fd(r.as_raw_fd()).unwrap(), input, "one inode");
        assert_eq!(input.tty, None);
        (Stdio::from(r), w, input)
    }

    fn command(argv: &[&str], stdin: Stdio) -> Command {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    fn have_python() -> bool {
        let ok = Command::new("python3")
            .args(["-c", "pass"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: no python3 to run");
        }
        ok
    }

    const READ: &[i64] = &[libc::SYS_read];
    #[cfg(target_arch = "x86_64")]
    const SELECT: &[i64] = &[libc::SYS_select, libc::SYS_pselect6];
    #[cfg(not(target_arch = "x86_64"))]
    const SELECT: &[i64] = &[libc::SYS_pselect6];
    #[cfg(target_arch = "x86_64")]
    const POLL: &[i64] = &[libc::SYS_poll, libc::SYS_ppoll];
    #[cfg(not(target_arch = "x86_64"))]
    const POLL: &[i64] = &[libc::SYS_ppoll];
    #[cfg(target_arch = "x86_64")]
    const EPOLL: &[i64] = &[
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_pwait2,
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const EPOLL: &[i64] = &[libc::SYS_epoll_pwait, libc::SYS_epoll_pwait2];
    const SLEEP: &[i64] = &[libc::SYS_clock_nanosleep, libc::SYS_nanosleep];

    /// Waits (10 s at most) until thread `tid` of `pid` is asleep in one of `calls`; a
    /// `read` only counts on descriptor 0 (a program starting up may be caught reading a
    /// file from disk).
    #[track_caller]
    fn blocked_in(pid: i32, tid: i32, calls: &[i64]) {
        let task = Task { pid, tid };
        let deadline = Instant::now() + Duration::from_secs(10);
        let asleep =
            |b: Blocked| calls.contains(&b.nr) && (b.nr != libc::SYS_read || b.args[0] == 0);
        loop {
            if task.blocked().is_some_and(asleep) {
                return;
            }
            let path = format!("/proc/{pid}/task/{tid}/syscall");
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "{pid}/{tid} not in {calls:?}: {now}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The children of `pid` once it has `n` of them (10 s at most).
    #[track_caller]
    fn children(pid: i32, n: usize) -> Vec<i32> {
        let path = format!("/proc/{pid}/task/{pid}/children");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let kids: Vec<i32> = text.split_whitespace().flat_map(str::parse).collect();
            if kids.len() >= n {
                return kids;
            }
            assert!(Instant::now() < deadline, "{pid} has children {kids:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn reader(pid: i32, call: Call, fd: i32) -> Option<Reader> {
        Some(Reader {
            pid,
            tid: pid,
            call,
            fd,
        })
    }

    #[test]
    fn cat_reading_its_stdin_pipe_is_waiting() {
        let (stdin, _w, input) = stdin_pipe();
        let kid = Kid::spawn(&mut command(&["cat"], stdin));
        blocked_in(kid.pid(), kid.pid(), READ);
        assert_eq!(
            find_reader(&[kid.pid()], input),
            reader(kid.pid(), Call::Read, 0)
        );
        assert_eq!(look(kid.pid(), input, &mut |_| true), Some(true));
        // A process the caller says not to read is not looked at: not known.
        assert_eq!(look(kid.pid(), input, &mut |_| false), None);
    }

    #[test]
    fn sleep_with_stdin_open_is_not_waiting() {
        let (stdin, _w, input) = stdin_pipe();
        let kid = Kid::spawn(&mut command(&["sleep", "30"], stdin));
        blocked_in(kid.pid(), kid.pid(), SLEEP);
        assert_eq!(find_reader(&[kid.pid()], input), None);
    }

    #[test]
    fn a_shell_read_is_waiting() {
        let (stdin, _w, input) = stdin_pipe();
        let kid = Kid::spawn(&mut command(&["sh", "-c", "read x"], stdin));
        blocked_in(kid.pid(), kid.pid(), READ);
        assert_eq!(
            find_reader(&[kid.pid()], input),
            reader(kid.pid(), Call::Read, 0)
        );
    }

    #[test]
    fn python_reading_selecting_polling_and_epolling_stdin_is_waiting() {
        if !have_python() {
            return;
        }
        let cases: [(&str, &[i64], Call); 4] = [
            ("import sys; sys.stdin.readline()", READ, Call::Read),
            (
                "import select,sys; select.select([sys.stdin],[],[])",
                SELECT,
                Call::Select,
            ),
            (
                "import select,sys; p=select.poll(); p.register(sys.stdin, select.POLLIN); p.poll()",
                POLL,
                Call::Poll,
            ),
            (
                "import select,sys; e=select.epoll(); e.register(sys.stdin.fileno(), select.EPOLLIN); e.poll()",
                EPOLL,
                Call::Epoll,
            ),
        ];
        for (script, calls, call) in cases {
            let (stdin, _w, input) = stdin_pipe();
            let kid = Kid::spawn(&mut command(&["python3", "-c", script], stdin));
            blocked_in(kid.pid(), kid.pid(), calls);
            assert_eq!(
                find_reader(&[kid.pid()], input),
                reader(kid.pid(), call, 0),
                "{script}"
            );
        }
    }

    #[test]
    fn python_waiting_only_on_another_pipe_is_not_waiting() {
        if !have_python() {
            return;
        }
        let cases: [(&str, &[i64]); 3] = [
            ("import select,os; r,w=os.pipe(); select.select([r],[],[])", SELECT),
            (
                "import select,os; r,w=os.pipe(); p=select.poll(); p.register(r, select.POLLIN); p.poll()",
                POLL,
            ),
            (
                "import select,os; r,w=os.pipe(); e=select.epoll(); e.register(r, select.EPOLLIN); e.poll()",
                EPOLL,
            ),
        ];
        for (script, calls) in cases {
            let (stdin, _w, input) = stdin_pipe();
            let kid = Kid::spawn(&mut command(&["python3", "-c", script], stdin));
            blocked_in(kid.pid(), kid.pid(), calls);
            assert_eq!(find_reader(&[kid.pid()], input), None, "{script}");
        }
    }

    #[test]
    fn a_thread_reading_is_found() {
        if !have_python() {
            return;
        }
        let script = "import sys,threading; t=threading.Thread(target=sys.stdin.readline); t.start(); t.join()";
        let (stdin, _w, input) = stdin_pipe();
        let kid = Kid::spawn(&mut command(&["python3", "-c", script], stdin));
        let pid = kid.pid();
        let deadline = Instant::now() + Duration::from_secs(10);
        let tid = loop {
            let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| {
                    d.flatten()
                        .flat_map(|e| e.file_name().to_str()?.parse().ok())
                })
                .into_iter()
                .flatten()
                .collect();
            if let Some(&tid) = tids.iter().find(|&&t| t != pid) {
                break tid;
            }
            assert!(Instant::now() < deadline, "no second thread in {pid}");
            std::thread::sleep(Duration::from_millis(10));
        };
        blocked_in(pid, tid, READ);
        let found = find_reader(&[pid], input);
        assert_eq!(
            found,
            Some(Reader {
                pid,
                tid,
                call: Call::Read,
                fd: 0
            })
        );
        assert!(!single_threaded(pid));
    }

    #[test]
    fn a_grandchild_reading_is_found_and_not_once_it_has_read() {
        let (stdin, w, input) = stdin_pipe();
        let script = "head -n 1 >/dev/null; exec sleep 30";
        let kid = Kid::spawn(&mut command(&["sh", "-c", script], stdin));
        let head = children(kid.pid(), 1)[0];
        blocked_in(head, head, READ);
        assert_eq!(
            find_reader(&[kid.pid()], input),
            reader(head, Call::Read, 0)
        );
        // A line lets head end; the shell becomes a sleep that never reads.
        let mut w = std::fs::File::from(w);
        w.write_all(b"line\n").unwrap();
        blocked_in(kid.pid(), kid.pid(), SLEEP);
        assert_eq!(find_reader(&[kid.pid()], input), None);
    }

    #[test]
    fn roots_beside_the_leader_are_searched() {
        let (stdin, _w, input) = stdin_pipe();
        let sleeper = Kid::spawn(&mut command(&["sleep", "30"], Stdio::null()));
        let cat = Kid::spawn(&mut command(&["cat"], stdin));
        blocked_in(cat.pid(), cat.pid(), READ);
        let roots = [sleeper.pid(), sleeper.pid(), cat.pid()];
        assert_eq!(find_reader(&roots, input), reader(cat.pid(), Call::Read, 0));
        assert_eq!(find_reader(&[sleeper.pid()], input), None);
    }

    #[test]
    fn a_reader_past_the_task_bound_is_not_known() {
        let (stdin, _w, input) = stdin_pipe();
        let script = "i=0; while [ $i -lt 70 ]; do sleep 30 </dev/null & i=$((i+1)); done; cat";
        let kid = Kid::spawn(&mut command(&["sh", "-c", script], stdin));
        let kids = children(kid.pid(), 71);
        let cat = *kids.last().unwrap();
        blocked_in(cat, cat, READ);
        // The leader and 63 sleepers use up the bound before the cat, started last.
        assert_eq!(find_reader(&[kid.pid()], input), None);
        assert_eq!(find_reader(&[cat], input), reader(cat, Call::Read, 0));
    }

    /// A PTY pair: (master, slave).
    fn pty() -> (OwnedFd, OwnedFd) {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two descriptors; the name, termios and size may be null.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
        // SAFETY: openpty succeeded: two new descriptors owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
    }

    /// `sh -c script` in a new session whose controlling terminal is the PTY's slave,
    /// which is also its stdout and stderr; stdin is the slave too, or /dev/null.
    fn on_pty(script: &str, slave: &OwnedFd, stdin_is_tty: bool) -> Kid {
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        let mut cmd = Command::new("sh");
        let stdin = if stdin_is_tty {
            io(slave)
        } else {
            Stdio::null()
        };
        cmd.args(["-c", script])
            .stdin(stdin)
            .stdout(io(slave))
            .stderr(io(slave));
        // SAFETY: the closure only makes two system calls, as a child after fork may.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(1, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Not Kid::spawn: setsid makes the child its own group leader already.
        Kid(cmd.spawn().expect("spawn"))
    }

    #[test]
    fn a_read_on_the_pty_is_waiting() {
        let (_master, slave) = pty();
        let input = InputFile::of_fd(slave.as_raw_fd()).unwrap();
        assert!(input.tty.is_some());
        let kid = on_pty("read x", &slave, true);
        drop(slave);
        blocked_in(kid.pid(), kid.pid(), READ);
        let found = find_reader(&[kid.pid()], input);
        assert_eq!(found, reader(kid.pid(), Call::Read, 0));
    }

    #[test]
    fn a_read_of_dev_tty_is_waiting_when_the_pty_is_its_terminal() {
        let (_master, slave) = pty();
        let input = InputFile::of_fd(slave.as_raw_fd()).unwrap();
        let kid = on_pty("read x </dev/tty", &slave, false);
        drop(slave);
        blocked_in(kid.pid(), kid.pid(), READ);
        let found = find_reader(&[kid.pid()], input);
        assert_eq!(found, reader(kid.pid(), Call::Read, 0));
        // Another terminal's input is not what this task reads.
        let (_other_master, other) = pty();
        let other = InputFile::of_fd(other.as_raw_fd()).unwrap();
        assert_eq!(find_reader(&[kid.pid()], other), None);
    }

    #[test]
    fn node_on_stdin_is_waiting_when_there_is_node() {
        let script = "process.stdin.on('data', () => {})";
        if Command::new("node").arg("-v").output().is_err() {
            eprintln!("skipped: no node to run");
            return;
        }
        let (stdin, _w, input) = stdin_pipe();
        let kid = Kid::spawn(&mut command(&["node", "-e", script], stdin));
        blocked_in(kid.pid(), kid.pid(), EPOLL);
        let found = find_reader(&[kid.pid()], input).expect("node is waiting");
        assert_eq!((found.pid, found.call), (kid.pid(), Call::Epoll));
    }

    #[test]
    fn parses_syscall_lines() {
        assert_eq!(parse_syscall(b"running\n"), None);
        assert_eq!(parse_syscall(b"-1 0x7ffc 0x7f3b\n"), None);
        assert_eq!(
            parse_syscall(b"270 0xfb 0x7ffcf8ad2830 0x0 0x0 0x7ffcf8ad2740 0x7ffcf8ad2750 0x7ffcf8ad2710 0x7f3bc2cf9aec\n"),
            Some(Blocked {
                nr: 270,
                args: [0xfb, 0x7ffcf8ad2830, 0, 0, 0x7ffcf8ad2740, 0x7ffcf8ad2750]
            })
        );
        assert_eq!(parse_syscall(b"0 0x0 0x1"), None, "cut short");
        assert_eq!(parse_syscall(b""), None);
    }

    #[test]
    fn a_read_names_the_low_half_of_its_first_argument() {
        let b = Blocked {
            nr: libc::SYS_read,
            args: [0xffff_ffff_0000_0007, 0, 0, 0, 0, 0],
        };
        assert_eq!(b.wait(), Some((Call::Read, WaitsOn::Fd(7))));
        let b = Blocked {
            nr: libc::SYS_pselect6,
            args: [4, 0x1000, 0, 0, 0, 0],
        };
        let set = WaitsOn::SelectSet {
            nfds: 4,
            readfds: 0x1000,
        };
        assert_eq!(b.wait(), Some((Call::Select, set)));
        let b = Blocked {
            nr: libc::SYS_write,
            args: [0; 6],
        };
        assert_eq!(b.wait(), None);
    }

    #[test]
    fn parses_epoll_watches() {
        let line =
            b"tfd:        0 events:       19 data:                0  pos:0 ino:98c09e sdev:fe00000";
        let watch = Watch {
            fd: 0,
            events: 0x19,
            ino: 0x98c09e,
            dev: libc::makedev(254, 0),
        };
        assert_eq!(parse_watch(line), Some(watch));
        assert_eq!(parse_watch(b"pos:\t0"), None);
        assert_eq!(parse_watch(b"tfd: 3 events: 1 data: 0"), None, "cut short");
    }

    #[test]
    fn fd_sets_are_ascending_and_unique() {
        let mut set = FdSet::new();
        for fd in [5, 0, -1, 5, 3] {
            set.push(fd);
        }
        assert_eq!(set.finish().as_slice(), &[0, 3, 5]);
    }

    #[test]
    fn a_proc_path_too_long_is_none() {
        let long = "x".repeat(64);
        assert!(ProcPath::new(format_args!("/proc/{long}")).is_none());
        let p = ProcPath::new(format_args!(
            "/proc/{}/task/{}/fdinfo/{}",
            i32::MAX,
            i32::MAX,
            i32::MAX
        ))
        .unwrap();
        assert_eq!(p.buf.iter().position(|&b| b == 0), Some(50));
    }

    #[test]
    fn memory_reads_through_proc_mem() {
        let here = [7u8, 6, 5, 4, 3, 2, 1, 0];
        let me = Task {
            pid: std::process::id() as i32,
            tid: std::process::id() as i32,
        };
        let addr = here.as_ptr() as u64;
        let mut copy = [0u8; 8];
        assert!(read_memory(me, addr, &mut copy));
        assert_eq!(copy, here);
    }

    /// The cost of one call, median and 90th percentile over many; run with
    /// `cargo test --lib waiting::tests::cost -- --ignored --nocapture`, and add
    /// `--config 'profile.dev.package.execd.opt-level=3'` for the daemon's figures (a
    /// debug build takes half as long again).
    #[test]
    #[ignore]
    fn cost_per_call() {
        const CALLS: usize = 4000;
        let cases: [(&str, &[&str], &[i64]); 5] = [
            ("cat blocked reading a pipe", &["cat"], READ),
            ("sleep 100 (not waiting)", &["sleep", "100"], SLEEP),
            (
                "sh -c 'sleep 100; true' (two processes, not waiting)",
                &["sh", "-c", "sleep 100; true"],
                &[libc::SYS_wait4],
            ),
            (
                "python3 select on stdin",
                &[
                    "python3",
                    "-c",
                    "import select,sys; select.select([sys.stdin],[],[])",
                ],
                SELECT,
            ),
            (
                "python3 epoll on stdin",
                &[
                    "python3",
                    "-c",
                    "import select,sys; e=select.epoll(); e.register(0, select.EPOLLIN); e.poll()",
                ],
                EPOLL,
            ),
        ];
        for (name, argv, calls) in cases {
            if argv[0] == "python3" && !have_python() {
                continue;
            }
            let (stdin, _w, input) = stdin_pipe();
            let kid = Kid::spawn(&mut command(argv, stdin));
            blocked_in(kid.pid(), kid.pid(), calls);
            std::thread::sleep(Duration::from_millis(100));
            let expected = look(kid.pid(), input, &mut |_| true);
            let mut times = Vec::with_capacity(CALLS);
            for _ in 0..CALLS {
                let start = Instant::now();
                let got = look(kid.pid(), input, &mut |_| true);
                times.push(start.elapsed());
                assert_eq!(got, expected);
            }
            times.sort();
            println!(
                "{name}: waiting={expected:?} median {:?} p90 {:?}",
                times[CALLS / 2],
                times[CALLS * 9 / 10]
            );
        }
    }
}
