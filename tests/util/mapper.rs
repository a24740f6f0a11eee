//! A process whose memory hangs, as one on a dead NFS or FUSE mount does: this test
//! binary, run with `MAP` naming a file of `util::fuse` whose reads are held, becomes (in
//! a constructor that runs before the test harness's `main`, and never returns) a process
//! of three threads:
//! - a faulting thread reads one byte of a mapping of that file through
//!   `/proc/self/mem`: the kernel holds the process's memory lock while it fetches the
//!   page (that path cannot drop it, as an ordinary fault would), and the fetch waits for
//!   the held READ;
//! - the main thread waits until the file `GO` exists (the test creates it once the READ
//!   is held), says `faulting` on stdout, and calls `mmap`, which queues to write-lock
//!   the memory behind the faulting thread; from then on every reader of the process's
//!   memory (`/proc/PID/environ`, `/proc/PID/mem`, `process_vm_readv`, `ps`) waits too;
//! - an input thread, let go at the same time, polls stdin (so a look for input reads its
//!   poll set, in its memory) until stdin ends (at once for `/dev/null`).
//!
//! Once the reads are released, everything goes on: the main thread maps its memory and
//! says `mapped`, and the process lives on until it is killed.
//!
//! After the faulting thread starts nothing allocates (an allocation may need `brk` or
//! `mmap`, which would queue behind it too early).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;

/// The variable naming the file to map (set: this process becomes the mapper).
pub const MAP: &str = "EXECD_TEST_HANG_MAP";
/// The variable naming the file whose existence lets the main thread call `mmap`.
pub const GO: &str = "EXECD_TEST_HANG_GO";

#[used]
#[link_section = ".init_array"]
static BECOME_MAPPER: extern "C" fn() = become_mapper;

extern "C" fn become_mapper() {
    if let Some(map) = std::env::var_os(MAP) {
        let go = std::env::var_os(GO).unwrap_or_default();
        mapper(map, go);
    }
}

fn cstring(s: OsString) -> CString {
    CString::new(s.into_vec()).unwrap_or_default()
}

fn say(what: &[u8]) {
    // SAFETY: writing a live buffer to our stdout.
    unsafe {
        libc::write(1, what.as_ptr().cast(), what.len());
    }
}

fn die(code: i32, why: &[u8]) -> ! {
    say(why);
    // SAFETY: _exit ends the process at once.
    unsafe { libc::_exit(code) }
}

fn mapper(map: OsString, go: OsString) -> ! {
    let (map, go) = (cstring(map), cstring(go));
    // SAFETY: plain system calls on a path we own and the mapping we make; the threads
    // below read only their own stack, the mapping and descriptors they were given.
    unsafe {
        // What it says may go to a pipe nobody reads any more (its daemon stopped): it
        // lives on all the same, until killed.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let fd = libc::open(map.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            die(3, b"mapper: cannot open the file\n");
        }
        let len = 4096;
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if addr == libc::MAP_FAILED {
            die(4, b"mapper: cannot map the file\n");
        }
        libc::close(fd);
        let mem = libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if mem < 0 {
            die(5, b"mapper: cannot open /proc/self/mem\n");
        }
        let mut pipe = [0; 2];
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            die(6, b"mapper: no pipe\n");
        }
        let [go_r, go_w] = pipe;
        // The input thread: let go with the main thread, then polls stdin. It says it
        // runs before the fault starts: a thread's start allocates (a new malloc arena is
        // an mmap), which would queue behind the fault and never reach the poll.
        static INPUT_RUNS: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        std::thread::spawn(move || {
            INPUT_RUNS.store(true, std::sync::atomic::Ordering::Release);
            let mut b = [0u8; 1];
            libc::read(go_r, b.as_mut_ptr().cast(), 1);
            let mut buf = [0u8; 512];
            loop {
                let mut p = libc::pollfd {
                    fd: 0,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&mut p, 1, -1);
                if libc::read(0, buf.as_mut_ptr().cast(), buf.len()) <= 0 {
                    break;
                }
            }
            loop {
                libc::pause();
            }
        });
        let mut waited = 0;
        while !INPUT_RUNS.load(std::sync::atomic::Ordering::Acquire) {
            if waited > 20_000 {
                die(9, b"mapper: the input thread never ran\n");
            }
            libc::usleep(1_000);
            waited += 1;
        }
        // The faulting thread.
        let addr = addr as i64;
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            libc::pread(mem, b.as_mut_ptr().cast(), 1, addr);
            loop {
                libc::pause();
            }
        });
        // Until the test saw the READ held: then the mmap queues behind the fault.
        let mut st: libc::stat = std::mem::zeroed();
        let mut waited = 0;
        while libc::stat(go.as_ptr(), &mut st) != 0 {
            if waited > 60_000 {
                die(7, b"mapper: never let go\n");
            }
            libc::usleep(10_000);
            waited += 10;
        }
        libc::write(go_w, b"g".as_ptr().cast(), 1);
        say(b"faulting\n");
        let more = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if more == libc::MAP_FAILED {
            die(8, b"mapper: cannot map memory\n");
        }
        say(b"mapped\n");
        loop {
            libc::pause();
        }
    }
}
