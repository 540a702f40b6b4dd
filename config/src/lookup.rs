//! Where `configuration.toml` is looked for, in Kata's order.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::Error;

/// Environment variable naming the configuration file to use first.
pub const CONF_FILE_ENV: &str = "KATA_CONF_FILE";
/// The administrator's configuration.
pub const ETC_CONF_FILE: &str = "/etc/kata-containers/configuration.toml";
/// The packaged defaults.
pub const DEFAULT_CONF_FILE: &str = "/usr/share/defaults/kata-containers/configuration.toml";

/// The file of the plain runtime (`io.containerd.kata.v2`).
pub const CONF_FILE_NAME: &str = "configuration.toml";

/// The first configuration file that exists: `$KATA_CONF_FILE`, then
/// [`ETC_CONF_FILE`], then [`DEFAULT_CONF_FILE`].
pub fn find_config_file() -> Result<PathBuf, Error> {
    find_config_file_for(CONF_FILE_NAME, None)
}

/// The configuration file a runtime uses when containerd names none (no `ConfigPath`):
/// `$KATA_CONF_FILE`, else `file_name` in `/etc/kata-containers/`, in the defaults of the
/// install the running binary `exe` belongs to (`<prefix>/share/defaults/kata-containers/`
/// for `<prefix>/bin/<binary>`, as kata-deploy's `/opt/kata`), then in
/// `/usr/share/defaults/kata-containers/`.
pub fn find_config_file_for(file_name: &str, exe: Option<&Path>) -> Result<PathBuf, Error> {
    find_in(std::env::var_os(CONF_FILE_ENV), file_name, exe, |p| {
        p.is_file()
    })
}

/// The configuration file name for a shim binary named `binary`, the way containerd
/// names shims after their runtime type: `containerd-shim-kata-v2` (`io.containerd.kata.v2`)
/// reads `configuration.toml`, `containerd-shim-kata-<flavour>-v2`
/// (`io.containerd.kata-<flavour>.v2`) reads `configuration-<flavour>.toml`. Any other name
/// (a copy, a test binary) reads `configuration.toml`.
pub fn file_name_for_shim(binary: &str) -> String {
    let flavour = binary
        .strip_prefix("containerd-shim-kata-")
        .and_then(|rest| rest.strip_suffix("-v2"))
        .filter(|f| {
            !f.is_empty()
                && f.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        });
    match flavour {
        Some(f) => format!("configuration-{f}.toml"),
        None => CONF_FILE_NAME.to_string(),
    }
}

/// The defaults directory of the install whose binary is `exe` (`<prefix>/bin/<name>`).
fn prefix_defaults_dir(exe: &Path) -> Option<PathBuf> {
    let bin = exe.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    Some(bin.parent()?.join("share/defaults/kata-containers"))
}

/// [`find_config_file_for`] with the environment and the file system passed in, for tests.
pub(crate) fn find_in(
    env: Option<OsString>,
    file_name: &str,
    exe: Option<&Path>,
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf, Error> {
    let env = env.filter(|v| !v.is_empty()).map(PathBuf::from);
    let etc = Path::new(ETC_CONF_FILE).with_file_name(file_name);
    let system = Path::new(DEFAULT_CONF_FILE).with_file_name(file_name);
    let mut candidates: Vec<PathBuf> = env.iter().cloned().collect();
    candidates.push(etc);
    if let Some(own) = exe.and_then(prefix_defaults_dir) {
        let own = own.join(file_name);
        if own != system {
            candidates.push(own);
        }
    }
    candidates.push(system);
    for candidate in &candidates {
        if exists(candidate) {
            return Ok(candidate.clone());
        }
    }
    let mut searched: Vec<String> = candidates
        .iter()
        .skip(usize::from(env.is_some()))
        .map(|p| p.display().to_string())
        .collect();
    let first = match &env {
        Some(p) => format!("${CONF_FILE_ENV} ({})", p.display()),
        None => format!("${CONF_FILE_ENV} (not set)"),
    };
    searched.insert(0, first);
    Err(Error::NotFound { searched })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_wins_when_it_exists() {
        let found = find_in(Some("/tmp/my.toml".into()), CONF_FILE_NAME, None, |_| true).unwrap();
        assert_eq!(found, PathBuf::from("/tmp/my.toml"));
    }

    #[test]
    fn falls_through_to_etc_then_defaults() {
        let found = find_in(Some("/missing.toml".into()), CONF_FILE_NAME, None, |p| {
            p == Path::new(ETC_CONF_FILE) || p == Path::new(DEFAULT_CONF_FILE)
        })
        .unwrap();
        assert_eq!(found, PathBuf::from(ETC_CONF_FILE));
        let found = find_in(None, CONF_FILE_NAME, None, |p| {
            p == Path::new(DEFAULT_CONF_FILE)
        })
        .unwrap();
        assert_eq!(found, PathBuf::from(DEFAULT_CONF_FILE));
    }

    #[test]
    fn empty_env_is_ignored() {
        let found = find_in(Some("".into()), CONF_FILE_NAME, None, |p| {
            p == Path::new(ETC_CONF_FILE)
        })
        .unwrap();
        assert_eq!(found, PathBuf::from(ETC_CONF_FILE));
    }

    #[test]
    fn not_found_lists_the_three_places() {
        let err = find_in(Some("/x/c.toml".into()), CONF_FILE_NAME, None, |_| false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("$KATA_CONF_FILE (/x/c.toml)"), "{msg}");
        assert!(msg.contains(ETC_CONF_FILE), "{msg}");
        assert!(msg.contains(DEFAULT_CONF_FILE), "{msg}");
        let msg = find_in(None, CONF_FILE_NAME, None, |_| false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("$KATA_CONF_FILE (not set)"), "{msg}");
    }

    #[test]
    fn a_shims_name_picks_its_file() {
        assert_eq!(
            file_name_for_shim("containerd-shim-kata-v2"),
            "configuration.toml"
        );
        assert_eq!(
            file_name_for_shim("containerd-shim-kata-builtin-v2"),
            "configuration-builtin.toml"
        );
        assert_eq!(
            file_name_for_shim("containerd-shim-kata-qemu-tcg-v2"),
            "configuration-qemu-tcg.toml"
        );
        for other in [
            "containerd-shim-kata--v2",
            "shim",
            "containerd-shim-kata-A.B-v2",
        ] {
            assert_eq!(file_name_for_shim(other), "configuration.toml", "{other}");
        }
    }

    #[test]
    fn an_install_under_a_prefix_finds_its_own_defaults_before_the_systems() {
        let exe = Path::new("/opt/kata/bin/containerd-shim-kata-builtin-v2");
        let own = Path::new("/opt/kata/share/defaults/kata-containers/configuration-builtin.toml");
        let system = Path::new("/usr/share/defaults/kata-containers/configuration-builtin.toml");
        let etc = Path::new("/etc/kata-containers/configuration-builtin.toml");
        let name = "configuration-builtin.toml";
        let found = |have: &[&Path]| find_in(None, name, Some(exe), |p| have.contains(&p));
        assert_eq!(found(&[own, system]).unwrap(), own);
        assert_eq!(found(&[system]).unwrap(), system);
        assert_eq!(found(&[etc, own]).unwrap(), etc);
        // $KATA_CONF_FILE still comes first.
        let env = find_in(Some("/x.toml".into()), name, Some(exe), |_| true).unwrap();
        assert_eq!(env, Path::new("/x.toml"));
        let msg = found(&[]).unwrap_err().to_string();
        for place in [etc, own, system] {
            assert!(msg.contains(&place.display().to_string()), "{msg}");
        }
        // A binary not in a bin/ directory has no install of its own.
        let loose = find_in(None, name, Some(Path::new("/tmp/x/shim")), |_| false)
            .unwrap_err()
            .to_string();
        assert!(!loose.contains("/tmp"), "{loose}");
    }
}
