//! What the Task service knows of its sandbox, containers and processes, with the
//! lookups and error replies every RPC shares. Held under a plain mutex, never across an
//! await: nothing slow happens while it is locked.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ttrpc::{Code, Error as TtrpcError};

use crate::container::{Container, Process};
use agent_client::{Agent, AgentError};
use kata_sandbox::sandbox::Sandbox;

pub type Result<T> = std::result::Result<T, TtrpcError>;

pub fn status(code: Code, msg: impl Into<String>) -> TtrpcError {
    TtrpcError::RpcStatus(ttrpc::get_status(code, msg.into()))
}

pub fn not_found(cid: &str, exec_id: &str) -> TtrpcError {
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

pub fn failed(e: impl std::fmt::Display) -> TtrpcError {
    status(Code::INTERNAL, e.to_string())
}

pub fn unimplemented(what: &str) -> TtrpcError {
    status(Code::UNIMPLEMENTED, what)
}

/// Maps an agent error to a gRPC code a caller can act on, keeping its message: the
/// guest's own code for a refused request, UNAVAILABLE once the VM is gone,
/// DEADLINE_EXCEEDED for a request the guest did not answer in time.
pub fn agent_err(e: AgentError) -> TtrpcError {
    match &e {
        AgentError::Rpc {
            op,
            source: TtrpcError::RpcStatus(st),
        } => status(st.code(), format!("{op}: {}", st.message())),
        AgentError::VmGone { .. } => status(Code::UNAVAILABLE, e.to_string()),
        AgentError::Timeout { .. } => status(Code::DEADLINE_EXCEEDED, e.to_string()),
        _ => failed(e),
    }
}

#[derive(Default)]
pub struct State {
    pub sandbox: Option<Arc<Sandbox>>,
    pub containers: HashMap<String, Container>,
    /// Containers whose create is under way (not yet in `containers`).
    pub creating: HashSet<String>,
    /// Containers told (TaskOOM, termination message) that the host's OOM killer ended
    /// their VM.
    pub oom_told: HashSet<String>,
}

impl State {
    pub fn container(&self, cid: &str) -> Result<&Container> {
        self.containers.get(cid).ok_or_else(|| not_found(cid, ""))
    }

    pub fn container_mut(&mut self, cid: &str) -> Result<&mut Container> {
        self.containers
            .get_mut(cid)
            .ok_or_else(|| not_found(cid, ""))
    }

    pub fn process(&self, cid: &str, exec_id: &str) -> Result<&Process> {
        self.container(cid)?
            .process(exec_id)
            .ok_or_else(|| not_found(cid, exec_id))
    }

    pub fn process_mut(&mut self, cid: &str, exec_id: &str) -> Result<&mut Process> {
        self.container_mut(cid)?
            .process_mut(exec_id)
            .ok_or_else(|| not_found(cid, exec_id))
    }

    /// The agent, for a request about container `cid`.
    pub fn agent(&self, cid: &str) -> Result<Arc<dyn Agent>> {
        self.sandbox
            .as_ref()
            .map(|s| s.agent())
            .ok_or_else(|| not_found(cid, ""))
    }

    pub fn task_pid(&self) -> u32 {
        self.sandbox.as_ref().map(|s| s.task_pid()).unwrap_or(0)
    }

    /// The host pid container `cid` (and each of its processes) reports: its anchor's,
    /// else the VMM's.
    pub fn pid_of(&self, cid: &str) -> u32 {
        self.containers
            .get(cid)
            .and_then(|c| c.anchor.as_ref())
            .map_or_else(|| self.task_pid(), |a| a.pid())
    }

    /// The containers by the host pid they report, for specs that name a container's
    /// namespaces by it (`/proc/<pid>/ns/<type>`); the VMM's pid is the pod's, not here.
    pub fn peers(&self) -> HashMap<u32, String> {
        self.containers
            .iter()
            .filter_map(|(id, c)| c.anchor.as_ref().map(|a| (a.pid(), id.clone())))
            .collect()
    }

    /// Whether the sandbox can be ended: no container left and none being created.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.creating.is_empty()
    }
}
