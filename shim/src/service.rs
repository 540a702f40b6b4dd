//! The shim daemon as containerd's shim crate runs it, and the `delete` action (clean up
//! after a daemon that died). `start` is ours alone (see `start`): containerd 2.3+ speaks
//! a bootstrap protocol on stdin that the crate does not know.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use containerd_shim::asynchronous::monitor::monitor_subscribe;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{ExitSignal, Shim};
use containerd_shim::monitor::{Subject, Topic};
use containerd_shim::{Config, Error as ShimError, Flags, StartOpts};
use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::MessageField;
use slog::{info, o, warn, Logger};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::events::{timestamp, Events};
use crate::launch::VmLauncher;
use crate::start::{remove_socket, sandbox_id_of_bundle};
use crate::task::{IdleProbe, TaskService};
use kata_sandbox::log::{fifo_logger, DebugSwitch};
use kata_sandbox::persist::SandboxState;
use kata_sandbox::sandbox::cleanup_host;

pub struct Service {
    id: String,
    namespace: String,
    /// containerd's address (`-address`), from which a sandbox's socket path follows.
    address: String,
    /// The daemon's own socket (`-socket`, `unix://...`); empty outside the daemon.
    socket: String,
    debug: bool,
    exit: Arc<ExitSignal>,
    /// Whether the sandbox is gone, once the Task service exists.
    idle: OnceLock<IdleProbe>,
    log: OnceLock<Logger>,
    /// SIGTERM, listened for from the daemon's start: the containerd-shim crate catches
    /// SIGTERM and drops it, so one sent before `wait` listened (right after `shim.pid`
    /// and the socket appear) would be lost and the daemon would never end.
    term: Option<Signal>,
}

/// The shim socket of the sandbox whose bundle is the current directory: the bundle's
/// `address` file, else containerd's default naming.
fn bundle_socket(address: &str, namespace: &str, sandbox_id: &str) -> String {
    std::fs::read_to_string("address")
        .ok()
        .map(|a| a.trim().to_string())
        .filter(|a| a.starts_with("unix://"))
        .unwrap_or_else(|| crate::start::socket_address(address, namespace, sandbox_id, None))
}

/// How long `delete` lets a daemon of the sandbox end by itself. containerd runs
/// `delete` as soon as its connection to the daemon closes, which on every normal
/// teardown is while the daemon is still on its way out after Shutdown (removing its
/// socket, flushing its log): killing it there left its socket behind.
const DAEMON_EXIT_GRACE: Duration = Duration::from_secs(2);

/// Ends the daemon the bundle's `shim.pid` names if it still runs for sandbox `id` (its
/// command line says so): it gets [`DAEMON_EXIT_GRACE`] to exit, then SIGKILL, and
/// `delete` goes on once it is gone. It is not our child: nothing to reap.
fn end_stale_daemon(id: &str) {
    let Some(pid) = std::fs::read_to_string("shim.pid")
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|p| *p > 1 && *p as u32 != std::process::id())
    else {
        return;
    };
    if !is_our_daemon(pid, id) {
        return;
    }
    if wait_gone(pid, DAEMON_EXIT_GRACE) {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    wait_gone(pid, DAEMON_EXIT_GRACE);
}

/// Whether `pid` runs this shim's daemon for sandbox `id`.
fn is_our_daemon(pid: i32, id: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.first()
        .is_some_and(|a| a.ends_with(b"containerd-shim-kata-v2"))
        && args
            .windows(2)
            .any(|w| w[0] == b"-id" && w[1] == id.as_bytes())
        && args.contains(&&b"-socket"[..])
}

/// Polls until `pid` has exited (a zombie counts as gone), for at most `limit`.
fn wait_gone(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !procinfo::pid::is_running(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Relays every exit containerd-shim's SIGCHLD reaper announces to the sandbox library
/// ([`kata_sandbox::exits`]), where the watchdog and the network helpers wait for them.
async fn relay_exits() {
    match monitor_subscribe(Topic::Pid).await {
        Ok(mut sub) => {
            tokio::spawn(async move {
                while let Some(ev) = sub.rx.recv().await {
                    if let Subject::Pid(pid) = ev.subject {
                        kata_sandbox::exits::announce(pid, ev.exit_code);
                    }
                }
            });
        }
        // Without them a dead VMM goes unnoticed until the next request fails: say so
        // where containerd logs the shim's stderr.
        Err(e) => eprintln!("containerd-shim-kata-v2: no exit announcements from the reaper: {e}"),
    }
}

fn other(msg: String) -> ShimError {
    ShimError::Other(msg)
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        relay_exits().await;
        Service {
            id: args.id.clone(),
            namespace: args.namespace.clone(),
            address: args.address.clone(),
            socket: args.socket.clone(),
            debug: args.debug,
            exit: Arc::new(ExitSignal::default()),
            idle: OnceLock::new(),
            log: OnceLock::new(),
            // Only the daemon listens: `delete` keeps SIGTERM's default action.
            term: if args.socket.is_empty() {
                None
            } else {
                signal(SignalKind::terminate()).ok()
            },
        }
    }

    async fn start_shim(&mut self, _opts: StartOpts) -> Result<String, ShimError> {
        // main.rs runs `start` itself (start.rs); the crate never gets here.
        Err(other(
            "start is handled by the shim's own start path".into(),
        ))
    }

    async fn delete_shim(&mut self) -> Result<DeleteResponse, ShimError> {
        // containerd calls this when the daemon is gone: undo what its state records.
        let log = Logger::root(slog::Discard, o!());
        // An invalid sandbox id annotation was refused at start: nothing of it to undo.
        let sandbox_id = sandbox_id_of_bundle(&self.id).unwrap_or_else(|_| self.id.clone());
        if sandbox_id == self.id {
            // A daemon containerd gave up on (a start that failed on its side, a daemon
            // that stopped answering) must not linger, nor its socket; one on its way out
            // finishes first, so that its own clean-up is not cut short.
            end_stale_daemon(&self.id);
            if let Ok(state) = SandboxState::load(&sandbox_id) {
                cleanup_host(&state, &log).await;
            }
            let address = bundle_socket(&self.address, &self.namespace, &sandbox_id);
            remove_socket(&address, true);
        } else {
            let share = kata_sandbox::mount::SharedDirs::for_sandbox(&sandbox_id)
                .mounts
                .join(&self.id);
            kata_sandbox::host_mounts::teardown_host_mounts(&[], &share);
        }
        let rootfs = Path::new("rootfs");
        for m in kata_sandbox::mount::mounts_under(
            &std::env::current_dir().unwrap_or_default().join(rootfs),
        ) {
            kata_sandbox::mount::unmount(&m);
        }
        Ok(DeleteResponse {
            pid: 0,
            exit_status: 128 + libc::SIGKILL as u32,
            exited_at: MessageField::some(timestamp(SystemTime::now())),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        // SIGTERM ends a daemon whose sandbox is gone (or never came); one with a live
        // sandbox serves on until containerd removes it.
        let mut term = self.term.take();
        loop {
            tokio::select! {
                _ = self.exit.wait() => break,
                Some(()) = async { term.as_mut()?.recv().await } => {
                    let idle = self.idle.get().is_none_or(IdleProbe::is_idle);
                    if let Some(log) = self.log.get() {
                        if idle {
                            info!(log, "SIGTERM: no sandbox to serve, shim exits");
                        } else {
                            warn!(log, "SIGTERM ignored: the sandbox still runs; the shim ends when containerd removes it");
                        }
                    }
                    if idle {
                        break;
                    }
                }
            }
        }
        // The containerd-shim crate removes the socket after this only if the bundle's
        // `address` file is still there to read, and containerd may already have deleted
        // the bundle once Shutdown returned (`ctr run --rm`): the socket was left behind.
        // Connections already made (containerd's) are unaffected.
        remove_socket(&self.socket, false);
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let switch = DebugSwitch::default();
        switch.set(self.debug);
        let log = fifo_logger(Path::new("log"), &self.id, &switch);
        let _ = std::fs::write("shim.pid", std::process::id().to_string());
        info!(log, "shim daemon started"; "pid" => std::process::id(), "namespace" => &self.namespace);
        let events = Events::new(publisher, &self.namespace, log.clone());
        let launcher = Box::new(VmLauncher { debug: switch });
        let _ = self.log.set(log.clone());
        let task = TaskService::new(&self.id, launcher, events, self.exit.clone(), log);
        let _ = self.idle.set(task.idle_probe());
        // The daemon runs in its bundle (containerd starts `start` there).
        task.end_when_unreached(std::env::current_dir().ok());
        task
    }
}
