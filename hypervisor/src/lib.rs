//! `hypervisor`: runs a sandbox's virtual machine.
//!
//! Read this first. The [`Hypervisor`] trait is the seam between the shim and a VMM
//! backend: `start_vm` brings up the VM with virtio-fs (tag `kataShared`) and a hybrid
//! vsock socket for the agent, `stop_vm` tears everything down, and `pids` lists the
//! processes to clean up after a crash (see [`kill_and_reap`]).
//!
//! [`backend::Vm`] implements the trait once over a [`Backend`] (its run directory's
//! files, its checks, its launch): clean-up of stale files, the uid claim, the undo of a
//! failed start and the stop are the same for both backends. [`kernel_cmdline`] builds
//! the guest's command line for both.
//!
//! Backends: [`qemu`] spawns `qemu-system-x86_64 -M microvm` with `virtiofsd` and
//! the vsock backend (`kata-vsock`) as vhost-user helpers; [`builtin`] spawns the builtin KVM VMM
//! `kata-vmm` (selected by `[runtime] hypervisor_name = "builtin"`) with `virtiofsd` behind
//! its virtio-fs, and refuses a KVM that cannot run guests at full speed.
//! [`console`] keeps the guest's serial console, which the VMM writes to a pipe, in a
//! bounded `console.log` (a thread per running VM). [`accel`] decides between KVM and
//! TCG. [`process`] spawns, stops and waits for helper processes by pid, without relying
//! on `Child::wait` (the shim runs a global SIGCHLD reaper); whether a pid runs and how it
//! ended is `procinfo::pid`'s.
//!
//! This crate touches only the sandbox's run directory, the processes it started, and
//! the accelerator probe cache under `/run/kata-containers/`.

pub mod accel;
pub mod adopted;
pub mod agent_params;
pub mod backend;
pub mod bounded_log;
pub mod builtin;
pub mod console;
mod error;
pub mod jail;
pub mod kernel_cmdline;
pub mod probe;
pub mod process;
pub mod qemu;
/// The visible skip line of this workspace's tests (see `vmm_contract::test_skip`).
#[cfg(any(test, feature = "test-utils"))]
pub use vmm_contract::test_skip;
mod virtiofsd;
mod vm;

pub use backend::{Backend, Vm};
pub use error::Error;
pub use process::kill_and_reap;
pub use vm::{AttachedBlock, Hypervisor, NetDevice, VmConfig, VmInfo};

/// The virtio-fs tag the guest mounts the shared directory by, defined once in `protocols`
/// (the agent mounts by the same constant).
pub use protocols::SHARED_FS_TAG;

/// The backend the configuration selects. `logger` should carry the sandbox id.
pub fn new_hypervisor(cfg: &kata_config::Config, logger: slog::Logger) -> Box<dyn Hypervisor> {
    let (qemu, builtin) = backend_configs(cfg);
    match cfg.runtime.hypervisor_name {
        kata_config::HypervisorName::Qemu => Box::new(Vm::new(qemu::Qemu::new(qemu, logger))),
        kata_config::HypervisorName::Builtin => {
            Box::new(Vm::new(builtin::Builtin::new(builtin, logger)))
        }
    }
}

/// Where the guest finds container `<id>`'s rootfs directory `<id>/rootfs`: on the rootfs
/// share when the configured backend gives the VM one, else on the share.
pub fn guest_rootfs_root(cfg: &kata_config::Config) -> &'static str {
    let rootfs_share = match cfg.runtime.hypervisor_name {
        kata_config::HypervisorName::Qemu => cfg.hypervisor.qemu.rootfs_share(),
        kata_config::HypervisorName::Builtin => cfg.hypervisor.builtin.rootfs_share(),
    };
    if rootfs_share.is_some() {
        protocols::GUEST_ROOTFS_DIR
    } else {
        protocols::GUEST_SHARED_DIR
    }
}

/// The backends' sections with the words `[agent.kata]` asks of the guest kernel command
/// line in front of their `kernel_params` (see [`agent_params`]).
fn backend_configs(
    cfg: &kata_config::Config,
) -> (kata_config::QemuConfig, kata_config::BuiltinConfig) {
    let mut qemu = cfg.hypervisor.qemu.clone();
    qemu.kernel_params = agent_params::with_agent_params(&cfg.agent, &qemu.kernel_params);
    let mut builtin = cfg.hypervisor.builtin.clone();
    builtin.kernel_params = agent_params::with_agent_params(&cfg.agent, &builtin.kernel_params);
    (qemu, builtin)
}

/// A logger that drops everything, for callers that have none.
pub fn discard_logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}
