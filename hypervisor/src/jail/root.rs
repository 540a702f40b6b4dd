//! The minimal root a confined child pivots into (see [`Root`]): which directories, files,
//! links and binds it holds is decided in the parent ([`Root::build`]); the child builds it
//! and pivots ([`Root::enter`]).

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

use super::dev::PrivateDev;
use super::{cstring, sys};
use crate::Error;

/// Where confined children build their minimal root (see [`Root`]).
pub use layout::JAIL_ROOT_STAGE as ROOT_STAGE;

/// The path a confined program is run by: its real path, without links or `..`, which
/// the minimal root holds (see [`super::Jail::with_root`]).
pub fn real_path(program: &Path) -> Result<PathBuf, Error> {
    std::fs::canonicalize(program)
        .map_err(|e| Error::Containment(format!("cannot resolve {}: {e}", program.display())))
}

/// A bind mount of the minimal root.
#[derive(Debug)]
struct Bind {
    source: CString,
    /// Under the staging directory.
    target: CString,
    writable: bool,
}

/// The minimal root a confined child pivots into (as Firecracker's jailer's chroot): a
/// read-only tmpfs holding `/usr` (and the top-level links or directories of the system's
/// programs and libraries) read-only, the program itself, `/etc/ld.so.cache`, its
/// writable directories (the run directory), a `/proc` that shows only its own uid's
/// processes, and the private `/dev`. Built on [`ROOT_STAGE`] in the child's own mount
/// namespace (every child mounts its own tmpfs there).
#[derive(Debug)]
pub(super) struct Root {
    stage: CString,
    /// Directories to make under the stage, parents first.
    dirs: Vec<CString>,
    /// Empty files to make under the stage (mount points of file binds).
    files: Vec<CString>,
    /// (target, link path under the stage).
    links: Vec<(CString, CString)>,
    binds: Vec<Bind>,
    proc_dir: CString,
}

impl Root {
    /// The root that holds `program` and the directories `writable`, at their paths.
    pub(super) fn build(program: &Path, writable: &[&Path]) -> Result<Root, Error> {
        let stage = Path::new(ROOT_STAGE);
        std::fs::create_dir_all(stage)
            .map_err(|e| Error::Containment(format!("cannot make {}: {e}", stage.display())))?;
        let under = |p: &Path| -> Result<CString, Error> {
            cstring(&format!("{ROOT_STAGE}{}", p.display()))
        };
        let mut dirs: Vec<PathBuf> = Vec::new();
        let add_dir = |p: &Path, dirs: &mut Vec<PathBuf>| {
            for a in p.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if a != Path::new("/") && !dirs.iter().any(|d| d == a) {
                    dirs.push(a.to_path_buf());
                }
            }
        };
        let mut root = Root {
            stage: cstring(ROOT_STAGE)?,
            dirs: Vec::new(),
            files: Vec::new(),
            links: Vec::new(),
            binds: Vec::new(),
            proc_dir: under(Path::new("/proc"))?,
        };
        add_dir(Path::new("/usr"), &mut dirs);
        root.binds.push(Bind {
            source: cstring("/usr")?,
            target: under(Path::new("/usr"))?,
            writable: false,
        });
        for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            let top = Path::new(top);
            let Ok(meta) = std::fs::symlink_metadata(top) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(top).map_err(|e| {
                    Error::Containment(format!("cannot read {}: {e}", top.display()))
                })?;
                root.links
                    .push((cstring(&target.display().to_string())?, under(top)?));
            } else if meta.is_dir() {
                add_dir(top, &mut dirs);
                root.binds.push(Bind {
                    source: cstring(&top.display().to_string())?,
                    target: under(top)?,
                    writable: false,
                });
            }
        }
        let mut files = Vec::new();
        let ld_cache = Path::new("/etc/ld.so.cache");
        if ld_cache.is_file() {
            add_dir(Path::new("/etc"), &mut dirs);
            files.push(ld_cache.to_path_buf());
        }
        // The program at its real path (see [`real_path`]), unless /usr brings it.
        let real = real_path(program)?;
        if !real.starts_with("/usr/") {
            if let Some(parent) = real.parent() {
                add_dir(parent, &mut dirs);
            }
            files.push(real);
        }
        for f in &files {
            root.files.push(under(f)?);
            root.binds.push(Bind {
                source: cstring(&f.display().to_string())?,
                target: under(f)?,
                writable: false,
            });
        }
        for w in writable {
            add_dir(w, &mut dirs);
            root.binds.push(Bind {
                source: cstring(&w.display().to_string())?,
                target: under(w)?,
                writable: true,
            });
        }
        add_dir(Path::new("/proc"), &mut dirs);
        add_dir(Path::new("/dev"), &mut dirs);
        // Directories that are bind targets themselves are made as well (the mount point).
        root.dirs = dirs.iter().map(|d| under(d)).collect::<Result<_, _>>()?;
        Ok(root)
    }

    /// Builds the minimal root on the stage, with the private `/dev`, and pivots into it.
    /// In the child: async-signal-safe calls only.
    pub(super) fn enter(
        &self,
        dev: &PrivateDev,
        uid: libc::uid_t,
        gid: libc::gid_t,
    ) -> io::Result<()> {
        sys::mount(
            Some(c"tmpfs"),
            &self.stage,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(c"mode=0755,size=64k,nr_inodes=256"),
        )?;
        for dir in &self.dirs {
            sys::mkdir(dir, 0o755)?;
        }
        for file in &self.files {
            sys::create_empty(file)?;
        }
        for (target, link) in &self.links {
            sys::symlink(target, link)?;
        }
        for bind in &self.binds {
            sys::mount(
                Some(&bind.source),
                &bind.target,
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )?;
            let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV;
            if bind.writable {
                flags |= libc::MS_NOEXEC;
            } else {
                flags |= libc::MS_RDONLY;
            }
            sys::mount(None, &bind.target, None, flags, None)?;
        }
        sys::mount(
            Some(c"proc"),
            &self.proc_dir,
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"hidepid=2"),
        )?;
        dev.make(uid, gid)?;
        sys::mount(
            None,
            &self.stage,
            None,
            libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
        sys::pivot_into(&self.stage)
    }
}
