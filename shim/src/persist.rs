//! Sandbox state on disk (`/run/vc/sbs/<sandbox-id>/persist.json`): enough for the
//! `delete` action to clean up after a shim that crashed: the VMM and helper pids, the
//! directories the sandbox made, and every mount it holds on the host.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Root of the persisted sandbox states, as in Kata.
pub const SANDBOX_STATE_ROOT: &str = "/run/vc/sbs";

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct SandboxState {
    pub sandbox_id: String,
    pub shim_pid: u32,
    #[serde(default)]
    pub vmm_pid: i32,
    #[serde(default)]
    pub helper_pids: Vec<i32>,
    /// Directories this sandbox created, removed (deepest first) on cleanup.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
    /// Host mount points this sandbox made, unmounted in reverse order on cleanup.
    #[serde(default)]
    pub mounts: Vec<PathBuf>,
    /// What the sandbox changed in the pod's network namespace (taps, tc redirects,
    /// the port-forward redirect).
    #[serde(default)]
    pub network: Option<crate::network::NetworkState>,
    /// Host cgroup directories the sandbox made, parents first.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

pub fn state_dir(sandbox_id: &str) -> PathBuf {
    Path::new(SANDBOX_STATE_ROOT).join(sandbox_id)
}

pub fn state_file(sandbox_id: &str) -> PathBuf {
    state_dir(sandbox_id).join("persist.json")
}

impl SandboxState {
    /// Writes the state atomically (temp file + rename), so a crash never leaves half a file.
    pub fn save(&self) -> std::io::Result<()> {
        let dir = state_dir(&self.sandbox_id);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join("persist.json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, state_file(&self.sandbox_id))
    }

    pub fn load(sandbox_id: &str) -> std::io::Result<Self> {
        let path = state_file(sandbox_id);
        let text = std::fs::read(&path)?;
        serde_json::from_slice(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    pub fn remove(sandbox_id: &str) -> std::io::Result<()> {
        crate::mount::remove_dir_if_unmounted(&state_dir(sandbox_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_files_without_optional_fields_still_load() {
        let text = r#"{"sandbox_id":"abc","shim_pid":7}"#;
        let s: SandboxState = serde_json::from_str(text).unwrap();
        assert_eq!(s.sandbox_id, "abc");
        assert!(s.mounts.is_empty() && s.helper_pids.is_empty());
    }
}
