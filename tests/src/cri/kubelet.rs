//! kubelet's volume layout, made by hand for a pod the CRI runs: what containerd's CRI
//! then hands the runtime as bind sources (`<root>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`),
//! with a tmpfs for a `medium: Memory` emptyDir and kubelet's atomic writer for
//! ConfigMaps. Its mounts are undone when it is dropped, a failed test's too.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

pub struct FakeKubelet {
    root: PathBuf,
    volumes: PathBuf,
    tmpfs: Vec<PathBuf>,
    version: AtomicU32,
}

impl FakeKubelet {
    /// A kubelet root under `dir` with the volumes directory of pod `uid`.
    pub fn new(dir: &Path, uid: &str) -> FakeKubelet {
        let root = dir.join("kubelet");
        let volumes = root.join("pods").join(uid).join("volumes");
        std::fs::create_dir_all(&volumes).expect("create the pod's volumes dir");
        FakeKubelet {
            root,
            volumes,
            tmpfs: Vec::new(),
            version: AtomicU32::new(0),
        }
    }

    fn plugin_dir(&self, plugin: &str, name: &str) -> PathBuf {
        let dir = self
            .volumes
            .join(format!("kubernetes.io~{plugin}"))
            .join(name);
        std::fs::create_dir_all(&dir).expect("create a volume dir");
        dir
    }

    /// A disk emptyDir with `mode` (kubelet: 0777; with fsGroup, setgid and the group).
    pub fn empty_dir(&self, name: &str, mode: u32, gid: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.plugin_dir("empty-dir", name);
        std::os::unix::fs::chown(&dir, None, Some(gid)).expect("chgrp the emptyDir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .expect("chmod the emptyDir");
        dir
    }

    /// A `medium: Memory` emptyDir: a tmpfs of `size` (tmpfs's `size=`) at its path.
    pub fn memory_empty_dir(&mut self, name: &str, size: &str) -> PathBuf {
        let dir = self.plugin_dir("empty-dir", name);
        let data = format!("size={size},mode=0777");
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", dir.display()));
        self.tmpfs.push(dir.clone());
        dir
    }

    /// A ConfigMap volume holding `files`, written as kubelet's atomic writer does.
    pub fn configmap(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.plugin_dir("configmap", name);
        self.write_configmap(&dir, files);
        dir
    }

    /// kubelet's update of a ConfigMap volume: the files in a new `..<version>` dir,
    /// `..data` swapped to it by rename, new keys' symlinks, then the old version
    /// removed.
    pub fn write_configmap(&self, dir: &Path, files: &[(&str, &str)]) {
        let n = self.version.fetch_add(1, Ordering::SeqCst);
        let version = format!("..2026_11_28_00_00_00.{n}");
        let new = dir.join(&version);
        std::fs::create_dir(&new).expect("create a ConfigMap version dir");
        for (key, content) in files {
            std::fs::write(new.join(key), content).expect("write a ConfigMap key");
        }
        let old = std::fs::read_link(dir.join("..data")).ok();
        let tmp = dir.join("..data_tmp");
        symlink(&version, &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
        for (key, _) in files {
            let link = dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(format!("..data/{key}"), &link).expect("symlink a key");
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).expect("remove the old version");
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for dir in &self.tmpfs {
            let _ = umount2(dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
