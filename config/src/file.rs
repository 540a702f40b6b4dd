//! The shape of `configuration.toml` as written, before validation: what serde reads.
//!
//! Words such as `accelerator` stay strings here so that a wrong one is reported with the
//! key and the allowed words (see `choice.rs`) rather than serde's generic message.
//! Every section and key may be left out; `Default` holds the shipped defaults.

use serde::Deserialize;

/// The guest's own memory beside a pod's limit, in MiB (`pod_memory_overhead`): what a
/// guest of ours takes with no container running (kernel, agent, page tables), measured,
/// plus room for the page cache of the shares (bench/README.md, "Pod sizing").
pub const POD_MEMORY_OVERHEAD_MIB: u32 = 96;

/// The first uid (and gid) handed to a sandbox's host processes (`host_uid_start`):
/// 0x70000000, above the ranges `/etc/subuid`, systemd's dynamic users and
/// systemd-nspawn's containers hand out (systemd's UIDS-GIDS.md leaves 0x70000000 to
/// 0x7FFFFFFF unused).
pub const HOST_UID_START: u32 = 0x7000_0000;
/// How many uids the range holds (`host_uid_count`): at most this many sandboxes run at
/// once.
pub const HOST_UID_COUNT: u32 = 65536;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct File {
    pub hypervisor: HypervisorSection,
    pub agent: AgentSection,
    pub runtime: RuntimeSection,
    pub factory: FactorySection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HypervisorSection {
    pub qemu: QemuSection,
    pub builtin: BuiltinSection,
}

/// `[hypervisor.builtin]`: the builtin KVM VMM.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct BuiltinSection {
    pub path: String,
    pub kernel: String,
    pub initrd: String,
    pub kernel_params: String,
    pub default_vcpus: u32,
    pub default_memory: u32,
    pub default_maxvcpus: u32,
    pub default_maxmemory: u32,
    pub pod_vcpus_overhead: u32,
    pub pod_memory_overhead: u32,
    pub virtio_fs_daemon: String,
    pub virtio_fs_cache: String,
    pub virtio_fs_rootfs_cache: String,
    pub sandbox_host_processes: bool,
    pub host_uid_start: u32,
    pub host_uid_count: u32,
}

impl Default for BuiltinSection {
    fn default() -> Self {
        Self {
            path: "/usr/local/bin/kata-vmm".into(),
            kernel: "/usr/share/kata-containers/vmlinux".into(),
            initrd: "/usr/share/kata-containers/kata-initrd.img".into(),
            kernel_params: String::new(),
            default_vcpus: 1,
            default_memory: 512,
            default_maxvcpus: 0,
            default_maxmemory: 0,
            pod_vcpus_overhead: 0,
            pod_memory_overhead: POD_MEMORY_OVERHEAD_MIB,
            virtio_fs_daemon: "/usr/local/bin/virtiofsd".into(),
            virtio_fs_cache: "auto".into(),
            virtio_fs_rootfs_cache: "always".into(),
            sandbox_host_processes: true,
            host_uid_start: HOST_UID_START,
            host_uid_count: HOST_UID_COUNT,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct QemuSection {
    pub path: String,
    pub kernel: String,
    pub initrd: String,
    pub kernel_params: String,
    pub default_vcpus: u32,
    pub default_memory: u32,
    pub default_maxvcpus: u32,
    pub default_maxmemory: u32,
    pub pod_vcpus_overhead: u32,
    pub pod_memory_overhead: u32,
    pub pod_resize_vcpus: u32,
    pub pod_resize_memory: u32,
    pub shared_fs: String,
    pub virtio_fs_daemon: String,
    pub virtio_fs_cache: String,
    pub virtio_fs_rootfs_cache: String,
    pub vsock_backend: String,
    pub accelerator: String,
    pub sandbox_host_processes: bool,
    pub host_uid_start: u32,
    pub host_uid_count: u32,
    pub block_device_hotplug: bool,
}

impl Default for QemuSection {
    fn default() -> Self {
        Self {
            path: "/usr/bin/qemu-system-x86_64".into(),
            kernel: "/usr/share/kata-containers/vmlinux".into(),
            initrd: "/usr/share/kata-containers/kata-initrd.img".into(),
            kernel_params: String::new(),
            default_vcpus: 1,
            default_memory: 512,
            default_maxvcpus: 0,
            default_maxmemory: 0,
            pod_vcpus_overhead: 0,
            pod_memory_overhead: POD_MEMORY_OVERHEAD_MIB,
            pod_resize_vcpus: 0,
            pod_resize_memory: 0,
            shared_fs: "virtio-fs".into(),
            virtio_fs_daemon: "/usr/local/bin/virtiofsd".into(),
            virtio_fs_cache: "auto".into(),
            virtio_fs_rootfs_cache: "always".into(),
            vsock_backend: "/usr/local/bin/kata-vsock".into(),
            accelerator: "auto".into(),
            sandbox_host_processes: true,
            host_uid_start: HOST_UID_START,
            host_uid_count: HOST_UID_COUNT,
            block_device_hotplug: true,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct AgentSection {
    pub kata: KataAgentSection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KataAgentSection {
    pub dial_timeout: u32,
    pub debug_console_enabled: bool,
}

impl Default for KataAgentSection {
    fn default() -> Self {
        Self {
            dial_timeout: 30,
            debug_console_enabled: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RuntimeSection {
    pub enable_debug: bool,
    pub hypervisor_name: String,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        Self {
            enable_debug: false,
            hypervisor_name: "qemu".into(),
        }
    }
}

/// `[factory]` (Kata's section): the pool of booted, idle VMs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct FactorySection {
    pub vm_cache_number: u32,
    pub vm_cache_dir: String,
    /// Kata's VM templates, which this runtime does not have; only `false` is accepted.
    pub enable_template: bool,
}

/// Where the pool lives unless `vm_cache_dir` says otherwise.
pub use layout::POOL_DIR as DEFAULT_VM_CACHE_DIR;

impl Default for FactorySection {
    fn default() -> Self {
        Self {
            vm_cache_number: 0,
            vm_cache_dir: DEFAULT_VM_CACHE_DIR.into(),
            enable_template: false,
        }
    }
}
