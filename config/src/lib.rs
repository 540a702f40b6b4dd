//! `kata-config`: the runtime's `configuration.toml`.
//!
//! Read this first: the file has Kata Containers' shape (`[hypervisor.qemu]`,
//! `[agent.kata]`, `[runtime]`); [`Config::load`] finds it in Kata's lookup order
//! (`$KATA_CONF_FILE`, `/etc/kata-containers/`, `/usr/share/defaults/kata-containers/`),
//! parses it with unknown keys rejected, and checks values with errors that name the file,
//! the key and what is allowed. [`Config::validate_paths`] separately checks that the
//! binaries, kernel and initrd exist. The shipped defaults are `config/configuration.toml`.
//! Drop-ins, as Kata reads them: `config.d/*.toml` beside the file, applied over it in name
//! order, each a few keys (an installer's paths, an operator's change); a drop-in with an
//! unknown key or a bad value fails like the file does, naming the drop-in.
//!
//! This crate only reads files; it never touches the rest of the host.

mod choice;
mod error;
mod file;
mod lookup;
mod model;
mod paths;

use std::path::{Path, PathBuf};

pub use choice::{Accelerator, Choice, HypervisorName, SharedFs, VirtioFsCache};
pub use error::Error;
pub use file::{DEFAULT_VM_CACHE_DIR, HOST_UID_COUNT, HOST_UID_START, POD_MEMORY_OVERHEAD_MIB};
pub use lookup::{
    file_name_for_shim, find_config_file, find_config_file_for, CONF_FILE_ENV, CONF_FILE_NAME,
    DEFAULT_CONF_FILE, ETC_CONF_FILE,
};
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

    /// Reads and validates the file at `path` with its drop-ins (`config.d/*.toml` beside
    /// it, in name order); paths inside are not checked.
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        Self::load_layers(path).map(|(config, _)| config)
    }

    /// [`Config::load_from`], also giving each file that made the configuration with its
    /// own TOML: the file first, then its drop-ins in the order they applied.
    pub fn load_layers(path: &Path) -> Result<(Self, Vec<Layer>), Error> {
        let text = read(path)?;
        let mut config = Self::from_str(&text, path)?;
        let mut merged = parse_table(&text, path)?;
        let mut layers = vec![Layer {
            path: path.to_path_buf(),
            table: merged.clone(),
        }];
        for drop_in in drop_ins(path)? {
            let text = read(&drop_in)?;
            // Alone first: an unknown key or a wrong type is reported with its line.
            toml::from_str::<file::File>(&text).map_err(|e| syntax(&drop_in, e))?;
            let table = parse_table(&text, &drop_in)?;
            merge(&mut merged, table.clone());
            let file: file::File = toml::Value::Table(merged.clone())
                .try_into()
                .map_err(|e| syntax(&drop_in, e))?;
            // The values so far were valid: a bad one now is this drop-in's.
            config = Self::from_file(file, &drop_in)?;
            config.origin = path.to_path_buf();
            layers.push(Layer {
                path: drop_in,
                table,
            });
        }
        Ok((config, layers))
    }

    /// Parses and validates `text`; `origin` names it in error messages.
    pub fn from_str(text: &str, origin: impl AsRef<Path>) -> Result<Self, Error> {
        let origin = origin.as_ref();
        let file: file::File = toml::from_str(text).map_err(|e| syntax(origin, e))?;
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

/// The directory of drop-ins beside a configuration file.
pub const DROP_IN_DIR: &str = "config.d";

/// One file of a configuration and the TOML it holds (see [`Config::load_layers`]).
#[derive(Debug, Clone)]
pub struct Layer {
    pub path: PathBuf,
    pub table: toml::Table,
}

/// The drop-ins that apply over the configuration file `path`: the `*.toml` files of
/// [`DROP_IN_DIR`] beside it, in name (byte) order; none when the directory is missing.
pub fn drop_ins(path: &Path) -> Result<Vec<PathBuf>, Error> {
    let dir = path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(DROP_IN_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::Read { path: dir, source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Read {
            path: dir.clone(),
            source,
        })?;
        let p = entry.path();
        // Editors' backups and disabled files (`x.toml.orig`, `.x.toml.swp`) stay out.
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".toml") || p.is_dir() {
            continue;
        }
        found.push(p);
    }
    found.sort();
    Ok(found)
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn syntax(origin: &Path, e: impl std::fmt::Display) -> Error {
    Error::Syntax {
        origin: origin.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    }
}

fn parse_table(text: &str, origin: &Path) -> Result<toml::Table, Error> {
    toml::from_str(text).map_err(|e| syntax(origin, e))
}

/// Lays `over` onto `base`: tables merge key by key, any other value replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests;
