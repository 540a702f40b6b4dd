//! The pod's shared namespaces in the guest.
//!
//! Under Kubernetes every container of a pod shares the IPC and UTS namespaces of the
//! pod's sandbox (pause) container, and its PID namespace when the pod asks for it. The
//! host names them by host paths (`/proc/<pause pid>/ns/ipc`), which mean nothing in the
//! VM; the shim rewrites such a path to `<GUEST_SANDBOX_NS_DIR>/<type>`, and the agent
//! keeps the sandbox container's namespaces there, bind-mounted, for as long as that
//! container exists. The stage then joins them by path like any other.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::error::AgentError;

/// Where the pod's namespaces live: [`protocols::GUEST_SANDBOX_NS_DIR`] in the guest.
#[derive(Debug, Clone)]
pub struct PodNamespaces {
    dir: PathBuf,
}

impl Default for PodNamespaces {
    fn default() -> Self {
        Self::new(protocols::GUEST_SANDBOX_NS_DIR)
    }
}

impl PodNamespaces {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn path(&self, typ: &str) -> PathBuf {
        self.dir.join(typ)
    }

    /// Makes the namespaces of process `pid` (the sandbox container's init) the pod's.
    /// All or nothing: on failure none stays pinned.
    pub fn pin(&self, pid: i32) -> Result<(), AgentError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| AgentError::Internal(format!("create {}: {e}", self.dir.display())))?;
        self.unpin();
        for typ in protocols::POD_SHARED_NAMESPACES {
            if let Err(e) = bind(&format!("/proc/{pid}/ns/{typ}"), &self.path(typ)) {
                self.unpin();
                return Err(AgentError::Internal(format!(
                    "keep the pod's {typ} namespace (of pid {pid}) for its containers: {e}"
                )));
            }
        }
        Ok(())
    }

    /// Lets the pod's namespaces go (they end with their last process).
    pub fn unpin(&self) {
        for typ in protocols::POD_SHARED_NAMESPACES {
            let path = self.path(typ);
            // Not mounted (never pinned, or pinned by an earlier sandbox container): fine.
            let _ = umount2(&path, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Why a namespace could not be kept.
#[derive(Debug, thiserror::Error)]
enum BindError {
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot bind {source_path} on {}: {source}", path.display())]
    Mount {
        source_path: String,
        path: std::path::PathBuf,
        source: nix::Error,
    },
}

fn bind(source: &str, target: &Path) -> Result<(), BindError> {
    std::fs::File::create(target).map_err(|e| BindError::Create {
        path: target.to_path_buf(),
        source: e,
    })?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| BindError::Mount {
        source_path: source.to_string(),
        path: target.to_path_buf(),
        source: e,
    })
}
