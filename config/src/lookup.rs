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

/// The first configuration file that exists: `$KATA_CONF_FILE`, then
/// [`ETC_CONF_FILE`], then [`DEFAULT_CONF_FILE`].
pub fn find_config_file() -> Result<PathBuf, Error> {
    find_in(std::env::var_os(CONF_FILE_ENV), |p| p.is_file())
}

/// [`find_config_file`] with the environment and the file system passed in, for tests.
pub(crate) fn find_in(
    env: Option<OsString>,
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf, Error> {
    let env = env.filter(|v| !v.is_empty()).map(PathBuf::from);
    let candidates = env.iter().cloned().chain([
        PathBuf::from(ETC_CONF_FILE),
        PathBuf::from(DEFAULT_CONF_FILE),
    ]);
    for candidate in candidates {
        if exists(&candidate) {
            return Ok(candidate);
        }
    }
    let first = match &env {
        Some(p) => format!("${CONF_FILE_ENV} ({})", p.display()),
        None => format!("${CONF_FILE_ENV} (not set)"),
    };
    Err(Error::NotFound {
        searched: vec![first, ETC_CONF_FILE.into(), DEFAULT_CONF_FILE.into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_wins_when_it_exists() {
        let found = find_in(Some("/tmp/my.toml".into()), |_| true).unwrap();
        assert_eq!(found, PathBuf::from("/tmp/my.toml"));
    }

    #[test]
    fn falls_through_to_etc_then_defaults() {
        let found = find_in(Some("/missing.toml".into()), |p| {
            p == Path::new(ETC_CONF_FILE) || p == Path::new(DEFAULT_CONF_FILE)
        })
        .unwrap();
        assert_eq!(found, PathBuf::from(ETC_CONF_FILE));
        let found = find_in(None, |p| p == Path::new(DEFAULT_CONF_FILE)).unwrap();
        assert_eq!(found, PathBuf::from(DEFAULT_CONF_FILE));
    }

    #[test]
    fn empty_env_is_ignored() {
        let found = find_in(Some("".into()), |p| p == Path::new(ETC_CONF_FILE)).unwrap();
        assert_eq!(found, PathBuf::from(ETC_CONF_FILE));
    }

    #[test]
    fn not_found_lists_the_three_places() {
        let err = find_in(Some("/x/c.toml".into()), |_| false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("$KATA_CONF_FILE (/x/c.toml)"), "{msg}");
        assert!(msg.contains(ETC_CONF_FILE), "{msg}");
        assert!(msg.contains(DEFAULT_CONF_FILE), "{msg}");
        let msg = find_in(None, |_| false).unwrap_err().to_string();
        assert!(msg.contains("$KATA_CONF_FILE (not set)"), "{msg}");
    }
}
