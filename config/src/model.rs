//! The validated configuration the runtime works with, and its construction from the
//! file's raw shape (range and choice checks that need no file system).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::choice::{Accelerator, Choice, HypervisorName, SharedFs, VirtioFsCache};
use crate::file::{BuiltinSection, File, QemuSection};
use crate::Error;

/// Smallest VM memory accepted, in MiB: below it the guest kernel and agent do not fit.
pub const MIN_MEMORY_MIB: u32 = 64;
/// Most vCPUs accepted (what QEMU's microvm machine can address with its mptable).
pub const MAX_VCPUS: u32 = 255;

/// A whole, validated `configuration.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was read from (or the origin given to [`Config::from_str`]).
    pub origin: PathBuf,
    /// `[hypervisor.*]`.
    pub hypervisor: HypervisorConfig,
    /// `[agent.*]`.
    pub agent: AgentConfig,
    /// `[runtime]`.
    pub runtime: RuntimeConfig,
    /// `[factory]`.
    pub factory: FactoryConfig,
}

/// Most idle VMs the pool may keep (`vm_cache_number`): each one holds its memory.
pub const MAX_VM_CACHE_NUMBER: u32 = 64;

/// `[factory]`: the pool of booted, idle VMs sandboxes start from instead of booting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactoryConfig {
    /// How many booted, idle VMs the factory daemon keeps ready (Kata's key); 0: no pool,
    /// every sandbox boots its own VM.
    pub vm_cache_number: u32,
    /// Where the pool lives: the factory's pid file and one directory per kind of VM.
    pub vm_cache_dir: PathBuf,
}

impl FactoryConfig {
    /// Whether sandboxes look for a pooled VM before they boot one.
    pub fn enabled(&self) -> bool {
        self.vm_cache_number > 0
    }

    fn from_section(section: crate::file::FactorySection, origin: &Path) -> Result<Self, Error> {
        if section.enable_template {
            return Err(Error::Invalid {
                origin: origin.to_path_buf(),
                key: "factory.enable_template",
                value: "true".into(),
                expected: "VM templates are not supported: QEMU cannot migrate (save) a VM with \
                           the vhost-user-vsock device every VM here has, and the microvm \
                           machine cannot hot-plug a sandbox's devices after a restore; set \
                           factory.vm_cache_number instead for a pool of booted VMs"
                    .into(),
            });
        }
        if section.vm_cache_number > MAX_VM_CACHE_NUMBER {
            return Err(invalid(
                origin,
                "factory.vm_cache_number",
                section.vm_cache_number,
                &format!(
                    "expected 0 (no pool) to {MAX_VM_CACHE_NUMBER}: each ready VM holds its \
                     memory while it waits"
                ),
            ));
        }
        Ok(Self {
            vm_cache_number: section.vm_cache_number,
            vm_cache_dir: absolute(origin, "factory.vm_cache_dir", section.vm_cache_dir)?,
        })
    }
}

/// `[hypervisor.*]`: the one VMM backend configured.
#[derive(Debug, Clone, PartialEq)]
pub struct HypervisorConfig {
    /// `[hypervisor.qemu]`.
    pub qemu: QemuConfig,
    /// `[hypervisor.builtin]`.
    pub builtin: BuiltinConfig,
}

/// Most vCPUs the builtin VMM accepts.
pub const MAX_BUILTIN_VCPUS: u32 = 32;

/// `[hypervisor.builtin]`: the builtin KVM VMM, used when `runtime.hypervisor_name` is
/// `builtin`.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltinConfig {
    /// The kata-vmm binary.
    pub path: PathBuf,
    /// Guest kernel (ELF vmlinux).
    pub kernel: PathBuf,
    /// Guest initrd with the agent as `/init`.
    pub initrd: PathBuf,
    /// Appended to the built-in kernel command line.
    pub kernel_params: String,
    /// vCPUs per VM, 1..=[`MAX_BUILTIN_VCPUS`].
    pub default_vcpus: u32,
    /// Memory per VM in MiB, at least [`MIN_MEMORY_MIB`].
    pub default_memory: u32,
    /// How pods with resource limits are sized.
    pub sizing: PodSizing,
    /// The virtiofsd binary (kata-vmm's virtio-fs is a vhost-user frontend to it).
    pub virtio_fs_daemon: PathBuf,
    /// virtiofsd's `--cache` policy for volumes (and for container root filesystems
    /// too when it equals `virtio_fs_rootfs_cache`).
    pub virtio_fs_cache: VirtioFsCache,
    /// virtiofsd's `--cache` policy for container root filesystems. When it differs from
    /// `virtio_fs_cache`, a second virtiofsd exports the share under it as the
    /// rootfs share, which the guest reads root filesystems from (see
    /// [`QemuConfig::rootfs_share`]).
    pub virtio_fs_rootfs_cache: VirtioFsCache,
    /// Who kata-vmm runs as.
    pub host_processes: HostProcesses,
}

/// How a sandbox's VMM and the helpers that need no privilege (kata-vsock) run on the
/// host (`sandbox_host_processes`, `host_uid_start`, `host_uid_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostProcesses {
    /// Each sandbox's VMM and kata-vsock run as a uid and gid of the sandbox's own, with
    /// no capabilities, no new privileges, a private `/dev` and (kata-vsock) no network;
    /// false: as the shim (root).
    pub sandboxed: bool,
    /// The first uid (and gid, the same number) of the range sandboxes get theirs from.
    pub uid_start: u32,
    /// How many ids the range holds, at least 1.
    pub uid_count: u32,
}

impl HostProcesses {
    fn from_keys(
        origin: &Path,
        (start_key, count_key): (&'static str, &'static str),
        (sandboxed, uid_start, uid_count): (bool, u32, u32),
    ) -> Result<Self, Error> {
        if uid_start < MIN_HOST_UID {
            return Err(invalid(
                origin,
                start_key,
                uid_start,
                &format!("expected a uid of at least {MIN_HOST_UID}, above the host's own users"),
            ));
        }
        // u32::MAX is the kernel's "no id" ((uid_t)-1).
        let end = u64::from(uid_start) + u64::from(uid_count);
        if uid_count == 0 || end > u64::from(u32::MAX) {
            return Err(invalid(
                origin,
                count_key,
                uid_count,
                &format!(
                    "expected 1 to {} (the range must end below 4294967295)",
                    u32::MAX - uid_start
                ),
            ));
        }
        Ok(Self {
            sandboxed,
            uid_start,
            uid_count,
        })
    }
}

/// The lowest `host_uid_start` accepted: below it live the host's system and login users.
pub const MIN_HOST_UID: u32 = 65536;

/// `[hypervisor.qemu]`.
#[derive(Debug, Clone, PartialEq)]
pub struct QemuConfig {
    /// The qemu-system-x86_64 binary.
    pub path: PathBuf,
    /// Guest kernel (ELF vmlinux).
    pub kernel: PathBuf,
    /// Guest initrd with the agent as `/init`.
    pub initrd: PathBuf,
    /// Appended to the built-in kernel command line.
    pub kernel_params: String,
    /// vCPUs per VM, 1..=[`MAX_VCPUS`].
    pub default_vcpus: u32,
    /// Memory per VM in MiB, at least [`MIN_MEMORY_MIB`].
    pub default_memory: u32,
    /// How pods with resource limits are sized.
    pub sizing: PodSizing,
    /// How files are shared with the guest.
    pub shared_fs: SharedFs,
    /// The virtiofsd binary.
    pub virtio_fs_daemon: PathBuf,
    /// virtiofsd's `--cache` policy for volumes (and for container root filesystems
    /// too when it equals `virtio_fs_rootfs_cache`).
    pub virtio_fs_cache: VirtioFsCache,
    /// virtiofsd's `--cache` policy for container root filesystems. When it differs from
    /// `virtio_fs_cache`, a second virtiofsd exports the share under it as the
    /// rootfs share, which the guest reads root filesystems from (see
    /// [`QemuConfig::rootfs_share`]).
    pub virtio_fs_rootfs_cache: VirtioFsCache,
    /// The vhost-user vsock backend binary (kata-vsock, or vhost-device-vsock).
    pub vsock_backend: PathBuf,
    /// kvm, tcg or auto.
    pub accelerator: Accelerator,
    /// Who QEMU and the vsock backend run as.
    pub host_processes: HostProcesses,
    /// A virtio-scsi controller in every VM, so that host block devices named in a
    /// container's spec (raw block volumes) can be attached to the running VM.
    pub block_device_hotplug: bool,
}

/// How a pod's VM is sized from the pod's resource limits (static sizing: the VM cannot
/// grow after boot): vCPUs = ceil(CPU quota / period) + `vcpus_overhead`, memory = the
/// memory limit + `memory_overhead`, plus the guest kernel's page descriptors (1/64 of
/// the guest's memory). A pod without a limit gets `default_vcpus` / `default_memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodSizing {
    /// Most vCPUs a sandbox may get (`default_maxvcpus`); 0: the host's CPUs.
    pub max_vcpus: u32,
    /// Most memory a sandbox may get, MiB (`default_maxmemory`); 0: the host's memory.
    pub max_memory: u32,
    /// vCPUs added to a CPU-limited pod's (`pod_vcpus_overhead`).
    pub vcpus_overhead: u32,
    /// MiB added to a memory-limited pod's limit: the guest's own need
    /// (`pod_memory_overhead`).
    pub memory_overhead: u32,
    /// How many vCPUs past its boot size a pod's VM may grow to on an in-place resize
    /// (`pod_resize_vcpus`; QEMU only, 0: none).
    pub resize_vcpus: u32,
    /// How much memory past its boot size, MiB (`pod_resize_memory`; QEMU only, 0: none).
    pub resize_memory: u32,
}

/// `[agent.*]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// `[agent.kata]`.
    pub kata: KataAgentConfig,
}

/// `[agent.kata]`.
#[derive(Debug, Clone, PartialEq)]
pub struct KataAgentConfig {
    /// How long to wait for the agent to answer after the VM starts (whole seconds in
    /// the file, at least 1).
    pub dial_timeout: Duration,
    /// A shell in the guest for `kata-runtime exec` (the agent's debug console on vsock
    /// port 1026). Off by default: it is root in the VM, for debugging only.
    pub debug_console_enabled: bool,
}

/// `[runtime]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// Debug logging and guest boot messages on the console.
    pub enable_debug: bool,
    /// Which backend runs sandboxes.
    pub hypervisor_name: HypervisorName,
}

impl Config {
    /// Checks the raw file and turns it into a [`Config`].
    pub(crate) fn from_file(file: File, origin: &Path) -> Result<Self, Error> {
        Ok(Self {
            origin: origin.to_path_buf(),
            hypervisor: HypervisorConfig {
                qemu: QemuConfig::from_section(file.hypervisor.qemu, origin)?,
                builtin: BuiltinConfig::from_section(file.hypervisor.builtin, origin)?,
            },
            agent: AgentConfig {
                kata: KataAgentConfig {
                    dial_timeout: {
                        let secs = file.agent.kata.dial_timeout;
                        if secs == 0 {
                            return Err(invalid(
                                origin,
                                "agent.kata.dial_timeout",
                                secs,
                                "expected a number of seconds of at least 1",
                            ));
                        }
                        Duration::from_secs(secs.into())
                    },
                    debug_console_enabled: file.agent.kata.debug_console_enabled,
                },
            },
            runtime: RuntimeConfig {
                enable_debug: file.runtime.enable_debug,
                hypervisor_name: HypervisorName::parse(
                    origin,
                    "runtime.hypervisor_name",
                    &file.runtime.hypervisor_name,
                )?,
            },
            factory: FactoryConfig::from_section(file.factory, origin)?,
        })
    }
}

/// The keys of one hypervisor section that [`check_vm_shape`] checks.
struct VmShapeKeys {
    vcpus: &'static str,
    memory: &'static str,
    kernel_params: &'static str,
    max_vcpus: &'static str,
    max_memory: &'static str,
}

/// The checks every hypervisor section shares: vCPUs in 1..=`max_vcpus`, enough memory,
/// a one-line kernel command line.
fn check_vm_shape(
    origin: &Path,
    keys: VmShapeKeys,
    (vcpus, max_vcpus): (u32, u32),
    memory_mib: u32,
    sizing: &PodSizing,
    kernel_params: &str,
) -> Result<(), Error> {
    if vcpus == 0 || vcpus > max_vcpus {
        return Err(invalid(
            origin,
            keys.vcpus,
            vcpus,
            &format!("expected a number of vCPUs from 1 to {max_vcpus}"),
        ));
    }
    if memory_mib < MIN_MEMORY_MIB {
        return Err(invalid(
            origin,
            keys.memory,
            memory_mib,
            &format!("expected at least {MIN_MEMORY_MIB} (MiB)"),
        ));
    }
    if sizing.max_vcpus > max_vcpus || (sizing.max_vcpus != 0 && sizing.max_vcpus < vcpus) {
        return Err(invalid(
            origin,
            keys.max_vcpus,
            sizing.max_vcpus,
            &format!(
                "expected 0 (the host's CPUs) or a number of vCPUs from {vcpus} ({}) to {max_vcpus}",
                keys.vcpus
            ),
        ));
    }
    if sizing.max_memory != 0 && sizing.max_memory < memory_mib {
        return Err(invalid(
            origin,
            keys.max_memory,
            sizing.max_memory,
            &format!(
                "expected 0 (the host's memory) or at least {memory_mib} (MiB, {})",
                keys.memory
            ),
        ));
    }
    if kernel_params.contains(['\n', '\r', '\0']) {
        return Err(Error::Invalid {
            origin: origin.to_path_buf(),
            key: keys.kernel_params,
            value: format!("{kernel_params:?}"),
            expected: "expected a single line".into(),
        });
    }
    Ok(())
}

impl QemuConfig {
    fn from_section(s: QemuSection, origin: &Path) -> Result<Self, Error> {
        let keys = VmShapeKeys {
            vcpus: "hypervisor.qemu.default_vcpus",
            memory: "hypervisor.qemu.default_memory",
            kernel_params: "hypervisor.qemu.kernel_params",
            max_vcpus: "hypervisor.qemu.default_maxvcpus",
            max_memory: "hypervisor.qemu.default_maxmemory",
        };
        let sizing = PodSizing {
            max_vcpus: s.default_maxvcpus,
            max_memory: s.default_maxmemory,
            vcpus_overhead: s.pod_vcpus_overhead,
            memory_overhead: s.pod_memory_overhead,
            resize_vcpus: s.pod_resize_vcpus,
            resize_memory: s.pod_resize_memory,
        };
        if s.pod_resize_vcpus > MAX_VCPUS {
            return Err(invalid(
                origin,
                "hypervisor.qemu.pod_resize_vcpus",
                s.pod_resize_vcpus,
                &format!("expected a number of vCPUs from 0 (none) to {MAX_VCPUS}"),
            ));
        }
        check_vm_shape(
            origin,
            keys,
            (s.default_vcpus, MAX_VCPUS),
            s.default_memory,
            &sizing,
            &s.kernel_params,
        )?;
        Ok(Self {
            path: absolute(origin, "hypervisor.qemu.path", s.path)?,
            kernel: absolute(origin, "hypervisor.qemu.kernel", s.kernel)?,
            initrd: absolute(origin, "hypervisor.qemu.initrd", s.initrd)?,
            kernel_params: s.kernel_params,
            default_vcpus: s.default_vcpus,
            default_memory: s.default_memory,
            sizing,
            shared_fs: SharedFs::parse(origin, "hypervisor.qemu.shared_fs", &s.shared_fs)?,
            virtio_fs_daemon: absolute(
                origin,
                "hypervisor.qemu.virtio_fs_daemon",
                s.virtio_fs_daemon,
            )?,
            virtio_fs_cache: VirtioFsCache::parse(
                origin,
                "hypervisor.qemu.virtio_fs_cache",
                &s.virtio_fs_cache,
            )?,
            virtio_fs_rootfs_cache: VirtioFsCache::parse(
                origin,
                "hypervisor.qemu.virtio_fs_rootfs_cache",
                &s.virtio_fs_rootfs_cache,
            )?,
            vsock_backend: absolute(origin, "hypervisor.qemu.vsock_backend", s.vsock_backend)?,
            accelerator: Accelerator::parse(origin, "hypervisor.qemu.accelerator", &s.accelerator)?,
            host_processes: HostProcesses::from_keys(
                origin,
                (
                    "hypervisor.qemu.host_uid_start",
                    "hypervisor.qemu.host_uid_count",
                ),
                (s.sandbox_host_processes, s.host_uid_start, s.host_uid_count),
            )?,
            block_device_hotplug: s.block_device_hotplug,
        })
    }
}

/// The cache policy of the rootfs share, if a VM with these two policies has one: only
/// when they differ does a second virtiofsd run.
fn rootfs_share(volumes: VirtioFsCache, rootfs: VirtioFsCache) -> Option<VirtioFsCache> {
    (volumes != rootfs).then_some(rootfs)
}

impl QemuConfig {
    /// The rootfs share's cache policy, when the VM gets one (a second virtio-fs device
    /// and virtiofsd); None: root filesystems come through the one share.
    pub fn rootfs_share(&self) -> Option<VirtioFsCache> {
        rootfs_share(self.virtio_fs_cache, self.virtio_fs_rootfs_cache)
    }
}

impl BuiltinConfig {
    /// As [`QemuConfig::rootfs_share`].
    pub fn rootfs_share(&self) -> Option<VirtioFsCache> {
        rootfs_share(self.virtio_fs_cache, self.virtio_fs_rootfs_cache)
    }

    fn from_section(s: BuiltinSection, origin: &Path) -> Result<Self, Error> {
        let keys = VmShapeKeys {
            vcpus: "hypervisor.builtin.default_vcpus",
            memory: "hypervisor.builtin.default_memory",
            kernel_params: "hypervisor.builtin.kernel_params",
            max_vcpus: "hypervisor.builtin.default_maxvcpus",
            max_memory: "hypervisor.builtin.default_maxmemory",
        };
        let sizing = PodSizing {
            max_vcpus: s.default_maxvcpus,
            max_memory: s.default_maxmemory,
            vcpus_overhead: s.pod_vcpus_overhead,
            memory_overhead: s.pod_memory_overhead,
            // kata-vmm has no balloon: its VMs keep their boot size.
            resize_vcpus: 0,
            resize_memory: 0,
        };
        check_vm_shape(
            origin,
            keys,
            (s.default_vcpus, MAX_BUILTIN_VCPUS),
            s.default_memory,
            &sizing,
            &s.kernel_params,
        )?;
        Ok(Self {
            path: absolute(origin, "hypervisor.builtin.path", s.path)?,
            kernel: absolute(origin, "hypervisor.builtin.kernel", s.kernel)?,
            initrd: absolute(origin, "hypervisor.builtin.initrd", s.initrd)?,
            kernel_params: s.kernel_params,
            default_vcpus: s.default_vcpus,
            default_memory: s.default_memory,
            sizing,
            virtio_fs_daemon: absolute(
                origin,
                "hypervisor.builtin.virtio_fs_daemon",
                s.virtio_fs_daemon,
            )?,
            virtio_fs_cache: VirtioFsCache::parse(
                origin,
                "hypervisor.builtin.virtio_fs_cache",
                &s.virtio_fs_cache,
            )?,
            virtio_fs_rootfs_cache: VirtioFsCache::parse(
                origin,
                "hypervisor.builtin.virtio_fs_rootfs_cache",
                &s.virtio_fs_rootfs_cache,
            )?,
            host_processes: HostProcesses::from_keys(
                origin,
                (
                    "hypervisor.builtin.host_uid_start",
                    "hypervisor.builtin.host_uid_count",
                ),
                (s.sandbox_host_processes, s.host_uid_start, s.host_uid_count),
            )?,
        })
    }
}

fn invalid(origin: &Path, key: &'static str, value: u32, expected: &str) -> Error {
    Error::Invalid {
        origin: origin.to_path_buf(),
        key,
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// Paths must be absolute: the shim runs with the bundle as its working directory.
fn absolute(origin: &Path, key: &'static str, value: String) -> Result<PathBuf, Error> {
    let path = PathBuf::from(&value);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(Error::Invalid {
            origin: origin.to_path_buf(),
            key,
            value: format!("{value:?}"),
            expected: "expected an absolute path".into(),
        })
    }
}
