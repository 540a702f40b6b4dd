//! Per-container cgroup v2 directories: `<root>/<container_id>`.
//!
//! The agent creates one cgroup per container, writes the OCI `linux.resources` into it
//! ([`resources`]), freezes and thaws it ([`freezer`]), reads its figures ([`stats`]),
//! watches it for OOM kills ([`oom`]), and kills and removes it at the end. Where no
//! cgroup v2 hierarchy is mounted at the root (the host test mode on a v1 host), cgroups
//! are skipped. This module touches only files under the cgroup root.

pub mod freezer;
pub mod oom;
pub mod resources;
pub mod stats;

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use nix::unistd::Pid;

use crate::error::AgentError;

/// How long a cgroup may take to empty after its processes were killed.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a condition on cgroup files is checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "{field}: the guest kernel has no cgroup file {file} (its controller is not \
         built into the guest kernel or not enabled for containers)"
    )]
    MissingFile { file: String, field: String },
    #[error("{field}: write {value:?} to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        field: String,
        source: std::io::Error,
    },
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid linux.resources: {0}")]
    InvalidResources(String),
    #[error("{} did not {what} within {timeout:?}", path.display())]
    Timeout {
        path: PathBuf,
        what: &'static str,
        timeout: Duration,
    },
}

impl CgroupError {
    /// The agent error for this failure, its message prefixed with `context` (e.g.
    /// "container c1"): bad input is InvalidArgument, a guest kernel without the needed
    /// controller FailedPrecondition, anything else Internal.
    pub fn in_context(self, context: &str) -> AgentError {
        let message = format!("{context}: {self}");
        match &self {
            CgroupError::InvalidResources(_) => AgentError::InvalidArgument(message),
            CgroupError::Write { source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(libc::EINVAL) | Some(libc::ERANGE)
                ) =>
            {
                AgentError::InvalidArgument(message)
            }
            CgroupError::MissingFile { .. } => AgentError::FailedPrecondition(message),
            _ => AgentError::Internal(message),
        }
    }
}

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
            Err(e) if e.kind() != ErrorKind::AlreadyExists => Err(e),
            _ => Ok(dir),
        }
    }
}

/// Writes `value` to the existing cgroup file `dir/file` in one write; `field` names what
/// asked for it (e.g. `linux.resources.memory.limit`) so errors can say so.
pub fn write_file(dir: &Path, file: &str, value: &str, field: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    // Never create: a missing file means the kernel lacks the controller.
    let mut f = match fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(CgroupError::MissingFile {
                file: file.to_string(),
                field: field.to_string(),
            })
        }
        Err(source) => {
            return Err(CgroupError::Write {
                path,
                value: value.to_string(),
                field: field.to_string(),
                source,
            })
        }
    };
    f.write_all(value.as_bytes())
        .map_err(|source| CgroupError::Write {
            path,
            value: value.to_string(),
            field: field.to_string(),
            source,
        })
}

/// Reads `dir/file`; `Ok(None)` if it does not exist.
pub fn read_optional(dir: &Path, file: &str) -> Result<Option<String>, CgroupError> {
    let path = dir.join(file);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read { path, source }),
    }
}

/// The value of `key` in a flat-keyed file such as `cgroup.events` or `memory.events`.
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The pids listed in a cgroup's `cgroup.procs`.
pub fn pids(dir: &Path) -> std::io::Result<Vec<i32>> {
    let text = fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Kills every process in the cgroup (frozen ones too), waits until `cgroup.procs` is
/// empty, and removes the directory. A cgroup that is already gone is not an error.
pub async fn remove(dir: &Path) -> Result<(), CgroupError> {
    if !dir.exists() {
        return Ok(());
    }
    let deadline = Instant::now() + EMPTY_TIMEOUT;
    loop {
        let pids = match pids(dir) {
            Ok(pids) => pids,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()), // removed meanwhile
            Err(source) => {
                return Err(CgroupError::Read {
                    path: dir.join("cgroup.procs"),
                    source,
                })
            }
        };
        if pids.is_empty() {
            break;
        }
        // cgroup.kill (Linux 5.14) also catches processes forked while we kill.
        if write_file(dir, "cgroup.kill", "1", "remove cgroup").is_err() {
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if Instant::now() > deadline {
            return Err(CgroupError::Timeout {
                path: dir.join("cgroup.procs"),
                what: "become empty after SIGKILL",
                timeout: EMPTY_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    // The kernel may still count exiting processes for a moment after they leave
    // cgroup.procs (rmdir says EBUSY).
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(source) if Instant::now() > deadline => {
                return Err(CgroupError::Write {
                    path: dir.to_path_buf(),
                    value: String::new(),
                    field: "rmdir".into(),
                    source,
                })
            }
            Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_values() {
        let events = "low 0\nhigh 2\nmax 7\noom 1\noom_kill 3\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(3));
        assert_eq!(keyed_value(events, "oom"), Some(1));
        assert_eq!(keyed_value(events, "nope"), None);
        assert_eq!(keyed_value("populated 1\nfrozen 0\n", "frozen"), Some(0));
    }

    #[test]
    fn write_file_names_missing_file_and_field() {
        let dir = std::env::temp_dir().join(format!("cg-write-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(dir.join("pids.max"), "").expect("seed");
        write_file(&dir, "pids.max", "5", "linux.resources.pids.limit").expect("write");
        assert_eq!(fs::read_to_string(dir.join("pids.max")).expect("read"), "5");
        let err = write_file(&dir, "memory.max", "1", "linux.resources.memory.limit")
            .expect_err("missing file");
        let text = err.to_string();
        assert!(
            text.contains("memory.max") && text.contains("memory.limit"),
            "{text}"
        );
        assert!(
            !dir.join("memory.max").exists(),
            "must not create cgroup files"
        );
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
