//! inotify, for cgroup `populated` changes: a non-blocking, close-on-exec instance, watches,
//! and reading events until `EAGAIN`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::path_cstring;

pub use libc::IN_MODIFY;

/// The wd `read_events` reports for a queue overflow (`IN_Q_OVERFLOW`): events were lost,
/// so every watched file must be rechecked.
pub const OVERFLOW_WD: i32 = -1;

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
