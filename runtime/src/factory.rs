//! `kata-runtime factory init|status|destroy [--config FILE]` (Kata's command): the VM
//! pool's daemon lives in the shim binary, which has the pieces a sandbox's VM is made
//! of; this command runs `containerd-shim-kata-v2 factory ...` in its place (exec: same
//! pid, same signals), the shim found next to kata-runtime, else in PATH.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use crate::containerd::SHIM_BINARY;

/// The shim binary beside this program, else its name for a PATH lookup.
pub fn shim_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(SHIM_BINARY)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(SHIM_BINARY))
}

/// The shim's arguments for `factory` with `rest` (what followed `factory`) and the
/// configuration file given to kata-runtime, if any.
pub fn shim_args(rest: &[String], config: Option<&PathBuf>) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["factory".into()];
    args.extend(rest.iter().map(OsString::from));
    if let Some(c) = config {
        args.push("--config".into());
        args.push(c.into());
    }
    args
}

/// Replaces this process with the shim's factory command; returns only on failure.
pub fn exec(rest: &[String], config: Option<&PathBuf>) -> String {
    let shim = shim_binary();
    let err = std::process::Command::new(&shim)
        .args(shim_args(rest, config))
        .exec();
    format!(
        "cannot run {} (the factory lives in the shim binary; install it next to \
         kata-runtime or in PATH): {err}",
        shim.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pass_through_with_the_configuration_file() {
        let args = shim_args(&["init".into()], Some(&PathBuf::from("/etc/kata/c.toml")));
        assert_eq!(args, ["factory", "init", "--config", "/etc/kata/c.toml"]);
        assert_eq!(shim_args(&["status".into()], None), ["factory", "status"]);
    }
}
