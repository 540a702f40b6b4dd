//! `kata-runtime env`: what sandboxes will use, printed as TOML in the shape of Kata's
//! `kata-runtime env` (`[Meta]`, `[Runtime]`, `[Hypervisor]`, `[Kernel]`, `[Initrd]`,
//! `[Agent]`, `[Host]`, ...), plus `[Config]`: the configuration file and every key's
//! value with its source, the file or "default". `--json` prints the same as JSON.
//!
//! It only reads; the accelerator shown is the one the next sandbox would get (the KVM
//! probe's cached verdict for this boot, probing once if there is none).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kata_config::{Choice, HypervisorName};
use serde::Serialize;

use crate::command::{find_in_path, is_executable};
use crate::components;
use crate::containerd::{Containerd, RuntimeEntry, SHIM_BINARY};
use crate::effective::Effective;

/// The version of this output's layout (Kata's `[Meta] Version`).
const FORMAT_VERSION: &str = "1.0.0";

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Env {
    meta: Meta,
    runtime: Runtime,
    hypervisor: Hypervisor,
    kernel: Kernel,
    initrd: Initrd,
    agent: Agent,
    virtio_fs: Component,
    vsock: Vsock,
    shim: Component,
    containerd: ContainerdEnv,
    host: Host,
    config: ConfigEnv,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Meta {
    version: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Runtime {
    path: String,
    version: &'static str,
    debug: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Hypervisor {
    name: &'static str,
    path: String,
    version: String,
    machine_type: &'static str,
    /// The configured accelerator word (QEMU only; kata-vmm always uses KVM).
    accelerator: String,
    /// What the next sandbox gets ...
    accelerator_in_use: &'static str,
    /// ... and why.
    accelerator_reason: String,
    default_vcpus: u32,
    default_memory_mib: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Kernel {
    path: String,
    version: String,
    parameters: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Initrd {
    path: String,
    format: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Agent {
    version: String,
    dial_timeout_secs: u64,
    /// `kata-runtime exec` reaches new sandboxes' guests.
    debug_console_enabled: bool,
}

/// A binary we run, where it is and what version it says it is.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Component {
    path: String,
    version: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Vsock {
    backend: String,
    backend_version: String,
    vhost_vsock_device: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ContainerdEnv {
    path: String,
    version: String,
    config: String,
    runtimes: Vec<RuntimeEntry>,
    runtimes_error: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Host {
    kernel: String,
    architecture: &'static str,
    distro: String,
    cpu_model: String,
    cpus: usize,
    memory_total_kib: u64,
    kvm_device: bool,
    kvm: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ConfigEnv {
    path: String,
    chosen_by: &'static str,
    /// The drop-ins (`config.d/*.toml`) applied over the file, in order.
    drop_ins: Vec<String>,
    error: String,
    /// Every key: its value and where it came from (written by hand in TOML, see
    /// [`Env::to_toml`]).
    #[serde(skip)]
    values: BTreeMap<&'static str, Setting>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Setting {
    value: toml::Value,
    source: String,
}

fn text<T: ToString>(r: Result<T, String>) -> String {
    r.map(|v| v.to_string())
        .unwrap_or_else(|why| format!("unknown: {why}"))
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// A binary's path and the note that it reports no version.
fn unversioned(path: Option<PathBuf>, name: &str) -> Component {
    match path {
        Some(path) => Component {
            path: shown(&path),
            version: format!("unknown: {name} has no version flag"),
        },
        None => Component {
            path: String::new(),
            version: format!("unknown: {name} is not installed"),
        },
    }
}

/// Gathers everything `env` prints.
pub fn gather(eff: &Effective, containerd_config: &Path) -> Env {
    let c = &eff.config;
    let (q, b) = (&c.hypervisor.qemu, &c.hypervisor.builtin);
    let builtin = c.runtime.hypervisor_name == HypervisorName::Builtin;
    let (kernel, initrd, params, virtiofsd, vcpus, memory) = if builtin {
        (
            &b.kernel,
            &b.initrd,
            &b.kernel_params,
            &b.virtio_fs_daemon,
            b.default_vcpus,
            b.default_memory,
        )
    } else {
        (
            &q.kernel,
            &q.initrd,
            &q.kernel_params,
            &q.virtio_fs_daemon,
            q.default_vcpus,
            q.default_memory,
        )
    };
    let logger = hypervisor::discard_logger();
    let configured = if builtin {
        kata_config::Accelerator::Kvm
    } else {
        q.accelerator
    };
    // A refused `kvm` shows as no accelerator, with why.
    let (accel_in_use, accel_reason) = match hypervisor::accel::choose(configured, &logger) {
        Ok(choice) => (choice.accel.as_str(), choice.reason),
        Err(refusal) => ("none", refusal),
    };
    let containerd = Containerd::inspect(containerd_config);
    let version_of = |path: &Path, run: fn(&Path) -> Result<String, String>| {
        if is_executable(path) {
            text(run(path))
        } else {
            format!("unknown: {} is not an executable file", path.display())
        }
    };
    Env {
        meta: Meta {
            version: FORMAT_VERSION,
        },
        runtime: Runtime {
            path: std::env::current_exe()
                .map(|p| shown(&p))
                .unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION"),
            debug: c.runtime.enable_debug,
        },
        hypervisor: Hypervisor {
            name: c.runtime.hypervisor_name.as_str(),
            path: shown(if builtin { &b.path } else { &q.path }),
            version: if builtin {
                unversioned(Some(b.path.clone()), "kata-vmm").version
            } else {
                version_of(&q.path, components::qemu_version)
            },
            machine_type: if builtin { "kata-vmm" } else { "microvm" },
            accelerator: if builtin {
                "kvm".into()
            } else {
                q.accelerator.as_str().into()
            },
            accelerator_in_use: accel_in_use,
            accelerator_reason: accel_reason,
            default_vcpus: vcpus,
            default_memory_mib: memory,
        },
        kernel: Kernel {
            path: shown(kernel),
            version: text(components::kernel_release(kernel)),
            parameters: params.clone(),
        },
        initrd: Initrd {
            path: shown(initrd),
            format: text(components::initrd_format(initrd)),
        },
        agent: Agent {
            // The agent is /init inside the initrd and reports its version only over its
            // API (GetGuestDetails), that is, from a running sandbox.
            version: "unknown: only a running agent reports it".into(),
            dial_timeout_secs: c.agent.kata.dial_timeout.as_secs(),
            debug_console_enabled: c.agent.kata.debug_console_enabled,
        },
        virtio_fs: Component {
            path: shown(virtiofsd),
            version: version_of(virtiofsd, components::virtiofsd_version),
        },
        vsock: Vsock {
            backend: if builtin {
                "kata-vmm (in-process)".into()
            } else {
                shown(&q.vsock_backend)
            },
            backend_version: if builtin {
                String::new()
            } else {
                unversioned(Some(q.vsock_backend.clone()), "kata-vsock").version
            },
            vhost_vsock_device: Path::new("/dev/vhost-vsock").exists(),
        },
        shim: unversioned(find_in_path(SHIM_BINARY), SHIM_BINARY),
        containerd: ContainerdEnv {
            path: containerd.binary.as_deref().map(shown).unwrap_or_default(),
            version: text(containerd.version.clone()),
            config: shown(&containerd.config),
            runtimes_error: containerd
                .entries
                .as_ref()
                .err()
                .cloned()
                .unwrap_or_default(),
            runtimes: containerd.entries.unwrap_or_default(),
        },
        host: host(),
        config: ConfigEnv {
            path: eff.path.as_deref().map(shown).unwrap_or_default(),
            chosen_by: eff.chosen_by,
            drop_ins: eff.drop_ins().map(shown).collect(),
            error: eff
                .error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            values: eff
                .settings()
                .into_iter()
                .map(|s| {
                    (
                        s.key,
                        Setting {
                            value: s.value,
                            source: s.source.describe(),
                        },
                    )
                })
                .collect(),
        },
    }
}

fn host() -> Host {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let field = |text: &str, key: &str, sep: char| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(sep)?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
            .unwrap_or_default()
    };
    let meminfo = read("/proc/meminfo");
    let kvm = hypervisor::accel::kvm_verdict(&hypervisor::discard_logger());
    Host {
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        architecture: std::env::consts::ARCH,
        distro: field(&read("/etc/os-release"), "PRETTY_NAME", '='),
        cpu_model: field(&read("/proc/cpuinfo"), "model name", ':'),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        memory_total_kib: field(&meminfo, "MemTotal", ':')
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0),
        kvm_device: Path::new("/dev/kvm").exists(),
        kvm: kvm.describe(),
    }
}

impl Env {
    /// The report as TOML. `[Config.Values]` is written by hand so that each key stays on
    /// one line as an inline table (`key = { Value = ..., Source = ... }`).
    pub fn to_toml(&self) -> Result<String, String> {
        let mut out = toml::to_string(self)
            .map_err(|e| format!("cannot render the environment as TOML: {e}"))?;
        out.push_str("\n[Config.Values]\n");
        for (key, setting) in &self.config.values {
            out.push_str(&format!(
                "{} = {{ Value = {}, Source = {} }}\n",
                toml::Value::String((*key).to_string()),
                setting.value,
                toml::Value::String(setting.source.clone())
            ));
        }
        Ok(out)
    }

    /// The report as JSON, `Config.Values` included.
    pub fn to_json(&self) -> Result<String, String> {
        let fail = |e: serde_json::Error| format!("cannot render the environment as JSON: {e}");
        let mut json = serde_json::to_value(self).map_err(fail)?;
        let values = serde_json::to_value(&self.config.values).map_err(fail)?;
        if let Some(config) = json.get_mut("Config").and_then(|c| c.as_object_mut()) {
            config.insert("Values".into(), values);
        }
        serde_json::to_string_pretty(&json).map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_output_parses_and_keeps_every_setting_with_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("configuration.toml");
        std::fs::write(
            &file,
            "[hypervisor.qemu]\nkernel_params = \"a=\\\"b\\\" c\"\n",
        )
        .unwrap();
        let eff = Effective::load(Some(&file));
        let env = gather(&eff, Path::new("/nonexistent/containerd.toml"));
        let parsed: toml::Table = toml::from_str(&env.to_toml().unwrap()).unwrap();
        for section in [
            "Meta",
            "Runtime",
            "Hypervisor",
            "Kernel",
            "Initrd",
            "Agent",
            "Host",
            "Containerd",
            "Config",
        ] {
            assert!(
                parsed.get(section).and_then(|s| s.as_table()).is_some(),
                "no [{section}]"
            );
        }
        let values = parsed["Config"]["Values"].as_table().unwrap();
        assert_eq!(values.len(), crate::effective::settings(&eff.config).len());
        let params = &values["hypervisor.qemu.kernel_params"];
        assert_eq!(params["Value"].as_str(), Some("a=\"b\" c"));
        assert_eq!(
            params["Source"].as_str(),
            Some(file.display().to_string().as_str())
        );
        assert_eq!(
            values["runtime.hypervisor_name"]["Source"].as_str(),
            Some("default")
        );
        assert_eq!(parsed["Kernel"]["Parameters"].as_str(), Some("a=\"b\" c"));
        let json: serde_json::Value = serde_json::from_str(&env.to_json().unwrap()).unwrap();
        assert_eq!(
            json["Config"]["Values"]["hypervisor.qemu.kernel_params"]["Source"],
            params["Source"].as_str().unwrap()
        );
    }
}
