//! Who is who: users to run commands as (uid, gid, supplementary groups), the credentials
//! of a socket's peer, and the daemon's own ids.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use super::cstring;

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

/// The home directory of `uid` in the passwd database (what a sandbox's `$HOME` stands
/// for, PROTOCOL 16); `None` when it has no entry. Asked at start only: the database
/// may be a network service.
pub fn home_of(uid: u32) -> io::Result<Option<std::path::PathBuf>> {
    // SAFETY: passwd is plain old data that getpwuid_r fills, pointing into `buf`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: every pointer is to live, correctly sized storage.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if found.is_null() || pw.pw_dir.is_null() {
        return Ok(None);
    }
    // SAFETY: getpwuid_r succeeded: pw_dir points to a NUL-terminated string in `buf`.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    use std::os::unix::ffi::OsStrExt;
    Ok(Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
        dir.to_bytes(),
    ))))
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

/// The daemon's effective uid (what the kernel checks access to other processes with).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
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
