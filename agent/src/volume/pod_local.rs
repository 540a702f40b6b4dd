//! The pod's emptyDir volumes in the guest: one directory per (pod, volume) under
//! [`protocols::GUEST_POD_VOLUMES_DIR`], made at the first container that mounts it and
//! kept while the VM lives (kubelet keeps an emptyDir across container restarts), a tmpfs
//! of its own for `medium: Memory`.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use protocols::agent::PodLocalVolume;

use crate::error::{AgentError, Result};

pub struct PodVolumes {
    root: PathBuf,
    /// The volumes made so far (their directories).
    made: Mutex<HashSet<PathBuf>>,
}

impl Default for PodVolumes {
    fn default() -> PodVolumes {
        PodVolumes::at(Path::new(protocols::GUEST_POD_VOLUMES_DIR))
    }
}

/// `name` is one plain path component.
fn one_component(what: &str, name: &str) -> Result<()> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) if !name.contains('/') => Ok(()),
        _ => Err(AgentError::InvalidArgument(format!(
            "pod volume {what} {name:?} must be one path component"
        ))),
    }
}

impl PodVolumes {
    pub fn at(root: &Path) -> PodVolumes {
        PodVolumes {
            root: root.to_path_buf(),
            made: Mutex::new(HashSet::new()),
        }
    }

    /// The volume's directory, made (and mounted) at its first use.
    pub fn ensure(&self, v: &PodLocalVolume) -> Result<PathBuf> {
        one_component("pod uid", &v.pod_uid)?;
        one_component("name", &v.name)?;
        let dir = self.root.join(&v.pod_uid).join(&v.name);
        let mut made = self
            .made
            .lock()
            .map_err(|_| AgentError::Internal("pod volumes lock poisoned".into()))?;
        if made.contains(&dir) {
            return Ok(dir);
        }
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            AgentError::Internal(format!(
                "{what} pod volume {} ({}): {e}",
                v.name,
                dir.display()
            ))
        };
        std::fs::create_dir_all(&dir).map_err(|e| fail("create", &e))?;
        if v.memory {
            let mut data = format!("mode={:o},uid={},gid={}", v.mode & 0o7777, v.uid, v.gid);
            if v.size_bytes > 0 {
                data.push_str(&format!(",size={}", v.size_bytes));
            }
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
            mount(
                Some("tmpfs"),
                &dir,
                Some("tmpfs"),
                flags,
                Some(data.as_str()),
            )
            .map_err(|e| fail("mount tmpfs for", &e))?;
        } else {
            std::os::unix::fs::chown(&dir, Some(v.uid), Some(v.gid))
                .map_err(|e| fail("chown", &e))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(v.mode & 0o7777))
                .map_err(|e| fail("chmod", &e))?;
        }
        made.insert(dir.clone());
        Ok(dir)
    }

    /// Unmounts and removes every volume (an agent that exits; a guest's reset needs
    /// none of it).
    pub fn release(&self) {
        let Ok(mut made) = self.made.lock() else {
            return;
        };
        for dir in made.drain() {
            let _ = umount2(&dir, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn volume(uid: &str, name: &str) -> PodLocalVolume {
        PodLocalVolume {
            pod_uid: uid.into(),
            name: name.into(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            mode: 0o2777,
            ..Default::default()
        }
    }

    #[test]
    fn a_disk_volume_is_one_directory_with_kubelets_owner_and_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let vols = PodVolumes::at(tmp.path());
        let dir = vols.ensure(&volume("u1", "cache")).unwrap();
        assert_eq!(dir, tmp.path().join("u1/cache"));
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o2777);
        std::fs::write(dir.join("kept"), "x").unwrap();
        // The pod's next container (or a restart) finds it as it was.
        assert_eq!(vols.ensure(&volume("u1", "cache")).unwrap(), dir);
        assert!(dir.join("kept").exists());
        vols.release();
        assert!(!dir.exists());
    }

    #[test]
    fn names_that_leave_the_pods_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let vols = PodVolumes::at(tmp.path());
        for (uid, name) in [
            ("..", "x"),
            ("u1", ".."),
            ("u1", "a/b"),
            ("", "x"),
            ("u1", "."),
            ("/", "x"),
        ] {
            let err = vols.ensure(&volume(uid, name)).unwrap_err().to_string();
            assert!(
                err.contains("one path component"),
                "{uid:?} {name:?}: {err}"
            );
        }
    }
}
