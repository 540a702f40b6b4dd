//! containerd's Task API (v2) for a VM sandbox: one method per RPC, each looking up the
//! container and process under the state lock (briefly, never across an await) and
//! delegating to the sandbox, the agent or the relays.
//!
//! Only the sandbox's birth and death take the `lifecycle` lock (held across a VM boot):
//! a container created in a running sandbox, a delete that leaves the sandbox running,
//! State, Connect, Kill, Wait and exit reporting never wait for it. A request about a
//! container whose create is under way waits for that create alone (`Inner::settled`):
//! NOT_FOUND means nothing of that id exists.
//!
//! The RPCs that change the sandbox run to completion whatever happens to their caller,
//! and a daemon nobody can reach any more ends on its own (see `reach`). The files:
//! `create.rs`, `start.rs`, `delete.rs` (the longer RPCs), `state.rs` (what the service
//! knows, and its lookups), `watch.rs` (exits, OOM kills, the VM's end), `reach.rs`.

mod create;
mod delete;
mod reach;
mod start;
mod state;
#[cfg(test)]
mod tests;
mod watch;

pub use create::mount_rootfs;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::TtrpcContext;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use slog::{debug, info, Logger};
use ttrpc::Code;

use crate::container::{ExecRefused, Status};
use crate::events::{timestamp, Events};
use crate::io::StdioPaths;
use crate::launch::Launcher;
use kata_sandbox::sandbox::UpdateError;
use reach::{to_completion, Contact};
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
    metrics: Mutex<Option<kata_sandbox::metrics::server::MetricsServer>>,
    /// Who reached the daemon last, for its end when nobody can (see `reach`).
    contact: Contact,
    /// Bumped whenever a create settles (done or undone), for requests waiting on it.
    settled: tokio::sync::watch::Sender<u64>,
    /// Set once the daemon is ending: no sandbox is booted any more.
    ending: AtomicBool,
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
                contact: Contact::new(Instant::now()),
                settled: tokio::sync::watch::channel(0).0,
                ending: AtomicBool::new(false),
            }),
        }
    }

    /// Ends the daemon, undoing its sandbox, once nobody can reach it any more (see
    /// `reach`); `bundle` is the daemon's bundle directory.
    pub fn end_when_unreached(&self, bundle: Option<PathBuf>) {
        self.inner.end_when_unreached(bundle);
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

    /// A request `rpc` came in: its timer, and someone reaches the daemon.
    fn request(&self, rpc: &'static str) -> Option<kata_sandbox::metrics::TaskTimer> {
        self.contact.heard();
        kata_sandbox::metrics::task_timer(rpc)
    }

    /// Waits until no create of `cid` is under way, so that a request about it answers
    /// from what the create made: NOT_FOUND only when nothing of that id exists.
    async fn settled(&self, cid: &str) {
        let mut changes = self.settled.subscribe();
        while self.lock().creating.contains(cid) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Ends every container and the sandbox, and the daemon with them (Shutdown, and
    /// the end of a daemon nobody reaches). The caller holds the lifecycle lock.
    async fn end_locked(&self) {
        self.ending.store(true, Ordering::SeqCst);
        let sb = {
            let mut st = self.lock();
            st.containers.clear();
            st.sandbox.take()
        };
        if let Some(sb) = sb {
            self.stop_metrics();
            sb.destroy().await;
        }
        info!(self.log, "shim shutting down");
        self.exit.signal();
    }

    /// Serves the sandbox's metrics on its `shim-monitor.sock`, in the state directory a
    /// VM sandbox keeps (none for sandboxes without one, as in unit tests). Without it the
    /// sandbox runs on; only its metrics are missing, which the log says.
    fn serve_metrics(self: &Arc<Self>) {
        if !kata_sandbox::persist::state_dir(&self.sandbox_id).is_dir() {
            return;
        }
        let inner = Arc::downgrade(self);
        let source: kata_sandbox::metrics::SandboxSource =
            Arc::new(move || inner.upgrade().and_then(|i| i.lock().sandbox.clone()));
        let path = kata_sandbox::metrics::server::socket_path(&self.sandbox_id);
        let mut slot = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        // A sandbox booted anew replaces the server of the one before.
        slot.take();
        match kata_sandbox::metrics::server::start(&path, source) {
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
        let _timer = self.inner.request("create");
        info!(self.inner.log, "create"; "container" => &req.id, "bundle" => &req.bundle);
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(unimplemented(
                "restoring a checkpoint is not supported for VM sandboxes",
            ));
        }
        let inner = self.inner.clone();
        let pid = to_completion(&self.inner, "create", async move {
            inner.create_container(&req).await
        })
        .await?;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> Result<StartResponse> {
        let _timer = self.inner.request("start");
        self.inner.settled(&req.id).await;
        let inner = self.inner.clone();
        let pid = to_completion(&self.inner, "start", async move {
            inner.start_process(req).await
        })
        .await?;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> Result<StateResponse> {
        let _timer = self.inner.request("state");
        self.inner.settled(&req.id).await;
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
            pid: st.pid_of(&req.id),
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
        let _timer = self.inner.request("wait");
        self.inner.settled(&req.id).await;
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
        let _timer = self.inner.request("kill");
        self.inner.settled(&req.id).await;
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
        let _timer = self.inner.request("delete");
        self.inner.settled(&req.id).await;
        let inner = self.inner.clone();
        to_completion(&self.inner, "delete", async move {
            inner.delete_request(req).await
        })
        .await
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> Result<Empty> {
        let _timer = self.inner.request("exec");
        self.inner.settled(&req.id).await;
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
        let _timer = self.inner.request("resize_pty");
        self.inner.settled(&req.id).await;
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
        let _timer = self.inner.request("close_io");
        self.inner.settled(&req.id).await;
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
        let _timer = self.inner.request("pids");
        self.inner.settled(&req.id).await;
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

    async fn connect(&self, _ctx: &TtrpcContext, req: ConnectRequest) -> Result<ConnectResponse> {
        let _timer = self.inner.request("connect");
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: self.inner.lock().pid_of(&req.id),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, req: ShutdownRequest) -> Result<Empty> {
        let _timer = self.inner.request("shutdown");
        let inner = self.inner.clone();
        to_completion(&self.inner, "shutdown", async move {
            let _life = inner.lifecycle.lock().await;
            let count = inner.lock().containers.len();
            if !inner.lock().is_empty() && !req.now {
                debug!(inner.log, "shutdown ignored: containers remain"; "count" => count);
                return Ok(());
            }
            inner.end_locked().await;
            Ok(())
        })
        .await?;
        Ok(Empty::new())
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> Result<Empty> {
        let _timer = self.inner.request("pause");
        self.inner.settled(&req.id).await;
        let inner = self.inner.clone();
        to_completion(&self.inner, "pause", async move {
            inner.set_paused(&req.id, true).await?;
            inner.events.paused(&req.id).await;
            Ok(())
        })
        .await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> Result<Empty> {
        let _timer = self.inner.request("resume");
        self.inner.settled(&req.id).await;
        let inner = self.inner.clone();
        to_completion(&self.inner, "resume", async move {
            inner.set_paused(&req.id, false).await?;
            inner.events.resumed(&req.id).await;
            Ok(())
        })
        .await?;
        Ok(Empty::new())
    }

    async fn checkpoint(&self, _ctx: &TtrpcContext, _req: CheckpointTaskRequest) -> Result<Empty> {
        let _timer = self.inner.request("checkpoint");
        Err(unimplemented(
            "checkpoint is not supported for VM sandboxes",
        ))
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> Result<Empty> {
        let _timer = self.inner.request("update");
        self.inner.settled(&req.id).await;
        let (sandbox, members) = {
            let st = self.inner.lock();
            st.container(&req.id)?;
            let sandbox = st.sandbox.clone().ok_or_else(|| not_found(&req.id, ""))?;
            let members: Vec<_> = st
                .containers
                .iter()
                .map(|(id, c)| (id.clone(), c.bundle.clone(), c.given))
                .collect();
            (sandbox, members)
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
        let members: Vec<_> = members
            .iter()
            .map(|(id, bundle, given)| kata_sandbox::resize::Member {
                id,
                bundle,
                given: *given,
            })
            .collect();
        info!(self.inner.log, "update"; "container" => &req.id);
        let limits = sandbox
            .update_container(&req.id, resources, &members)
            .await
            .map_err(|e| match e {
                UpdateError::Refused(_) | UpdateError::Grow(_) => {
                    status(Code::FAILED_PRECONDITION, e.to_string())
                }
                UpdateError::Agent(e) => agent_err(e),
                UpdateError::Shrink(_) => status(Code::INTERNAL, e.to_string()),
            })?;
        if let Some(c) = self.inner.lock().containers.get_mut(&req.id) {
            c.given = Some(limits);
        }
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> Result<StatsResponse> {
        let _timer = self.inner.request("stats");
        self.inner.settled(&req.id).await;
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
