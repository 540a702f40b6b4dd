//! How the Task service gets a sandbox: the [`Launcher`] trait, with [`VmLauncher`]
//! loading the configuration containerd's runtime options select and handing it to
//! [`Sandbox::launch`]. Unit tests put a launcher of their own here, handing out
//! sandboxes around a fake agent.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use kata_sandbox::sandbox::Sandbox;
use kata_sandbox::spec::SandboxSpec;
use slog::Logger;

use crate::options::{self, OptionsError};
use kata_sandbox::log::DebugSwitch;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The configuration is wrong: the user must fix a file or an option.
    #[error("{0}")]
    Config(#[from] OptionsError),
    /// The pod cannot be sized, or its VM did not come up.
    #[error(transparent)]
    Sandbox(#[from] kata_sandbox::sandbox::LaunchError),
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
        Ok(Sandbox::launch(id, cfg, spec, log).await?)
    }
}
