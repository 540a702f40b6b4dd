//! A container's new resources (containerd's Update, an in-place pod resize) and the VM's
//! size that follows them: refused past what the VM can become, else the VM grows before
//! the container's limits rise in the guest and shrinks after they fall ([`crate::resize`]
//! plans it).

use slog::info;

use super::Sandbox;
use crate::resize::{self, Change, Limits, Member, Needed, Plan, Room};
use agent_client::AgentError;

/// Why an update was not applied (or, for [`UpdateError::Shrink`], not all of it).
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The update asks for more than the VM can become: nothing was changed.
    #[error(transparent)]
    Refused(#[from] resize::Refused),
    /// The VM could not grow to what the update needs: nothing was changed in the guest.
    #[error("{0}")]
    Grow(String),
    /// The agent refused or failed the guest's cgroup update.
    #[error(transparent)]
    Agent(AgentError),
    /// The container's new limits are set, but the VM kept its larger size.
    #[error("{0}")]
    Shrink(String),
}

impl Sandbox {
    /// Gives container `id` the OCI `LinuxResources` (JSON) of `resources`; `members` are
    /// the sandbox's containers with what each was given so far. Returns the limits the
    /// container now has.
    pub async fn update_container(
        &self,
        id: &str,
        resources: Vec<u8>,
        members: &[Member<'_>],
    ) -> Result<Limits, UpdateError> {
        let limits = resize::limits_of(&resources);
        let plan = resize::check(id, limits, members, self.room())?;
        if let Some(plan) = &plan {
            self.resize_vm(plan.grow())
                .await
                .map_err(UpdateError::Grow)?;
        }
        self.agent
            .update_container(id, resources)
            .await
            .map_err(UpdateError::Agent)?;
        if let Some(plan) = plan {
            self.resize_vm(plan.shrink())
                .await
                .map_err(UpdateError::Shrink)?;
            self.resized(&plan);
            crate::metrics::METRICS.set_vm_size(plan.to.vcpus, plan.to.memory_mib as u32);
        }
        Ok(limits)
    }

    /// Moves the VM to `change`: the agent brings vCPUs online or offline, the hypervisor
    /// gives the pod memory or takes it back.
    async fn resize_vm(&self, change: Change) -> Result<(), String> {
        if change.is_empty() {
            return Ok(());
        }
        if let Some(n) = change.vcpus {
            let online = self
                .agent
                .set_online_cpus(n)
                .await
                .map_err(|e| format!("bringing the VM to {n} vCPUs: {e}"))?;
            if online != n {
                return Err(format!(
                    "bringing the VM to {n} vCPUs: the guest has {online} online"
                ));
            }
        }
        if let Some(mib) = change.memory_mib {
            let mut vm = self.vm.lock().await;
            let Some(vm) = vm.as_mut() else {
                return Err("the VM is not running".into());
            };
            vm.resize_memory(mib)
                .await
                .map_err(|e| format!("giving the pod {mib} MiB of the VM: {e}"))?;
        }
        info!(self.log, "VM resized"; "vcpus" => change.vcpus, "memory_mib" => change.memory_mib);
        Ok(())
    }

    /// Records what the VM may become on a resize; it is its boot size now.
    pub fn set_room(&self, room: Room) {
        let now = room.boot_size();
        *self.room.lock().unwrap_or_else(|e| e.into_inner()) = Some((room, now));
    }

    /// What the VM may become, and its size now (None: it cannot be resized).
    pub fn room(&self) -> Option<(Room, Needed)> {
        self.room.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the VM's size after a resize.
    fn resized(&self, plan: &Plan) {
        if let Some((_, now)) = self.room.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            *now = plan.to;
        }
        // What an OOM kill of the VMM is measured against from now on.
        let mut pod = self.pod_memory.lock().unwrap_or_else(|e| e.into_inner());
        pod.vm_mib = plan.to.memory_mib;
        pod.limits_bytes = plan.pod.memory_mib.map_or(0, |m| m << 20);
    }
}
