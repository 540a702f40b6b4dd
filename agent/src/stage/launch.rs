//! The last steps of a container process: controlling terminal, user and groups, umask,
//! working directory, environment, and execve of `args[0]` resolved through the
//! process's own PATH. Errors return as text; the caller reports them to the agent.

use std::ffi::CString;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{umask, Mode};
use nix::unistd::{chdir, execve, setgid, setgroups, setsid, setuid, Gid, Uid};

use crate::spec::Process;

/// Turns this process into `process`; returns only on error.
pub fn exec_process(_sync: BorrowedFd<'_>, process: &Process) -> Result<(), String> {
    if process.terminal {
        setsid().map_err(|e| format!("setsid: {e}"))?;
        // SAFETY: TIOCSCTTY takes an int argument and touches no memory of ours; fd 0 is
        // the pty slave the agent gave us.
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            return Err(format!(
                "set controlling terminal: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    let user = &process.user;
    let groups: Vec<Gid> = user
        .additional_gids
        .iter()
        .map(|g| Gid::from_raw(*g))
        .collect();
    setgroups(&groups).map_err(|e| format!("setgroups {:?}: {e}", user.additional_gids))?;
    setgid(Gid::from_raw(user.gid)).map_err(|e| format!("setgid {}: {e}", user.gid))?;
    setuid(Uid::from_raw(user.uid)).map_err(|e| format!("setuid {}: {e}", user.uid))?;
    umask(Mode::from_bits_truncate(user.umask.unwrap_or(0o022)));

    chdir(process.cwd.as_str())
        .map_err(|e| format!("chdir to cwd {:?}: {}", process.cwd, e.desc()))?;

    let arg0 = &process.args[0];
    let path = resolve(arg0, process.path_env())
        .ok_or_else(|| format!("exec {arg0:?}: No such file or directory"))?;
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
    match execve(&path_c, &args, &env) {
        Err(e) => Err(format!("exec {arg0:?}: {}", e.desc())),
        Ok(never) => match never {},
    }
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
        .find(|candidate| {
            candidate
                .metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
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
