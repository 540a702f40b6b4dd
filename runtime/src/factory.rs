//! `kata-runtime factory init|status|destroy [--config FILE]` (Kata's command): the VM
//! pool's daemon is its own binary, `kata-vm-factory`, on the sandbox library the shim
//! builds its VMs with; this command runs `kata-vm-factory ...` in its place (exec: same
//! pid, same signals), the binary found next to kata-runtime, else in PATH.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use kata_sandbox::pool::FACTORY_BINARY;

/// The factory binary beside this program, else its name for a PATH lookup.
pub fn factory_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(FACTORY_BINARY)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(FACTORY_BINARY))
}

/// The factory's arguments: `rest` (what followed `factory`) and the configuration file
/// given to kata-runtime, if any.
pub fn factory_args(rest: &[String], config: Option<&PathBuf>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    args.extend(rest.iter().map(OsString::from));
    if let Some(c) = config {
        args.push("--config".into());
        args.push(c.into());
    }
    args
}

/// Replaces this process with the factory's command; returns only on failure.
pub fn exec(rest: &[String], config: Option<&PathBuf>) -> String {
    let factory = factory_binary();
    let err = std::process::Command::new(&factory)
        .args(factory_args(rest, config))
        .exec();
    format!(
        "cannot run {} (install {FACTORY_BINARY} next to kata-runtime or in PATH): {err}",
        factory.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pass_through_with_the_configuration_file() {
        let args = factory_args(&["init".into()], Some(&PathBuf::from("/etc/kata/c.toml")));
        assert_eq!(args, ["init", "--config", "/etc/kata/c.toml"]);
        assert_eq!(factory_args(&["status".into()], None), ["status"]);
    }
}
