//! The effective configuration: which `configuration.toml` applies (`--config`, then
//! kata-config's lookup order), every key's value, and where each came from: the file,
//! or one of its drop-ins (`config.d/*.toml`, the last that sets a key wins), or the
//! built-in default when none sets the key.
//!
//! kata-config's model keeps only values, so the keys each file sets are read from its raw
//! TOML (kata-config's layers). [`settings`] lists every key of the model; a unit test checks the
//! list against the shipped `configuration.toml`, so a new key cannot be forgotten here.

use std::path::{Path, PathBuf};

use kata_config::{Choice, Config};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Set in this file (the configuration file or a drop-in).
    File(PathBuf),
    /// Left out of the file (or no file): the built-in default.
    Default,
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Default => "default".into(),
        }
    }
}

/// One key of the effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The dotted key, e.g. `hypervisor.qemu.accelerator`.
    pub key: &'static str,
    pub value: toml::Value,
    pub source: Source,
}

/// The configuration file that applies and what it gives.
#[derive(Debug)]
pub struct Effective {
    /// The file, when one was found.
    pub path: Option<PathBuf>,
    /// How it was chosen: `--config`, `$KATA_CONF_FILE` or `lookup order`.
    pub chosen_by: &'static str,
    /// The configuration; the built-in defaults when the file could not be loaded.
    pub config: Config,
    /// Why the file could not be found or loaded.
    pub error: Option<kata_config::Error>,
    /// The file and its drop-ins with their own TOML, in the order they applied (none
    /// when the file could not be loaded).
    layers: Vec<kata_config::Layer>,
}

impl Effective {
    /// Loads `explicit` (from `--config`), else the first file of the lookup order.
    pub fn load(explicit: Option<&Path>) -> Self {
        let (found, chosen_by) = match explicit {
            Some(path) => (Ok(path.to_path_buf()), "--config"),
            None => {
                let found = kata_config::find_config_file();
                let from_env = std::env::var_os(kata_config::CONF_FILE_ENV);
                let by = match &found {
                    Ok(p) if from_env.as_deref() == Some(p.as_os_str()) => "$KATA_CONF_FILE",
                    _ => "lookup order",
                };
                (found, by)
            }
        };
        let path = match found {
            Ok(path) => path,
            Err(e) => return Self::defaults(None, chosen_by, e),
        };
        match Config::load_layers(&path) {
            Ok((config, layers)) => Self {
                path: Some(path),
                chosen_by,
                config,
                error: None,
                layers,
            },
            Err(e) => Self::defaults(Some(path), chosen_by, e),
        }
    }

    fn defaults(path: Option<PathBuf>, chosen_by: &'static str, error: kata_config::Error) -> Self {
        Self {
            path,
            chosen_by,
            config: Config::defaults(),
            error: Some(error),
            layers: Vec::new(),
        }
    }

    /// The drop-ins that applied over the file, in order.
    pub fn drop_ins(&self) -> impl Iterator<Item = &Path> {
        self.layers.iter().skip(1).map(|l| l.path.as_path())
    }

    /// Every key with its value and source.
    pub fn settings(&self) -> Vec<Setting> {
        settings(&self.config)
            .into_iter()
            .map(|(key, value)| Setting {
                key,
                value,
                source: match self.layers.iter().rev().find(|l| is_set(&l.table, key)) {
                    Some(layer) => Source::File(layer.path.clone()),
                    None => Source::Default,
                },
            })
            .collect()
    }
}

/// Whether the dotted `key` is present in `table`.
fn is_set(table: &toml::Table, key: &str) -> bool {
    let mut parts = key.split('.');
    let Some(first) = parts.next() else {
        return false;
    };
    let mut value = table.get(first);
    for part in parts {
        value = value.and_then(|v| v.get(part));
    }
    value.is_some()
}

fn path(p: &Path) -> toml::Value {
    toml::Value::String(p.display().to_string())
}

fn word(w: &str) -> toml::Value {
    toml::Value::String(w.to_string())
}

fn int(n: impl Into<i64>) -> toml::Value {
    toml::Value::Integer(n.into())
}

/// Every key of the model and its effective value, in the file's order.
pub fn settings(c: &Config) -> Vec<(&'static str, toml::Value)> {
    let (q, b) = (&c.hypervisor.qemu, &c.hypervisor.builtin);
    vec![
        ("hypervisor.qemu.path", path(&q.path)),
        ("hypervisor.qemu.kernel", path(&q.kernel)),
        ("hypervisor.qemu.initrd", path(&q.initrd)),
        ("hypervisor.qemu.kernel_params", word(&q.kernel_params)),
        ("hypervisor.qemu.default_vcpus", int(q.default_vcpus)),
        ("hypervisor.qemu.default_memory", int(q.default_memory)),
        ("hypervisor.qemu.default_maxvcpus", int(q.sizing.max_vcpus)),
        (
            "hypervisor.qemu.default_maxmemory",
            int(q.sizing.max_memory),
        ),
        (
            "hypervisor.qemu.pod_vcpus_overhead",
            int(q.sizing.vcpus_overhead),
        ),
        (
            "hypervisor.qemu.pod_memory_overhead",
            int(q.sizing.memory_overhead),
        ),
        (
            "hypervisor.qemu.pod_resize_vcpus",
            int(q.sizing.resize_vcpus),
        ),
        (
            "hypervisor.qemu.pod_resize_memory",
            int(q.sizing.resize_memory),
        ),
        ("hypervisor.qemu.shared_fs", word(q.shared_fs.as_str())),
        (
            "hypervisor.qemu.virtio_fs_daemon",
            path(&q.virtio_fs_daemon),
        ),
        (
            "hypervisor.qemu.virtio_fs_cache",
            word(q.virtio_fs_cache.as_str()),
        ),
        (
            "hypervisor.qemu.virtio_fs_rootfs_cache",
            word(q.virtio_fs_rootfs_cache.as_str()),
        ),
        ("hypervisor.qemu.vsock_backend", path(&q.vsock_backend)),
        ("hypervisor.qemu.accelerator", word(q.accelerator.as_str())),
        (
            "hypervisor.qemu.sandbox_host_processes",
            toml::Value::Boolean(q.host_processes.sandboxed),
        ),
        (
            "hypervisor.qemu.host_uid_start",
            int(q.host_processes.uid_start),
        ),
        (
            "hypervisor.qemu.host_uid_count",
            int(q.host_processes.uid_count),
        ),
        (
            "hypervisor.qemu.block_device_hotplug",
            toml::Value::Boolean(q.block_device_hotplug),
        ),
        ("hypervisor.builtin.path", path(&b.path)),
        ("hypervisor.builtin.kernel", path(&b.kernel)),
        ("hypervisor.builtin.initrd", path(&b.initrd)),
        ("hypervisor.builtin.kernel_params", word(&b.kernel_params)),
        ("hypervisor.builtin.default_vcpus", int(b.default_vcpus)),
        ("hypervisor.builtin.default_memory", int(b.default_memory)),
        (
            "hypervisor.builtin.default_maxvcpus",
            int(b.sizing.max_vcpus),
        ),
        (
            "hypervisor.builtin.default_maxmemory",
            int(b.sizing.max_memory),
        ),
        (
            "hypervisor.builtin.pod_vcpus_overhead",
            int(b.sizing.vcpus_overhead),
        ),
        (
            "hypervisor.builtin.pod_memory_overhead",
            int(b.sizing.memory_overhead),
        ),
        (
            "hypervisor.builtin.virtio_fs_daemon",
            path(&b.virtio_fs_daemon),
        ),
        (
            "hypervisor.builtin.virtio_fs_cache",
            word(b.virtio_fs_cache.as_str()),
        ),
        (
            "hypervisor.builtin.virtio_fs_rootfs_cache",
            word(b.virtio_fs_rootfs_cache.as_str()),
        ),
        (
            "hypervisor.builtin.sandbox_host_processes",
            toml::Value::Boolean(b.host_processes.sandboxed),
        ),
        (
            "hypervisor.builtin.host_uid_start",
            int(b.host_processes.uid_start),
        ),
        (
            "hypervisor.builtin.host_uid_count",
            int(b.host_processes.uid_count),
        ),
        (
            "agent.kata.dial_timeout",
            int(i64::try_from(c.agent.kata.dial_timeout.as_secs()).unwrap_or(i64::MAX)),
        ),
        (
            "agent.kata.debug_console_enabled",
            toml::Value::Boolean(c.agent.kata.debug_console_enabled),
        ),
        (
            "runtime.enable_debug",
            toml::Value::Boolean(c.runtime.enable_debug),
        ),
        (
            "runtime.hypervisor_name",
            word(c.runtime.hypervisor_name.as_str()),
        ),
        ("factory.vm_cache_number", int(c.factory.vm_cache_number)),
        ("factory.vm_cache_dir", path(&c.factory.vm_cache_dir)),
        // Templates are refused when on; what is in effect is always off.
        ("factory.enable_template", toml::Value::Boolean(false)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v.as_table() {
                Some(t) => leaf_keys(t, &key, out),
                None => out.push(key),
            }
        }
    }

    #[test]
    fn settings_cover_every_key_of_the_shipped_configuration() {
        let shipped: toml::Table = toml::from_str(kata_config::SHIPPED_CONFIGURATION).unwrap();
        let mut in_file = Vec::new();
        leaf_keys(&shipped, "", &mut in_file);
        in_file.sort();
        let mut listed: Vec<String> = settings(&Config::defaults())
            .into_iter()
            .map(|(k, _)| k.to_string())
            .collect();
        listed.sort();
        assert_eq!(listed, in_file);
    }

    #[test]
    fn shipped_values_are_the_defaults() {
        let shipped: toml::Table = toml::from_str(kata_config::SHIPPED_CONFIGURATION).unwrap();
        for (key, value) in settings(&Config::defaults()) {
            let mut v = Some(toml::Value::Table(shipped.clone()));
            for part in key.split('.') {
                v = v.and_then(|v| v.get(part).cloned());
            }
            assert_eq!(v, Some(value), "{key}");
        }
    }

    #[test]
    fn keys_in_the_file_come_from_the_file_and_the_rest_are_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("configuration.toml");
        std::fs::write(
            &file,
            "[hypervisor.qemu]\naccelerator = \"tcg\"\ndefault_memory = 256\n[runtime]\nenable_debug = true\n",
        )
        .unwrap();
        let eff = Effective::load(Some(&file));
        assert!(eff.error.is_none(), "{:?}", eff.error);
        assert_eq!(eff.chosen_by, "--config");
        let settings = eff.settings();
        let get = |key: &str| settings.iter().find(|s| s.key == key).unwrap().clone();
        assert_eq!(get("hypervisor.qemu.accelerator").value, word("tcg"));
        assert_eq!(
            get("hypervisor.qemu.accelerator").source,
            Source::File(file.clone())
        );
        assert_eq!(get("hypervisor.qemu.default_memory").value, int(256));
        assert_eq!(
            get("runtime.enable_debug").source,
            Source::File(file.clone())
        );
        assert_eq!(get("hypervisor.qemu.path").source, Source::Default);
        assert_eq!(
            get("hypervisor.builtin.default_memory").source,
            Source::Default
        );
        assert_eq!(get("hypervisor.builtin.default_memory").value, int(512));
        assert_eq!(Source::Default.describe(), "default");
    }

    #[test]
    fn keys_a_drop_in_sets_come_from_the_last_drop_in_setting_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("configuration.toml");
        std::fs::write(
            &file,
            "[hypervisor.qemu]\ndefault_memory = 256\ndefault_vcpus = 2\n",
        )
        .unwrap();
        let d = dir.path().join(kata_config::DROP_IN_DIR);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("10-install.toml"),
            "[hypervisor.qemu]\nkernel = \"/opt/kata/vmlinux\"\ndefault_memory = 300\n",
        )
        .unwrap();
        std::fs::write(
            d.join("50-operator.toml"),
            "[hypervisor.qemu]\ndefault_memory = 384\n",
        )
        .unwrap();
        let eff = Effective::load(Some(&file));
        assert!(eff.error.is_none(), "{:?}", eff.error);
        assert_eq!(
            eff.drop_ins().collect::<Vec<_>>(),
            vec![d.join("10-install.toml"), d.join("50-operator.toml")]
        );
        let settings = eff.settings();
        let get = |key: &str| settings.iter().find(|s| s.key == key).unwrap().clone();
        assert_eq!(get("hypervisor.qemu.default_memory").value, int(384));
        assert_eq!(
            get("hypervisor.qemu.default_memory").source,
            Source::File(d.join("50-operator.toml"))
        );
        assert_eq!(
            get("hypervisor.qemu.kernel").source,
            Source::File(d.join("10-install.toml"))
        );
        assert_eq!(
            get("hypervisor.qemu.default_vcpus").source,
            Source::File(file)
        );
        assert_eq!(get("hypervisor.qemu.path").source, Source::Default);
        // A bad drop-in: the error names it, as a bad file's does.
        std::fs::write(
            d.join("60-bad.toml"),
            "[hypervisor.qemu]\naccelerator = \"fast\"\n",
        )
        .unwrap();
        let eff = Effective::load(Some(&dir.path().join("configuration.toml")));
        let err = eff.error.as_ref().unwrap().to_string();
        assert!(
            err.contains("60-bad.toml") && err.contains("accelerator"),
            "{err}"
        );
    }

    #[test]
    fn an_invalid_file_gives_defaults_and_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("configuration.toml");
        std::fs::write(&file, "[hypervisor.qemu]\naccelerator = \"fast\"\n").unwrap();
        let eff = Effective::load(Some(&file));
        let err = eff.error.as_ref().unwrap().to_string();
        assert!(err.contains("hypervisor.qemu.accelerator"), "{err}");
        assert!(eff.settings().iter().all(|s| s.source == Source::Default));
    }

    #[test]
    fn the_builtin_deploy_configuration_selects_kata_vmm() {
        let text = include_str!("../../deploy/configuration-builtin.toml");
        let config = Config::from_str(text, "deploy/configuration-builtin.toml").unwrap();
        assert_eq!(
            config.runtime.hypervisor_name,
            kata_config::HypervisorName::Builtin
        );
    }
}
