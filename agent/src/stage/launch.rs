//! The last steps of a container process, in runc's order: controlling terminal,
//! rlimits, cwd, capability bounding set, user and groups (with PR_SET_KEEPCAPS), the
//! other capability sets, umask, no_new_privs, seccomp, and execve of `args[0]`
//! resolved through the process's own PATH. Everything that can be checked without
//! changing the process is checked first, in [`Launch::prepare`], so a bad capability
//! name or seccomp profile fails early, and what the rootfs must provide (user name, cwd,
//! command) in [`Launch::check_in_rootfs`]. Errors return as [`StageError`]; the caller
//! reports them.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{signal, sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::stat::{umask, Mode};
use nix::unistd::{chdir, execve, setgid, setgroups, setsid, setuid, Gid, Uid};

use super::caps::{self, CapabilitySets};
use super::error::StageError;
use super::seccomp::Filter;
use super::{log, passwd, rlimits};
use crate::spec::{Process, Seccomp};

/// A process ready to become the container's: its spec, checked and compiled.
pub struct Launch<'a> {
    process: &'a Process,
    caps: CapabilitySets,
    seccomp: Option<Filter>,
    /// `process.user.uid`/`gid`, or what `username` resolved to in [`Launch::check_in_rootfs`].
    uid: u32,
    gid: u32,
    /// `args[0]` as [`Launch::check_in_rootfs`] found it: resolved once, at create, as
    /// runc does, so the start does not walk the container's PATH through the rootfs
    /// share a second time.
    exe: Option<PathBuf>,
    /// The container's user namespace, joined after the rlimits (raising one needs the
    /// guest's CAP_SYS_RESOURCE) and before the user is taken, so the ids are the
    /// container's and its capabilities hold only inside the namespace.
    userns: Option<File>,
}

impl<'a> Launch<'a> {
    /// Parses the capabilities and rlimits and compiles the seccomp profile.
    pub fn prepare(
        sync: BorrowedFd<'_>,
        process: &'a Process,
        seccomp: Option<&Seccomp>,
    ) -> Result<Launch<'a>, StageError> {
        let caps = CapabilitySets::from_spec(process.capabilities.as_ref())?;
        rlimits::parse(&process.rlimits)?;
        let seccomp = seccomp.map(|p| Filter::compile(sync, p)).transpose()?;
        Ok(Launch {
            process,
            caps,
            seccomp,
            uid: process.user.uid,
            gid: process.user.gid,
            exe: None,
            userns: None,
        })
    }

    /// Checks what the container's rootfs must provide: the user name, the cwd and the
    /// command. Runs inside the container's root (after pivot_root, or after joining its
    /// mount namespace), still as full root, so that a spec the image cannot satisfy fails
    /// CreateContainer or ExecProcess with a clear error rather than start.
    pub fn check_in_rootfs(mut self) -> Result<Launch<'a>, StageError> {
        let process = self.process;
        if let Some(name) = process.user.username.as_deref().filter(|n| !n.is_empty()) {
            let (uid, gid) = passwd::lookup(Path::new("/etc/passwd"), name)?;
            if process.user.uid != 0 && process.user.uid != uid {
                return Err(StageError::UserMismatch {
                    name: name.to_string(),
                    uid,
                    spec_uid: process.user.uid,
                });
            }
            (self.uid, self.gid) = (uid, gid);
        }
        match std::fs::metadata(&process.cwd) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(StageError::CwdNotDirectory {
                    cwd: process.cwd.clone(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StageError::CwdMissing {
                    cwd: process.cwd.clone(),
                })
            }
            Err(e) => return Err(StageError::io("check process.cwd", &process.cwd, e)),
        }
        let arg0 = &process.args[0];
        let found = if arg0.contains('/') {
            // A relative path is relative to the cwd, where execve will run.
            let path = Path::new(&process.cwd).join(arg0);
            match path.metadata() {
                Err(_) => Err("no such file or directory"),
                Ok(_) if !is_executable(&path) => Err("not an executable file"),
                Ok(_) => Ok(PathBuf::from(arg0)),
            }
        } else {
            resolve(arg0, process.path_env()).ok_or("no such executable file")
        };
        match found {
            Ok(exe) => self.exe = Some(exe),
            Err(problem) => {
                return Err(StageError::CommandMissing {
                    arg0: arg0.clone(),
                    problem,
                    path_env: process.path_env().to_string(),
                })
            }
        }
        Ok(self)
    }

    /// Runs the process in the user namespace `ns` (an open `/proc/PID/ns/user`).
    pub fn in_user_namespace(mut self, ns: Option<File>) -> Self {
        self.userns = ns;
        self
    }

    /// Turns this process into the container process; returns only on error.
    pub fn exec(mut self, sync: BorrowedFd<'_>) -> Result<(), StageError> {
        let process = self.process;
        if process.terminal {
            set_controlling_terminal()?;
        }
        if let Some(profile) = process
            .apparmor_profile
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            log(
                sync,
                format!("ignoring apparmorProfile {profile:?}: the guest has no AppArmor"),
            );
        }
        if let Some(label) = process.selinux_label.as_deref().filter(|l| !l.is_empty()) {
            log(
                sync,
                format!("ignoring selinuxLabel {label:?}: the guest has no SELinux"),
            );
        }
        rlimits::apply(&process.rlimits)?;
        if let Some(ns) = self.userns.take() {
            setns(&ns, CloneFlags::CLONE_NEWUSER)
                .map_err(|e| StageError::sys("join the container's user namespace", e))?;
        }

        // As runc: chdir while still root, and again as the user if root was refused
        // (a directory the container user may enter but root-without-caps may not).
        let cwd_pending = match chdir(process.cwd.as_str()) {
            Ok(()) => false,
            Err(Errno::EACCES | Errno::EPERM) => true,
            Err(e) => return Err(chdir_error(&process.cwd, e)),
        };
        // Without no_new_privs, loading a filter needs CAP_SYS_ADMIN, which the user may
        // be about to lose: load it now, as runc does.
        if !process.no_new_privileges {
            if let Some(filter) = &self.seccomp {
                filter.load()?;
            }
        }
        self.caps.apply_bounding(sync)?;
        caps::set_keep_caps(true)?;
        set_user(process, self.uid, self.gid)?;
        if cwd_pending {
            chdir(process.cwd.as_str()).map_err(|e| chdir_error(&process.cwd, e))?;
        }
        caps::set_keep_caps(false)?;
        self.caps.apply(sync)?;
        umask(Mode::from_bits_truncate(
            process.user.umask.unwrap_or(0o022),
        ));

        let arg0 = &process.args[0];
        let path = match self.exe.take() {
            Some(exe) => exe,
            None => resolve(arg0, process.path_env()).ok_or_else(|| StageError::Exec {
                arg0: arg0.clone(),
                errno: Errno::ENOENT,
            })?,
        };
        let path_c = cstring(path.to_string_lossy().as_ref())?;
        let args = process
            .args
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<Vec<_>, _>>()?;
        let env = process
            .env
            .iter()
            .map(|e| cstring(e))
            .collect::<Result<Vec<_>, _>>()?;

        default_signals()?;
        if process.no_new_privileges {
            caps::set_no_new_privileges()?;
            if let Some(filter) = &self.seccomp {
                filter.load()?;
            }
        }
        match execve(&path_c, &args, &env) {
            Err(errno) => Err(StageError::Exec {
                arg0: arg0.clone(),
                errno,
            }),
            Ok(never) => match never {},
        }
    }
}

/// Gives the process every signal's default disposition and an empty signal mask, as
/// runc's containers start. The stage is a Rust program, whose runtime ignores SIGPIPE;
/// execve keeps ignored signals ignored, so without this every container process would
/// start with SIGPIPE ignored (`yes | head -n1` would see EPIPE errors instead of dying
/// quietly, and so would every program that counts on SIGPIPE to end it).
fn default_signals() -> Result<(), StageError> {
    for sig in nix::sys::signal::Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: SIG_DFL installs no handler of ours; the stage is single-threaded and
        // about to execve.
        unsafe { signal(sig, SigHandler::SigDfl) }
            .map_err(|e| StageError::sys(format!("reset the disposition of {sig}"), e))?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| StageError::sys("clear the signal mask", e))
}

fn set_controlling_terminal() -> Result<(), StageError> {
    setsid().map_err(|e| StageError::sys("start a session (setsid)", e))?;
    // SAFETY: TIOCSCTTY takes an int argument and touches no memory of ours; fd 0 is
    // the pty slave the agent gave us.
    if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
        return Err(StageError::Os {
            action: "make the pty the controlling terminal".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Additional groups, then gid, then uid (after which setgroups is no longer allowed).
fn set_user(process: &Process, uid: u32, gid: u32) -> Result<(), StageError> {
    let user = &process.user;
    let groups: Vec<Gid> = user
        .additional_gids
        .iter()
        .map(|g| Gid::from_raw(*g))
        .collect();
    setgroups(&groups).map_err(|e| {
        StageError::sys(
            format!("set additional groups {:?}", user.additional_gids),
            e,
        )
    })?;
    setgid(Gid::from_raw(gid))
        .map_err(|e| StageError::sys(format!("set gid {gid} (process.user.gid)"), e))?;
    setuid(Uid::from_raw(uid))
        .map_err(|e| StageError::sys(format!("set uid {uid} (process.user.uid)"), e))
}

fn chdir_error(cwd: &str, e: Errno) -> StageError {
    StageError::sys(format!("chdir to process.cwd {cwd:?}"), e)
}

/// Finds the executable like execvp, but in the container's PATH.
pub fn resolve(arg0: &str, path_env: &str) -> Option<PathBuf> {
    if arg0.contains('/') {
        return Some(PathBuf::from(arg0));
    }
    path_env
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(arg0))
        .find(|candidate| is_executable(candidate))
}

/// A regular file with an execute bit (execve checks the rest).
fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn cstring(s: &str) -> Result<CString, StageError> {
    CString::new(s).map_err(|_| StageError::NulByte {
        value: s.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_through_path_and_keeps_slashes() {
        assert_eq!(resolve("./x", "/bin"), Some(PathBuf::from("./x")));
        assert!(resolve("sh", "/nonexistent:/bin").is_some());
        assert_eq!(resolve("no-such-binary-here", "/bin:/usr/bin"), None);
    }
}
