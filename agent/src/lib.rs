//! kata-agent: PID 1 of the sandbox VM. It mounts the guest's base file systems, serves
//! the ttrpc AgentService (protocols/protos/agent.proto) on vsock port 1024, and runs OCI
//! containers whose rootfs arrives over virtio-fs.
//!
//! Reading order: `main.rs` (modes) → `rpc` → `sandbox` → `container` → `process`
//! (launch via the `stage`, forked by `stage::spawner`) → `stdio` (served by
//! `stdio::streams`), `reaper`, `cgroup`; `volume` the kubelet volumes the guest keeps itself; `init` holds the PID 1 duties; `debug_console`
//! the opt-in shell for `kata-runtime exec`.

pub mod block;
pub mod cgroup;
pub mod container;
pub mod cpus;
pub mod debug_console;
pub mod devpts;
pub mod entropy;
pub mod error;
pub mod host_only;
pub mod init;
pub mod logging;
pub mod metrics;
pub mod network;
pub mod pod_ns;
pub mod port_forward;
pub mod process;
pub mod reaper;
pub mod rpc;
pub mod sandbox;
pub mod spec;
pub mod stage;
pub mod stdio;
pub mod volume;
