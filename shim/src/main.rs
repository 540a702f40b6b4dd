//! `containerd-shim-kata-v2`: containerd's shim for running each pod in its own VM.
//!
//! containerd runs it with `start` (spawn or find the sandbox's daemon), `delete` (clean
//! up after a dead daemon), or as the daemon that serves the Task API over ttrpc. `start`
//! and `delete` are ours; the daemon runs on containerd's shim crate. This crate only
//! translates: containerd's requests, options, mounts and messages onto the `kata-sandbox`
//! library, which owns the sandbox's life (boot, pooled VMs, containers' host side,
//! resize, metrics, teardown), and the library's answers and exits back into containerd's
//! terms (task states, events, stdio).

mod container;
mod events;
mod io;
mod launch;
mod options;
mod ratelimit;
mod service;
mod start;
mod stats;
mod task;

use kata_sandbox::log;

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use containerd_shim::asynchronous::Shim;
use containerd_shim_protos::protobuf::Message;

/// The runtime name containerd knows this shim by.
const RUNTIME_ID: &str = "io.containerd.kata.v2";

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    let flags = match containerd_shim::parse(args.get(1..).unwrap_or_default()) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("{RUNTIME_ID}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if flags.version {
        println!(
            "containerd-shim-kata-v2 {} ({RUNTIME_ID})",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    if flags.info {
        // containerd 2.x asks every runtime for its OCI features (`-info`, the runtime
        // options on stdin); its CRI turns on recursive read-only mounts from them.
        let options = start::read_stdin();
        return write_stdout(&start::runtime_info(
            RUNTIME_ID,
            env!("CARGO_PKG_VERSION"),
            &options,
        ));
    }
    match flags.action.as_str() {
        "start" => run_start(&flags),
        "delete" => run_delete(flags),
        _ => run_daemon(),
    }
}

/// `start`: the address (or a bootstrap result) on stdout; an error on stderr, which
/// containerd shows with the failed start.
fn run_start(flags: &containerd_shim::Flags) -> ExitCode {
    let input = start::read_stdin();
    let switch = log::DebugSwitch::default();
    switch.set(flags.debug);
    let sandbox = match start::sandbox_id_of_bundle(&flags.id) {
        Ok(sandbox) => sandbox,
        Err(e) => {
            eprintln!("{RUNTIME_ID}: start {}: {e}", flags.id);
            return ExitCode::FAILURE;
        }
    };
    let logger = log::fifo_logger(Path::new("log"), &sandbox, &switch);
    match start::start(flags, &sandbox, &input, &logger) {
        Ok(out) => write_stdout(&out),
        Err(e) => {
            slog::error!(logger, "start failed: {e}"; "container" => &flags.id);
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `delete`: a DeleteResponse on stdout, after undoing what the sandbox's state records.
fn run_delete(flags: containerd_shim::Flags) -> ExitCode {
    let Some(rt) = runtime(&mut tokio::runtime::Builder::new_current_thread()) else {
        return ExitCode::FAILURE;
    };
    let out = rt.block_on(async {
        let mut config = containerd_shim::Config::default();
        let mut svc = service::Service::new(RUNTIME_ID, &flags, &mut config).await;
        svc.delete_shim().await
    });
    match out
        .map_err(|e| e.to_string())
        .and_then(|r| r.write_to_bytes().map_err(|e| e.to_string()))
    {
        Ok(bytes) => write_stdout(&bytes),
        Err(e) => {
            eprintln!("{RUNTIME_ID}: delete: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The daemon (`-socket ADDRESS`, spawned by `start`), on containerd's shim crate.
fn run_daemon() -> ExitCode {
    let Some(rt) = runtime(&mut tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    // Agent request latencies go to the sandbox's metrics.
    agent_client::observe_requests(|op, took| {
        kata_sandbox::metrics::METRICS.agent_request(op, took)
    });
    kata_sandbox::host_mounts::set_rootfs_mounter(task::mount_rootfs);
    let config = containerd_shim::Config {
        // The shim logs with slog into the bundle's log fifo itself.
        no_setup_logger: true,
        ..Default::default()
    };
    rt.block_on(containerd_shim::asynchronous::run::<service::Service>(
        RUNTIME_ID,
        Some(config),
    ));
    ExitCode::SUCCESS
}

/// A tokio runtime from `builder`, or the reason on stderr.
fn runtime(builder: &mut tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    builder
        .enable_all()
        .build()
        .inspect_err(|e| eprintln!("{RUNTIME_ID}: starting tokio: {e}"))
        .ok()
}

/// Writes an action's answer for containerd.
fn write_stdout(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
