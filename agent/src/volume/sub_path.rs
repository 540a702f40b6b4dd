//! kubelet's subPath of a guest emptyDir: the directory (or file) below the volume that
//! a container binds instead of the whole volume.
//!
//! The volume is the pod's containers' to write, so a path in it may be a symlink they
//! planted (to `/`, the agent's own root). Each component is opened below the one before
//! without following a symlink (missing directories are made, as kubelet does), and what
//! is found is bound, through its descriptor, at a path of the agent's that the stage then
//! binds into the container: no path in the volume is resolved twice.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

use nix::fcntl::{openat, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, mkdirat, Mode};

use crate::error::{AgentError, Result};

fn bad(sub: &str, what: impl std::fmt::Display) -> AgentError {
    AgentError::InvalidArgument(format!("subPath {sub:?} of a pod volume: {what}"))
}

/// Opens `name` below `dir` without following a symlink; a missing directory is made
/// when `make` says so.
fn open_below(dir: &OwnedFd, name: &Path, sub: &str, make: bool) -> Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let open = || openat(Some(dir.as_raw_fd()), name, flags, Mode::empty());
    let fd = match open() {
        Err(nix::Error::ENOENT) if make => {
            match mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(bad(sub, format!("make {}: {e}", name.display()))),
            }
            open()
        }
        other => other,
    }
    .map_err(|e| bad(sub, format!("open {}: {e}", name.display())))?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `sub` (relative, plain components) of the volume at `volume` onto `at`, which
/// is made here (a directory or an empty file, like what it binds).
pub fn bind(volume: &Path, sub: &str, at: &Path) -> Result<()> {
    let parts: Vec<&Path> = Path::new(sub)
        .components()
        .map(|c| match c {
            Component::Normal(p) => Ok(Path::new(p)),
            _ => Err(bad(sub, "must be relative, without `..`")),
        })
        .collect::<Result<_>>()?;
    if parts.is_empty() {
        return Err(bad(sub, "is empty"));
    }
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::open(volume, flags, Mode::empty())
        .map_err(|e| bad(sub, format!("open the volume {}: {e}", volume.display())))?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut cur = unsafe { OwnedFd::from_raw_fd(fd) };
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        cur = open_below(&cur, part, sub, true)?;
        let st = fstat(cur.as_raw_fd()).map_err(|e| bad(sub, e))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {}
            // Only the last component may be a file.
            libc::S_IFREG if i == last => {}
            libc::S_IFLNK => return Err(bad(sub, format!("{} is a symlink", part.display()))),
            _ => return Err(bad(sub, format!("{} is not a directory", part.display()))),
        }
    }
    let st = fstat(cur.as_raw_fd()).map_err(|e| bad(sub, e))?;
    let made = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        std::fs::create_dir_all(at)
    } else {
        at.parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|()| std::fs::File::create(at).map(drop))
    };
    made.map_err(|e| AgentError::Internal(format!("make {}: {e}", at.display())))?;
    let source = format!("/proc/self/fd/{}", cur.as_raw_fd());
    mount(
        Some(source.as_str()),
        at,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| AgentError::Internal(format!("bind subPath {sub:?} at {}: {e}", at.display())))
}

/// Undoes [`bind`].
pub fn unbind(at: &Path) {
    let _ = umount2(at, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(at).or_else(|_| std::fs::remove_dir(at));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_path_is_made_and_bound_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        let at = tmp.path().join("at");
        bind(&vol, "a/b", &at).unwrap();
        assert!(vol.join("a/b").is_dir(), "missing directories are made");
        std::fs::write(at.join("f"), "x").unwrap();
        assert_eq!(std::fs::read_to_string(vol.join("a/b/f")).unwrap(), "x");
        unbind(&at);
        assert!(!at.exists());

        // A file.
        std::fs::write(vol.join("conf"), "c").unwrap();
        let at_file = tmp.path().join("at-file");
        bind(&vol, "conf", &at_file).unwrap();
        assert_eq!(std::fs::read_to_string(&at_file).unwrap(), "c");
        unbind(&at_file);

        // A planted symlink, anywhere in the path.
        std::os::unix::fs::symlink("/", vol.join("escape")).unwrap();
        for sub in ["escape", "escape/etc", "a/../escape", "/etc", ".."] {
            let err = bind(&vol, sub, &tmp.path().join("bad")).unwrap_err();
            assert!(err.to_string().contains("subPath"), "{sub}: {err}");
        }
        assert!(!tmp.path().join("bad").exists());
    }
}
