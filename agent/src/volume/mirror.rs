//! A guest copy of a directory tree of the share, and the changes that bring it up to date.
//!
//! [`Tree::read`] snapshots the share's tree (bounded, never following a symlink, one
//! path component per open); [`diff`] lists the steps from one snapshot to the next in
//! the order kubelet's atomic writer takes them (new directories and files, then
//! symlinks, deletions last); [`apply`] carries them out in the copy, each file and
//! symlink written under a temporary name and renamed into place, so that a reader in the
//! container sees whole files and inotify events on the names it watches.
//!
//! The share is the host's and may change under the reader; the copy is the agent's
//! alone (the container gets it read-only), so paths in it are only ever directories
//! this module made.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode};

/// The name every temporary file or symlink of [`apply`] has while it is written; an
/// entry of the share with this name is not copied.
pub const TEMP_NAME: &str = "..kata_sync_tmp";

/// What a deep tree may cost before it is refused.
const MAX_DEPTH: usize = 32;
/// What an entry costs against the size cap beyond its bytes (its name, inode).
const ENTRY_COST: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("the volume is larger than the guest copies ({limit} bytes at most)")]
    TooBig { limit: u64 },
    #[error("the volume is deeper than {MAX_DEPTH} directories")]
    TooDeep,
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MirrorError {
    let path = path.to_path_buf();
    move |source| MirrorError::Io { what, path, source }
}

fn errno(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// Owner, group and permission bits (with setuid, setgid and sticky).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(OsString),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub node: Node,
    pub meta: Meta,
}

/// A snapshot of a tree: the root's metadata and every entry by its path relative to
/// the root. Paths order parents before their children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    pub root: Option<Meta>,
    pub entries: BTreeMap<PathBuf, Entry>,
}

impl Tree {
    /// Reads the tree at `src`, refusing it once its files and entries cost more than
    /// `limit` bytes. Sockets, FIFOs and devices are left out (kubelet writes none).
    pub fn read(src: &Path, limit: u64) -> Result<Tree, MirrorError> {
        let root = open_dir(None, src).map_err(io("open", src))?;
        let st = fstat(root.as_raw_fd()).map_err(|e| io("stat", src)(errno(e)))?;
        let mut tree = Tree {
            root: Some(meta_of(st.st_uid, st.st_gid, st.st_mode)),
            entries: BTreeMap::new(),
        };
        let mut budget = limit;
        read_dir_into(&root, src, Path::new(""), 0, &mut tree, &mut budget, limit)?;
        Ok(tree)
    }
}

fn meta_of(uid: u32, gid: u32, mode: u32) -> Meta {
    Meta {
        uid,
        gid,
        mode: mode & 0o7777,
    }
}

/// Opens a directory, `name` under `dir` (one component) or the path itself, without
/// following a symlink there.
fn open_dir(dir: Option<&OwnedFd>, name: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match dir {
        Some(d) => nix::fcntl::openat(Some(d.as_raw_fd()), name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    }
    .map_err(errno)?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names in an open directory (read through its /proc/self/fd link, which is that
/// directory whatever its path has become).
fn names_in(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let mut names: Vec<OsString> =
        std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

fn charge(budget: &mut u64, cost: u64, limit: u64) -> Result<(), MirrorError> {
    *budget = budget
        .checked_sub(cost)
        .ok_or(MirrorError::TooBig { limit })?;
    Ok(())
}

fn read_dir_into(
    dir: &OwnedFd,
    src: &Path,
    rel: &Path,
    depth: usize,
    tree: &mut Tree,
    budget: &mut u64,
    limit: u64,
) -> Result<(), MirrorError> {
    if depth >= MAX_DEPTH {
        return Err(MirrorError::TooDeep);
    }
    let here = src.join(rel);
    for name in names_in(dir).map_err(io("list", &here))? {
        if name.as_bytes() == TEMP_NAME.as_bytes() {
            continue;
        }
        let path = rel.join(&name);
        charge(budget, ENTRY_COST, limit)?;
        let st = match fstatat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            // Gone since the listing (kubelet removing an old version): as if never seen.
            Err(nix::Error::ENOENT) => continue,
            Err(e) => return Err(io("stat", &src.join(&path))(errno(e))),
        };
        let meta = meta_of(st.st_uid, st.st_gid, st.st_mode);
        let node = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let sub = match open_dir(Some(dir), Path::new(&name)) {
                    Ok(sub) => sub,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(io("open", &src.join(&path))(e)),
                };
                tree.entries.insert(
                    path.clone(),
                    Entry {
                        node: Node::Dir,
                        meta,
                    },
                );
                read_dir_into(&sub, src, &path, depth + 1, tree, budget, limit)?;
                continue;
            }
            libc::S_IFREG => match read_file(dir, &name, budget, limit) {
                Ok(bytes) => Node::File(bytes),
                Err(MirrorError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ENOENT) =>
                {
                    continue
                }
                Err(MirrorError::Io { what, source, .. }) => {
                    return Err(MirrorError::Io {
                        what,
                        path: src.join(&path),
                        source,
                    })
                }
                Err(e) => return Err(e),
            },
            libc::S_IFLNK => match readlinkat(Some(dir.as_raw_fd()), name.as_os_str()) {
                Ok(target) => {
                    charge(budget, target.len() as u64, limit)?;
                    Node::Symlink(target)
                }
                Err(nix::Error::ENOENT) => continue,
                Err(e) => return Err(io("read link", &src.join(&path))(errno(e))),
            },
            _ => continue,
        };
        tree.entries.insert(path, Entry { node, meta });
    }
    Ok(())
}

/// A regular file's bytes, read through a descriptor that is that file (not a symlink,
/// not something swapped in since the stat).
fn read_file(
    dir: &OwnedFd,
    name: &OsString,
    budget: &mut u64,
    limit: u64,
) -> Result<Vec<u8>, MirrorError> {
    let p = Path::new(name);
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(Some(dir.as_raw_fd()), p, flags, Mode::empty())
        .map_err(|e| io("open", p)(errno(e)))?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let st = fstat(file.as_raw_fd()).map_err(|e| io("stat", p)(errno(e)))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io("open", p)(std::io::Error::other("not a regular file")));
    }
    let mut bytes = Vec::new();
    // One byte past the budget tells a file that grew past it.
    (&mut file)
        .take(budget.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io("read", p))?;
    charge(budget, bytes.len() as u64, limit)?;
    Ok(bytes)
}

/// One step of bringing the copy up to date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// An entry whose kind changed goes first: a rename cannot replace a directory with
    /// a file or the other way round.
    Replace(PathBuf),
    MakeDir(PathBuf, Meta),
    SetMeta(PathBuf, Meta),
    WriteFile(PathBuf, Vec<u8>, Meta),
    Link(PathBuf, OsString, Meta),
    Delete(PathBuf),
    SetRootMeta(Meta),
}

/// The steps from `old` to `new`: kind changes, new or changed directories, files, then
/// symlinks, then deletions (children before their directories).
pub fn diff(old: &Tree, new: &Tree) -> Vec<Op> {
    let mut replace = Vec::new();
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut links = Vec::new();
    for (path, e) in &new.entries {
        let before = old.entries.get(path);
        let same_kind = before
            .is_some_and(|b| std::mem::discriminant(&b.node) == std::mem::discriminant(&e.node));
        if before.is_some() && !same_kind {
            replace.push(Op::Replace(path.clone()));
        }
        let was = before.filter(|_| same_kind);
        match &e.node {
            Node::Dir => match was {
                None => dirs.push(Op::MakeDir(path.clone(), e.meta)),
                Some(b) if b.meta != e.meta => dirs.push(Op::SetMeta(path.clone(), e.meta)),
                Some(_) => {}
            },
            Node::File(bytes) => {
                if was != Some(e) {
                    files.push(Op::WriteFile(path.clone(), bytes.clone(), e.meta));
                }
            }
            Node::Symlink(target) => {
                if was != Some(e) {
                    links.push(Op::Link(path.clone(), target.clone(), e.meta));
                }
            }
        }
    }
    // What was under a replaced directory went with it.
    let replaced: Vec<PathBuf> = replace
        .iter()
        .filter_map(|op| match op {
            Op::Replace(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let deletes = old
        .entries
        .keys()
        .rev()
        .filter(|p| !new.entries.contains_key(*p))
        .filter(|p| !replaced.iter().any(|r| p.starts_with(r)))
        .map(|p| Op::Delete(p.clone()));
    let mut ops: Vec<Op> = replace
        .into_iter()
        .chain(dirs)
        .chain(files)
        .chain(links)
        .collect();
    ops.extend(deletes);
    if let Some(root) = new.root.filter(|r| old.root != Some(*r)) {
        ops.push(Op::SetRootMeta(root));
    }
    ops
}

/// Carries out `ops` in the copy at `dest` (a directory the agent made).
pub fn apply(dest: &Path, ops: &[Op]) -> Result<(), MirrorError> {
    for op in ops {
        match op {
            Op::Replace(rel) | Op::Delete(rel) => remove(&dest.join(rel))?,
            Op::MakeDir(rel, meta) => {
                let path = dest.join(rel);
                match std::fs::create_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io("create", &path)(e)),
                }
                set_meta(&path, *meta)?;
            }
            Op::SetMeta(rel, meta) => set_meta(&dest.join(rel), *meta)?,
            Op::SetRootMeta(meta) => set_meta(dest, *meta)?,
            Op::WriteFile(rel, bytes, meta) => {
                let (path, tmp) = temp_beside(dest, rel);
                remove(&tmp)?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&tmp)
                    .map_err(io("create", &tmp))?;
                f.write_all(bytes).map_err(io("write", &tmp))?;
                drop(f);
                set_meta(&tmp, *meta)?;
                std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))?;
            }
            Op::Link(rel, target, meta) => {
                let (path, tmp) = temp_beside(dest, rel);
                remove(&tmp)?;
                std::os::unix::fs::symlink(target, &tmp).map_err(io("create symlink", &tmp))?;
                std::os::unix::fs::lchown(&tmp, Some(meta.uid), Some(meta.gid))
                    .map_err(io("chown", &tmp))?;
                std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))?;
            }
        }
    }
    Ok(())
}

/// `dest/rel` and the temporary name beside it.
fn temp_beside(dest: &Path, rel: &Path) -> (PathBuf, PathBuf) {
    let path = dest.join(rel);
    let tmp = path.with_file_name(TEMP_NAME);
    (path, tmp)
}

/// Owner first: chown clears setuid and setgid bits, which the mode then sets.
fn set_meta(path: &Path, meta: Meta) -> Result<(), MirrorError> {
    std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid)).map_err(io("chown", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode))
        .map_err(io("chmod", path))
}

/// Removes whatever is at `path` (a directory with its contents); nothing there is fine.
fn remove(path: &Path) -> Result<(), MirrorError> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    const LIMIT: u64 = 1 << 20;

    /// kubelet's atomic writer layout: `..<ts>/` with the files, `..data -> ..<ts>`, and
    /// `key -> ..data/key` for each key.
    fn write_version(dir: &Path, ts: &str, files: &[(&str, &str)]) {
        let v = dir.join(ts);
        std::fs::create_dir(&v).unwrap();
        for (k, content) in files {
            std::fs::write(v.join(k), content).unwrap();
        }
        let tmp = dir.join("..data_tmp");
        symlink(ts, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        for (k, _) in files {
            let _ = symlink(format!("..data/{k}"), dir.join(k));
        }
    }

    fn sync(src: &Path, dest: &Path, last: &Tree) -> Tree {
        let now = Tree::read(src, LIMIT).unwrap();
        apply(dest, &diff(last, &now)).unwrap();
        now
    }

    #[test]
    fn the_copy_follows_an_atomic_writer_update_in_its_order() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        write_version(src.path(), "..2026_1", &[("a", "one"), ("b", "bee")]);
        let first = sync(src.path(), dest.path(), &Tree::default());
        assert_eq!(
            std::fs::read_to_string(dest.path().join("a")).unwrap(),
            "one"
        );
        assert_eq!(
            std::fs::read_link(dest.path().join("..data")).unwrap(),
            Path::new("..2026_1")
        );

        // kubelet's update: a new version, ..data swapped, a new key, the old version
        // and a dropped key removed.
        write_version(src.path(), "..2026_2", &[("a", "two"), ("c", "sea")]);
        std::fs::remove_dir_all(src.path().join("..2026_1")).unwrap();
        std::fs::remove_file(src.path().join("b")).unwrap();
        let now = Tree::read(src.path(), LIMIT).unwrap();
        let ops = diff(&first, &now);
        let kinds: Vec<String> = ops
            .iter()
            .map(|op| match op {
                Op::MakeDir(p, _) => format!("mkdir {}", p.display()),
                Op::WriteFile(p, ..) => format!("write {}", p.display()),
                Op::Link(p, ..) => format!("link {}", p.display()),
                Op::Delete(p) => format!("delete {}", p.display()),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "mkdir ..2026_2",
                "write ..2026_2/a",
                "write ..2026_2/c",
                "link ..data",
                "link c",
                "delete b",
                "delete ..2026_1/b",
                "delete ..2026_1/a",
                "delete ..2026_1",
            ]
        );
        apply(dest.path(), &ops).unwrap();
        assert_eq!(Tree::read(dest.path(), LIMIT).unwrap().entries, now.entries);
        assert_eq!(
            std::fs::read_to_string(dest.path().join("a")).unwrap(),
            "two"
        );
        assert!(!dest.path().join(TEMP_NAME).exists());
        // Nothing changed: nothing to do.
        assert!(diff(&now, &Tree::read(src.path(), LIMIT).unwrap()).is_empty());
    }

    #[test]
    fn owners_and_modes_are_kept() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::fs::write(src.path().join("d/secret"), "s").unwrap();
        std::fs::set_permissions(
            src.path().join("d/secret"),
            PermissionsExt::from_mode(0o440),
        )
        .unwrap();
        std::fs::set_permissions(src.path().join("d"), PermissionsExt::from_mode(0o2750)).unwrap();
        std::fs::set_permissions(src.path(), PermissionsExt::from_mode(0o1777)).unwrap();
        sync(src.path(), dest.path(), &Tree::default());
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dest.path().join("d/secret")), 0o440);
        assert_eq!(mode(&dest.path().join("d")), 0o2750);
        assert_eq!(mode(dest.path()), 0o1777);
        let uid = std::fs::metadata(src.path().join("d/secret"))
            .unwrap()
            .uid();
        assert_eq!(
            std::fs::metadata(dest.path().join("d/secret"))
                .unwrap()
                .uid(),
            uid
        );
    }

    #[test]
    fn symlinks_are_copied_never_followed() {
        let src = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("private"), "guest secret").unwrap();
        symlink(outside.path(), src.path().join("escape")).unwrap();
        symlink(outside.path().join("private"), src.path().join("file")).unwrap();
        let tree = Tree::read(src.path(), LIMIT).unwrap();
        assert_eq!(tree.entries.len(), 2, "{tree:?}");
        for e in tree.entries.values() {
            assert!(matches!(e.node, Node::Symlink(_)), "{e:?}");
        }
        // The root itself must not be a symlink either.
        let link = src.path().join("escape");
        assert!(Tree::read(&link, LIMIT).is_err());
    }

    #[test]
    fn a_kind_change_replaces_the_entry_first() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("x")).unwrap();
        std::fs::write(src.path().join("x/in"), "1").unwrap();
        let first = sync(src.path(), dest.path(), &Tree::default());
        std::fs::remove_dir_all(src.path().join("x")).unwrap();
        std::fs::write(src.path().join("x"), "now a file").unwrap();
        let now = Tree::read(src.path(), LIMIT).unwrap();
        let ops = diff(&first, &now);
        assert_eq!(ops[0], Op::Replace(PathBuf::from("x")));
        apply(dest.path(), &ops).unwrap();
        assert_eq!(
            std::fs::read_to_string(dest.path().join("x")).unwrap(),
            "now a file"
        );
    }

    #[test]
    fn a_volume_over_the_cap_is_refused() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("big"), vec![0u8; 4096]).unwrap();
        assert!(matches!(
            Tree::read(src.path(), 4000),
            Err(MirrorError::TooBig { limit: 4000 })
        ));
        // Many small entries count too.
        for i in 0..100 {
            std::fs::write(src.path().join(format!("f{i}")), "").unwrap();
        }
        std::fs::remove_file(src.path().join("big")).unwrap();
        assert!(Tree::read(src.path(), 100 * ENTRY_COST - 1).is_err());
        assert!(Tree::read(src.path(), 100 * ENTRY_COST).is_ok());
    }

    #[test]
    fn many_files_are_copied() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let files: Vec<(String, String)> = (0..50)
            .map(|i| (format!("k{i}"), format!("v{i}")))
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        write_version(src.path(), "..1", &refs);
        sync(src.path(), dest.path(), &Tree::default());
        assert_eq!(
            std::fs::read_to_string(dest.path().join("k49")).unwrap(),
            "v49"
        );
    }
}
