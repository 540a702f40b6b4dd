//! How a step of the container stage fails.
//!
//! The stage reports an error to the agent as text over the sync socket (see
//! [`super::protocol`]); [`StageError::is_invalid_spec`] decides whether the agent answers
//! INVALID_ARGUMENT (the spec or the image must change) or FAILED_PRECONDITION.

use std::path::PathBuf;

use nix::errno::Errno;
use nix::mount::MsFlags;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    // The spec asks for what the container's rootfs does not have.
    #[error(
        "process.user.username {name:?} cannot be resolved: the container's rootfs has no \
         {}; give a numeric process.user.uid instead",
        path.display()
    )]
    NoPasswdFile { name: String, path: PathBuf },
    #[error(
        "process.user.username {name:?} is not in the container's {}: add the user to the \
         image or give a numeric process.user.uid",
        path.display()
    )]
    UnknownUser { name: String, path: PathBuf },
    #[error(
        "process.user.username {name:?} is uid {uid} in the container's /etc/passwd but \
         process.user.uid is {spec_uid}: give one or make them agree"
    )]
    UserMismatch {
        name: String,
        uid: u32,
        spec_uid: u32,
    },
    #[error("process.cwd {cwd:?}: not a directory in the container's rootfs: choose a directory")]
    CwdNotDirectory { cwd: String },
    #[error(
        "process.cwd {cwd:?}: no such file or directory in the container's rootfs: create it \
         in the image or choose an existing directory"
    )]
    CwdMissing { cwd: String },
    #[error(
        "process.args[0] {arg0:?}: {problem} in the container's rootfs (PATH={path_env}): fix \
         the command or add it to the image"
    )]
    CommandMissing {
        arg0: String,
        problem: &'static str,
        path_env: String,
    },

    // A spec field the stage cannot act on.
    #[error("the OCI spec has no {0}: the shim must send one")]
    MissingField(&'static str),
    #[error(
        "unknown capability {name:?} in process.capabilities.{set}: use a name such as CAP_CHOWN"
    )]
    UnknownCapability { set: &'static str, name: String },
    #[error("unknown rlimit type {typ:?} in process.rlimits: use a name such as RLIMIT_NOFILE")]
    UnknownRlimit { typ: String },
    #[error(
        "rlimit {typ}: soft limit {soft} is above the hard limit {hard}: lower the soft limit"
    )]
    RlimitSoftAboveHard { typ: String, soft: u64, hard: u64 },
    #[error(
        "invalid sysctl name {key:?} in linux.sysctl: use a dotted name such as kernel.msgmax"
    )]
    SysctlName { key: String },
    #[error("sysctl {key:?} is not allowed in a container: {why}")]
    SysctlNotAllowed { key: String, why: &'static str },
    #[error("unknown namespace type {0:?} in linux.namespaces")]
    UnknownNamespace(String),
    /// A field of `linux.seccomp`, `linux.devices` or `mounts` with a value the stage
    /// cannot use; `problem` says what is wrong and what is expected.
    #[error("{field}: {problem}")]
    BadField { field: String, problem: String },
    #[error("{value:?} contains a NUL byte: remove it from the process's args or env")]
    NulByte { value: String },

    // The guest refused a step.
    #[error("failed to {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {action}: {source}")]
    Os {
        action: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {action}: {}", source.desc())]
    Sys {
        action: String,
        #[source]
        source: Errno,
    },
    #[error(
        "failed to mount {src:?} on {} (type {}, flags {flags:?}, data {data:?}): {}",
        target.display(),
        fstype.as_deref().unwrap_or("none"),
        errno.desc()
    )]
    Mount {
        src: String,
        target: PathBuf,
        fstype: Option<String>,
        flags: MsFlags,
        data: Option<String>,
        #[source]
        errno: Errno,
    },
    #[error(
        "bind mount source {src:?} for {destination} is not usable in the guest: {source}: \
         share the directory with the sandbox or fix the mount's source"
    )]
    BindSource {
        src: String,
        destination: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} resolves to {}, outside the rootfs {}: the image has a symlink that escapes it",
        resolved.display(),
        real.display(),
        root.display()
    )]
    OutsideRootfs {
        resolved: PathBuf,
        real: PathBuf,
        root: PathBuf,
    },
    #[error("resolve {path:?} in rootfs {}: too many levels of symbolic links", root.display())]
    SymlinkLoop { path: String, root: PathBuf },
    #[error("the process has a terminal but its stdin is {}, not a pty", stdin.display())]
    NoPty { stdin: PathBuf },
    #[error("failed to {action}: {source}")]
    Capabilities {
        action: String,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("failed to {action}: {source}")]
    Seccomp {
        action: String,
        #[source]
        source: libseccomp::error::SeccompError,
    },
    #[error("failed to read the stage config from the agent: {0}")]
    Config(#[source] serde_json::Error),
    #[error("exec {arg0:?}: {}", errno.desc())]
    Exec { arg0: String, errno: Errno },
    #[error("the container process returned without exec")]
    ReturnedWithoutExec,
}

impl StageError {
    /// Whether the spec (or the image) must change, rather than the guest: reported to
    /// the caller as INVALID_ARGUMENT.
    pub fn is_invalid_spec(&self) -> bool {
        matches!(
            self,
            StageError::NoPasswdFile { .. }
                | StageError::UnknownUser { .. }
                | StageError::UserMismatch { .. }
                | StageError::CwdNotDirectory { .. }
                | StageError::CwdMissing { .. }
                | StageError::CommandMissing { .. }
        )
    }

    /// A failed system call, with what it was for.
    pub fn sys(action: impl Into<String>, source: Errno) -> StageError {
        StageError::Sys {
            action: action.into(),
            source,
        }
    }

    /// A failed file operation on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StageError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// A spec field with a value the stage cannot use.
    pub fn bad_field(field: impl Into<String>, problem: impl Into<String>) -> StageError {
        StageError::BadField {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
