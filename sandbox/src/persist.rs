//! Sandbox state on disk (`/run/vc/sbs/<sandbox-id>/persist.json`, see the `layout` crate): enough for the
//! `delete` action to clean up after a shim that crashed: the VMM and helper pids, the
//! directories the sandbox made, and every mount it holds on the host.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use layout::sandbox_state_root;
/// For the sandbox's create (task/create.rs), which names it here; the host layout is
/// the `layout` crate's.
pub use layout::vm_run_root;

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
    /// The pooled VM the sandbox runs on (issue 30); None: it booted its own.
    #[serde(default)]
    pub pooled: Option<PooledState>,
}

/// A VM the sandbox took from the VM factory's pool: what its clean-up needs beyond a
/// cold start's (the VM's run directory and share are named by the VM's id).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PooledState {
    /// The pooled VM's id (`pool-…`): its run directory `/run/vc/vm/<vm_id>`, its share
    /// and, until the sandbox took it over, its uid claim are named by it.
    pub vm_id: String,
    /// The bind of the pool's network namespace the VM started in, removed at adoption.
    pub netns: PathBuf,
    /// The pool's claimed file of the VM, removed once this state records the VM.
    pub claimed: PathBuf,
}

impl SandboxState {
    /// The id the VM's run directory and share are named by: the pooled VM's, else the
    /// sandbox's.
    pub fn vm_id(&self) -> &str {
        self.pooled
            .as_ref()
            .map_or(self.sandbox_id.as_str(), |p| p.vm_id.as_str())
    }
}

pub fn state_dir(sandbox_id: &str) -> PathBuf {
    sandbox_state_root().join(sandbox_id)
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
        assert_eq!(
            s.vm_id(),
            "abc",
            "a cold sandbox's VM is named by the sandbox"
        );
    }

    #[test]
    fn a_pooled_sandboxs_vm_is_named_by_the_pooled_vm() {
        let text = r#"{"sandbox_id":"abc","shim_pid":7,
            "pooled":{"vm_id":"pool-00112233445566aa","netns":"/run/vc/pool/k/netns/x",
            "claimed":"/run/vc/pool/k/claimed-abc.json"}}"#;
        let s: SandboxState = serde_json::from_str(text).unwrap();
        assert_eq!(s.vm_id(), "pool-00112233445566aa");
    }
}
