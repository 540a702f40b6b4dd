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
    publisher: RemotePublisher,
    namespace: String,
    log: Logger,
}

impl Events {
    pub fn new(publisher: RemotePublisher, namespace: &str, log: Logger) -> Self {
        Events {
            publisher,
            namespace: namespace.to_string(),
            log,
        }
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        let ctx = ttrpc::context::with_duration(std::time::Duration::from_secs(5));
        if let Err(e) = self
            .publisher
            .publish(ctx, topic, &self.namespace, event)
            .await
        {
            warn!(self.log, "publishing event failed"; "topic" => topic, "error" => %e);
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
