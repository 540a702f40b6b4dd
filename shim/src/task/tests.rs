//! The Task state machine against a fake agent: no VM, and containers' mounts only
//! directories (`container::DirsOnly`), so every test runs without root.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::TtrpcContext;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use slog::Logger;
use tokio::sync::Notify;
use ttrpc::Code;

use super::TaskService;
use crate::events::Events;
use crate::launch::{LaunchError, Launcher};
use agent_client::fake::FakeAgent;
use kata_sandbox::mount::SharedDirs;
use kata_sandbox::sandbox::Sandbox;
use kata_sandbox::spec::SandboxSpec;

/// Hands out sandboxes around one fake agent, sharing from a temp dir; optionally holds
/// the boot until `release` is notified.
struct FakeLauncher {
    agent: Arc<FakeAgent>,
    share: PathBuf,
    gate: Option<Arc<Notify>>,
    launched: AtomicUsize,
    sandbox: std::sync::Mutex<Option<Arc<Sandbox>>>,
    /// The sandboxes' host cgroup directories (test trees of cgroup files).
    cgroup: Vec<PathBuf>,
    /// The next launch panics (a bug in the boot).
    panic_once: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Launcher for FakeLauncher {
    async fn launch(
        &self,
        id: &str,
        _options: &MessageField<Any>,
        _spec: &SandboxSpec,
        _log: &Logger,
    ) -> Result<Arc<Sandbox>, LaunchError> {
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        if self.panic_once.swap(false, Ordering::SeqCst) {
            panic!("a bug in the boot");
        }
        self.launched.fetch_add(1, Ordering::SeqCst);
        let base = self.share.join(id);
        let shared = SharedDirs {
            mounts: base.join("mounts"),
            shared: base.join("shared"),
            base,
        };
        let sb = Sandbox::for_test_in(id, self.agent.clone(), shared, &self.cgroup);
        *self.sandbox.lock().unwrap() = Some(sb.clone());
        Ok(sb)
    }
}

struct Fixture {
    svc: TaskService,
    agent: Arc<FakeAgent>,
    launcher: Arc<FakeLauncher>,
    dir: tempfile::TempDir,
}

/// Forwards to the fixture's launcher, so the test keeps a handle on it.
struct Shared(Arc<FakeLauncher>);

#[async_trait]
impl Launcher for Shared {
    async fn launch(
        &self,
        id: &str,
        options: &MessageField<Any>,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Result<Arc<Sandbox>, LaunchError> {
        self.0.launch(id, options, spec, log).await
    }
}

const SB: &str = "sb1";

fn fixture(gate: Option<Arc<Notify>>) -> Fixture {
    fixture_in(gate, |_| Vec::new())
}

/// A fixture whose sandboxes' host cgroup is what `cgroup` makes in the fixture's dir.
fn fixture_in(gate: Option<Arc<Notify>>, cgroup: impl FnOnce(&Path) -> Vec<PathBuf>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let agent = Arc::new(FakeAgent::new());
    let launcher = Arc::new(FakeLauncher {
        agent: agent.clone(),
        share: dir.path().join("share"),
        gate,
        launched: AtomicUsize::new(0),
        sandbox: Default::default(),
        cgroup: cgroup(dir.path()),
        panic_once: Default::default(),
    });
    let svc = TaskService::new(
        SB,
        Box::new(Shared(launcher.clone())),
        Events::recorder(),
        Arc::new(ExitSignal::default()),
        hypervisor::discard_logger(),
    );
    Fixture {
        svc,
        agent,
        launcher,
        dir,
    }
}

fn ctx() -> TtrpcContext {
    TtrpcContext {
        mh: Default::default(),
        metadata: Default::default(),
        timeout_nano: 0,
    }
}

/// The config.json of a container of pod sandbox `SB` (CRI's annotations).
fn pod_member_spec() -> String {
    format!(
        r#"{{"process":{{"args":["sh"],"cwd":"/"}},"root":{{"path":"rootfs"}},"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"{SB}"}}}}"#
    )
}

impl Fixture {
    /// A bundle for container `id` with a config.json (`spec`) and an empty rootfs.
    fn bundle(&self, id: &str, spec: Option<&str>) -> PathBuf {
        let b = self.dir.path().join("bundles").join(id);
        std::fs::create_dir_all(b.join("rootfs")).unwrap();
        if let Some(spec) = spec {
            std::fs::write(b.join("config.json"), spec).unwrap();
        }
        b
    }

    fn create_req(&self, id: &str, bundle: &Path) -> CreateTaskRequest {
        CreateTaskRequest {
            id: id.into(),
            bundle: bundle.display().to_string(),
            ..Default::default()
        }
    }

    async fn create(&self, id: &str) -> Result<u32, ttrpc::Error> {
        let spec = r#"{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/"},"root":{"path":"rootfs"}}"#;
        let b = self.bundle(id, Some(spec));
        let req = self.create_req(id, &b);
        self.svc.create(&ctx(), req).await.map(|r| r.pid)
    }

    async fn start(&self, id: &str, exec_id: &str) -> Result<(), ttrpc::Error> {
        let req = StartRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.svc.start(&ctx(), req).await.map(|_| ())
    }

    async fn state(&self, id: &str, exec_id: &str) -> Result<StateResponse, ttrpc::Error> {
        let req = StateRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.svc.state(&ctx(), req).await
    }

    async fn wait(&self, id: &str, exec_id: &str) -> WaitResponse {
        let req = WaitRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        tokio::time::timeout(Duration::from_secs(5), self.svc.wait(&ctx(), req))
            .await
            .expect("Wait answered")
            .unwrap()
    }

    async fn delete(&self, id: &str) -> Result<DeleteResponse, ttrpc::Error> {
        let req = DeleteRequest {
            id: id.into(),
            ..Default::default()
        };
        self.svc.delete(&ctx(), req).await
    }

    fn share_is_gone(&self) -> bool {
        !self.dir.path().join("share").join(SB).exists()
            && kata_sandbox::mount::mounts_under(self.dir.path()).is_empty()
    }
}

fn code(e: &ttrpc::Error) -> Code {
    match e {
        ttrpc::Error::RpcStatus(s) => s.code(),
        other => panic!("not an RPC status: {other:?}"),
    }
}

#[tokio::test]
async fn a_process_exit_in_the_guest_is_reported_then_delete_ends_the_sandbox() {
    let f = fixture(None);
    let pid = f.create(SB).await.unwrap();
    assert_eq!(pid, 4242, "tasks carry the sandbox's VMM pid");
    f.start(SB, "").await.unwrap();
    assert_eq!(
        f.state(SB, "").await.unwrap().status,
        Status::RUNNING.into()
    );
    f.agent.exit(SB, "", 3);
    assert_eq!(f.wait(SB, "").await.exit_status, 3);
    let st = f.state(SB, "").await.unwrap();
    assert_eq!((st.status, st.exit_status), (Status::STOPPED.into(), 3));
    assert_eq!(f.delete(SB).await.unwrap().exit_status, 3);
    assert!(
        f.share_is_gone(),
        "delete of the last container ends the sandbox"
    );
    let events = f.svc.inner.events.recorded();
    let topics: Vec<&str> = events
        .iter()
        .map(|e| e.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        topics,
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ]
    );
    assert_eq!(f.agent.called("DestroySandbox"), 1);
}

#[tokio::test]
async fn only_a_container_the_sandbox_outlives_is_removed_in_the_guest() {
    let f = fixture(None);
    f.create(SB).await.unwrap();
    f.start(SB, "").await.unwrap();
    let b = f.bundle("c1", Some(&pod_member_spec()));
    f.svc.create(&ctx(), f.create_req("c1", &b)).await.unwrap();
    f.start("c1", "").await.unwrap();

    f.agent.exit("c1", "", 0);
    assert_eq!(f.wait("c1", "").await.exit_status, 0);
    f.delete("c1").await.unwrap();
    assert_eq!(
        f.agent.called("RemoveContainer"),
        1,
        "c1 leaves a sandbox that goes on"
    );
    assert_eq!(f.agent.called("DestroySandbox"), 0);

    // The last one: DestroySandbox ends everything in the guest, no RemoveContainer first.
    f.agent.exit(SB, "", 0);
    assert_eq!(f.wait(SB, "").await.exit_status, 0);
    f.delete(SB).await.unwrap();
    assert_eq!(f.agent.called("RemoveContainer"), 1);
    assert_eq!(f.agent.called("DestroySandbox"), 1);
    assert!(f.share_is_gone());
}

#[tokio::test]
async fn a_dead_vm_stops_every_process_and_kill_and_delete_answer_at_once() {
    let f = fixture(None);
    f.create(SB).await.unwrap();
    f.start(SB, "").await.unwrap();
    // An exec added but not started: nobody waits on it in the guest.
    let exec = ExecProcessRequest {
        id: SB.into(),
        exec_id: "e1".into(),
        spec: MessageField::some(Any {
            value: br#"{"args":["true"],"cwd":"/"}"#.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.svc.exec(&ctx(), exec).await.unwrap();

    let sb = f.launcher.sandbox.lock().unwrap().clone().unwrap();
    sb.vm_ended("the VMM qemu (pid 9) was killed by signal 9")
        .await;

    assert_eq!(f.wait(SB, "").await.exit_status, 255);
    assert_eq!(f.wait(SB, "e1").await.exit_status, 255);
    let kill = KillRequest {
        id: SB.into(),
        signal: 9,
        ..Default::default()
    };
    let answered = tokio::time::timeout(Duration::from_secs(1), f.svc.kill(&ctx(), kill)).await;
    assert!(answered.expect("Kill answers at once").is_ok());
    let deleted = tokio::time::timeout(Duration::from_secs(5), f.delete(SB))
        .await
        .expect("Delete answers at once")
        .unwrap();
    assert_eq!(deleted.exit_status, 255);
    assert!(f.share_is_gone());
    assert_eq!(
        f.agent.called("RemoveContainer") + f.agent.called("DestroySandbox"),
        0,
        "nothing is asked of a guest that is gone"
    );
    let exits = f
        .svc
        .inner
        .events
        .recorded()
        .into_iter()
        .filter(|e| e.starts_with("/tasks/exit"))
        .count();
    assert_eq!(exits, 2, "a TaskExit for the init and for the exec");
}

#[tokio::test]
async fn a_vmm_oom_killed_in_the_pods_cgroup_ends_every_container_oom_killed_with_the_reason() {
    // The pod's cgroup limited to 136 MiB, the sandbox's below it (v1 files).
    let f = fixture_in(None, |dir| {
        let pod = dir.join("cgroup/kubepods/pod1");
        let sb = pod.join(SB);
        std::fs::create_dir_all(&sb).unwrap();
        std::fs::write(pod.join("memory.limit_in_bytes"), format!("{}", 136 << 20)).unwrap();
        std::fs::write(sb.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        std::fs::write(
            sb.join("memory.oom_control"),
            "oom_kill_disable 0\noom_kill 0\n",
        )
        .unwrap();
        vec![sb]
    });
    // kubelet's termination-message file, bound at /dev/termination-log.
    let message = f.dir.path().join("kubelet/pods/u1/containers/c/0a1b");
    std::fs::create_dir_all(message.parent().unwrap()).unwrap();
    std::fs::write(&message, "").unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/dev/termination-log", "type": "bind",
                    "source": message, "options": ["rbind", "rw"]}],
    });
    let b = f.bundle(SB, Some(&spec.to_string()));
    f.svc.create(&ctx(), f.create_req(SB, &b)).await.unwrap();
    f.start(SB, "").await.unwrap();

    let sb = f.launcher.sandbox.lock().unwrap().clone().unwrap();
    let oom = f
        .dir
        .path()
        .join(format!("cgroup/kubepods/pod1/{SB}/memory.oom_control"));
    std::fs::write(&oom, "oom_kill_disable 0\noom_kill 1\n").unwrap();
    sb.vm_ended("the VMM qemu (pid 9) was killed by signal 9")
        .await;

    assert_eq!(f.wait(SB, "").await.exit_status, 137);
    let text = std::fs::read_to_string(&message).unwrap();
    assert!(
        text.contains("the pod's cgroup ") && text.contains("memory limit of 136 MiB"),
        "{text}"
    );
    assert!(text.contains("overhead.podFixed.memory to 186Mi"), "{text}");
    // TaskOOM first (the CRI's reason), then TaskExit.
    let events: Vec<String> = f
        .svc
        .inner
        .events
        .recorded()
        .into_iter()
        .filter(|e| e.starts_with("/tasks/oom") || e.starts_with("/tasks/exit"))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events[0].starts_with("/tasks/oom"), "{events:?}");
    assert!(events[1].starts_with("/tasks/exit"), "{events:?}");
    f.delete(SB).await.unwrap();
}

#[tokio::test]
async fn connect_answers_while_the_sandbox_boots_and_state_waits_for_it() {
    let gate = Arc::new(Notify::new());
    let f = Arc::new(fixture(Some(gate.clone())));
    let creating = {
        let f = f.clone();
        tokio::spawn(async move { f.create(SB).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!creating.is_finished(), "the boot is held");
    let connect = tokio::time::timeout(
        Duration::from_secs(1),
        f.svc.connect(&ctx(), ConnectRequest::default()),
    )
    .await
    .expect("Connect answers during a boot");
    assert_eq!(connect.unwrap().shim_pid, std::process::id());
    // State of a container being created answers from what the create makes: never
    // NOT_FOUND while something of that id exists.
    let state = {
        let f = f.clone();
        tokio::spawn(async move { f.state(SB, "").await })
    };
    // A second create of the same id fails at once.
    let again = tokio::time::timeout(Duration::from_secs(1), f.create(SB))
        .await
        .expect("a duplicate create answers during the boot");
    assert_eq!(code(&again.unwrap_err()), Code::ALREADY_EXISTS);
    assert!(!state.is_finished(), "State waits for the create");
    gate.notify_one();
    creating.await.unwrap().unwrap();
    let state = tokio::time::timeout(Duration::from_secs(5), state)
        .await
        .expect("State answers once the create is done")
        .unwrap()
        .unwrap();
    assert_eq!(state.status, Status::CREATED.into());
    let dup = f.create(SB).await.unwrap_err();
    assert_eq!(code(&dup), Code::ALREADY_EXISTS);
    assert_eq!(f.launcher.launched.load(Ordering::SeqCst), 1);
    f.agent.exit(SB, "", 0);
    // Never started: delete right away.
    f.delete(SB).await.unwrap();
    assert!(f.share_is_gone());
}

#[tokio::test]
async fn a_create_whose_caller_went_away_finishes_and_is_found() {
    let gate = Arc::new(Notify::new());
    let f = Arc::new(fixture(Some(gate.clone())));
    let creating = {
        let f = f.clone();
        tokio::spawn(async move { f.create(SB).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // What ttrpc does when the request's connection closes: the handler is dropped.
    creating.abort();
    assert!(creating.await.unwrap_err().is_cancelled());
    gate.notify_one();
    let state = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match f.state(SB, "").await {
                Ok(st) => break st,
                // The create's own task may not have registered it yet.
                Err(e) if code(&e) == Code::NOT_FOUND => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("state: {e:?}"),
            }
        }
    })
    .await
    .expect("the create finished without its caller");
    assert_eq!(state.status, Status::CREATED.into());
    assert_eq!(f.launcher.launched.load(Ordering::SeqCst), 1);
    let kill = KillRequest {
        id: SB.into(),
        signal: 9,
        ..Default::default()
    };
    f.svc.kill(&ctx(), kill).await.unwrap();
    f.delete(SB).await.unwrap();
    assert!(f.share_is_gone());
    assert_eq!(f.agent.called("DestroySandbox"), 1);
}

#[tokio::test]
async fn bad_bundles_and_ids_fail_before_any_vm_is_started() {
    let f = fixture(None);
    let b = f.bundle(SB, None);
    let err = f
        .svc
        .create(&ctx(), f.create_req(SB, &b))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Code::INVALID_ARGUMENT);
    assert!(format!("{err:?}").contains("config.json"), "{err:?}");
    for bad in ["../escape", "a/b", "..", ".x"] {
        let err = f
            .svc
            .create(&ctx(), f.create_req(bad, &b))
            .await
            .unwrap_err();
        assert_eq!(code(&err), Code::INVALID_ARGUMENT, "{bad}");
        assert!(format!("{err:?}").contains("not a valid id"), "{err:?}");
    }
    assert_eq!(f.launcher.launched.load(Ordering::SeqCst), 0);
    assert!(f.share_is_gone());
}

#[tokio::test]
async fn a_delete_answers_while_another_containers_create_is_in_flight() {
    let f = Arc::new(fixture(None));
    f.create(SB).await.unwrap();
    f.start(SB, "").await.unwrap();
    let a = f.bundle("a", Some(&pod_member_spec()));
    f.svc.create(&ctx(), f.create_req("a", &a)).await.unwrap();
    // The guest holds b's create (as a slow CreateContainer would, up to its deadline).
    let gate = f.agent.hold_create("b");
    let creating_b = {
        let f = f.clone();
        tokio::spawn(async move {
            let b = f.bundle("b", Some(&pod_member_spec()));
            f.svc
                .create(&ctx(), f.create_req("b", &b))
                .await
                .map(|_| ())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!creating_b.is_finished(), "b's create is held in the guest");
    // a never started: its delete needs nothing of b's create.
    let deleted = tokio::time::timeout(Duration::from_secs(2), f.delete("a"))
        .await
        .expect("Delete of a answers while b's create is in flight");
    deleted.unwrap();
    assert_eq!(f.agent.called("DestroySandbox"), 0, "the sandbox goes on");
    gate.notify_one();
    creating_b.await.unwrap().unwrap();
    f.agent.exit("b", "", 0);
    f.delete("b").await.unwrap();
    f.agent.exit(SB, "", 0);
    assert_eq!(f.wait(SB, "").await.exit_status, 0);
    f.delete(SB).await.unwrap();
    assert!(f.share_is_gone());
}

#[tokio::test]
async fn a_pod_container_needs_its_sandbox_container_first() {
    let f = fixture(None);
    let b = f.bundle("c1", Some(&pod_member_spec()));
    let err = f
        .svc
        .create(&ctx(), f.create_req("c1", &b))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Code::FAILED_PRECONDITION);
    assert!(format!("{err:?}").contains("create its sandbox container first"));
    assert_eq!(f.launcher.launched.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn killing_a_task_never_started_ends_it_as_runc_does() {
    let f = fixture(None);
    f.create(SB).await.unwrap();
    let kill = KillRequest {
        id: SB.into(),
        signal: 9,
        ..Default::default()
    };
    f.svc.kill(&ctx(), kill).await.unwrap();
    assert_eq!(f.wait(SB, "").await.exit_status, 137);
    assert_eq!(
        f.agent.called("SignalProcess"),
        0,
        "nothing runs in the guest yet"
    );
    assert_eq!(f.delete(SB).await.unwrap().exit_status, 137);
    assert!(f.share_is_gone());
}

/// The guest names the container of an OOM kill: only the sandbox's own containers get a
/// TaskOOM, and a flood for one of them gives at most one per second (the rate itself is
/// `ratelimit`'s unit test).
#[tokio::test]
async fn oom_events_are_published_only_for_the_sandboxs_own_containers() {
    let f = fixture(None);
    f.create(SB).await.unwrap();
    f.start(SB, "").await.unwrap();
    for _ in 0..50 {
        f.agent.oom("someone-elses-container");
        f.agent.oom(&"x".repeat(100_000));
    }
    f.agent.oom(SB);
    let ooms = || {
        f.svc
            .inner
            .events
            .recorded()
            .into_iter()
            .filter(|e| e.starts_with("/tasks/oom"))
            .collect::<Vec<_>>()
    };
    // The watch takes the events in order: once SB's is published, the others were seen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ooms().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no TaskOOM for {SB}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let published = ooms();
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(published[0].contains(SB), "{published:?}");
}

#[tokio::test]
async fn a_create_whose_work_panicked_holds_nothing_up() {
    let f = fixture(None);
    f.launcher.panic_once.store(true, Ordering::SeqCst);
    let err = f.create(SB).await.unwrap_err();
    assert_eq!(code(&err), Code::INTERNAL, "{err}");
    assert!(err.to_string().contains("create did not finish"), "{err}");
    // A request about it answers from what is there (nothing) instead of waiting for a
    // create that will never end, and the daemon is not kept up by it.
    let state = tokio::time::timeout(Duration::from_secs(5), f.state(SB, ""))
        .await
        .expect("State answered");
    assert_eq!(code(&state.unwrap_err()), Code::NOT_FOUND);
    assert_eq!(f.svc.inner.tasks(), super::reach::Tasks::None);
    // containerd's retry creates it.
    f.create(SB).await.unwrap();
    assert_eq!(f.state(SB, "").await.unwrap().status(), Status::CREATED);
}
