//! The runtime configuration (`configuration.toml`) a test's containerd hands to the shim
//! through `KATA_CONF_FILE`: our kernel, initrd and binaries with debug logs, plus whatever
//! keys a test sets on top (absurd sizes, paths pointing nowhere, unknown keys).

use crate::env;

/// The VMM backend a test's runtime configuration selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// QEMU microvm (the default).
    Qemu,
    /// kata-vmm, from `KATA_TEST_SHIM_DIR`; the agent gets `dial_timeout` seconds.
    Builtin { dial_timeout: u32 },
}

/// A `configuration.toml`, section by section, in the order it is written.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    sections: Vec<(String, Vec<(String, String)>)>,
}

/// The pool directory of `KATA_TEST_POOL_DIR`, when set (and not empty).
pub fn pool_dir() -> Option<String> {
    std::env::var("KATA_TEST_POOL_DIR")
        .ok()
        .filter(|d| !d.is_empty())
}

/// `s` as a TOML basic string.
pub fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

impl RuntimeConfig {
    /// What every test runs with for `backend`.
    pub fn for_backend(backend: Backend) -> Self {
        let (kernel, initrd, bin) = (
            env("KATA_TEST_KERNEL"),
            env("KATA_TEST_INITRD"),
            env("KATA_TEST_SHIM_DIR"),
        );
        let mut config = RuntimeConfig {
            sections: Vec::new(),
        }
        .set("runtime", "enable_debug", "true");
        // `KATA_TEST_POOL_DIR=DIR`: every sandbox looks for a pooled VM there first, so a
        // suite run once against a running factory (`kata-runtime factory init` with the
        // same configuration) starts its sandboxes from the pool.
        if let Some(dir) = pool_dir() {
            config = config.set("factory", "vm_cache_number", "2").set(
                "factory",
                "vm_cache_dir",
                &toml_str(&dir),
            );
        }
        match backend {
            Backend::Qemu => config
                .set("hypervisor.qemu", "kernel", &toml_str(&kernel))
                .set("hypervisor.qemu", "initrd", &toml_str(&initrd))
                .set(
                    "hypervisor.qemu",
                    "vsock_backend",
                    &toml_str(&format!("{bin}/kata-vsock")),
                ),
            Backend::Builtin { dial_timeout } => config
                .set("runtime", "hypervisor_name", "\"builtin\"")
                .set(
                    "hypervisor.builtin",
                    "path",
                    &toml_str(&format!("{bin}/kata-vmm")),
                )
                .set("hypervisor.builtin", "kernel", &toml_str(&kernel))
                .set("hypervisor.builtin", "initrd", &toml_str(&initrd))
                .set("agent.kata", "dial_timeout", &dial_timeout.to_string()),
        }
    }

    /// The QEMU configuration every test runs with.
    pub fn qemu() -> Self {
        Self::for_backend(Backend::Qemu)
    }

    /// Sets `key` in `[section]` to `value`, a TOML value written as is (quote strings
    /// with [`toml_str`]); replaces the key if it is there.
    pub fn set(mut self, section: &str, key: &str, value: &str) -> Self {
        let index = match self.sections.iter().position(|(s, _)| s == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let keys = &mut self.sections[index].1;
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_string(),
            None => keys.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        for (section, keys) in &self.sections {
            text.push_str(&format!("[{section}]\n"));
            for (key, value) in keys {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_or_adds_keys_within_their_section() {
        let text = RuntimeConfig {
            sections: Vec::new(),
        }
        .set("a", "x", "1")
        .set("b", "y", "\"s\"")
        .set("a", "x", "2")
        .set("a", "z", "true")
        .render();
        assert_eq!(text, "[a]\nx = 2\nz = true\n[b]\ny = \"s\"\n");
    }

    #[test]
    fn strings_are_quoted_for_toml() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
