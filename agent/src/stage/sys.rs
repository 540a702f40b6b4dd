//! The system calls more than one of the stage's steps make, each with its errno turned into
//! a [`StageError`] that says what was asked. A leaf: the steps (`mounts`, `devices`) use
//! it and not each other for it.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::StageError;

/// mount(2), the error naming source, target, type, flags and data.
pub(super) fn do_mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), StageError> {
    mount(source, target, fstype, flags, data).map_err(|errno| StageError::Mount {
        src: source.map(|s| s.display().to_string()).unwrap_or_default(),
        target: target.to_path_buf(),
        fstype: fstype.map(str::to_string),
        flags,
        data: data.map(str::to_string),
        errno,
    })
}
