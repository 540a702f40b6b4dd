//! User namespaces (`hostUsers: false`): the container process runs in a user namespace
//! of its own with the spec's `linux.uidMappings`/`gidMappings`, and the mounts that ask
//! for it (`mounts[].uidMappings`, the rootfs when the shim says its snapshot was
//! ID-mapped on the host) are ID-mapped mounts in the guest, so files owned by uid 0 on
//! the share appear owned by the container's root.
//!
//! The namespace is made by a short-lived helper (it unshares, the stage writes its maps
//! as root of the guest, opens `/proc/<helper>/ns/user`, kills it). Every other
//! namespace and mount of the container is still made by the stage as the guest's root;
//! the container process joins the user namespace last, just before it takes its user
//! (see `launch`), so its capabilities hold only inside it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pipe, ForkResult};
use serde::Deserialize;
use serde_json::Value;

use super::StageError;
use crate::spec::{Linux, Mount, Spec};

/// Set by the shim on the spec it sends when the rootfs's snapshot carried `uidmap=`/
/// `gidmap=` (containerd's overlay snapshotter asks for ID-mapped layers): the guest maps
/// the rootfs instead. The shim removes it otherwise.
pub const ROOTFS_IDMAP_ANNOTATION: &str = protocols::ROOTFS_IDMAP_ANNOTATION;

/// One line of an ID map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdMapping {
    #[serde(rename = "containerID")]
    pub container_id: u32,
    #[serde(rename = "hostID")]
    pub host_id: u32,
    pub size: u32,
}

/// The mappings of a container's user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMaps {
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
}

impl IdMaps {
    /// The spec's user namespace: `None` without a `user` namespace entry. An entry
    /// without mappings, or with a mapping the kernel refuses, is an error that names the
    /// field.
    pub fn of_spec(spec: &Spec) -> Result<Option<IdMaps>, StageError> {
        let Some(linux) = &spec.linux else {
            return Ok(None);
        };
        if !linux.namespaces.iter().any(|ns| ns.typ == "user") {
            return Ok(None);
        }
        let maps = IdMaps {
            uids: field(linux, "uidMappings")?,
            gids: field(linux, "gidMappings")?,
        };
        if maps.uids.is_empty() || maps.gids.is_empty() {
            return Err(StageError::bad_field(
                "linux.uidMappings/gidMappings",
                "a user namespace needs both: give the container's uid and gid ranges",
            ));
        }
        Ok(Some(maps))
    }

    /// The mappings a mount asks for (`None`: a plain mount), which must be the
    /// container's own: an ID-mapped mount here is mapped through its user namespace.
    pub fn of_mount(&self, m: &Mount) -> Result<bool, StageError> {
        let uids = mapping_list(m.extra.get("uidMappings"), "mounts[].uidMappings")?;
        let gids = mapping_list(m.extra.get("gidMappings"), "mounts[].gidMappings")?;
        if uids.is_empty() && gids.is_empty() {
            return Ok(false);
        }
        if uids != self.uids || gids != self.gids {
            return Err(StageError::bad_field(
                "mounts[].uidMappings",
                format!(
                    "the mount at {:?} asks for ID mappings other than the container's user \
                     namespace's; only those are supported",
                    m.destination
                ),
            ));
        }
        Ok(true)
    }

    /// Runs `f` with the file system ids of the container's root (the guest ids its uid
    /// and gid 0 map to), so that what it creates on an ID-mapped mount is owned by uid 0
    /// there: the guest's root itself is outside the mapping, and such a create fails
    /// with EOVERFLOW. (The file capabilities dropped meanwhile come back with fsuid 0.)
    pub fn as_container_root<T>(
        &self,
        f: impl FnOnce() -> Result<T, StageError>,
    ) -> Result<T, StageError> {
        let host_root = |maps: &[IdMapping], what: &str| {
            maps.iter()
                .find(|m| m.container_id == 0)
                .map(|m| m.host_id)
                .ok_or_else(|| {
                    StageError::bad_field(what, "maps no container id 0: the rootfs needs a root")
                })
        };
        let uid = host_root(&self.uids, "linux.uidMappings")?;
        let gid = host_root(&self.gids, "linux.gidMappings")?;
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
        let result = f();
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
        result
    }

    /// The `/proc/PID/uid_map` text of `maps`.
    fn text(maps: &[IdMapping]) -> String {
        maps.iter()
            .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size))
            .collect()
    }

    /// A new user namespace with these mappings, as an open `/proc/PID/ns/user`.
    pub fn create(&self) -> Result<File, StageError> {
        let (ready_r, ready_w) = pipe().map_err(|e| StageError::sys("pipe for userns", e))?;
        let (hold_r, hold_w) = pipe().map_err(|e| StageError::sys("pipe for userns", e))?;
        // SAFETY: the stage is single-threaded, so the child may run arbitrary code.
        match unsafe { fork() }.map_err(|e| StageError::sys("fork the userns helper", e))? {
            ForkResult::Child => {
                drop(ready_r);
                drop(hold_w);
                let ok = unshare(CloneFlags::CLONE_NEWUSER).is_ok();
                let mut w = File::from(ready_w);
                let _ = w.write_all(if ok { b"1" } else { b"0" });
                drop(w);
                // Stay until the stage has the namespace (it kills us, or closes hold_w).
                let mut r = File::from(hold_r);
                let _ = r.read(&mut [0u8; 1]);
                std::process::exit(0);
            }
            ForkResult::Parent { child } => {
                drop(ready_w);
                drop(hold_r);
                let result = (|| {
                    let mut byte = [0u8; 1];
                    let n = File::from(ready_r).read(&mut byte).unwrap_or(0);
                    if n != 1 || byte[0] != b'1' {
                        return Err(StageError::Sys {
                            action: "unshare a user namespace (guest kernel without \
                                     CONFIG_USER_NS?)"
                                .into(),
                            source: nix::errno::Errno::EPERM,
                        });
                    }
                    let proc_dir = format!("/proc/{}", child.as_raw());
                    write_map(&proc_dir, "uid_map", &IdMaps::text(&self.uids))?;
                    write_map(&proc_dir, "gid_map", &IdMaps::text(&self.gids))?;
                    let path = format!("{proc_dir}/ns/user");
                    File::open(&path).map_err(|e| StageError::io("open", path, e))
                })();
                drop(hold_w);
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                result
            }
        }
    }
}

fn write_map(proc_dir: &str, name: &str, text: &str) -> Result<(), StageError> {
    let path = format!("{proc_dir}/{name}");
    std::fs::write(&path, text).map_err(|e| {
        StageError::bad_field(
            format!(
                "linux.{}",
                if name == "uid_map" {
                    "uidMappings"
                } else {
                    "gidMappings"
                }
            ),
            format!("the guest kernel refused {text:?} as {path}: {e}"),
        )
    })
}

fn field(linux: &Linux, name: &str) -> Result<Vec<IdMapping>, StageError> {
    mapping_list(linux.extra.get(name), &format!("linux.{name}"))
}

fn mapping_list(v: Option<&Value>, what: &str) -> Result<Vec<IdMapping>, StageError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| StageError::bad_field(what, format!("not a list of ID mappings: {e}"))),
    }
}

/// Mounts `source` (a clone of its tree, recursive with `recursive`) at `target`, ID-mapped
/// through the user namespace `userns`: an inode owned by uid N on `source` is seen as
/// owned by the uid N maps to.
pub fn idmapped_bind(
    source: &Path,
    target: &Path,
    recursive: bool,
    userns: &File,
) -> Result<(), StageError> {
    let what = || {
        format!(
            "ID-mapped bind of {} on {}",
            source.display(),
            target.display()
        )
    };
    let src = cstring(source)?;
    let dst = cstring(target)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `src` is a NUL-terminated string that outlives the call; open_tree reads it
    // and returns a new file descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), flags) };
    if fd < 0 {
        return Err(StageError::sys(what(), nix::errno::Errno::last()));
    }
    let fd = i32::try_from(fd).map_err(|_| StageError::sys(what(), nix::errno::Errno::EBADF))?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let mut at = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        at |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: the path is a static empty C string, `attr` a live mount_attr whose size is
    // passed with it; mount_setattr only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            at,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(StageError::sys(
            format!("{} (the file system must support ID-mapped mounts)", what()),
            nix::errno::Errno::last(),
        ));
    }
    // SAFETY: both paths are NUL-terminated strings that outlive the call; move_mount
    // only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(StageError::sys(what(), nix::errno::Errno::last()));
    }
    Ok(())
}

fn cstring(p: &Path) -> Result<std::ffi::CString, StageError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| StageError::bad_field("mounts", format!("{} has a NUL byte", p.display())))
}

/// Whether `e` is a create the kernel refused because the caller's ids are not mapped
/// on the ID-mapped mount it was made on.
pub fn unmapped_caller(e: &StageError) -> bool {
    match e {
        StageError::Io { source, .. } => source.raw_os_error() == Some(libc::EOVERFLOW),
        StageError::Sys { source, .. } => *source == nix::errno::Errno::EOVERFLOW,
        _ => false,
    }
}

/// Whether the shim asked for the rootfs to be ID-mapped in the guest.
pub fn rootfs_idmapped(spec: &Spec) -> bool {
    spec.annotations
        .get(ROOTFS_IDMAP_ANNOTATION)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(linux: &str) -> Spec {
        let json = format!(
            r#"{{"process":{{"args":["sh"],"cwd":"/"}},"root":{{"path":"/r"}},"linux":{linux}}}"#
        );
        Spec::from_json(json.as_bytes()).expect("a spec of the right shape")
    }

    const MAP: &str = r#"[{"containerID":0,"hostID":1000,"size":100000}]"#;

    #[test]
    fn the_user_namespace_and_its_mappings_come_from_the_spec() {
        assert_eq!(
            IdMaps::of_spec(&spec(r#"{"namespaces":[{"type":"pid"}]}"#)).unwrap(),
            None
        );
        let s = spec(&format!(
            r#"{{"namespaces":[{{"type":"user"}}],"uidMappings":{MAP},"gidMappings":{MAP}}}"#
        ));
        let maps = IdMaps::of_spec(&s).unwrap().expect("a user namespace");
        let one = IdMapping {
            container_id: 0,
            host_id: 1000,
            size: 100000,
        };
        assert_eq!(maps.uids, vec![one]);
        assert_eq!(IdMaps::text(&maps.gids), "0 1000 100000\n");
        // A user namespace without mappings is refused, naming the fields.
        let e = IdMaps::of_spec(&spec(r#"{"namespaces":[{"type":"user"}]}"#)).unwrap_err();
        assert!(e.to_string().contains("uidMappings"), "{e}");
    }

    #[test]
    fn a_mount_is_id_mapped_only_through_the_containers_own_mappings() {
        let s = spec(&format!(
            r#"{{"namespaces":[{{"type":"user"}}],"uidMappings":{MAP},"gidMappings":{MAP}}}"#
        ));
        let maps = IdMaps::of_spec(&s).unwrap().expect("a user namespace");
        let mount = |extra: &str| -> Mount {
            serde_json::from_str(&format!(r#"{{"destination":"/v"{extra}}}"#)).unwrap()
        };
        assert!(!maps.of_mount(&mount("")).unwrap());
        let same = format!(r#","uidMappings":{MAP},"gidMappings":{MAP}"#);
        assert!(maps.of_mount(&mount(&same)).unwrap());
        let other = r#","uidMappings":[{"containerID":0,"hostID":5,"size":1}],"gidMappings":[]"#;
        let e = maps.of_mount(&mount(other)).unwrap_err();
        assert!(e.to_string().contains("\"/v\""), "{e}");
    }
}
