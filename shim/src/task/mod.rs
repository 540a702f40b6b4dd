//! containerd's Task API (v2) for a VM sandbox: one method per RPC, each looking up the
//! container and process under the state lock (briefly, never across an await) and
//! delegating to the sandbox, the agent or the relays.
//!
//! Only the sandbox's birth and death take the `lifecycle` lock (held across a VM boot):
//! a container created in a running sandbox, a delete that leaves the sandbox running,
//! State, Connect, Kill, Wait and exit reporting never wait for it.

mod create;
mod state;
#[cfg(test)]
mod tests;
mod watch;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::TtrpcContext;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use slog::{debug, info, Logger};
use ttrpc::Code;

use crate::container::{ExecRefused, Exit, Status};
use crate::events::{timestamp, Events};
use crate::io::{Relays, StdioPaths};
use crate::launch::Launcher;
use crate::sandbox::Sandbox;
use state::{agent_err, failed, not_found, status, unimplemented, Result, State};

pub struct TaskService {
    inner: Arc<Inner>,
}

struct Inner {
    sandbox_id: String,
    state: Mutex<State>,
    /// Serialises creating and ending the sandbox.
    lifecycle: tokio::sync::Mutex<()>,
    launcher: Box<dyn Launcher>,
    events: Events,
    exit: Arc<ExitSignal>,
    log: Logger,
    /// `/metrics` on the sandbox's `shim-monitor.sock`, while it has a VM.
    metrics: Mutex<Option<crate::metrics::server::MetricsServer>>,
}

impl TaskService {
    pub fn new(
        sandbox_id: &str,
        launcher: Box<dyn Launcher>,
        events: Events,
        exit: Arc<ExitSignal>,
        log: Logger,
    ) -> Self {
        TaskService {
            inner: Arc::new(Inner {
                sandbox_id: sandbox_id.to_string(),
                state: Mutex::new(State::default()),
                lifecycle: tokio::sync::Mutex::new(()),
                launcher,
                events,
                exit,
                log,
                metrics: Mutex::new(None),
            }),
        }
    }
}

/// Tells whether a Task service's sandbox is gone (or never came): no VM, no container
/// and none being created. The daemon ends on SIGTERM only then.
pub struct IdleProbe(Arc<Inner>);

impl IdleProbe {
    pub fn is_idle(&self) -> bool {
        let st = self.0.lock();
        st.sandbox.is_none() && st.is_empty()
    }
}

impl TaskService {
    pub fn idle_probe(&self) -> IdleProbe {
        IdleProbe(self.inner.clone())
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not wedge every later RPC.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves the sandbox's metrics on its `shim-monitor.sock`, in the state directory a
    /// VM sandbox keeps (none for sandboxes without one, as in unit tests). Without it the
    /// sandbox runs on; only its metrics are missing, which the log says.
    fn serve_metrics(self: &Arc<Self>) {
        if !crate::persist::state_dir(&self.sandbox_id).is_dir() {
            return;
        }
        let inner = Arc::downgrade(self);
        let source: crate::metrics::SandboxSource =
            Arc::new(move || inner.upgrade().and_then(|i| i.lock().sandbox.clone()));
        let path = crate::metrics::server::socket_path(&self.sandbox_id);
        let mut slot = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        // A sandbox booted anew replaces the server of the one before.
        slot.take();
        match crate::metrics::server::start(&path, source) {
            Ok(server) => *slot = Some(server),
            Err(e) => {
                slog::warn!(self.log, "the sandbox's metrics will not be served"; "socket" => path.display(), "error" => %e)
            }
        }
    }

    /// Stops serving metrics (the sandbox is going; its socket goes with its state
    /// directory).
    fn stop_metrics(&self) {
        self.metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// Freezes or thaws container `cid` in the guest and records it.
    async fn set_paused(&self, cid: &str, pause: bool) -> Result<()> {
        let (from, to) = if pause {
            (Status::Running, Status::Paused)
        } else {
            (Status::Paused, Status::Running)
        };
        let agent = {
            let st = self.lock();
            let now = st.container(cid)?.init.status();
            if now != from {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("container {cid} is {now:?}, not {from:?}").to_lowercase(),
                ));
            }
            st.agent(cid)?
        };
        let res = if pause {
            agent.pause_container(cid).await
        } else {
            agent.resume_container(cid).await
        };
        res.map_err(agent_err)?;
        if let Ok(init) = self.lock().process_mut(cid, "") {
            // An exit meanwhile stays the last word.
            let _ = init.pause_transition(from, to);
        }
        info!(self.log, "{}", if pause { "paused" } else { "resumed" }; "container" => cid);
        Ok(())
    }

    /// Ends the sandbox once no container is left in it (or being created); whether it
    /// did.
    async fn end_sandbox_if_empty(&self) -> bool {
        // A sandbox that goes on needs no lock: a delete does not wait for a create.
        if !self.lock().is_empty() {
            return false;
        }
        let _life = self.lifecycle.lock().await;
        let sb = {
            let mut st = self.lock();
            if !st.is_empty() {
                return false;
            }
            st.sandbox.take()
        };
        if let Some(sb) = sb {
            self.stop_metrics();
            sb.destroy().await;
        }
        true
    }

    /// Removes container `cid` from the guest and the host; ends the sandbox when it was
    /// the last one.
    async fn delete_container(&self, cid: &str) -> Result<Option<Exit>> {
        let (mut c, sb) = {
            let mut st = self.lock();
            let c = st.container(cid)?;
            if matches!(c.init.status(), Status::Running | Status::Paused) {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("container {cid} is still running; kill it first"),
                ));
            }
            let c = st
                .containers
                .remove(cid)
                .ok_or_else(|| not_found(cid, ""))?;
            (c, st.sandbox.clone())
        };
        let exit = c.init.exit();
        let Some(sb) = sb else {
            drop(c);
            self.end_sandbox_if_empty().await;
            return Ok(exit);
        };
        // The last container's delete ends the sandbox, and DestroySandbox ends every
        // process in the guest before the VM stops: removing this container in the guest
        // first would cost a round trip and guest work (unmounts, its cgroup) that the
        // VM's end makes moot.
        let last = self.lock().is_empty();
        if !last {
            self.remove_in_guest(&sb, cid).await;
            // Once no process of it can hold them.
            sb.remove_block_devices(cid, &c.block_devices).await;
        }
        sb.remove_container_host(&c.mounts, &c.share_dir);
        let block_devices = std::mem::take(&mut c.block_devices);
        drop(c);
        if !self.end_sandbox_if_empty().await && last {
            // A create came in meanwhile and keeps the sandbox: remove it after all.
            self.remove_in_guest(&sb, cid).await;
            sb.remove_block_devices(cid, &block_devices).await;
        }
        Ok(exit)
    }

    async fn remove_in_guest(&self, sb: &Sandbox, cid: &str) {
        // A VM that is gone has nothing left to remove.
        if sb.end_cause().is_none() {
            if let Err(e) = sb.agent().remove_container(cid).await {
                slog::warn!(self.log, "removing the container in the guest"; "container" => cid, "error" => %e);
            }
        }
    }
}

fn proc_status(s: Status) -> containerd_shim_protos::api::Status {
    match s {
        Status::Created => containerd_shim_protos::api::Status::CREATED,
        Status::Running => containerd_shim_protos::api::Status::RUNNING,
        Status::Paused => containerd_shim_protos::api::Status::PAUSED,
        Status::Stopped => containerd_shim_protos::api::Status::STOPPED,
    }
}

#[async_trait]
impl Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> Result<CreateTaskResponse> {
        let _timer = crate::metrics::task_timer("create");
        info!(self.inner.log, "create"; "container" => &req.id, "bundle" => &req.bundle);
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(unimplemented(
                "restoring a checkpoint is not supported for VM sandboxes",
            ));
        }
        let pid = self.inner.create_container(&req).await?;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> Result<StartResponse> {
        let _timer = crate::metrics::task_timer("start");
        let inner = &self.inner;
        let (agent, pid, exec_spec, stdio) = {
            let mut st = inner.lock();
            let (agent, pid) = (st.agent(&req.id)?, st.task_pid());
            let p = st.process_mut(&req.id, &req.exec_id)?;
            p.begin_start().map_err(|e| {
                status(
                    Code::FAILED_PRECONDITION,
                    format!("process {:?} of {} {e}", req.exec_id, req.id),
                )
            })?;
            (agent, pid, p.spec.clone(), p.stdio.clone())
        };
        let started = if req.exec_id.is_empty() {
            agent.start_container(&req.id).await
        } else {
            let spec = exec_spec.unwrap_or_default();
            agent
                .exec_process(&req.id, &req.exec_id, spec, !stdio.stdin.is_empty())
                .await
        };
        {
            let mut st = inner.lock();
            let p = st.process_mut(&req.id, &req.exec_id)?;
            if let Err(e) = started {
                p.start_failed();
                return Err(agent_err(e));
            }
            p.started();
            if !req.exec_id.is_empty() {
                p.relays = Some(Relays::start(
                    &agent,
                    &req.id,
                    &req.exec_id,
                    &stdio,
                    &inner.log,
                ));
            }
        }
        inner.watch_exit(&req.id, &req.exec_id, agent);
        if req.exec_id.is_empty() {
            info!(inner.log, "phase: container started"; "phase" => "container started", "container" => &req.id);
            if req.id == inner.sandbox_id {
                crate::metrics::METRICS.phase("sandbox_started");
            }
            inner.events.start(&req.id, pid).await;
        } else {
            inner.events.exec_started(&req.id, &req.exec_id, pid).await;
        }
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> Result<StateResponse> {
        let _timer = crate::metrics::task_timer("state");
        let st = self.inner.lock();
        let c = st.container(&req.id)?;
        let p = st.process(&req.id, &req.exec_id)?;
        let exit = p.exit();
        Ok(StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            bundle: c.bundle.display().to_string(),
            pid: st.task_pid(),
            status: proc_status(p.status()).into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.map(|e| e.status).unwrap_or(0),
            exited_at: exit.map(|e| timestamp(e.at)).into(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> Result<WaitResponse> {
        let _timer = crate::metrics::task_timer("wait");
        let mut rx = self.inner.lock().process(&req.id, &req.exec_id)?.exits();
        let exit = loop {
            if let Some(e) = *rx.borrow_and_update() {
                break e;
            }
            if rx.changed().await.is_err() {
                return Err(status(
                    Code::NOT_FOUND,
                    format!(
                        "process {:?} of {} was deleted before it exited",
                        req.exec_id, req.id
                    ),
                ));
            }
        };
        Ok(WaitResponse {
            exit_status: exit.status,
            exited_at: MessageField::some(timestamp(exit.at)),
            ..Default::default()
        })
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("kill");
        let agent = {
            let st = self.inner.lock();
            let p = st.process(&req.id, &req.exec_id)?;
            match p.status() {
                Status::Stopped => return Ok(Empty::new()),
                Status::Created if !req.exec_id.is_empty() => {
                    return Err(status(
                        Code::FAILED_PRECONDITION,
                        format!("process {} was never started", req.exec_id),
                    ));
                }
                Status::Created if p.never_started() => None,
                _ => Some(st.agent(&req.id)?),
            }
        };
        let Some(agent) = agent else {
            // Nothing runs yet: as with runc's init killed before start, the task ends
            // here (its container is removed from the guest at Delete).
            if req.signal != 0 {
                info!(self.inner.log, "kill of a task never started"; "container" => &req.id, "signal" => req.signal);
                self.inner.record_exit(&req.id, "", 128 + req.signal).await;
            }
            return Ok(Empty::new());
        };
        info!(self.inner.log, "kill"; "container" => &req.id, "exec" => &req.exec_id, "signal" => req.signal, "all" => req.all);
        match agent
            .signal_process(&req.id, &req.exec_id, req.signal, req.all)
            .await
        {
            // With the VM gone the process is gone too; its exit is being reported.
            Err(e) if e.vm_gone() => Ok(Empty::new()),
            r => r.map(|()| Empty::new()).map_err(agent_err),
        }
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> Result<DeleteResponse> {
        let _timer = crate::metrics::task_timer("delete");
        let inner = &self.inner;
        if !req.exec_id.is_empty() {
            let mut st = inner.lock();
            let pid = st.task_pid();
            if matches!(
                st.process(&req.id, &req.exec_id)?.status(),
                Status::Running | Status::Paused
            ) {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("process {} is still running; kill it first", req.exec_id),
                ));
            }
            let p = st
                .container_mut(&req.id)?
                .execs
                .remove(&req.exec_id)
                .ok_or_else(|| not_found(&req.id, &req.exec_id))?;
            let exit = p.exit();
            return Ok(DeleteResponse {
                pid,
                exit_status: exit.map(|e| e.status).unwrap_or(0),
                exited_at: exit.map(|e| timestamp(e.at)).into(),
                ..Default::default()
            });
        }
        info!(inner.log, "delete"; "container" => &req.id);
        let pid = inner.lock().task_pid();
        let exit = inner.delete_container(&req.id).await?;
        let code = exit.map(|e| e.status).unwrap_or(0);
        inner
            .events
            .delete(&req.id, pid, code, exit.map(|e| e.at))
            .await;
        Ok(DeleteResponse {
            pid,
            exit_status: code,
            exited_at: MessageField::some(timestamp(
                exit.map(|e| e.at).unwrap_or_else(SystemTime::now),
            )),
            ..Default::default()
        })
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("exec");
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        // The exec's own `terminal` wins over the request's, as with runc.
        let terminal = serde_json::from_slice::<serde_json::Value>(&spec)
            .ok()
            .and_then(|v| v.get("terminal").and_then(|t| t.as_bool()))
            .unwrap_or(req.terminal);
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal,
        };
        self.inner
            .lock()
            .container_mut(&req.id)?
            .add_exec(&req.exec_id, stdio, spec)
            .map_err(|e| {
                let code = match e {
                    ExecRefused::IdInUse => Code::ALREADY_EXISTS,
                    _ => Code::FAILED_PRECONDITION,
                };
                status(
                    code,
                    format!("container {}: exec {}: {e}", req.id, req.exec_id),
                )
            })?;
        self.inner.events.exec_added(&req.id, &req.exec_id).await;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("resize_pty");
        let agent = {
            let st = self.inner.lock();
            st.process(&req.id, &req.exec_id)?;
            st.agent(&req.id)?
        };
        agent
            .tty_win_resize(&req.id, &req.exec_id, req.height, req.width)
            .await
            .map_err(agent_err)?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("close_io");
        debug!(self.inner.log, "close io"; "container" => &req.id, "exec" => &req.exec_id, "stdin" => req.stdin);
        let mut st = self.inner.lock();
        let p = st.process_mut(&req.id, &req.exec_id)?;
        if req.stdin {
            if let Some(r) = p.relays.as_mut() {
                r.close_stdin();
            }
        }
        Ok(Empty::new())
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> Result<PidsResponse> {
        let _timer = crate::metrics::task_timer("pids");
        let agent = {
            let st = self.inner.lock();
            st.container(&req.id)?;
            st.agent(&req.id)?
        };
        let pids = agent.list_processes(&req.id).await.map_err(agent_err)?;
        Ok(PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| ProcessInfo {
                    pid: pid as u32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    async fn connect(&self, _ctx: &TtrpcContext, _req: ConnectRequest) -> Result<ConnectResponse> {
        let _timer = crate::metrics::task_timer("connect");
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: self.inner.lock().task_pid(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, req: ShutdownRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("shutdown");
        let inner = &self.inner;
        let _life = inner.lifecycle.lock().await;
        let sb = {
            let mut st = inner.lock();
            if !st.is_empty() && !req.now {
                debug!(inner.log, "shutdown ignored: containers remain"; "count" => st.containers.len());
                return Ok(Empty::new());
            }
            st.containers.clear();
            st.sandbox.take()
        };
        if let Some(sb) = sb {
            inner.stop_metrics();
            sb.destroy().await;
        }
        info!(inner.log, "shim shutting down");
        inner.exit.signal();
        Ok(Empty::new())
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("pause");
        self.inner.set_paused(&req.id, true).await?;
        self.inner.events.paused(&req.id).await;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("resume");
        self.inner.set_paused(&req.id, false).await?;
        self.inner.events.resumed(&req.id).await;
        Ok(Empty::new())
    }

    async fn checkpoint(&self, _ctx: &TtrpcContext, _req: CheckpointTaskRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("checkpoint");
        Err(unimplemented(
            "checkpoint is not supported for VM sandboxes",
        ))
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> Result<Empty> {
        let _timer = crate::metrics::task_timer("update");
        let agent = {
            let st = self.inner.lock();
            st.container(&req.id)?;
            st.agent(&req.id)?
        };
        // containerd sends the OCI LinuxResources as JSON inside the Any.
        let resources = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        if resources.is_empty() {
            return Err(status(
                Code::INVALID_ARGUMENT,
                "update carries no resources",
            ));
        }
        info!(self.inner.log, "update"; "container" => &req.id);
        agent
            .update_container(&req.id, resources)
            .await
            .map_err(agent_err)?;
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> Result<StatsResponse> {
        let _timer = crate::metrics::task_timer("stats");
        let agent = {
            let st = self.inner.lock();
            st.container(&req.id)?;
            st.agent(&req.id)?
        };
        let guest = agent.stats_container(&req.id).await.map_err(agent_err)?;
        let metrics = crate::stats::metrics_from(&guest);
        let any = containerd_shim::util::convert_to_any(Box::new(metrics)).map_err(failed)?;
        Ok(StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }
}
