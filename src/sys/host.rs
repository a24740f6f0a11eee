//! The daemon's own process: inherited descriptors, its descriptor limit, its signal mask,
//! the allocator, the pages of its own code, the subreaper role, and a few file-system
//! questions about paths it owns. For execctl: the terminal's width, and children that
//! outlive a Ctrl-C.

use std::io;
use std::os::fd::RawFd;
use std::path::Path;

use super::path_cstring;

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

/// The daemon's descriptor limit once `raise_nofile` had its say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit the daemon runs with.
    pub limit: u64,
    /// The limits as they were at start, to restore in commands, if they were raised.
    pub raised_from: Option<(u64, u64)>,
}

/// Raises the daemon's soft descriptor limit to its hard limit (a service started with
/// the common soft limit of 1024 would otherwise run out at a few hundred commands).
pub fn raise_nofile() -> Nofile {
    // SAFETY: rlimit is plain old data for getrlimit to fill.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Nofile {
            limit: 1024,
            raised_from: None,
        };
    }
    let now = Nofile {
        limit: lim.rlim_cur as u64,
        raised_from: None,
    };
    if lim.rlim_cur >= lim.rlim_max {
        return now;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: a pointer to a live rlimit; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return now;
    }
    Nofile {
        limit: lim.rlim_max as u64,
        raised_from: Some((lim.rlim_cur as u64, lim.rlim_max as u64)),
    }
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

/// How long the loop, and the off-loop reader, wait with nothing to do before they give
/// back what an idle process does not need: the next request maps the code it runs
/// again, a hundred or so minor faults, so a client that calls every few seconds pays
/// that once per call at most.
pub const IDLE_GIVE_BACK: std::time::Duration = std::time::Duration::from_secs(2);

/// Unmaps the pages of execd's own code and read-only data from the daemon, and returns
/// how many bytes that covered. Start-up and the last requests touched most of the
/// binary, and the kernel maps a faulted page's cached neighbours with it, so an idle
/// daemon would keep some 2 MiB of code it is not running mapped. What the next request
/// runs is mapped again from the page cache (minor faults); meanwhile the pages are clean,
/// the first the kernel takes back when memory runs short.
///
/// Only pages that are the file's own bytes are advised (`MADV_DONTNEED` would put any
/// other back to the file's): not a writable segment, nor one that overlaps the part made
/// read-only after relocation (RELRO), nor any of an object with text relocations; and
/// of the rest, not a page this process holds a copy of (`/proc/self/pagemap`: present
/// but not the file's, or swapped), as a debugger's breakpoint or a uprobe makes. Without
/// `pagemap`, nothing is advised.
pub fn unmap_own_code() -> usize {
    use std::os::unix::fs::FileExt;
    let mut found = Own {
        at: unmap_own_code as fn() -> usize as usize,
        ranges: Vec::new(),
    };
    // SAFETY: the callback only reads the loader's program headers for the duration of
    // the call, and writes into `found`, which outlives it.
    unsafe { libc::dl_iterate_phdr(Some(own_segments), (&mut found as *mut Own).cast()) };
    let Ok(pagemap) = std::fs::File::open("/proc/self/pagemap") else {
        return 0;
    };
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let mut unmapped = 0;
    let mut entries = Vec::new();
    for (start, end) in found.ranges {
        // Inward to whole pages: a partial page at either end may be another mapping's.
        let (first, last) = (start.div_ceil(page), end / page);
        if last <= first {
            continue;
        }
        entries.resize((last - first) * 8, 0);
        if pagemap
            .read_exact_at(&mut entries, (first * 8) as u64)
            .is_err()
        {
            continue;
        }
        // Runs of pages that are the file's or not there at all.
        let own_copy = |i: usize| {
            let e = u64::from_ne_bytes(entries[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            let (present, swapped, file) = (e >> 63 & 1 == 1, e >> 62 & 1 == 1, e >> 61 & 1 == 1);
            (present && !file) || swapped
        };
        let mut i = 0;
        while i < last - first {
            if own_copy(i) {
                i += 1;
                continue;
            }
            let run = i;
            while i < last - first && !own_copy(i) {
                i += 1;
            }
            let (at, len) = ((first + run) * page, (i - run) * page);
            // SAFETY: whole pages of a read-only file mapping of this executable that
            // hold nothing but the file's bytes: dropping them only makes the next
            // access fault them in again from the file, the same bytes.
            if unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED) } == 0 {
                unmapped += len;
            }
        }
    }
    unmapped
}

/// What `dl_iterate_phdr` is asked for: the read-only segments of the object that holds
/// `at`.
struct Own {
    at: usize,
    ranges: Vec<(usize, usize)>,
}

/// The program header of this word size.
#[cfg(target_pointer_width = "64")]
type Phdr = libc::Elf64_Phdr;
#[cfg(target_pointer_width = "32")]
type Phdr = libc::Elf32_Phdr;

/// The `dl_iterate_phdr` callback: collects the never-written segments of the object
/// that holds `Own::at` and stops there.
unsafe extern "C" fn own_segments(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid `dl_phdr_info` and our own `Own` back.
    let (info, own) = unsafe { (&*info, &mut *data.cast::<Own>()) };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers for this call.
    let phdrs: &[Phdr] =
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr as usize;
    let span = |p: &Phdr| {
        let start = base + p.p_vaddr as usize;
        (start, start + p.p_memsz as usize)
    };
    let loads = || phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    if !loads().any(|p| (span(p).0..span(p).1).contains(&own.at)) {
        return 0;
    }
    // Text relocations (never made for execd, but a build could ask for them) would have
    // the loader write read-only segments: then none is touched.
    if let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) {
        const DT_TEXTREL: usize = 22;
        const DT_FLAGS: usize = 30;
        const DF_TEXTREL: usize = 0x4;
        // `ElfN_Dyn`: a tag and a value, a word each.
        let mut entry = span(dynamic).0 as *const [usize; 2];
        loop {
            // SAFETY: the dynamic section is mapped for the object's life, aligned, and
            // ends with a `DT_NULL` entry.
            let [tag, value] = unsafe { *entry };
            match tag {
                0 => break,
                DT_TEXTREL => return 1,
                DT_FLAGS if value & DF_TEXTREL != 0 => return 1,
                _ => {}
            }
            // SAFETY: not past the `DT_NULL` entry, which is not reached yet.
            entry = unsafe { entry.add(1) };
        }
    }
    let relro = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_GNU_RELRO)
        .map(span);
    for p in loads().filter(|p| p.p_flags & libc::PF_W == 0) {
        let (start, end) = span(p);
        if relro.is_some_and(|(rs, re)| rs < end && start < re) {
            continue;
        }
        // What lies past the file's bytes (`p_memsz` beyond `p_filesz`) the loader
        // zeroed, writing: left alone.
        own.ranges.push((start, start + p.p_filesz as usize));
    }
    1
}

/// Makes the daemon the reaper of orphaned descendants, so they are reaped here too.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Changes the owner group of a path (the socket file, for `--socket-group`).
pub fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Columns of the terminal on stdout, if stdout is one.
pub fn terminal_width() -> Option<usize> {
    // SAFETY: winsize is plain old data; TIOCGWINSZ writes at most its size into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on fd 1 with a pointer to a live winsize.
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
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

/// Has `cmd`'s child ignore SIGINT. A Ctrl-C at a terminal goes to its whole foreground
/// process group: execctl's own ssh links (`execctl -H ssh://...`) are in it and must
/// survive it, since execctl turns the Ctrl-C into a kill of the remote command sent over
/// them. OpenSSH leaves an ignored SIGINT ignored, and so does a shell script standing in
/// for ssh; unlike a process group of its own, this keeps ssh in the foreground, where it
/// may still ask for a password or a host key on the terminal.
pub fn ignore_sigint_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; signal(2) is async-signal-safe and
    // touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
}

/// 32 bytes from the kernel's random source (`getrandom(2)`), for the secrets the daemon
/// makes shell sessions' nonces from.
pub fn random_secret() -> io::Result<[u8; 32]> {
    let mut buf = [0u8; 32];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: getrandom writes at most the given length into the buffer we own.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pointers the loader relocated: a table of `&'static str` and trait objects (their
    /// vtables live in RELRO).
    static NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

    /// The tests that unmap run one at a time: one's unmap could otherwise fall between
    /// the other's making a private copy of a page and its look at it.
    static UNMAPPING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn shown(items: &[&dyn std::fmt::Display]) -> String {
        items
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn unmapping_the_code_keeps_everything_running_and_every_relocated_pointer() {
        let _one = UNMAPPING.lock().unwrap_or_else(|p| p.into_inner());
        let before = (NAMES.join(" "), shown(&[&1u8, &"two", &3.5f64]));
        let unmapped = unmap_own_code();
        assert!(unmapped > 0, "the test binary's code segments were advised");
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(unmapped % page, 0, "whole pages only");
        // The code runs on (faulted back from the file), and what the loader wrote is
        // as it wrote it.
        let after = (NAMES.join(" "), shown(&[&1u8, &"two", &3.5f64]));
        assert_eq!(before, after);
        assert_eq!(after.0, "alpha beta gamma");
        // A second time is as harmless.
        assert!(unmap_own_code() > 0);
        assert_eq!(NAMES[2], "gamma");
    }

    /// Whether the page at `addr` is this process's own copy (present, not the file's).
    fn own_copy(addr: usize, page: usize) -> bool {
        use std::os::unix::fs::FileExt;
        let pagemap = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        let mut e = [0u8; 8];
        pagemap
            .read_exact_at(&mut e, (addr / page * 8) as u64)
            .expect("an entry");
        let e = u64::from_ne_bytes(e);
        e >> 63 & 1 == 1 && e >> 61 & 1 == 0
    }

    #[test]
    fn a_code_page_the_process_holds_a_copy_of_is_kept() {
        let _one = UNMAPPING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // What a debugger's breakpoint does to a code page: a private copy, here of the
        // page this test's helper is on, written with the byte it holds (other threads
        // may run code there meanwhile: it stays executable and the same).
        let addr = own_copy as fn(usize, usize) -> bool as usize;
        let start = (addr / page * page) as *mut libc::c_void;
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        // SAFETY: the page is mapped (it holds code that runs); it stays executable, and
        // the byte written is the one read.
        unsafe {
            assert_eq!(libc::mprotect(start, page, rwx), 0);
            let b = std::ptr::read_volatile(addr as *const u8);
            std::ptr::write_volatile(addr as *mut u8, b);
            assert_eq!(
                libc::mprotect(start, page, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
        }
        assert!(own_copy(addr, page), "the write made a private copy");
        unmap_own_code();
        assert!(
            own_copy(addr, page),
            "the copy is kept, not put back to the file's bytes"
        );
    }
}
