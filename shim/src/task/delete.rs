//! Delete: an exec's record, or a container from the guest and the host, and the
//! sandbox with the last container.

use std::sync::Arc;
use std::time::SystemTime;

use containerd_shim_protos::api::{DeleteRequest, DeleteResponse};
use containerd_shim_protos::protobuf::MessageField;
use slog::info;
use ttrpc::Code;

use super::state::{not_found, status, Result};
use super::Inner;
use crate::container::{Exit, Status};
use crate::events::timestamp;
use kata_sandbox::sandbox::Sandbox;

impl Inner {
    /// Removes exec `req.exec_id`, or container `req.id` (and the sandbox with the last).
    pub(super) async fn delete_request(
        self: &Arc<Self>,
        req: DeleteRequest,
    ) -> Result<DeleteResponse> {
        if !req.exec_id.is_empty() {
            let mut st = self.lock();
            let pid = st.pid_of(&req.id);
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
        info!(self.log, "delete"; "container" => &req.id);
        let pid = self.lock().pid_of(&req.id);
        let exit = self.delete_container(&req.id).await?;
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
