//! A FUSE file system, served from this process over the raw kernel protocol on
//! `/dev/fuse`, whose one directory `slow` is found only when the test says so: a lookup of
//! `slow` (by `chdir`, `stat`, ...) blocks in the kernel until `release`, then finds a
//! directory or nothing (`ENOENT`). It is how a test makes a path's lookup hang, as on a
//! dead network mount, without a network or a FUSE library.
//!
//! It also holds one regular file, `data` (`DATA_BYTES` of `x`), found, opened and stat'ed
//! at once, whose READs are held until `release_reads`: a process that maps it and
//! touches a page sleeps in the kernel's page fault, as on a dead NFS server, until then.
//! A held READ that the kernel has handed over cannot be interrupted, not even by SIGKILL:
//! the process waits for the answer (or for the connection to be aborted).
//!
//! One thread serves it: it polls the device and an eventfd, reads one request per read
//! and answers at once, except that a held lookup of `slow` is only noted; the answer is
//! written when `release` (or drop) wakes the thread through the eventfd, so a held lookup
//! never stops other requests (the root's GETATTR, say) from being answered. Requests it
//! does not know get `ENOSYS`, which the kernel takes as "not supported" and copes with.
//!
//! Drop releases a held lookup (as `ENOENT`) and the held reads, detaches the mount, stops and joins the
//! thread (bounded), closes the device (which aborts the connection should anything still
//! wait on it) and removes the directory, also when the test failed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{TempDir, WAIT};

/// What the held lookup of `slow` finally finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A directory (node 2): a `chdir` into it succeeds.
    Dir,
    /// Nothing: the lookup fails with `ENOENT`.
    Nothing,
}

/// The mounted file system; see the module doc.
pub struct SlowFs {
    mount: PathBuf,
    server: Option<JoinHandle<()>>,
    /// Dropped after `drop` (fields drop in this order): the device closes here unless the
    /// server thread is stuck with it.
    shared: Arc<Shared>,
    /// Removed last, once nothing is mounted in it (left alone if the unmount failed: a
    /// walk into a mount nobody serves would hang).
    dir: Option<TempDir>,
}

/// What the test and the server thread share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// The FUSE device, non-blocking and close-on-exec.
    dev: OwnedFd,
    /// Wakes the server thread: a release or a stop.
    wake: OwnedFd,
}

#[derive(Default)]
struct State {
    /// `None` while lookups of `slow` are held.
    found: Option<Found>,
    /// The pids whose lookups of `slow` have been held, in arrival order.
    held_for: Vec<u32>,
    /// Reads of `data` are answered (until then they are held).
    reads_free: bool,
    /// The threads whose reads of `data` have been held, in arrival order.
    reads_held_for: Vec<u32>,
    stop: bool,
}

// Opcodes and sizes from include/uapi/linux/fuse.h.
const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
const ROOT: u64 = 1;
const SLOW: u64 = 2;
const DATA: u64 = 3;
/// The size of `data`.
pub const DATA_BYTES: usize = 64 << 10;
/// `struct fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid, extlen+padding.
const IN_HEADER: usize = 40;
/// The minor version we speak at most: entry and attr replies at their full size (from
/// 7.9), and the 64-byte `fuse_init_out` (from 7.23).
const MINOR: u32 = 31;
/// How long the kernel may cache names and attributes, in seconds.
const VALID: u64 = 60;

impl SlowFs {
    /// Mounts it on a fresh directory; `Err` says why FUSE is not available here (no
    /// `/dev/fuse`, or mounting is not permitted), for the caller to `skip`. Any other
    /// failure panics.
    pub fn mount() -> Result<SlowFs, String> {
        // SAFETY: a valid NUL-terminated path and plain flags.
        let fd = unsafe {
            libc::open(
                c"/dev/fuse".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(format!(
                "cannot open /dev/fuse: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: open succeeded; nobody else owns it.
        let dev = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain flags.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(wake >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: eventfd succeeded; nobody else owns it.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };

        let dir = TempDir::new();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("create the mount point");
        let target = cstr(mount.as_os_str().as_bytes());
        // SAFETY: geteuid and getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let opts = cstr(format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid}").as_bytes());
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"fuse-slow".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EPERM | libc::ENODEV) => {
                    Err(format!("cannot mount a FUSE file system here: {e}"))
                }
                _ => panic!("mounting FUSE on {}: {e}", mount.display()),
            };
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            dev,
            wake,
        });
        let server = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("fuse-slow".into())
                .spawn(move || serve(&shared))
                .expect("spawn the FUSE server thread")
        };
        Ok(SlowFs {
            mount,
            shared,
            server: Some(server),
            dir: Some(dir),
        })
    }

    /// The directory whose lookup is held.
    pub fn slow(&self) -> PathBuf {
        self.mount.join("slow")
    }

    /// Waits (at most `WAIT`) until a lookup of `slow` is being held; returns the pid of
    /// the process whose lookup it is.
    #[track_caller]
    pub fn wait_held(&self) -> u32 {
        let deadline = Instant::now() + WAIT;
        let mut st = self.shared.lock();
        loop {
            if let Some(&pid) = st.held_for.first() {
                return pid;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "nothing looked up {} within {WAIT:?}",
                self.slow().display()
            );
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Lets every held lookup of `slow` (and every later one) find `found`.
    pub fn release(&self, found: Found) {
        self.shared.lock().found.get_or_insert(found);
        self.shared.wake();
    }

    /// The file whose reads are held.
    pub fn data(&self) -> PathBuf {
        self.mount.join("data")
    }

    /// Waits (at most `WAIT`) until a read of `data` is being held; returns the thread
    /// whose read it is.
    #[track_caller]
    pub fn wait_read_held(&self) -> u32 {
        let deadline = Instant::now() + WAIT;
        let mut st = self.shared.lock();
        loop {
            if let Some(&tid) = st.reads_held_for.first() {
                return tid;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "nothing read {} within {WAIT:?}",
                self.data().display()
            );
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Answers every held read of `data`, and every later one at once.
    pub fn release_reads(&self) {
        self.shared.lock().reads_free = true;
        self.shared.wake();
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        self.release(Found::Nothing);
        self.release_reads();
        let target = cstr(self.mount.as_os_str().as_bytes());
        // SAFETY: a NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            std::mem::forget(self.dir.take());
        }
        self.shared.lock().stop = true;
        self.shared.wake();
        if let Some(server) = self.server.take() {
            let deadline = Instant::now() + WAIT;
            while !server.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if server.is_finished() {
                let _ = server.join();
            }
        }
        // Then `shared` drops with the last `Arc` to the device: a connection whose device
        // is closed is aborted, failing whatever still waits on it. Then `dir` goes.
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that failed while holding it poisoned it; the state is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a live buffer to our eventfd.
        unsafe {
            libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len());
        }
    }

    /// Writes one reply: `fuse_out_header {len, error, unique}` and `body`. A reply the
    /// kernel no longer wants (its caller was killed) fails with ENOENT: ignored.
    fn reply(&self, unique: u64, error: i32, body: &[u8]) {
        let mut msg = Vec::with_capacity(16 + body.len());
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&(-error).to_ne_bytes());
        msg.extend_from_slice(&unique.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: writing a live buffer to the device we own.
        unsafe {
            libc::write(self.dev.as_raw_fd(), msg.as_ptr().cast(), msg.len());
        }
    }
}

/// The server thread: until stopped or the connection is gone, answers requests and, once
/// released, the lookups it held.
fn serve(shared: &Shared) {
    let dev = shared.dev.as_raw_fd();
    let mut buf = vec![0u8; (1 << 20) + 4096];
    let mut held: Vec<u64> = Vec::new();
    // Held reads of `data`: unique, offset, size.
    let mut reads: Vec<(u64, u64, u32)> = Vec::new();
    loop {
        let (found, reads_free, stop) = {
            let st = shared.lock();
            (st.found, st.reads_free, st.stop)
        };
        // Held lookups and reads are answered before a stop: drop releases, then stops.
        if let Some(found) = found {
            for unique in held.drain(..) {
                answer_slow(shared, unique, found);
            }
        }
        if reads_free {
            for (unique, offset, size) in reads.drain(..) {
                answer_read(shared, unique, offset, size);
            }
        }
        if stop {
            return;
        }
        if !wait_readable(dev, shared.wake.as_raw_fd()) {
            continue;
        }
        // SAFETY: reading into a live buffer of its length.
        let n = unsafe { libc::read(dev, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => continue,
                // ENODEV: unmounted and the connection is gone.
                _ => return,
            }
        }
        let req = &buf[..n as usize];
        if req.len() < IN_HEADER {
            continue;
        }
        let (opcode, unique, node, pid) = (
            u32_at(req, 4),
            u64_at(req, 8),
            u64_at(req, 16),
            u32_at(req, 32),
        );
        let body = &req[IN_HEADER..];
        match opcode {
            FUSE_INIT => {
                // fuse_init_in: major, minor, max_readahead, flags, ...
                let (major, minor) = (u32_at(body, 0), u32_at(body, 4));
                if major != 7 {
                    shared.reply(unique, libc::EPROTO, &[]);
                    continue;
                }
                shared.reply(unique, 0, &init_out(minor.min(MINOR)));
            }
            FUSE_LOOKUP => {
                let name = body.split(|&b| b == 0).next().unwrap_or_default();
                if node == ROOT && name == b"data" {
                    shared.reply(unique, 0, &entry(DATA, &file_attr()));
                    continue;
                }
                if node != ROOT || name != b"slow" {
                    shared.reply(unique, libc::ENOENT, &[]);
                    continue;
                }
                let mut st = shared.lock();
                match st.found {
                    Some(found) => {
                        drop(st);
                        answer_slow(shared, unique, found);
                    }
                    None => {
                        held.push(unique);
                        st.held_for.push(pid);
                        shared.changed.notify_all();
                    }
                }
            }
            FUSE_GETATTR => {
                let found = shared.lock().found;
                let attr = match node {
                    DATA => Some(file_attr()),
                    ROOT => Some(dir_attr(node)),
                    SLOW if found == Some(Found::Dir) => Some(dir_attr(node)),
                    _ => None,
                };
                if let Some(attr) = attr {
                    let mut out = Vec::with_capacity(104);
                    out.extend_from_slice(&VALID.to_ne_bytes()); // attr_valid
                    out.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
                    out.extend_from_slice(&0u32.to_ne_bytes()); // dummy
                    out.extend_from_slice(&attr);
                    shared.reply(unique, 0, &out);
                } else {
                    shared.reply(unique, libc::ENOENT, &[]);
                }
            }
            // fuse_open_out: fh, open_flags, padding (page cache kept: mappable).
            FUSE_OPEN if node == DATA => shared.reply(unique, 0, &[0; 16]),
            FUSE_READ if node == DATA => {
                // fuse_read_in: fh, offset, size, ...
                let (offset, size) = (u64_at(body, 8), u32_at(body, 16));
                let mut st = shared.lock();
                if st.reads_free {
                    drop(st);
                    answer_read(shared, unique, offset, size);
                } else {
                    reads.push((unique, offset, size));
                    st.reads_held_for.push(pid);
                    shared.changed.notify_all();
                }
            }
            FUSE_FLUSH | FUSE_RELEASE => shared.reply(unique, 0, &[]),
            // No reply is expected to these.
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
            FUSE_DESTROY => {
                shared.reply(unique, 0, &[]);
                return;
            }
            _ => shared.reply(unique, libc::ENOSYS, &[]),
        }
    }
}

/// Answers a lookup of `slow`: `fuse_entry_out` for a directory, or `ENOENT`.
fn answer_slow(shared: &Shared, unique: u64, found: Found) {
    match found {
        Found::Dir => shared.reply(unique, 0, &entry(SLOW, &dir_attr(SLOW))),
        Found::Nothing => shared.reply(unique, libc::ENOENT, &[]),
    }
}

/// Answers a read of `data`: `size` bytes of `x` from `offset`, fewer at its end.
fn answer_read(shared: &Shared, unique: u64, offset: u64, size: u32) {
    let left = (DATA_BYTES as u64).saturating_sub(offset);
    let n = left.min(u64::from(size)) as usize;
    shared.reply(unique, 0, &vec![b'x'; n]);
}

/// `struct fuse_entry_out` of node `node` with attributes `attr`.
fn entry(node: u64, attr: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&node.to_ne_bytes()); // nodeid
    out.extend_from_slice(&1u64.to_ne_bytes()); // generation
    out.extend_from_slice(&VALID.to_ne_bytes()); // entry_valid
    out.extend_from_slice(&VALID.to_ne_bytes()); // attr_valid
    out.extend_from_slice(&0u32.to_ne_bytes()); // entry_valid_nsec
    out.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    out.extend_from_slice(attr);
    out
}

/// `struct fuse_attr` (88 bytes) of a directory `drwxr-xr-x` owned by us.
fn dir_attr(ino: u64) -> Vec<u8> {
    attr(ino, 0o040755, 0, 2)
}

/// `struct fuse_attr` of `data`, a file `-rw-r--r--` of `DATA_BYTES` owned by us.
fn file_attr() -> Vec<u8> {
    attr(DATA, 0o100644, DATA_BYTES as u64, 1)
}

/// `struct fuse_attr` (88 bytes).
fn attr(ino: u64, mode: u32, size: u64, nlink: u32) -> Vec<u8> {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut a = Vec::with_capacity(88);
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        // ino, size, blocks, atime, mtime, ctime
        a.extend_from_slice(&v.to_ne_bytes());
    }
    // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
    for v in [0, 0, 0, mode, nlink, uid, gid, 0, 4096, 0u32] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    a
}

/// `struct fuse_init_out` for `minor`: the 24 bytes of 7.22 and before, else all 64.
fn init_out(minor: u32) -> Vec<u8> {
    let mut o = Vec::with_capacity(64);
    o.extend_from_slice(&7u32.to_ne_bytes()); // major
    o.extend_from_slice(&minor.to_ne_bytes());
    o.extend_from_slice(&(128u32 << 10).to_ne_bytes()); // max_readahead
    o.extend_from_slice(&0u32.to_ne_bytes()); // flags
    o.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    o.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    o.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
    if minor <= 22 {
        return o;
    }
    o.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    o.resize(64, 0); // max_pages, map_alignment, flags2, unused: none
    o
}

/// Waits until the device is readable or the eventfd fired (which it drains); returns
/// whether the device is. Polls with a timeout, so a missed wakeup costs only a moment.
fn wait_readable(dev: RawFd, wake: RawFd) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: dev,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two live pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
    if n <= 0 {
        return false;
    }
    if fds[1].revents != 0 {
        let mut count = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from our eventfd.
        unsafe {
            libc::read(wake, count.as_mut_ptr().cast(), count.len());
        }
    }
    // An aborted or unmounted connection shows as POLLERR: the read says ENODEV.
    fds[0].revents != 0
}

/// The `u32` at `i` of a request, 0 past its end.
fn u32_at(b: &[u8], i: usize) -> u32 {
    b.get(i..i + 4)
        .map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

/// The `u64` at `i` of a request, 0 past its end.
fn u64_at(b: &[u8], i: usize) -> u64 {
    b.get(i..i + 8)
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

fn cstr(bytes: &[u8]) -> std::ffi::CString {
    std::ffi::CString::new(bytes).expect("no NUL in a path")
}
