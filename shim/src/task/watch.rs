//! What the Task service watches in the background for a sandbox: each started
//! process's exit, OOM kills, and the end of the VM itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{debug, info, warn};

use super::Inner;
use crate::ratelimit::{clip, PerKey};
use agent_client::Agent;
use kata_sandbox::sandbox::Sandbox;

/// The exit status reported for every process of a sandbox whose VM died: the guest can
/// no longer say how they ended (as runc reports for a process it lost).
pub const VM_GONE_EXIT_STATUS: u32 = 255;

/// The exit status of every process of a sandbox whose VMM the host's OOM killer killed
/// in the pod's cgroup: 128 + SIGKILL, as for a container the kernel OOM-killed.
pub const OOM_KILLED_EXIT_STATUS: u32 = 137;

/// How long a process whose wait failed waits for the watchdog to say how the VM ended
/// (it notices within milliseconds; the agent's connection may break first).
const END_NOTICE: Duration = Duration::from_secs(3);

/// At most one TaskOOM per container per period.
pub const OOM_EVENT_PERIOD: Duration = Duration::from_secs(1);
/// How much of an id the guest sent a log line quotes.
const LOGGED_ID_BYTES: usize = 128;

/// How long an exited process's output may take to end before its exit is reported
/// anyway.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

impl Inner {
    /// Publishes TaskOOM for the OOM kills the guest reports, for the sandbox's life: only
    /// for this sandbox's own containers, and at most once per container per
    /// [`OOM_EVENT_PERIOD`] (the guest decides how often it reports; containerd and the
    /// shim's log must not follow). What is not published is counted and logged.
    pub(super) fn watch_oom(self: &Arc<Self>, agent: Arc<dyn Agent>) {
        let inner = self.clone();
        tokio::spawn(async move {
            let mut per_container = PerKey::new(OOM_EVENT_PERIOD);
            let mut unknown = PerKey::new(OOM_EVENT_PERIOD);
            loop {
                let cid = match agent.get_oom_event().await {
                    Ok(cid) => cid,
                    Err(e) => {
                        let dropped = per_container.take_dropped();
                        debug!(inner.log, "OOM watch ended"; "error" => %e,
                            "oom_events_not_published" => format!("{dropped:?}"));
                        return;
                    }
                };
                kata_sandbox::metrics::METRICS.oom_event();
                let now = Instant::now();
                if !inner.lock().containers.contains_key(&cid) {
                    if let Some(more) = unknown.admit("", now) {
                        warn!(inner.log, "the guest reported an OOM kill in a container this \
                            sandbox does not have; not published";
                            "container" => clip(&cid, LOGGED_ID_BYTES),
                            "more_since_last_warning" => more);
                    }
                    continue;
                }
                if let Some(dropped) = per_container.admit(&cid, now) {
                    info!(inner.log, "OOM kill in the guest"; "container" => &cid,
                        "not_published_since_last" => dropped);
                    inner.events.oom(&cid).await;
                }
            }
        });
    }

    /// Watches a started process: waits for its exit in the guest and for the end of its
    /// output, records the exit, then tells containerd. When the VM dies the wait fails at
    /// once and the process is reported exited with [`VM_GONE_EXIT_STATUS`].
    pub(super) fn watch_exit(self: &Arc<Self>, cid: &str, exec_id: &str, agent: Arc<dyn Agent>) {
        let inner = self.clone();
        let (cid, exec_id) = (cid.to_string(), exec_id.to_string());
        tokio::spawn(async move {
            let code = match agent.wait_process(&cid, &exec_id).await {
                Ok(s) => s as u32,
                Err(e) => {
                    let status = inner.lost_exit_status(&cid).await;
                    warn!(inner.log, "waiting for the process failed; reporting it exited"; "container" => &cid, "exec" => &exec_id, "status" => status, "error" => %e);
                    status
                }
            };
            // Take the relays out so their output can finish without the lock held.
            let relays = inner
                .lock()
                .process_mut(&cid, &exec_id)
                .ok()
                .and_then(|p| p.relays.take());
            if let Some(mut r) = relays {
                // What the process wrote is in its pipe and the socket's window: moments
                // away. A stream still open after the grace is held by something else (a
                // background child that inherited it): the exit is not held back for it.
                let ended = tokio::time::timeout(OUTPUT_GRACE, r.wait_outputs()).await;
                r.stop_stdin();
                if ended.is_err() {
                    warn!(inner.log, "the process exited but its output is still open (a background process holds it?); reporting the exit; the output flows until it closes or the process is deleted";
                        "container" => &cid, "exec" => &exec_id, "grace_s" => OUTPUT_GRACE.as_secs());
                    // Back with the process: deleting it stops them and closes the fifos.
                    if let Ok(p) = inner.lock().process_mut(&cid, &exec_id) {
                        p.relays = Some(r);
                    }
                }
            }
            inner.record_exit(&cid, &exec_id, code).await;
        });
    }

    /// Marks a process stopped with `code` (unless it already is) and publishes TaskExit.
    pub(super) async fn record_exit(&self, cid: &str, exec_id: &str, code: u32) {
        let (pid, at) = {
            let mut st = self.lock();
            let pid = st.pid_of(cid);
            match st
                .process_mut(cid, exec_id)
                .ok()
                .and_then(|p| p.stopped(code))
            {
                Some(exit) => (pid, exit.at),
                // Deleted meanwhile, or already reported.
                None => return,
            }
        };
        info!(self.log, "process exited"; "container" => cid, "exec" => exec_id, "status" => code);
        self.events.exit(cid, exec_id, pid, code, at).await;
    }

    /// When the sandbox's VM ends on its own, reports the processes nobody waits for
    /// (created, never started) exited too; started ones are reported by `watch_exit`.
    pub(super) fn watch_sandbox(self: &Arc<Self>, sb: &Arc<Sandbox>) {
        let inner = self.clone();
        let mut ended = sb.ended();
        tokio::spawn(async move {
            let cause = match ended.wait_for(Option::is_some).await {
                Ok(c) => c.clone().unwrap_or_default(),
                // The sandbox was destroyed without its VM dying first.
                Err(_) => return,
            };
            let unstarted: Vec<(String, String)> = {
                let st = inner.lock();
                st.containers
                    .iter()
                    .flat_map(|(cid, c)| {
                        std::iter::once((String::new(), &c.init))
                            .chain(c.execs.iter().map(|(id, p)| (id.clone(), p)))
                            .filter(|(_, p)| p.never_started())
                            .map(move |(exec_id, _)| (cid.clone(), exec_id))
                    })
                    .collect()
            };
            kata_sandbox::metrics::METRICS.vm_ended(&cause);
            warn!(inner.log, "sandbox VM ended"; "cause" => &cause, "unstarted_processes" => unstarted.len());
            for (cid, exec_id) in unstarted {
                let status = inner.lost_exit_status(&cid).await;
                inner.record_exit(&cid, &exec_id, status).await;
            }
        });
    }

    /// The exit status of a process of container `cid` the VM took with it:
    /// [`OOM_KILLED_EXIT_STATUS`] when the host's OOM killer ended the VM (the container
    /// told so first, see [`Inner::tell_oom`]), else [`VM_GONE_EXIT_STATUS`].
    async fn lost_exit_status(&self, cid: &str) -> u32 {
        let Some(sb) = self.lock().sandbox.clone() else {
            return VM_GONE_EXIT_STATUS;
        };
        let mut ended = sb.ended();
        let _ = tokio::time::timeout(END_NOTICE, ended.wait_for(Option::is_some)).await;
        match sb.oom_reason() {
            Some(reason) => {
                self.tell_oom(cid, &reason).await;
                OOM_KILLED_EXIT_STATUS
            }
            None => VM_GONE_EXIT_STATUS,
        }
    }

    /// Once per container, before its exit: TaskOOM (containerd's CRI then gives it the
    /// reason `OOMKilled`), and `reason` as its termination message (kubelet's file,
    /// which kubelet shows as the container's message) unless the container wrote one.
    async fn tell_oom(&self, cid: &str, reason: &str) {
        let bundle = {
            let mut st = self.lock();
            if !st.oom_told.insert(cid.to_string()) {
                return;
            }
            st.container(cid).ok().map(|c| c.bundle.clone())
        };
        kata_sandbox::metrics::METRICS.oom_event();
        self.events.oom(cid).await;
        let spec = bundle
            .and_then(|b| std::fs::read(b.join("config.json")).ok())
            .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok());
        let Some(path) = spec
            .as_ref()
            .and_then(kata_sandbox::oom_kill::termination_log)
        else {
            return;
        };
        match kata_sandbox::oom_kill::write_termination_log(&path, reason) {
            Ok(written) => {
                info!(self.log, "container ended by the host's OOM killer"; "container" => cid,
                    "termination_message" => path.display(), "written" => written)
            }
            Err(e) => warn!(self.log, "cannot write the container's termination message";
                "container" => cid, "path" => path.display(), "error" => %e),
        }
    }
}
