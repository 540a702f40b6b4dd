//! Which configuration file a sandbox uses.
//!
//! Lookup order, first found wins:
//! 1. the runtime options: containerd's `runtimeoptions.v1.Options` with `ConfigPath`, set
//!    by a runtime entry's `options.ConfigPath` (one RuntimeClass per configuration file)
//!    or by `ctr run --runtime-config-path FILE`; CreateTask carries them, and so does
//!    `start`'s stdin (see `start`), for a CreateTask without any;
//! 2. `$KATA_CONF_FILE`;
//! 3. the file of the runtime containerd started, named by the shim's own name as
//!    containerd runs it (`containerd-shim-kata-v2`: `configuration.toml`;
//!    `containerd-shim-kata-<flavour>-v2`, runtime type `io.containerd.kata-<flavour>.v2`:
//!    `configuration-<flavour>.toml`), in `/etc/kata-containers/`, then in the defaults of
//!    the install the binary belongs to (`<prefix>/share/defaults/kata-containers/`), then
//!    in `/usr/share/defaults/kata-containers/`.
//!
//! So a runtime entry needs no `options` table to have a configuration of its own, and
//! without one containerd 2.3+ can create user-namespaced containers (see
//! `start::user_namespaces_work`).
//!
//! A file named by the options must exist: a typo there is an error, not a silent
//! fall-back to the defaults.

use std::path::PathBuf;

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};
use protocols::runtimeoptions::Options;

/// The message name containerd gives its runtime options (with or without a URL prefix).
pub const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("the runtime options ({type_url}) cannot be decoded: {reason}")]
    Decode { type_url: String, reason: String },
    #[error("{0}")]
    Config(#[from] kata_config::Error),
    #[error("the configuration file {path} named by the runtime options (ConfigPath) cannot be read: {source}; fix `ConfigPath` in the runtime entry of containerd's config (or `ctr run --runtime-config-path`)")]
    ConfigPath {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The `ConfigPath` in CreateTask's options, if they are containerd's runtime options and
/// name one. Options of another type (runc's, say) name no configuration and are ignored.
pub fn config_path(options: &MessageField<Any>) -> Result<Option<PathBuf>, OptionsError> {
    match options.as_ref() {
        Some(any) => config_path_of(any),
        None => Ok(None),
    }
}

/// The `ConfigPath` in runtime options `any`, as [`config_path`].
pub fn config_path_of(any: &Any) -> Result<Option<PathBuf>, OptionsError> {
    if !any.type_url.ends_with(RUNTIME_OPTIONS_TYPE) {
        return Ok(None);
    }
    let opts = Options::parse_from_bytes(&any.value).map_err(|e| OptionsError::Decode {
        type_url: any.type_url.clone(),
        reason: e.to_string(),
    })?;
    let path = opts.config_path.trim();
    Ok((!path.is_empty()).then(|| PathBuf::from(path)))
}

/// Loads the configuration the lookup order selects, with its paths checked.
/// `start_path` is the `ConfigPath` that came at `start`, for options without one.
pub fn load_config(
    options: &MessageField<Any>,
    start_path: Option<PathBuf>,
) -> Result<kata_config::Config, OptionsError> {
    let cfg = match config_path(options)?.or(start_path) {
        Some(path) => {
            if let Err(source) = std::fs::metadata(&path) {
                return Err(OptionsError::ConfigPath { path, source });
            }
            kata_config::Config::load_from(&path)?
        }
        None => kata_config::Config::load_from(&kata_config::find_config_file_for(
            &own_file_name(),
            std::env::current_exe().ok().as_deref(),
        )?)?,
    };
    cfg.validate_paths()?;
    Ok(cfg)
}

/// The configuration file name this shim's name selects (as containerd ran it: `argv[0]`).
pub fn own_file_name() -> String {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    kata_config::file_name_for_shim(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, config_path: &str) -> MessageField<Any> {
        let opts = Options {
            config_path: config_path.into(),
            ..Default::default()
        };
        MessageField::some(Any {
            type_url: type_url.into(),
            value: opts.write_to_bytes().unwrap(),
            ..Default::default()
        })
    }

    #[test]
    fn config_path_is_read_from_containerds_runtime_options() {
        let p = config_path(&any("runtimeoptions.v1.Options", "/etc/kata/a.toml")).unwrap();
        assert_eq!(p, Some(PathBuf::from("/etc/kata/a.toml")));
        let prefixed = any("type.googleapis.com/runtimeoptions.v1.Options", "/b.toml");
        assert_eq!(
            config_path(&prefixed).unwrap(),
            Some(PathBuf::from("/b.toml"))
        );
    }

    #[test]
    fn no_options_other_options_or_an_empty_path_select_nothing() {
        assert_eq!(config_path(&MessageField::none()).unwrap(), None);
        assert_eq!(
            config_path(&any("containerd.runc.v1.Options", "/x.toml")).unwrap(),
            None
        );
        assert_eq!(
            config_path(&any("runtimeoptions.v1.Options", "")).unwrap(),
            None
        );
    }

    #[test]
    fn garbage_options_are_an_error_naming_the_type() {
        let bad = MessageField::some(Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: vec![0x12, 0x05, b'a'],
            ..Default::default()
        });
        let err = config_path(&bad).unwrap_err().to_string();
        assert!(err.contains("runtimeoptions.v1.Options"), "{err}");
    }

    #[test]
    fn a_missing_config_path_is_an_error_not_the_defaults() {
        let err = load_config(
            &any("runtimeoptions.v1.Options", "/nonexistent/kata.toml"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/kata.toml"), "{err}");
        assert!(err.contains("ConfigPath"), "{err}");
    }

    #[test]
    fn the_config_path_from_start_serves_a_create_without_one() {
        let start = Some(PathBuf::from("/nonexistent/start.toml"));
        let err = load_config(&MessageField::none(), start.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/start.toml"), "{err}");
        let own = any("runtimeoptions.v1.Options", "/nonexistent/create.toml");
        let err = load_config(&own, start).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/create.toml"), "{err}");
    }

    #[test]
    fn a_bad_value_in_the_named_file_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lots.toml");
        std::fs::write(&file, "[hypervisor.qemu]\ndefault_memory = \"lots\"\n").unwrap();
        let err = load_config(
            &any("runtimeoptions.v1.Options", file.to_str().unwrap()),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(file.to_str().unwrap()), "{err}");
        assert!(err.contains("default_memory"), "{err}");
    }
}
