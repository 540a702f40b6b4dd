//! `kata-sandbox`: a VM sandbox's life on the host, free of containerd.
//!
//! The shim (`containerd-shim-kata-v2`) translates containerd's requests onto it; the
//! VM-pool factory (`kata-vm-factory`) boots its idle VMs with it; kata-runtime reads its
//! state. The data path reads down: the shim's Task service → [`sandbox::Sandbox`] → the
//! agent client (`agent-client`) → the agent in the guest.
//!
//! - The sandbox ([`sandbox`]): a cold boot or a pooled VM's hand-over to the same
//!   running sandbox through one `connect_guest` step, a container's host side
//!   ([`host_mounts`], [`spec`]: the OCI spec as the guest sees it), the in-place resize
//!   ([`resize`]), the sandbox's `/metrics` ([`metrics`]), teardown and the clean-up after
//!   a crashed shim.
//! - On the host: the pod's cgroup ([`cgroup`], [`stats`], [`oom_kill`]), mounts and the
//!   virtio-fs share ([`mount`], [`block`], [`kubelet_volume`], [`full_disk`]), pod
//!   networking ([`network`]), the VM's size ([`sizing`]), the processes watched
//!   ([`watchdog`], fed by the host process's reaper through [`exits`]), per-container host
//!   pids ([`pid_anchor`]), state on disk for a later `delete` ([`persist`]), the VM
//!   pool's directory and claim ([`pool`], [`pooled`]) and the JSON-lines logger ([`log`]).
//!
//! What the host process provides: every child exit it reaps ([`exits::announce`]) and how
//! a container's rootfs mounts are made ([`host_mounts::set_rootfs_mounter`]).

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
