//! An in-memory agent for unit tests: containers and processes that exist only as
//! entries, exit when signalled with SIGKILL or SIGTERM (or when a test says so), and a
//! disconnect that fails every request the way [`KataAgent`](super::KataAgent) does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use protocols::agent::StatsContainerResponse;
use protocols::stdio::StdioStream;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::{Agent, AgentError, Result, VmGone};

/// Exit status per `(container, exec id)` once the process has exited.
type Exits = HashMap<(String, String), watch::Sender<Option<i32>>>;
/// What reached a process's stdin, per `(container, exec id)`, once the shim closed it.
pub type StdinSeen = Arc<Mutex<HashMap<(String, String), Vec<u8>>>>;

#[derive(Default)]
pub struct FakeAgent {
    exits: Mutex<Exits>,
    gone: Mutex<Option<watch::Sender<Option<String>>>>,
    /// Every request made, as `op container exec`, in order.
    pub calls: Mutex<Vec<String>>,
    pub stdin: StdinSeen,
    /// OOM kills the guest will report, in order (see [`FakeAgent::oom`]).
    ooms: Mutex<std::collections::VecDeque<String>>,
    oom_ready: tokio::sync::Notify,
    /// CreateContainer requests held until notified, by container id.
    held_creates: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl FakeAgent {
    pub fn new() -> Self {
        let f = FakeAgent::default();
        if let Ok(mut g) = f.gone.lock() {
            *g = Some(watch::channel(None).0);
        }
        f
    }

    fn record(&self, op: &str, id: &str, exec_id: &str) {
        if let Ok(mut c) = self.calls.lock() {
            c.push(format!("{op} {id} {exec_id}").trim_end().to_string());
        }
    }

    /// Holds CreateContainer of container `id` until the returned gate is notified.
    pub fn hold_create(&self, id: &str) -> Arc<tokio::sync::Notify> {
        let gate = Arc::new(tokio::sync::Notify::new());
        if let Ok(mut held) = self.held_creates.lock() {
            held.insert(id.to_string(), gate.clone());
        }
        gate
    }

    pub fn called(&self, op: &str) -> usize {
        self.calls
            .lock()
            .map(|c| c.iter().filter(|l| l.starts_with(op)).count())
            .unwrap_or(0)
    }

    fn process(&self, id: &str, exec_id: &str) -> watch::Sender<Option<i32>> {
        let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
        exits
            .entry((id.to_string(), exec_id.to_string()))
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// Has the guest report an OOM kill in container `id` (any id: the guest's word).
    pub fn oom(&self, id: &str) {
        if let Ok(mut q) = self.ooms.lock() {
            q.push_back(id.to_string());
        }
        self.oom_ready.notify_one();
    }

    async fn next_oom(&self) -> String {
        loop {
            let next = self.ooms.lock().ok().and_then(|mut q| q.pop_front());
            if let Some(id) = next {
                return id;
            }
            self.oom_ready.notified().await;
        }
    }

    /// Makes the process exit with `status`, as if it had ended in the guest.
    pub fn exit(&self, id: &str, exec_id: &str, status: i32) {
        self.process(id, exec_id).send_replace(Some(status));
    }

    fn gone_rx(&self) -> watch::Receiver<Option<String>> {
        let g = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(tx) => tx.subscribe(),
            None => watch::channel(None).1,
        }
    }

    /// Fails at once when disconnected, else runs `f`.
    async fn serve<T>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut gone = self.gone_rx();
        if let Some(cause) = gone.borrow_and_update().clone() {
            return Err(AgentError::VmGone { op, cause });
        }
        tokio::select! {
            r = f => r,
            c = gone.wait_for(Option::is_some) => Err(AgentError::VmGone {
                op,
                cause: c.ok().and_then(|c| c.clone()).unwrap_or_default(),
            }),
        }
    }

    async fn wait_exit(&self, id: &str, exec_id: &str) -> i32 {
        let mut rx = self.process(id, exec_id).subscribe();
        loop {
            if let Some(s) = *rx.borrow_and_update() {
                return s;
            }
            if rx.changed().await.is_err() {
                return 255;
            }
        }
    }
}

#[async_trait]
impl Agent for FakeAgent {
    fn disconnect(&self, cause: &str) {
        let g = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = g.as_ref() {
            tx.send_if_modified(|c| {
                let first = c.is_none();
                if first {
                    *c = Some(cause.to_string());
                }
                first
            });
        }
    }

    async fn create_sandbox(&self, req: protocols::agent::CreateSandboxRequest) -> Result<()> {
        self.record("CreateSandbox", &req.hostname, "");
        self.serve("CreateSandbox", async { Ok(()) }).await
    }

    async fn create_container(&self, req: protocols::agent::CreateContainerRequest) -> Result<()> {
        let id = req.container_id.as_str();
        self.record("CreateContainer", id, "");
        let gate = self
            .held_creates
            .lock()
            .ok()
            .and_then(|h| h.get(id).cloned());
        self.serve("CreateContainer", async {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            Ok(())
        })
        .await
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        self.record("StartContainer", id, "");
        self.serve("StartContainer", async { Ok(()) }).await
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.record("RemoveContainer", id, "");
        self.serve("RemoveContainer", async { Ok(()) }).await
    }

    async fn exec_process(&self, id: &str, exec_id: &str, _p: Vec<u8>, _s: bool) -> Result<()> {
        self.record("ExecProcess", id, exec_id);
        self.serve("ExecProcess", async { Ok(()) }).await
    }

    async fn signal_process(&self, id: &str, exec_id: &str, signal: u32, _all: bool) -> Result<()> {
        self.record("SignalProcess", id, exec_id);
        self.serve("SignalProcess", async {
            if signal == libc::SIGKILL as u32 || signal == libc::SIGTERM as u32 {
                self.exit(id, exec_id, 128 + signal as i32);
            }
            Ok(())
        })
        .await
    }

    async fn wait_process(&self, id: &str, exec_id: &str) -> Result<i32> {
        self.serve("WaitProcess", async {
            Ok(self.wait_exit(id, exec_id).await)
        })
        .await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<i32>> {
        self.record("ListProcesses", id, "");
        self.serve("ListProcesses", async { Ok(vec![1]) }).await
    }

    /// Output streams end when the process exits (with no bytes); stdin is read until
    /// the shim closes it, and then found in [`FakeAgent::stdin`].
    async fn open_stdio(&self, id: &str, exec_id: &str, stream: StdioStream) -> Result<UnixStream> {
        self.record(&format!("OpenStdio {stream}"), id, exec_id);
        let mut exit = self.process(id, exec_id).subscribe();
        let (seen, key) = (self.stdin.clone(), (id.to_string(), exec_id.to_string()));
        self.serve("OpenStdio", async move {
            let (shim_end, mut guest_end) = UnixStream::pair().map_err(|e| AgentError::Stdio {
                stream,
                process: protocols::stdio::process_name(id, exec_id),
                why: e.to_string(),
            })?;
            tokio::spawn(async move {
                if stream == StdioStream::Stdin {
                    let mut got = Vec::new();
                    let _ = guest_end.read_to_end(&mut got).await;
                    if let Ok(mut seen) = seen.lock() {
                        seen.insert(key, got);
                    }
                } else {
                    let _ = exit.wait_for(Option::is_some).await;
                }
            });
            Ok(shim_end)
        })
        .await
    }

    fn vm_gone(&self) -> VmGone {
        VmGone::new(self.gone_rx())
    }

    async fn tty_win_resize(&self, _id: &str, _x: &str, _r: u32, _c: u32) -> Result<()> {
        self.serve("TtyWinResize", async { Ok(()) }).await
    }

    async fn pause_container(&self, id: &str) -> Result<()> {
        self.record("PauseContainer", id, "");
        self.serve("PauseContainer", async { Ok(()) }).await
    }

    async fn resume_container(&self, id: &str) -> Result<()> {
        self.record("ResumeContainer", id, "");
        self.serve("ResumeContainer", async { Ok(()) }).await
    }

    async fn get_metrics(&self) -> Result<String> {
        self.serve("GetMetrics", async {
            Ok("# TYPE kata_guest_load gauge\nkata_guest_load{item=\"load1\"} 0.5\n".to_string())
        })
        .await
    }

    async fn stats_container(&self, _id: &str) -> Result<StatsContainerResponse> {
        self.serve("StatsContainer", async {
            Ok(StatsContainerResponse::new())
        })
        .await
    }

    async fn set_online_cpus(&self, count: u32) -> Result<u32> {
        self.serve("SetOnlineCpus", async move { Ok(count) }).await
    }

    async fn update_container(&self, _id: &str, _r: Vec<u8>) -> Result<()> {
        self.serve("UpdateContainer", async { Ok(()) }).await
    }

    async fn get_oom_event(&self) -> Result<String> {
        self.serve("GetOOMEvent", async { Ok(self.next_oom().await) })
            .await
    }

    async fn destroy_sandbox(&self) -> Result<()> {
        self.record("DestroySandbox", "", "");
        self.serve("DestroySandbox", async { Ok(()) }).await
    }
}
