//! `kata-sandbox`: a VM sandbox's life on the host, without containerd's Task API.
//!
//! The shim (`containerd-shim-kata-v2`) translates containerd's requests onto it and the
//! VM-pool factory (`kata-vm-factory`) boots its idle VMs with it. What is here: the
//! pod's host cgroup ([`cgroup`], [`stats`], [`oom_kill`]), host mounts and the
//! virtio-fs share ([`mount`], [`block`], [`kubelet_volume`], [`full_disk`]), pod
//! networking ([`network`]), the VM's size ([`sizing`]), the processes watched
//! ([`watchdog`]), per-container host pids ([`pid_anchor`]), state on disk for a later
//! `delete` ([`persist`]), the VM pool's directory and claim ([`pool`], [`pooled`]) and
//! the JSON-lines logger ([`log`]).

pub mod block;
pub mod cgroup;
pub mod exits;
pub mod full_disk;
pub mod host_mounts;
pub mod kubelet_volume;
pub mod log;
pub mod metrics;
pub mod mount;
pub mod network;
pub mod oom_kill;
pub mod persist;
pub mod pid_anchor;
pub mod pool;
pub mod pooled;
pub mod resize;
pub mod sandbox;
pub mod sizing;
pub mod spec;
pub mod stats;
pub mod watchdog;
