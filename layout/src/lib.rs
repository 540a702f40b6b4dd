//! Where the runtime keeps things on the host, named once for the shim, its VM factory,
//! kata-runtime, kata-monitor and the hypervisor crate.
//!
//! ```text
//! /run/vc/sbs/<sandbox>/persist.json        sandbox states (the shim's, for delete)
//! /run/vc/sbs/<sandbox>/shim-monitor.sock   the sandbox's /metrics (kata-monitor scrapes)
//! /run/vc/vm/<vm>/                          a VM's run directory: sockets, logs
//! /run/vc/ids/                              uid claims of sandboxed host processes
//! /run/vc/pool/                             the VM factory's pool (configurable)
//! /run/vc/jail-root                         where a confined process's root is staged
//! /run/kata-containers/shared/sandboxes/<sandbox>/   the share exported over virtio-fs
//! ```
//!
//! Tests may move `sbs` and `vm` (not `ids`, which every sandbox of the host shares)
//! with [`RUN_ROOT_ENV`]; the shim and its factory honour it through [`run_root`].

use std::path::PathBuf;

/// Where the sandbox states (`sbs`) and the VMs' run directories (`vm`) live, as in Kata.
pub const RUN_ROOT: &str = "/run/vc";

/// For tests only: a directory that replaces [`RUN_ROOT`] for the sandbox states and the
/// VMs' run directories (a small tmpfs a test fills without filling the host's
/// `/run/vc`). Never for the uid claims ([`ID_CLAIMS_DIR`]), which every sandbox of the
/// host shares. containerd passes its environment to the shims it starts.
pub const RUN_ROOT_ENV: &str = "KATA_TEST_RUN_VC";

/// The shim's metrics socket in its sandbox's state directory, where Kata's monitor (and
/// ours) looks: `<SANDBOX_STATES>/<sandbox>/shim-monitor.sock`.
pub const METRICS_SOCKET: &str = "shim-monitor.sock";

/// The persisted sandbox states, `<RUN_ROOT>/sbs`.
pub const SANDBOX_STATES: &str = "/run/vc/sbs";
/// The VMs' run directories, `<RUN_ROOT>/vm`.
pub const VM_RUN_DIRS: &str = "/run/vc/vm";
/// The uid claims of sandboxed host processes, one file per claimed uid.
pub const ID_CLAIMS_DIR: &str = "/run/vc/ids";
/// The VM factory's pool of ready VMs, by default (`[factory] vm_cache_dir`).
pub const POOL_DIR: &str = "/run/vc/pool";
/// Where a confined process's minimal root is staged in its own mount namespace.
pub const JAIL_ROOT_STAGE: &str = "/run/vc/jail-root";
/// The sandboxes' shares (`<SHARE_ROOT>/<sandbox>/{mounts,shared}`), exported to the
/// guest over virtio-fs.
pub const SHARE_ROOT: &str = "/run/kata-containers/shared/sandboxes";

/// [`RUN_ROOT`], or `$KATA_TEST_RUN_VC` when set.
pub fn run_root() -> PathBuf {
    std::env::var_os(RUN_ROOT_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(RUN_ROOT), PathBuf::from)
}

/// Root of the persisted sandbox states ([`SANDBOX_STATES`], under [`run_root`]).
pub fn sandbox_state_root() -> PathBuf {
    run_root().join("sbs")
}

/// Root of the VMs' run directories ([`VM_RUN_DIRS`], under [`run_root`]).
pub fn vm_run_root() -> PathBuf {
    run_root().join("vm")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_fixed_paths_are_under_the_run_root() {
        let root = Path::new(RUN_ROOT);
        assert_eq!(Path::new(SANDBOX_STATES), root.join("sbs"));
        assert_eq!(Path::new(VM_RUN_DIRS), root.join("vm"));
        assert_eq!(Path::new(ID_CLAIMS_DIR), root.join("ids"));
        assert_eq!(Path::new(POOL_DIR), root.join("pool"));
        assert_eq!(Path::new(JAIL_ROOT_STAGE), root.join("jail-root"));
    }
}
