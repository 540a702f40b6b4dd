//! Task events published to containerd (`/tasks/create`, `/tasks/exit`, ...).

use std::time::SystemTime;

use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{MessageDyn, MessageField};
use containerd_shim_protos::topics;
use slog::{warn, Logger};

use crate::io::StdioPaths;

pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

pub struct Events {
    sink: Sink,
    namespace: String,
    log: Logger,
}

enum Sink {
    Containerd(RemotePublisher),
    /// Unit tests: every event as `topic text-format`, in order.
    #[cfg(test)]
    Recorder(std::sync::Mutex<Vec<String>>),
}

impl Events {
    pub fn new(publisher: RemotePublisher, namespace: &str, log: Logger) -> Self {
        Events {
            sink: Sink::Containerd(publisher),
            namespace: namespace.to_string(),
            log,
        }
    }

    /// Events kept in memory, for unit tests (see [`Events::recorded`]).
    #[cfg(test)]
    pub fn recorder() -> Self {
        Events {
            sink: Sink::Recorder(Default::default()),
            namespace: "test".into(),
            log: hypervisor::discard_logger(),
        }
    }

    #[cfg(test)]
    pub fn recorded(&self) -> Vec<String> {
        match &self.sink {
            Sink::Recorder(r) => r.lock().map(|r| r.clone()).unwrap_or_default(),
            Sink::Containerd(_) => Vec::new(),
        }
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        match &self.sink {
            Sink::Containerd(publisher) => {
                let ctx = ttrpc::context::with_duration(std::time::Duration::from_secs(5));
                if let Err(e) = publisher.publish(ctx, topic, &self.namespace, event).await {
                    warn!(self.log, "publishing event failed"; "topic" => topic, "error" => %e);
                }
            }
            #[cfg(test)]
            Sink::Recorder(r) => {
                if let Ok(mut r) = r.lock() {
                    r.push(format!("{topic} {event}"));
                }
            }
        }
    }

    pub async fn create(&self, cid: &str, bundle: &str, stdio: &StdioPaths, pid: u32) {
        let ev = TaskCreate {
            container_id: cid.to_string(),
            bundle: bundle.to_string(),
            io: MessageField::some(TaskIO {
                stdin: stdio.stdin.clone(),
                stdout: stdio.stdout.clone(),
                stderr: stdio.stderr.clone(),
                terminal: stdio.terminal,
                ..Default::default()
            }),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn start(&self, cid: &str, pid: u32) {
        let ev = TaskStart {
            container_id: cid.to_string(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_START_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn exit(&self, cid: &str, exec_id: &str, pid: u32, status: u32, at: SystemTime) {
        let ev = TaskExit {
            container_id: cid.to_string(),
            id: if exec_id.is_empty() {
                cid.to_string()
            } else {
                exec_id.to_string()
            },
            pid,
            exit_status: status,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        };
        self.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn delete(&self, cid: &str, pid: u32, status: u32, at: Option<SystemTime>) {
        let ev = TaskDelete {
            container_id: cid.to_string(),
            id: cid.to_string(),
            pid,
            exit_status: status,
            exited_at: at.map(timestamp).into(),
            ..Default::default()
        };
        self.publish(topics::TASK_DELETE_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn exec_added(&self, cid: &str, exec_id: &str) {
        let ev = TaskExecAdded {
            container_id: cid.to_string(),
            exec_id: exec_id.to_string(),
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn exec_started(&self, cid: &str, exec_id: &str, pid: u32) {
        let ev = TaskExecStarted {
            container_id: cid.to_string(),
            exec_id: exec_id.to_string(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn paused(&self, cid: &str) {
        let ev = TaskPaused {
            container_id: cid.to_string(),
            ..Default::default()
        };
        self.publish(topics::TASK_PAUSED_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn resumed(&self, cid: &str) {
        let ev = TaskResumed {
            container_id: cid.to_string(),
            ..Default::default()
        };
        self.publish(topics::TASK_RESUMED_EVENT_TOPIC, Box::new(ev))
            .await;
    }

    pub async fn oom(&self, cid: &str) {
        let ev = TaskOOM {
            container_id: cid.to_string(),
            ..Default::default()
        };
        self.publish(topics::TASK_OOM_EVENT_TOPIC, Box::new(ev))
            .await;
    }
}
