//! The system calls a confined child makes between fork and exec, each behind a wrapper
//! that turns -1 into the errno. They are async-signal-safe: raw calls on integers, or on
//! C strings and arrays the parent made before the fork and that outlive it; nothing here
//! allocates.

use std::ffi::CStr;
use std::io;

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

/// mount(2).
pub(super) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    // SAFETY: every pointer is null or a NUL-terminated string that lives across the call.
    check(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
}

/// mkdir(2).
pub(super) fn mkdir(path: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated string that lives across the call.
    check(unsafe { libc::mkdir(path.as_ptr(), mode) })
}

/// An empty file at `path` (the mount point of a file bind).
pub(super) fn create_empty(path: &CStr) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated string that lives across the call.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    check(fd)?;
    // SAFETY: `fd` was just opened here and is closed once.
    unsafe { libc::close(fd) };
    Ok(())
}

/// symlink(2): `link` pointing at `target`.
pub(super) fn symlink(target: &CStr, link: &CStr) -> io::Result<()> {
    // SAFETY: both are NUL-terminated strings that live across the call.
    check(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) })
}

/// A device node, with exactly `mode` (mknod applies the umask) and, when `owner` is
/// given, owned by that uid and gid.
pub(super) fn device_node(
    path: &CStr,
    mode: libc::mode_t,
    rdev: libc::dev_t,
    owner: Option<(libc::uid_t, libc::gid_t)>,
) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated string that lives across the calls; the rest are
    // integers.
    unsafe {
        check(libc::mknod(path.as_ptr(), mode, rdev))?;
        check(libc::chmod(path.as_ptr(), mode & 0o7777))?;
        if let Some((uid, gid)) = owner {
            check(libc::chown(path.as_ptr(), uid, gid))?;
        }
    }
    Ok(())
}

/// unshare(2).
pub(super) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a system call on an integer.
    check(unsafe { libc::unshare(flags) })
}

/// Makes `dir` the root: chdir there, pivot_root(".", ".") (which stacks the old root under
/// the new one), detach the old root, chdir to the new `/`.
pub(super) fn pivot_into(dir: &CStr) -> io::Result<()> {
    // SAFETY: `dir` and the literals are NUL-terminated strings that live across the calls.
    unsafe {
        check(libc::chdir(dir.as_ptr()))?;
        check(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int)?;
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
        check(libc::chdir(c"/".as_ptr()))
    }
}

/// umask(2); it cannot fail.
pub(super) fn umask(mask: libc::mode_t) {
    // SAFETY: a system call on an integer.
    unsafe { libc::umask(mask) };
}

/// prctl(2) with integer arguments.
pub(super) fn prctl(
    option: libc::c_int,
    arg2: libc::c_ulong,
    arg3: libc::c_ulong,
) -> io::Result<()> {
    // SAFETY: a system call on integers.
    check(unsafe { libc::prctl(option, arg2, arg3, 0, 0) })
}

/// No supplementary groups, then `gid` and `uid` as real, effective and saved ids.
pub(super) fn become_ids(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    // SAFETY: system calls on integers and a null list of length 0.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(gid, gid, gid))?;
        check(libc::setresuid(uid, uid, uid))
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capset(2) with every set empty, for this process.
pub(super) fn clear_capabilities() -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads one header and, for version 3, two data structs, which live
    // across the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int })
}
