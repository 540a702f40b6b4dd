//! The guest's serial console, kept in a bounded file.
//!
//! A guest (or a container that reaches `/dev/console`) may print without end. The VMM
//! therefore never writes a file of its own: it gets the write end of a pipe, on
//! descriptor [`CONSOLE_FD`], and a thread of the shim reads the other end into
//! `console.log` in the run directory, which never grows beyond [`CONSOLE_LOG_CAP`] (see
//! [`crate::bounded_log`], which every host process's log goes through).
//!
//! The VMM needs no access to the run directory for its console, and the shim keeps the
//! log tail it quotes when a guest fails to boot ([`crate::process::log_tail`] reads the
//! file as before).

use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use slog::Logger;

use crate::Error;

/// The most `console.log` ever holds, in bytes (1 MiB).
pub const CONSOLE_LOG_CAP: u64 = crate::bounded_log::LOG_CAP;
/// The descriptor the VMM finds the console pipe's write end on.
pub const CONSOLE_FD: RawFd = 3;

/// Starts the console reader for `path` (created empty, or emptied) and returns the
/// pipe's write end, to be handed to the VMM on [`CONSOLE_FD`]; drop every copy of it once
/// the VMM is spawned, so that the reader ends with the VMM.
pub fn start(path: &Path, cap: u64, logger: &Logger) -> Result<Arc<OwnedFd>, Error> {
    crate::bounded_log::start(path, cap, "the guest console", logger)
}
