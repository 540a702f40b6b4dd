//! The shim binary's lifecycle as containerd drives it: `start` (spawn the per-sandbox
//! daemon, or return the address of the sandbox's daemon for a pod's other containers),
//! `delete` (clean up after a daemon that died), and the daemon itself.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::util::write_str_to_file;
use containerd_shim::asynchronous::{spawn, ExitSignal, Shim};
use containerd_shim::{Config, Error as ShimError, Flags, StartOpts};
use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::MessageField;
use slog::{info, o, Logger};

use crate::events::{timestamp, Events};
use crate::launch::VmLauncher;
use crate::log::{fifo_logger, DebugSwitch};
use crate::persist::SandboxState;
use crate::sandbox::cleanup_host;
use crate::spec;
use crate::task::TaskService;

pub struct Service {
    id: String,
    namespace: String,
    /// containerd's address (`-address`), from which a sandbox's socket path follows.
    address: String,
    /// The daemon's own socket (`-socket`, `unix://...`); empty outside the daemon.
    socket: String,
    debug: bool,
    exit: Arc<ExitSignal>,
}

/// Removes the shim socket at `address` (`unix://PATH`); with `only_if_dead`, only when no
/// daemon answers on it.
fn remove_socket(address: &str, only_if_dead: bool) {
    let Some(path) = address.strip_prefix("unix://") else {
        return;
    };
    if !only_if_dead || std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// Reads the sandbox id of the container whose bundle is the current directory.
fn sandbox_id_of_bundle(id: &str) -> String {
    std::fs::read("config.json")
        .ok()
        .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .map(|s| spec::sandbox_of(&s, id))
        .unwrap_or_else(|| id.to_string())
}

fn other(msg: String) -> ShimError {
    ShimError::Other(msg)
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Service {
            id: args.id.clone(),
            namespace: args.namespace.clone(),
            address: args.address.clone(),
            socket: args.socket.clone(),
            debug: args.debug,
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, ShimError> {
        let sandbox_id = sandbox_id_of_bundle(&opts.id);
        if sandbox_id != opts.id {
            // A pod container: its sandbox's daemon serves it; spawn nothing.
            let address =
                containerd_shim::socket_address(&opts.address, &opts.namespace, &sandbox_id);
            let path = address.trim_start_matches("unix://");
            if std::os::unix::net::UnixStream::connect(path).is_err() {
                return Err(other(format!(
                    "sandbox {sandbox_id} of container {} has no running shim at {address}; start the sandbox container first",
                    opts.id
                )));
            }
            write_str_to_file("address", &address).await?;
            if let Ok(state) = SandboxState::load(&sandbox_id) {
                let _ = std::fs::write("shim.pid", state.shim_pid.to_string());
            }
            return Ok(address);
        }
        let address = spawn(opts, &sandbox_id, Vec::new()).await?;
        write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> Result<DeleteResponse, ShimError> {
        // containerd calls this when the daemon is gone: undo what its state records.
        let log = Logger::root(slog::Discard, o!());
        let sandbox_id = sandbox_id_of_bundle(&self.id);
        if sandbox_id == self.id {
            if let Ok(state) = SandboxState::load(&sandbox_id) {
                cleanup_host(&state, &log).await;
            }
            // A daemon that was killed never removed its socket.
            let address =
                containerd_shim::socket_address(&self.address, &self.namespace, &sandbox_id);
            remove_socket(&address, true);
        } else {
            let share = crate::mount::SharedDirs::for_sandbox(&sandbox_id)
                .mounts
                .join(&self.id);
            crate::container::teardown_host_mounts(&[], &share);
        }
        let rootfs = Path::new("rootfs");
        for m in
            crate::mount::mounts_under(&std::env::current_dir().unwrap_or_default().join(rootfs))
        {
            crate::mount::unmount(&m);
        }
        Ok(DeleteResponse {
            pid: 0,
            exit_status: 128 + libc::SIGKILL as u32,
            exited_at: MessageField::some(timestamp(SystemTime::now())),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
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
        TaskService::new(&self.id, launcher, events, self.exit.clone(), log)
    }
}
