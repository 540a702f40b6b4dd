//! `kata-config`: the runtime's `configuration.toml`.
//!
//! Read this first: the file has Kata Containers' shape (`[hypervisor.qemu]`,
//! `[agent.kata]`, `[runtime]`); [`Config::load`] finds it in Kata's lookup order
//! (`$KATA_CONF_FILE`, `/etc/kata-containers/`, `/usr/share/defaults/kata-containers/`),
//! parses it with unknown keys rejected, and checks values with errors that name the file,
//! the key and what is allowed. [`Config::validate_paths`] separately checks that the
//! binaries, kernel and initrd exist. The shipped defaults are `config/configuration.toml`.
//!
//! This crate only reads files; it never touches the rest of the host.

mod choice;
mod error;
mod file;
mod lookup;
mod model;
mod paths;

use std::path::Path;

pub use choice::{Accelerator, Choice, HypervisorName, SharedFs, VirtioFsCache};
pub use error::Error;
pub use file::{DEFAULT_VM_CACHE_DIR, HOST_UID_COUNT, HOST_UID_START, POD_MEMORY_OVERHEAD_MIB};
pub use lookup::{find_config_file, CONF_FILE_ENV, DEFAULT_CONF_FILE, ETC_CONF_FILE};
pub use model::{
    AgentConfig, BuiltinConfig, Config, FactoryConfig, HostProcesses, HypervisorConfig,
    KataAgentConfig, PodSizing, QemuConfig, RuntimeConfig, MAX_BUILTIN_VCPUS, MAX_VCPUS,
    MAX_VM_CACHE_NUMBER, MIN_HOST_UID, MIN_MEMORY_MIB,
};

/// The configuration file shipped with the runtime (installed as [`DEFAULT_CONF_FILE`]).
pub const SHIPPED_CONFIGURATION: &str = include_str!("../configuration.toml");

impl Config {
    /// Finds the configuration file in the lookup order and loads it.
    pub fn load() -> Result<Self, Error> {
        Self::load_from(&find_config_file()?)
    }

    /// Reads and validates the file at `path` (paths inside it are not checked).
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_str(&text, path)
    }

    /// Parses and validates `text`; `origin` names it in error messages.
    pub fn from_str(text: &str, origin: impl AsRef<Path>) -> Result<Self, Error> {
        let origin = origin.as_ref();
        let file: file::File = toml::from_str(text).map_err(|e| Error::Syntax {
            origin: origin.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        Self::from_file(file, origin)
    }

    /// The configuration an empty file gives: every key at its default.
    pub fn defaults() -> Self {
        // The built-in defaults are valid by construction (checked by a unit test).
        match Self::from_file(file::File::default(), Path::new("<defaults>")) {
            Ok(c) => c,
            Err(e) => panic!("built-in defaults are invalid: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
