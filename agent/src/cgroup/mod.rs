//! Per-container cgroup v2 directories: `<root>/<container_id>`.
//!
//! Used to find and signal every process of a container. Where no cgroup v2 hierarchy
//! is mounted at the root (the host test mode on a v1 host), cgroups are skipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};

#[derive(Debug, Clone)]
pub struct CgroupRoot {
    path: PathBuf,
}

impl CgroupRoot {
    /// The cgroup v2 hierarchy at `path`, if that is what is mounted there.
    pub fn detect(path: &Path) -> Option<CgroupRoot> {
        let fs = statfs(path).ok()?;
        (fs.filesystem_type() == CGROUP2_SUPER_MAGIC).then(|| CgroupRoot {
            path: path.to_path_buf(),
        })
    }

    /// Delegates every available controller to child cgroups.
    pub fn enable_controllers(&self) -> std::io::Result<()> {
        let available = fs::read_to_string(self.path.join("cgroup.controllers"))?;
        for controller in available.split_whitespace() {
            // One at a time: a controller that cannot be enabled must not stop the rest.
            let _ = fs::write(
                self.path.join("cgroup.subtree_control"),
                format!("+{controller}"),
            );
        }
        Ok(())
    }

    pub fn create(&self, container_id: &str) -> std::io::Result<PathBuf> {
        let dir = self.path.join(container_id);
        match fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(dir),
        }
    }
}

/// The pids listed in a cgroup's `cgroup.procs`.
pub fn pids(dir: &Path) -> std::io::Result<Vec<i32>> {
    let text = fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Removes a cgroup, retrying while the kernel still counts exiting processes in it.
pub async fn remove(dir: &Path) -> std::io::Result<()> {
    let mut last = Ok(());
    for _ in 0..50 {
        last = fs::remove_dir(dir);
        match &last {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    last
}
