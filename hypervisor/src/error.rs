//! Errors of starting and stopping a sandbox VM.

use std::io;
use std::path::PathBuf;

/// Why a VM could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One step of the start sequence (a helper daemon or the VMM) failed. The log tail is
    /// what the process itself said about it.
    #[error("starting {step} failed: {reason}; last lines of {}:\n{tail}", log.display())]
    Step {
        /// What was being started, e.g. `virtiofsd` or `qemu`.
        step: &'static str,
        /// What went wrong, as a sentence fragment.
        reason: String,
        /// The process's log file.
        log: PathBuf,
        /// Its last lines (empty if it wrote nothing).
        tail: String,
    },

    /// A file or directory in the sandbox's run directory could not be prepared.
    #[error("cannot prepare {}: {source}", path.display())]
    RunDir {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },

    /// Where the VMM or a helper must start (a cgroup, a network namespace) cannot be
    /// opened.
    #[error("cannot open {what} {}: {source}", path.display())]
    Place {
        /// What it is.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },

    /// The request cannot be served on this host or with these inputs.
    #[error("{0}")]
    Unsupported(String),

    /// The sandbox's host processes cannot be confined as configured.
    #[error(
        "cannot confine the sandbox's host processes: {0}; `kata-runtime check` says what \
         this host lacks, and sandbox_host_processes = false in the hypervisor's section \
         turns the confinement off (the VMM then runs as root)"
    )]
    Containment(String),

    /// A device could not be attached to or detached from the running VM.
    #[error("{action} failed: {reason}")]
    Device {
        /// What was being done, e.g. `attaching block device blk0 (SCSI target 0)`.
        action: String,
        /// What went wrong.
        reason: String,
    },

    /// `start_vm` was called twice on the same backend.
    #[error("the VM is already running (VMM pid {0}); stop it before starting another")]
    AlreadyRunning(i32),

    /// Processes survived SIGTERM and SIGKILL.
    #[error("processes {pids:?} were still running after SIGKILL")]
    Survivors {
        /// The pids still alive.
        pids: Vec<i32>,
    },
}
