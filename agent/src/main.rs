//! kata-agent's entry point. Three modes:
//! - `kata-agent __container-stage`: the container stage (see `stage`), dispatched before
//!   any thread exists;
//! - PID 1 in the guest: mount, then serve on vsock port 1024, stdio streams on 1028 and
//!   port-forward on 1027 (and, when the kernel command line asks, the bench sink on 1025
//!   and the debug console on 1026);
//! - `kata-agent --listen unix:///path.sock`: serve on the host for tests, as a child
//!   subreaper, without mounting anything global; stdio streams at `/path.sock.stdio`.

#[cfg(feature = "bench-sink")]
mod bench_sink;

use std::path::Path;
use std::sync::Arc;

use kata_agent::cgroup::CgroupRoot;
use kata_agent::rpc::{AgentRpc, Ending};
use kata_agent::sandbox::Sandbox;
use kata_agent::stage::protocol::STAGE_ARG;
use kata_agent::stage::spawner::StageSpawner;
use kata_agent::stdio::streams;
use kata_agent::{debug_console, host_only, init, logging, reaper::Reaper, stage};
use slog::{error, info, Logger};
use ttrpc::r#async::transport::Listener;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(STAGE_ARG) {
        stage::main();
    }
    let pid1 = std::process::id() == 1;
    let listen = match parse_listen(&args[1..]) {
        Ok(l) => l,
        // The kernel hands unknown cmdline words to init; PID 1 must not exit over them.
        Err(_) if pid1 => None,
        Err(e) => {
            eprintln!("kata-agent: {e}\nusage: kata-agent [--listen unix:///path/to.sock]");
            std::process::exit(2);
        }
    };
    if pid1 {
        let started_ms = init::boot_ms();
        let switched = init::leave_initramfs();
        let mounted = init::mount_base();
        let log = logging::logger(true);
        init::install_panic_hook(log.clone());
        if let Err(e) = switched {
            slog::warn!(log, "staying on the initramfs root; containers cannot pivot_root"; "error" => %e);
        }
        let mounted_ms = init::boot_ms();
        // Read after the base mounts (procfs among them).
        let cmdline = std::fs::read_to_string("/proc/cmdline");
        let rootfs_share = cmdline.as_deref().is_ok_and(init::has_rootfs_share);
        if let Err(e) = mounted.and_then(|()| init::mount_shares(rootfs_share)) {
            init::fatal(&log, &e.to_string());
        }
        // SAFETY: no thread exists yet (the first ones are the bench sink's, the debug
        // console's and the tokio runtime's, below).
        let stages = unsafe { StageSpawner::start(log.clone()) };
        // Where boot time goes, in ms since the kernel started.
        slog::info!(log, "agent started"; "init_ms" => started_ms,
            "base_mounts_ms" => mounted_ms, "shared_dir_ms" => init::boot_ms(),
            "rootfs_share" => rootfs_share);
        match cmdline {
            Ok(cmdline) => {
                bench_sink_if_requested(&log, &cmdline);
                debug_console::start_or_remove_shell(&log, &cmdline);
            }
            Err(e) => {
                slog::warn!(log, "cannot read /proc/cmdline; no rootfs share, no bench sink, \
                    no debug console"; "error" => %e);
                debug_console::remove_shell(&log);
            }
        }
        let addr = listen.unwrap_or_else(|| format!("vsock://-1:{}", protocols::AGENT_VSOCK_PORT));
        if let Err(e) = serve(&log, &addr, true, stages) {
            init::fatal(&log, &e.to_string());
        }
        init::fatal(&log, "the ttrpc server stopped");
    }
    let log = logging::logger(false);
    let Some(addr) = listen else {
        error!(log, "not PID 1: pass --listen unix:///path/to.sock");
        std::process::exit(2);
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        error!(log, "cannot become a child subreaper"; "error" => %e);
        std::process::exit(1);
    }
    // SAFETY: no thread exists yet (the tokio runtime starts in `serve`).
    let stages = unsafe { StageSpawner::start(log.clone()) };
    if let Err(e) = serve(&log, &addr, false, stages) {
        error!(log, "agent failed"; "error" => %e);
        std::process::exit(1);
    }
}

/// Why the agent could not serve its API.
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("unexpected arguments {0:?}")]
    Usage(Vec<String>),
    #[error("expected vsock://CID:PORT or unix:///path, got {0:?}")]
    Address(String),
    #[error("failed to {step}: {source}")]
    Io {
        step: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to start the ttrpc server on {addr}: {source}")]
    Server {
        addr: String,
        #[source]
        source: ttrpc::Error,
    },
}

fn io_step(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let step = step.into();
    move |source| ServeError::Io { step, source }
}

fn parse_listen(args: &[String]) -> Result<Option<String>, ServeError> {
    match args {
        [] => Ok(None),
        [flag, addr] if flag == "--listen" => Ok(Some(addr.clone())),
        _ => Err(ServeError::Usage(args.to_vec())),
    }
}

fn serve(log: &Logger, addr: &str, pid1: bool, stages: StageSpawner) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io_step("start the tokio runtime"))?;
    rt.block_on(async {
        let reaper = Reaper::start(log.clone()).map_err(io_step("install the SIGCHLD handler"))?;
        let cgroups = CgroupRoot::detect(Path::new("/sys/fs/cgroup"));
        let sandbox = Arc::new(Sandbox::new(log.clone(), reaper, cgroups, stages));
        let service = Arc::new(AgentRpc {
            sandbox: sandbox.clone(),
            ending: if pid1 {
                Ending::ResetGuest
            } else {
                Ending::ExitAgent
            },
        });
        let listener = listen(log, addr)?;
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(listener)
            .register_service(protocols::agent_ttrpc::create_agent_service(service));
        server
            .start()
            .await
            .map_err(|source| ServeError::Server {
                addr: addr.to_string(),
                source,
            })?;
        if pid1 {
            kata_agent::port_forward::start(log.clone());
            streams::start_vsock(log.clone(), sandbox.clone());
        } else if let Some(path) = addr.strip_prefix("unix://") {
            let path = format!("{path}.stdio");
            streams::start_unix(log.clone(), sandbox.clone(), Path::new(&path))
                .map_err(io_step(format!("listen for stdio streams on {path}")))?;
        }
        info!(log, "{}", protocols::AGENT_READY_MESSAGE; "address" => addr, "boot_ms" => init::boot_ms());
        if addr.starts_with("vsock://") {
            tokio::spawn(host_only::tell_host_ready());
        }

        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io_step("install the SIGTERM handler"))?;
        if pid1 {
            std::future::pending::<()>().await;
        }
        term.recv().await;
        info!(log, "SIGTERM: removing containers and exiting");
        sandbox.destroy().await;
        let _ = server.shutdown().await;
        Ok(())
    })
}

/// The API's listener: on vsock, one that serves the host only (see `host_only`); on a
/// unix socket (tests on the host), ttrpc's own.
fn listen(log: &Logger, addr: &str) -> Result<Listener, ServeError> {
    if let Some(vsock) = addr.strip_prefix("vsock://") {
        let parsed = vsock.split_once(':').and_then(|(cid, port)| {
            // ttrpc's spelling of VMADDR_CID_ANY.
            let cid = match cid {
                "-1" => libc::VMADDR_CID_ANY,
                cid => cid.parse().ok()?,
            };
            Some((cid, port.parse().ok()?))
        });
        let (cid, port) = parsed.ok_or_else(|| ServeError::Address(addr.to_string()))?;
        return host_only::ttrpc_listener(log.clone(), cid, port)
            .map_err(io_step(format!("listen on {addr}")));
    }
    let Some(path) = addr.strip_prefix("unix://") else {
        return Err(ServeError::Address(addr.to_string()));
    };
    let _ = std::fs::remove_file(path);
    Listener::bind(addr).map_err(io_step(format!("listen on {addr}")))
}

/// Starts the bench sink when the kernel command line asks for it ([`protocols::BENCH_SINK_PARAM`]),
/// in an agent built with it (`--features bench-sink`, `make initrd-bench`).
#[cfg(feature = "bench-sink")]
fn bench_sink_if_requested(log: &slog::Logger, cmdline: &str) {
    if bench_sink::requested(cmdline) {
        bench_sink::start(log.clone());
    }
}

/// A production agent has no bench sink: asking for one only says so.
#[cfg(not(feature = "bench-sink"))]
fn bench_sink_if_requested(log: &slog::Logger, cmdline: &str) {
    if cmdline
        .split_whitespace()
        .any(|w| w == protocols::BENCH_SINK_PARAM)
    {
        slog::warn!(
            log,
            "the kernel command line asks for the bench sink, which this agent \
            is built without; `make bench` uses an initrd whose agent has it (make initrd-bench)"
        );
    }
}
