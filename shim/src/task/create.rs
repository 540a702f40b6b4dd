//! CreateTask: the first container boots the sandbox, every container gets its rootfs
//! and binds shared into the VM and is created by the agent. All or nothing: a failure
//! undoes the container's host mounts, and the sandbox when it was booted for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use containerd_shim_protos::api::CreateTaskRequest;
use slog::info;
use ttrpc::Code;

use super::state::{agent_err, status, Result};
use super::Inner;
use crate::container::{Container, Process};
use crate::io::{Relays, StdioPaths};
use crate::launch::LaunchError;
use kata_sandbox::sandbox::LaunchError as SandboxLaunch;
use kata_sandbox::sandbox::{ContainerError, Sandbox};
use kata_sandbox::spec;

/// The parts of a CreateTask request the create needs, read from the bundle.
struct Parsed {
    bundle: PathBuf,
    /// What the (sandbox) container's spec says about the whole sandbox.
    sandbox: spec::SandboxSpec,
    spec: serde_json::Value,
    /// The host binds and guest volumes the guest's spec relies on.
    mounts: spec::GuestMounts,
    stdio: StdioPaths,
}

/// Container `id`'s create, registered in `creating` while it is under way. Its end,
/// however it comes (done, failed, or the create's task panicked), lets the requests
/// about `id` that wait for it (`Inner::settled`) answer; a create that never ended would
/// hold them, and keep the daemon up, for ever.
struct Creating {
    inner: Arc<Inner>,
    id: String,
}

impl Drop for Creating {
    fn drop(&mut self) {
        self.inner.lock().creating.remove(&self.id);
        self.inner.settled.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Inner {
    pub(super) async fn create_container(self: &Arc<Self>, req: &CreateTaskRequest) -> Result<u32> {
        let t0 = Instant::now();
        if req.id == self.sandbox_id {
            kata_sandbox::metrics::METRICS.start_phases();
        }
        let parsed = self.parse(req)?;
        // Registered first: a sandbox with a create in flight is not ended under it.
        let (creating, booting) = {
            let mut st = self.lock();
            if st.containers.contains_key(&req.id) || !st.creating.insert(req.id.clone()) {
                return Err(status(
                    Code::ALREADY_EXISTS,
                    format!("container {} already exists", req.id),
                ));
            }
            let creating = Creating {
                inner: self.clone(),
                id: req.id.clone(),
            };
            (creating, st.sandbox.is_none())
        };
        // Only a sandbox's boot (or a wait for one in progress, or for its end) takes the
        // lifecycle lock: a container created in a running sandbox neither waits for nor
        // holds up another container's create or delete.
        let _life = match booting {
            true => Some(self.lifecycle.lock().await),
            false => None,
        };
        let result = if self.ending.load(Ordering::SeqCst) {
            Err(status(
                Code::UNAVAILABLE,
                format!(
                    "the shim of sandbox {} is shutting down; create container {} again",
                    self.sandbox_id, req.id
                ),
            ))
        } else {
            self.create_locked(req, &parsed).await
        };
        drop(creating);
        let pid = result.map_err(|e| self.full_disk_context(e, &parsed.bundle))?;
        info!(self.log, "phase: container created"; "phase" => "container created", "elapsed_ms" => t0.elapsed().as_millis() as u64, "container" => &req.id);
        if req.id == self.sandbox_id {
            kata_sandbox::metrics::METRICS.phase("sandbox_created");
        }
        self.events
            .create(&req.id, &req.bundle, &parsed.stdio, pid)
            .await;
        Ok(pid)
    }

    fn parse(&self, req: &CreateTaskRequest) -> Result<Parsed> {
        spec::check_id(&req.id).map_err(|e| status(Code::INVALID_ARGUMENT, e.to_string()))?;
        let bundle = PathBuf::from(&req.bundle);
        let spec_path = bundle.join("config.json");
        let text = std::fs::read(&spec_path).map_err(|e| {
            status(
                Code::INVALID_ARGUMENT,
                format!(
                    "reading the OCI spec {}: {e}; the bundle must hold config.json",
                    spec_path.display()
                ),
            )
        })?;
        let mut spec: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            status(
                Code::INVALID_ARGUMENT,
                format!("{} is not a valid OCI spec: {e}", spec_path.display()),
            )
        })?;
        let sandbox_id = spec::sandbox_of(&spec, &req.id)
            .map_err(|e| status(Code::INVALID_ARGUMENT, e.to_string()))?;
        if sandbox_id != self.sandbox_id {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!(
                    "container {} belongs to sandbox {sandbox_id}, but this shim serves sandbox {}",
                    req.id, self.sandbox_id
                ),
            ));
        }
        let sandbox = spec::sandbox_spec(&spec);
        if sandbox.pod && sandbox.host_network && req.id == self.sandbox_id {
            return Err(status(
                Code::INVALID_ARGUMENT,
                format!(
                    "pod sandbox {} asks for the host's network (hostNetwork: true), which a VM \
                     sandbox cannot join: its containers would not be on the node's network. \
                     Run this pod with another RuntimeClass (runc), or without hostNetwork",
                    req.id
                ),
            ));
        }
        let pod_member = sandbox_id != req.id;
        if pod_member {
            let peers = self.lock().peers();
            spec::name_peer_namespaces(&mut spec, &peers);
        }
        let mounts = spec::rewrite_for_guest(&mut spec, &req.id, pod_member)
            .map_err(|e| status(Code::INVALID_ARGUMENT, e.to_string()))?;
        let terminal = spec
            .pointer("/process/terminal")
            .and_then(|v| v.as_bool())
            .unwrap_or(req.terminal);
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal,
        };
        Ok(Parsed {
            bundle,
            sandbox,
            spec,
            mounts,
            stdio,
        })
    }

    /// A create that failed on a full file system says which one and what is full.
    fn full_disk_context(&self, e: ttrpc::Error, bundle: &std::path::Path) -> ttrpc::Error {
        let ttrpc::Error::RpcStatus(mut st) = e else {
            return e;
        };
        let places = [
            (
                "the sandbox state",
                kata_sandbox::persist::state_dir(&self.sandbox_id),
            ),
            (
                "the VM's run directory",
                kata_sandbox::persist::vm_run_root().join(&self.sandbox_id),
            ),
            (
                "the share",
                kata_sandbox::mount::SharedDirs::for_sandbox(&self.sandbox_id).base,
            ),
            ("containerd's bundle", bundle.to_path_buf()),
        ];
        if let Some(more) = kata_sandbox::full_disk::explain(&st.message, &places) {
            slog::error!(self.log, "create failed on a full file system: {more}"; "error" => &st.message);
            st.message = format!("{}: {more}", st.message);
        }
        ttrpc::Error::RpcStatus(st)
    }

    /// The sandbox to create in, booting it for the sandbox container. Returns whether it
    /// was booted now.
    async fn sandbox_for(
        self: &Arc<Self>,
        req: &CreateTaskRequest,
        spec: &spec::SandboxSpec,
    ) -> Result<(Arc<Sandbox>, bool)> {
        if let Some(sb) = self.lock().sandbox.clone() {
            if let Some(cause) = sb.end_cause() {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!(
                        "sandbox {} cannot take container {}: its VM is gone ({cause}); remove the sandbox and create it again",
                        self.sandbox_id, req.id
                    ),
                ));
            }
            return Ok((sb, false));
        }
        if req.id != self.sandbox_id {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!(
                    "sandbox {} is not running: create its sandbox container first",
                    self.sandbox_id
                ),
            ));
        }
        let sb = self
            .launcher
            .launch(&self.sandbox_id, &req.options, spec, &self.log)
            .await
            .map_err(|e| match e {
                LaunchError::Config(e) => status(Code::INVALID_ARGUMENT, e.to_string()),
                LaunchError::Sandbox(SandboxLaunch::Size(e)) => status(
                    Code::INVALID_ARGUMENT,
                    format!("sizing VM sandbox {}: {e}", self.sandbox_id),
                ),
                LaunchError::Sandbox(SandboxLaunch::Boot(e)) => status(
                    Code::UNKNOWN,
                    format!("creating VM sandbox {}: {e}", self.sandbox_id),
                ),
            })?;
        self.lock().sandbox = Some(sb.clone());
        self.watch_sandbox(&sb);
        self.watch_oom(sb.agent());
        self.serve_metrics();
        Ok((sb, true))
    }

    /// Called with the lifecycle lock held when the sandbox may have to boot.
    async fn create_locked(self: &Arc<Self>, req: &CreateTaskRequest, p: &Parsed) -> Result<u32> {
        let (sb, booted) = self.sandbox_for(req, &p.sandbox).await?;
        let result = self.create_in(&sb, req, p).await;
        if result.is_err() && booted {
            // The sandbox was booted for this container alone: take it down with it, unless
            // another container came into it meanwhile.
            let sb = {
                let mut st = self.lock();
                if st.containers.is_empty() && st.creating.iter().all(|c| *c == req.id) {
                    st.sandbox.take()
                } else {
                    None
                }
            };
            if let Some(sb) = sb {
                sb.destroy().await;
            }
        }
        result
    }

    async fn create_in(&self, sb: &Sandbox, req: &CreateTaskRequest, p: &Parsed) -> Result<u32> {
        // The sandbox container reports the VMM's pid (the pod's namespaces), the others
        // a pid of their own. Made first: nothing to undo if it fails.
        let anchor = match req.id == self.sandbox_id {
            true => None,
            false => Some(kata_sandbox::pid_anchor::PidAnchor::new().map_err(|e| {
                super::state::failed(format!(
                    "container {}: no host thread for its pid: {e}; the host is out of \
                     threads (see its pid limits)",
                    req.id
                ))
            })?),
        };
        let rootfs: Vec<_> = req.rootfs.iter().map(rootfs_mount).collect();
        let host = sb
            .create_container(
                &req.id,
                &p.bundle,
                &rootfs,
                &p.mounts,
                p.spec.clone(),
                !p.stdio.stdin.is_empty(),
                req.id == self.sandbox_id,
            )
            .await
            .map_err(|e| match e {
                ContainerError::Host(e) => status(Code::INVALID_ARGUMENT, e.to_string()),
                ContainerError::Spec(e) => super::state::failed(e),
                e @ ContainerError::Device { .. } => {
                    status(Code::FAILED_PRECONDITION, e.to_string())
                }
                ContainerError::Guest(e) => agent_err(e),
            })?;
        let pid = anchor.as_ref().map_or_else(|| sb.task_pid(), |a| a.pid());
        let mut init = Process::new(p.stdio.clone(), None);
        init.relays = Some(Relays::start(&sb.agent(), &req.id, "", &p.stdio, &self.log));
        let mut st = self.lock();
        st.containers.insert(
            req.id.clone(),
            Container {
                bundle: p.bundle.clone(),
                mounts: host.mounts,
                share_dir: host.share_dir,
                block_devices: host.block_devices,
                init,
                execs: HashMap::new(),
                anchor,
                given: None,
            },
        );
        Ok(pid)
    }
}

/// One of containerd's rootfs mounts in the sandbox library's terms (its `target` is
/// always the bundle's `rootfs`, where the library mounts them).
fn rootfs_mount(m: &containerd_shim_protos::api::Mount) -> kata_sandbox::spec::RootfsMount {
    kata_sandbox::spec::RootfsMount {
        kind: m.type_.clone(),
        source: m.source.clone(),
        options: m.options.clone(),
    }
}

/// Makes one of containerd's rootfs mounts at `target` as containerd's shims do
/// (containerd-shim's `mount_rootfs`): the sandbox library's
/// [`kata_sandbox::host_mounts::MountRootfs`] for this process.
pub fn mount_rootfs(
    m: &kata_sandbox::spec::RootfsMount,
    target: &Path,
) -> std::result::Result<(), String> {
    fn some(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    containerd_shim::mount::mount_rootfs(some(&m.kind), some(&m.source), &m.options, target)
        .map_err(|e| e.to_string())
}
