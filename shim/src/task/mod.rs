//! containerd's Task API (v2) for a VM sandbox: one method per RPC, each looking up the
//! container and process and delegating to the sandbox, the agent or the relays.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::TtrpcContext;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use slog::{debug, info, warn, Logger};
use tokio::sync::Mutex;
use ttrpc::{Code, Error as TtrpcError};

use crate::agent::Agent;
use crate::container::{self, Container, Exit, Process, Status};
use crate::events::{timestamp, Events};
use crate::io::{Relays, StdioPaths};
use crate::log::DebugSwitch;
use crate::sandbox::Sandbox;
use crate::spec;

type Result<T> = std::result::Result<T, TtrpcError>;

fn status(code: Code, msg: impl Into<String>) -> TtrpcError {
    TtrpcError::RpcStatus(ttrpc::get_status(code, msg.into()))
}

fn not_found(cid: &str, exec_id: &str) -> TtrpcError {
    if exec_id.is_empty() {
        status(
            Code::NOT_FOUND,
            format!("container {cid} not found in this sandbox"),
        )
    } else {
        status(
            Code::NOT_FOUND,
            format!("process {exec_id} of container {cid} not found"),
        )
    }
}

fn failed(e: impl std::fmt::Display) -> TtrpcError {
    status(Code::INTERNAL, e.to_string())
}

/// Maps an agent error to the gRPC code the guest gave, keeping its message.
fn agent_err(e: crate::agent::AgentError) -> TtrpcError {
    if let crate::agent::AgentError::Rpc {
        op,
        source: TtrpcError::RpcStatus(st),
    } = &e
    {
        return status(st.code(), format!("{op}: {}", st.message()));
    }
    failed(e)
}

#[derive(Default)]
struct State {
    sandbox: Option<Sandbox>,
    containers: HashMap<String, Container>,
}

/// Lookups that answer containerd's NOT_FOUND when the id is unknown.
impl State {
    fn container(&self, cid: &str) -> Result<&Container> {
        self.containers.get(cid).ok_or_else(|| not_found(cid, ""))
    }

    fn container_mut(&mut self, cid: &str) -> Result<&mut Container> {
        self.containers
            .get_mut(cid)
            .ok_or_else(|| not_found(cid, ""))
    }

    fn process(&self, cid: &str, exec_id: &str) -> Result<&Process> {
        self.container(cid)?
            .process(exec_id)
            .ok_or_else(|| not_found(cid, exec_id))
    }

    fn process_mut(&mut self, cid: &str, exec_id: &str) -> Result<&mut Process> {
        self.container_mut(cid)?
            .process_mut(exec_id)
            .ok_or_else(|| not_found(cid, exec_id))
    }

    /// The agent, for a request about container `cid`.
    fn agent(&self, cid: &str) -> Result<Agent> {
        self.sandbox
            .as_ref()
            .map(|s| s.agent.clone())
            .ok_or_else(|| not_found(cid, ""))
    }

    fn task_pid(&self) -> u32 {
        self.sandbox.as_ref().map(|s| s.task_pid()).unwrap_or(0)
    }
}

fn unimplemented(what: &str) -> TtrpcError {
    status(Code::UNIMPLEMENTED, what)
}

pub struct TaskService {
    sandbox_id: String,
    state: Arc<Mutex<State>>,
    events: Arc<Events>,
    exit: Arc<ExitSignal>,
    log: Logger,
    debug: DebugSwitch,
}

impl TaskService {
    pub fn new(
        sandbox_id: &str,
        events: Events,
        exit: Arc<ExitSignal>,
        log: Logger,
        debug: DebugSwitch,
    ) -> Self {
        TaskService {
            sandbox_id: sandbox_id.to_string(),
            state: Arc::new(Mutex::new(State::default())),
            events: Arc::new(events),
            exit,
            log,
            debug,
        }
    }

    /// Freezes or thaws container `cid` in the guest and records it.
    async fn set_paused(&self, cid: &str, pause: bool) -> Result<()> {
        let mut st = self.state.lock().await;
        let agent = st.agent(cid)?;
        let init = &mut st.container_mut(cid)?.init;
        let (from, to) = if pause {
            (Status::Running, Status::Paused)
        } else {
            (Status::Paused, Status::Running)
        };
        if init.status != from {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!("container {cid} is {:?}, not {from:?}", init.status).to_lowercase(),
            ));
        }
        let res = if pause {
            agent.pause_container(cid).await
        } else {
            agent.resume_container(cid).await
        };
        res.map_err(agent_err)?;
        init.status = to;
        info!(self.log, "{}", if pause { "paused" } else { "resumed" }; "container" => cid);
        Ok(())
    }

    /// Publishes TaskOOM for every OOM kill the guest reports, for the sandbox's life.
    fn watch_oom(&self, agent: Agent) {
        let (events, log) = (self.events.clone(), self.log.clone());
        tokio::spawn(async move {
            loop {
                match agent.get_oom_event().await {
                    Ok(cid) => {
                        info!(log, "OOM kill in the guest"; "container" => &cid);
                        events.oom(&cid).await;
                    }
                    Err(e) => {
                        debug!(log, "OOM watch ended"; "error" => %e);
                        return;
                    }
                }
            }
        });
    }

    /// Watches a started process: waits for its exit in the guest and for the end of its
    /// output, records the exit, then tells containerd.
    fn watch_exit(&self, cid: &str, exec_id: &str) {
        let (state, events, log) = (self.state.clone(), self.events.clone(), self.log.clone());
        let (cid, exec_id) = (cid.to_string(), exec_id.to_string());
        tokio::spawn(async move {
            let agent = {
                let st = state.lock().await;
                match &st.sandbox {
                    Some(sb) => sb.agent.clone(),
                    None => return,
                }
            };
            let code = match agent.wait_process(&cid, &exec_id).await {
                Ok(s) => s as u32,
                Err(e) => {
                    warn!(log, "waiting for the process failed; reporting exit 255"; "container" => &cid, "exec" => &exec_id, "error" => %e);
                    255
                }
            };
            // Take the relays out so their output can finish without the lock held.
            let relays = {
                let mut st = state.lock().await;
                st.containers
                    .get_mut(&cid)
                    .and_then(|c| c.process_mut(&exec_id))
                    .and_then(|p| p.relays.take())
            };
            if let Some(mut r) = relays {
                r.wait_outputs().await;
                r.stop_stdin();
            }
            let at = SystemTime::now();
            let pid = {
                let mut st = state.lock().await;
                let pid = st.task_pid();
                if let Some(p) = st
                    .containers
                    .get_mut(&cid)
                    .and_then(|c| c.process_mut(&exec_id))
                {
                    p.status = Status::Stopped;
                    p.exit_tx.send_replace(Some(Exit { status: code, at }));
                }
                pid
            };
            info!(log, "process exited"; "container" => &cid, "exec" => &exec_id, "status" => code);
            events.exit(&cid, &exec_id, pid, code, at).await;
        });
    }

    async fn create_container(&self, req: &CreateTaskRequest) -> Result<u32> {
        let t0 = Instant::now();
        let bundle = PathBuf::from(&req.bundle);
        let spec_path = bundle.join("config.json");
        let text = std::fs::read(&spec_path).map_err(|e| {
            status(
                Code::INVALID_ARGUMENT,
                format!("reading {}: {e}", spec_path.display()),
            )
        })?;
        let mut spec: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            status(
                Code::INVALID_ARGUMENT,
                format!("{}: {e}", spec_path.display()),
            )
        })?;
        let sandbox_id = spec::sandbox_of(&spec, &req.id);
        if sandbox_id != self.sandbox_id {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!(
                    "container {} belongs to sandbox {sandbox_id}, but this shim serves sandbox {}",
                    req.id, self.sandbox_id
                ),
            ));
        }
        let binds = spec::rewrite_for_guest(&mut spec, &req.id)
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

        let mut st = self.state.lock().await;
        if st.containers.contains_key(&req.id) {
            return Err(status(
                Code::ALREADY_EXISTS,
                format!("container {} already exists", req.id),
            ));
        }
        let first = st.sandbox.is_none();
        if first {
            if req.id != self.sandbox_id {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!(
                        "sandbox {} is not running: create its sandbox container first",
                        self.sandbox_id
                    ),
                ));
            }
            let cfg = kata_config::Config::load()
                .map_err(|e| status(Code::FAILED_PRECONDITION, e.to_string()))?;
            cfg.validate_paths()
                .map_err(|e| status(Code::FAILED_PRECONDITION, e.to_string()))?;
            self.debug.set(cfg.runtime.enable_debug);
            debug!(self.log, "phase: shim start"; "elapsed_ms" => 0u64, "container" => &req.id);
            let sb = Sandbox::create(&self.sandbox_id, &cfg, &self.log)
                .await
                .map_err(|e| {
                    status(
                        Code::UNKNOWN,
                        format!("creating VM sandbox {}: {e}", self.sandbox_id),
                    )
                })?;
            self.watch_oom(sb.agent.clone());
            st.sandbox = Some(sb);
        }
        let result = self
            .create_in_sandbox(&mut st, req, &bundle, &spec, &binds, stdio.clone())
            .await;
        match result {
            Ok(pid) => {
                debug!(self.log, "phase: container created"; "elapsed_ms" => t0.elapsed().as_millis() as u64, "container" => &req.id);
                drop(st);
                self.events.create(&req.id, &req.bundle, &stdio, pid).await;
                Ok(pid)
            }
            Err(e) => {
                if first && st.containers.is_empty() {
                    if let Some(sb) = st.sandbox.take() {
                        sb.destroy().await;
                    }
                }
                Err(e)
            }
        }
    }

    async fn create_in_sandbox(
        &self,
        st: &mut State,
        req: &CreateTaskRequest,
        bundle: &std::path::Path,
        spec: &serde_json::Value,
        binds: &[spec::HostBind],
        stdio: StdioPaths,
    ) -> Result<u32> {
        let sb = st
            .sandbox
            .as_mut()
            .ok_or_else(|| failed("sandbox vanished"))?;
        let share_dir = sb.shared.mounts.join(&req.id);
        let mounts = container::setup_host_mounts(bundle, &req.rootfs, &share_dir, binds)
            .await
            .map_err(|e| status(Code::INVALID_ARGUMENT, e.to_string()))?;
        sb.state.mounts.extend(mounts.iter().cloned());
        sb.state.containers.push(req.id.clone());
        sb.save();
        let spec_bytes = serde_json::to_vec(spec).map_err(failed)?;
        if let Err(e) = sb
            .agent
            .create_container(&req.id, spec_bytes, !stdio.stdin.is_empty())
            .await
        {
            container::teardown_host_mounts(&mounts, &share_dir);
            sb.state.mounts.retain(|m| !mounts.contains(m));
            sb.state.containers.retain(|c| c != &req.id);
            sb.save();
            return Err(agent_err(e));
        }
        let mut init = Process::new(stdio.clone(), None);
        init.relays = Some(Relays::start(&sb.agent, &req.id, "", &stdio, &self.log));
        let pid = sb.task_pid();
        st.containers.insert(
            req.id.clone(),
            Container {
                bundle: bundle.to_path_buf(),
                mounts,
                share_dir,
                init,
                execs: HashMap::new(),
            },
        );
        Ok(pid)
    }

    /// Removes container `cid` from the guest and the host; ends the sandbox when it was
    /// the last one.
    async fn delete_container(&self, st: &mut State, cid: &str) -> Result<Option<Exit>> {
        let c = st
            .containers
            .remove(cid)
            .ok_or_else(|| not_found(cid, ""))?;
        let exit = c.init.exit();
        if let Some(sb) = st.sandbox.as_mut() {
            if let Err(e) = sb.agent.remove_container(cid).await {
                warn!(self.log, "removing the container in the guest"; "container" => cid, "error" => %e);
            }
            container::teardown_host_mounts(&c.mounts, &c.share_dir);
            sb.state.mounts.retain(|m| !c.mounts.contains(m));
            sb.state.containers.retain(|x| x != cid);
            sb.save();
        }
        drop(c);
        if st.containers.is_empty() {
            if let Some(sb) = st.sandbox.take() {
                sb.destroy().await;
            }
        }
        Ok(exit)
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
        info!(self.log, "create"; "container" => &req.id, "bundle" => &req.bundle);
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(unimplemented(
                "restoring a checkpoint is not supported for VM sandboxes",
            ));
        }
        let pid = self.create_container(&req).await?;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> Result<StartResponse> {
        let mut st = self.state.lock().await;
        let (agent, pid) = (st.agent(&req.id)?, st.task_pid());
        let p = st.process_mut(&req.id, &req.exec_id)?;
        if p.status != Status::Created {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!(
                    "process {:?} of {} was already started",
                    req.exec_id, req.id
                ),
            ));
        }
        let started = if req.exec_id.is_empty() {
            agent.start_container(&req.id).await
        } else {
            let spec = p.spec.clone().unwrap_or_default();
            let r = agent
                .exec_process(&req.id, &req.exec_id, spec, !p.stdio.stdin.is_empty())
                .await;
            if r.is_ok() {
                p.relays = Some(Relays::start(
                    &agent,
                    &req.id,
                    &req.exec_id,
                    &p.stdio,
                    &self.log,
                ));
            }
            r
        };
        if let Err(e) = started {
            // As with runc, a process that failed to start is stopped, so that containerd
            // can delete it (it refuses to delete a task that looks merely created).
            p.status = Status::Stopped;
            p.relays = None;
            p.exit_tx.send_replace(Some(Exit {
                status: 255,
                at: SystemTime::now(),
            }));
            return Err(agent_err(e));
        }
        p.status = Status::Running;
        drop(st);
        self.watch_exit(&req.id, &req.exec_id);
        if req.exec_id.is_empty() {
            info!(self.log, "phase: container started"; "container" => &req.id);
            self.events.start(&req.id, pid).await;
        } else {
            self.events.exec_started(&req.id, &req.exec_id, pid).await;
        }
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> Result<StateResponse> {
        let st = self.state.lock().await;
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
            status: proc_status(p.status).into(),
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
        let mut rx = {
            let st = self.state.lock().await;
            st.process(&req.id, &req.exec_id)?.exit_tx.subscribe()
        };
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
        let st = self.state.lock().await;
        let agent = st.agent(&req.id)?;
        match st.process(&req.id, &req.exec_id)?.status {
            Status::Stopped => return Ok(Empty::new()),
            Status::Created if !req.exec_id.is_empty() => {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("process {} was never started", req.exec_id),
                ));
            }
            _ => {}
        }
        drop(st);
        info!(self.log, "kill"; "container" => &req.id, "exec" => &req.exec_id, "signal" => req.signal, "all" => req.all);
        agent
            .signal_process(&req.id, &req.exec_id, req.signal, req.all)
            .await
            .map_err(agent_err)?;
        Ok(Empty::new())
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> Result<DeleteResponse> {
        let mut st = self.state.lock().await;
        let pid = st.task_pid();
        if !req.exec_id.is_empty() {
            if matches!(
                st.process(&req.id, &req.exec_id)?.status,
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
        let c = st.container(&req.id)?;
        if matches!(c.init.status, Status::Running | Status::Paused) {
            return Err(status(
                Code::FAILED_PRECONDITION,
                format!("container {} is still running; kill it first", req.id),
            ));
        }
        info!(self.log, "delete"; "container" => &req.id);
        let exit = self.delete_container(&mut st, &req.id).await?;
        drop(st);
        let code = exit.map(|e| e.status).unwrap_or(0);
        self.events
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
        let mut st = self.state.lock().await;
        let c = st.container_mut(&req.id)?;
        match c.init.status {
            Status::Running => {}
            Status::Paused => {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("container {} is paused: resume it before exec", req.id),
                ));
            }
            _ => {
                return Err(status(
                    Code::FAILED_PRECONDITION,
                    format!("container {} is not running", req.id),
                ));
            }
        }
        if c.execs.contains_key(&req.exec_id) {
            return Err(status(
                Code::ALREADY_EXISTS,
                format!(
                    "exec id {} is already in use in container {}",
                    req.exec_id, req.id
                ),
            ));
        }
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
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
        c.execs
            .insert(req.exec_id.clone(), Process::new(stdio, Some(spec)));
        drop(st);
        self.events.exec_added(&req.id, &req.exec_id).await;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> Result<Empty> {
        let agent = {
            let st = self.state.lock().await;
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
        let mut st = self.state.lock().await;
        let p = st.process_mut(&req.id, &req.exec_id)?;
        if req.stdin {
            if let Some(r) = p.relays.as_mut() {
                r.close_stdin();
            }
        }
        Ok(Empty::new())
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> Result<PidsResponse> {
        let agent = {
            let st = self.state.lock().await;
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
        let st = self.state.lock().await;
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: st.task_pid(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, req: ShutdownRequest) -> Result<Empty> {
        let mut st = self.state.lock().await;
        if !st.containers.is_empty() && !req.now {
            debug!(self.log, "shutdown ignored: containers remain"; "count" => st.containers.len());
            return Ok(Empty::new());
        }
        if let Some(sb) = st.sandbox.take() {
            sb.destroy().await;
        }
        st.containers.clear();
        info!(self.log, "shim shutting down");
        self.exit.signal();
        Ok(Empty::new())
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> Result<Empty> {
        self.set_paused(&req.id, true).await?;
        self.events.paused(&req.id).await;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> Result<Empty> {
        self.set_paused(&req.id, false).await?;
        self.events.resumed(&req.id).await;
        Ok(Empty::new())
    }

    async fn checkpoint(&self, _ctx: &TtrpcContext, _req: CheckpointTaskRequest) -> Result<Empty> {
        Err(unimplemented(
            "checkpoint is not supported for VM sandboxes",
        ))
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> Result<Empty> {
        let agent = {
            let st = self.state.lock().await;
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
        info!(self.log, "update"; "container" => &req.id);
        agent
            .update_container(&req.id, resources)
            .await
            .map_err(agent_err)?;
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> Result<StatsResponse> {
        let agent = {
            let st = self.state.lock().await;
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
