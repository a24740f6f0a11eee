//! Where a process really is: its working directory as the kernel holds it
//! (`/proc/PID/cwd`), which no variable a shell line sets can change (PROTOCOL 12.2: what
//! approvers and the audit see of a shell session's directory).
//!
//! Invariants:
//! - Nothing here waits on a file system: the link is read from `/proc`, and the one path
//!   looked up (a shell's logical `$PWD`, to compare with the link) is looked at with
//!   `AT_STATX_DONT_SYNC`, the attributes the kernel has cached (a network file system is
//!   not asked again).

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use super::path_cstring;

/// The working directory of process `pid`. A directory removed since reads as its old path
/// with ` (deleted)` after it, as the kernel says.
pub fn of(pid: i32) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
}

/// Whether `path` names the working directory of process `pid` (the same device and
/// inode): a logical `$PWD` through symlinks does, a `PWD=` a line made up does not.
pub fn names(pid: i32, path: &Path) -> bool {
    let (Ok(link), Ok(given)) = (CString::new(format!("/proc/{pid}/cwd")), path_cstring(path))
    else {
        return false;
    };
    match (identity(&link), identity(&given)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A file's device and inode, from what the kernel has cached.
fn identity(path: &CString) -> io::Result<(u32, u32, u64)> {
    let mut st = MaybeUninit::<libc::statx>::uninit();
    // SAFETY: a NUL-terminated path and a statx buffer we own for the kernel to fill.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            st.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_where_the_kernel_says_and_a_symlink_to_it_names_it() {
        let pid = std::process::id() as i32;
        let here = std::env::current_dir().expect("cwd");
        assert_eq!(of(pid).expect("cwd link"), here);
        assert!(names(pid, &here));
        let dir = std::env::temp_dir().join(format!("execd-cwd-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let link = dir.join("here");
        std::os::unix::fs::symlink(&here, &link).expect("symlink");
        assert!(names(pid, &link), "a symlink to the directory names it");
        assert!(!names(pid, &dir), "another directory does not");
        assert!(!names(pid, &dir.join("missing")));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(of(-1).is_err());
    }
}
