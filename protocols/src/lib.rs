//! The agent API shared by the shim (client) and kata-agent (server).
//!
//! `agent` holds the messages and `agent_ttrpc` the async ttrpc client and server, both
//! generated at build time from `protos/agent.proto`.

#[allow(clippy::all, unused_mut, unused_imports, unknown_lints, unused_attributes, non_upper_case_globals, non_camel_case_types, unused_results)]
#[rustfmt::skip]
pub mod agent {
    include!(concat!(env!("OUT_DIR"), "/agent.rs"));
}

#[allow(clippy::all, unused_mut, unused_imports, unknown_lints, unused_attributes, non_upper_case_globals, non_camel_case_types, unused_results)]
#[rustfmt::skip]
pub mod agent_ttrpc {
    include!(concat!(env!("OUT_DIR"), "/agent_ttrpc.rs"));
}

pub mod hybrid_vsock;
pub mod id;
pub mod stdio;

/// containerd's runtime options message (`runtimeoptions.v1.Options`), which carries the
/// `ConfigPath` of a runtime entry to the shim in CreateTask.
#[allow(clippy::all, unused_mut, unused_imports, unknown_lints, unused_attributes, non_upper_case_globals, non_camel_case_types, unused_results)]
#[rustfmt::skip]
pub mod runtimeoptions {
    include!(concat!(env!("OUT_DIR"), "/runtimeoptions.rs"));
}

/// containerd's shim bootstrap messages (`containerd.runtime.bootstrap.v1`): from 2.3 on,
/// containerd writes `BootstrapParams` on the shim's stdin at `start` and accepts a
/// `BootstrapResult` on its stdout.
#[allow(clippy::all, unused_mut, unused_imports, unknown_lints, unused_attributes, non_upper_case_globals, non_camel_case_types, unused_results)]
#[rustfmt::skip]
pub mod bootstrap {
    include!(concat!(env!("OUT_DIR"), "/bootstrap.rs"));
}

/// The vsock port kata-agent serves its ttrpc API on (Kata's port).
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// The virtio-fs tag of the per-sandbox share.
pub const SHARED_FS_TAG: &str = "kataShared";

/// Where the guest mounts the virtio-fs share; container `<id>` has its rootfs at
/// `<GUEST_SHARED_DIR>/<id>/rootfs` unless the VM has the rootfs share.
pub const GUEST_SHARED_DIR: &str = "/run/kata-containers/shared/containers";

/// The virtio-fs tag of the rootfs share: the same host directory as [`SHARED_FS_TAG`]'s,
/// exported by a second virtiofsd with its own cache policy
/// (`virtio_fs_rootfs_cache`), and read by the guest for container root filesystems
/// only. A VM has it when that policy differs from the volumes' (`virtio_fs_cache`).
pub const ROOTFS_FS_TAG: &str = "kataRootfs";

/// Where the guest mounts the rootfs share; container `<id>` then has its rootfs at
/// `<GUEST_ROOTFS_DIR>/<id>/rootfs`.
pub const GUEST_ROOTFS_DIR: &str = "/run/kata-containers/shared/rootfs";

/// The guest kernel command line word that tells the agent the VM has the rootfs share
/// ([`ROOTFS_FS_TAG`]), to mount at [`GUEST_ROOTFS_DIR`] at boot.
pub const ROOTFS_SHARE_PARAM: &str = "agent.rootfs_share";

/// The kernel command line key that sets the level of kata-agent's console log
/// (`agent.log=debug`, Kata's spelling). Without it the agent logs warnings and errors
/// only, rate-limited; the host adds [`AGENT_DEBUG_LOG`] in debug mode, which logs
/// everything.
pub const AGENT_LOG_PARAM: &str = "agent.log";
/// The word the host adds to the guest kernel command line in debug mode.
pub const AGENT_DEBUG_LOG: &str = "agent.log=debug";

/// The message kata-agent writes to the guest console once its API is listening.
pub const AGENT_READY_MESSAGE: &str = "serving the agent API";

/// The host vsock port (on CID 2) kata-agent connects to once its API listens, to tell
/// the host to dial now rather than at its next retry. The connection carries nothing;
/// with a hybrid vsock the host listens on `<hybrid socket>_1029` while it dials, and
/// where nobody listens the connection is refused and the host finds the agent by
/// retrying. Any guest process can connect there too: it can only make a dial try early.
pub const AGENT_READY_VSOCK_PORT: u32 = 1029;

/// The vsock port of the guest's debug console (Kata's default `debug_console_vport`),
/// served only when the kernel command line carries [`DEBUG_CONSOLE_PARAM`]: a shell in
/// the guest for `kata-runtime exec`.
pub const DEBUG_CONSOLE_VSOCK_PORT: u32 = 1026;

/// The kernel command line word that turns the agent's debug console on (Kata's spelling).
pub const DEBUG_CONSOLE_PARAM: &str = "agent.debug_console";

/// The kernel command line key that names the debug console's vsock port
/// (`agent.debug_console_vport=1026`, Kata's spelling).
pub const DEBUG_CONSOLE_VPORT_PARAM: &str = "agent.debug_console_vport";

/// The vsock port of the agent's stdio streams (host only): one connection per stream
/// of a process, named by its first line; see [`stdio`].
pub const STDIO_VSOCK_PORT: u32 = 1028;

/// The vsock port of the agent's port forwarder (host only): the host writes the guest
/// TCP port as a decimal line (`"8080\n"`), the agent answers `"OK\n"` once it is
/// connected to `127.0.0.1:<port>` in the guest (or `"ERR <reason>\n"`), and the stream
/// then carries the connection's bytes both ways. How `kubectl port-forward` reaches a
/// pod whose network is inside the VM.
pub const PORT_FORWARD_VSOCK_PORT: u32 = 1027;

/// The vsock port of the agent's bench sink (host only), served only when the kernel
/// command line carries [`BENCH_SINK_PARAM`]: each host connection gets zeros through the
/// path container stdout takes, for `make bench`'s throughput row.
pub const BENCH_SINK_VSOCK_PORT: u32 = 1025;

/// The kernel command line word that turns the agent's bench sink on.
pub const BENCH_SINK_PARAM: &str = "agent.bench_sink=1";

/// Where the agent keeps the pod's shared namespaces (`ipc`, `uts`, `pid`), those of its
/// sandbox container, for the pod's other containers to join.
pub const GUEST_SANDBOX_NS_DIR: &str = "/run/kata-containers/sandbox/ns";

/// How a container's spec names another container's namespace in the guest,
/// `<dir>/<container id>/<type>`: the target's PID namespace of `kubectl debug --target`.
/// Nothing is at this path; the agent resolves it to the named container's init process
/// (`/proc/<its pid>/ns/<type>`) when it creates the container.
pub const GUEST_CONTAINER_NS_DIR: &str = "/run/kata-containers/sandbox/container-ns";

/// Where the agent keeps the pod's emptyDir volumes, `<dir>/<pod uid>/<volume name>`
/// (`PodLocalVolume` of the agent API), for every container of the pod to bind.
pub const GUEST_POD_VOLUMES_DIR: &str = "/run/kata-containers/sandbox/volumes";

/// Where the agent keeps a container's copies of kubelet's watched volumes
/// (`WatchedVolume`, `<dir>/<container id>/<mount index>`) and the binds of its emptyDir
/// subPaths (`<dir>/<container id>/sub-<mount index>`), on the guest's /run tmpfs.
pub const GUEST_WATCHED_VOLUMES_DIR: &str = "/run/kata-containers/sandbox/watched";

/// An annotation the shim sets on a container's spec when containerd's snapshot of its
/// rootfs asked for ID-mapped layers (`uidmap=`/`gidmap=`): the shim mounts the snapshot
/// plainly and the agent ID-maps the rootfs in the guest through the container's user
/// namespace. The shim removes it from every other spec.
pub const ROOTFS_IDMAP_ANNOTATION: &str = "io.katacontainers.rootfs.idmap";

/// The namespace types a pod's containers share with its sandbox container when their
/// spec names one by path.
pub const POD_SHARED_NAMESPACES: [&str; 3] = ["ipc", "uts", "pid"];
