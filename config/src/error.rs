//! Errors of loading and validating `configuration.toml`.
//!
//! Every message starts with the file it is about, names the key and says what is allowed,
//! so an operator can fix the file without reading the code.

use std::io;
use std::path::PathBuf;

/// Why a configuration could not be loaded or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// None of the places in the lookup order holds a file.
    #[error("no configuration file found; looked for {}", searched.join(", then "))]
    NotFound {
        /// The places looked at, in order, as shown to the user.
        searched: Vec<String>,
    },

    /// The file exists but could not be read.
    #[error("{}: cannot read the configuration file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },

    /// The text is not TOML, has an unknown key or a value of the wrong type.
    #[error("{}: {message}", origin.display())]
    Syntax {
        /// The file (or test origin) the text came from.
        origin: PathBuf,
        /// The `toml` crate's message, with line and column.
        message: String,
    },

    /// A key has a value of the right type that is not allowed.
    #[error("{}: {key} = {value}: {expected}", origin.display())]
    Invalid {
        /// The file (or test origin) the text came from.
        origin: PathBuf,
        /// The dotted key, e.g. `hypervisor.qemu.accelerator`.
        key: &'static str,
        /// The value as written in TOML, e.g. `"foo"` or `0`.
        value: String,
        /// What is allowed, e.g. `expected one of auto, kvm, tcg`.
        expected: String,
    },

    /// A key names a file that is missing or unusable on this host.
    #[error("{}: {key} = \"{}\": {problem}", origin.display(), path.display())]
    Path {
        /// The file (or test origin) the text came from.
        origin: PathBuf,
        /// The dotted key, e.g. `hypervisor.qemu.kernel`.
        key: &'static str,
        /// The path the key holds.
        path: PathBuf,
        /// What is wrong with it, as a sentence fragment.
        problem: String,
    },
}
