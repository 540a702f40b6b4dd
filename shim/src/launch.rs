//! How the Task service gets a sandbox: the [`Launcher`] trait, with [`VmLauncher`]
//! loading the configuration the runtime options select and booting a VM. Unit tests
//! put a launcher of their own here, handing out sandboxes around a fake agent.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use slog::Logger;

use crate::log::DebugSwitch;
use crate::options::{self, OptionsError};
use crate::sandbox::{Sandbox, SandboxError};
use crate::spec::SandboxSpec;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The configuration is wrong: the user must fix a file or an option.
    #[error("{0}")]
    Config(#[from] OptionsError),
    /// The pod's resources cannot be met or read.
    #[error(transparent)]
    Size(#[from] crate::sizing::SizingError),
    /// The VM did not come up.
    #[error(transparent)]
    Boot(#[from] SandboxError),
}

#[async_trait]
pub trait Launcher: Send + Sync {
    /// Boots sandbox `id` with the configuration CreateTask's `options` select.
    async fn launch(
        &self,
        id: &str,
        options: &MessageField<Any>,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Result<Arc<Sandbox>, LaunchError>;
}

/// Boots a VM through the configured hypervisor.
pub struct VmLauncher {
    /// Turned on when the configuration asks for debug logs.
    pub debug: DebugSwitch,
}

#[async_trait]
impl Launcher for VmLauncher {
    async fn launch(
        &self,
        id: &str,
        options: &MessageField<Any>,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Result<Arc<Sandbox>, LaunchError> {
        let cfg = options::load_config(options, crate::start::start_config_path())?;
        self.debug.set(cfg.runtime.enable_debug);
        slog::info!(log, "phase: shim start"; "phase" => "shim start", "elapsed_ms" => 0u64, "container" => id,
            "configuration" => cfg.origin.display());
        let (cfg, size) = crate::sizing::apply(cfg, &spec.resources)?;
        slog::info!(log, "sandbox size: {} vCPUs, {} MiB", size.vcpus, size.memory_mib;
            "vcpus" => size.vcpus, "memory_mib" => size.memory_mib, "why" => &size.why);
        crate::metrics::METRICS.set_vm_size(size.vcpus, size.memory_mib);
        let sandbox = Sandbox::create(id, &cfg, spec, log).await?;
        let mut room = crate::resize::Room::of_config(&cfg);
        if sandbox.pooled() {
            // A pooled VM is the pool's size (this pod's, or it would not have been
            // claimed) and keeps it: the hand-over gives the shim no balloon to work.
            room.resize_vcpus = 0;
            room.resize_memory_mib = 0;
        }
        sandbox.set_room(room);
        Ok(sandbox)
    }
}
