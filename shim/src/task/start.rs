//! Start: a container's init or an exec begins in the guest, with its stdio relays and
//! the watch on its exit.

use std::sync::Arc;

use containerd_shim_protos::api::StartRequest;
use slog::info;
use ttrpc::Code;

use super::state::{agent_err, status, Result};
use super::Inner;
use crate::io::Relays;

impl Inner {
    /// Starts container `req.id`'s init or exec `req.exec_id` in the guest, with its
    /// stdio relays and exit watch; the task pid.
    pub(super) async fn start_process(self: &Arc<Self>, req: StartRequest) -> Result<u32> {
        let (agent, pid, exec_spec, stdio) = {
            let mut st = self.lock();
            let (agent, pid) = (st.agent(&req.id)?, st.pid_of(&req.id));
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
            let mut st = self.lock();
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
                    &self.log,
                ));
            }
        }
        self.watch_exit(&req.id, &req.exec_id, agent);
        if req.exec_id.is_empty() {
            info!(self.log, "phase: container started"; "phase" => "container started", "container" => &req.id);
            if req.id == self.sandbox_id {
                kata_sandbox::metrics::METRICS.phase("sandbox_started");
            }
            self.events.start(&req.id, pid).await;
        } else {
            self.events.exec_started(&req.id, &req.exec_id, pid).await;
        }
        Ok(pid)
    }
}
