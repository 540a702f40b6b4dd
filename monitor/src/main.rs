//! kata-monitor: one daemon per node that serves the metrics of every sandbox for
//! Prometheus, as Kata's does. It finds the sandboxes under the runtime's state directory
//! (`/run/vc/sbs/<id>/shim-monitor.sock`), scrapes each shim concurrently within a
//! deadline, labels each series with `sandbox_id` and the pod's `cri_uid`, `cri_name`
//! and `cri_namespace` (from the CRI's ListPodSandbox on `--runtime-endpoint`), and adds
//! its own `kata_monitor_*` figures. Nothing runs between scrapes.

mod args;
mod cri;
mod log;
mod monitor;
mod server;

use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::sync::Arc;

use log::info;

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("kata-monitor: {msg}");
    ExitCode::from(code)
}

/// Binds the listen address; the error says what is wrong and what to do.
fn bind(address: &str) -> Result<std::net::TcpListener, String> {
    let addrs: Vec<_> = address
        .to_socket_addrs()
        .map_err(|e| format!("--listen-address {address:?} is not IP:PORT ({e})"))?
        .collect();
    let mut last = None;
    for addr in &addrs {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == std::io::ErrorKind::AddrInUse => format!(
            "cannot listen on {address}: the address is in use (another kata-monitor?); \
             stop it or choose another with --listen-address"
        ),
        Some(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => format!(
            "cannot listen on {address}: not an address of this host; choose another with \
             --listen-address"
        ),
        Some(e) => format!("cannot listen on {address}: {e}"),
        None => format!("--listen-address {address:?} resolves to no address"),
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&argv) {
        Ok(args::Command::Run(a)) => a,
        Ok(args::Command::Help) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(args::Command::Version) => {
            println!("kata-monitor {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(2, &format!("{e} (see kata-monitor --help)")),
    };
    log::set_threshold(args.log_level);
    if let Err(e) = cri::check_endpoint(&args.runtime_endpoint) {
        return fail(1, &e);
    }
    let listener = match bind(&args.listen_address) {
        Ok(l) => l,
        Err(e) => return fail(1, &e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, &format!("starting the async runtime: {e}")),
    };
    runtime
        .block_on(async move {
            let listener = listener
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(listener))
                .map_err(|e| format!("listening on {}: {e}", args.listen_address))?;
            let cri = cri::Cri::new(&args.runtime_endpoint)?;
            let monitor = Arc::new(monitor::Monitor::new(
                args.sandboxes_dir.clone(),
                args.shim_timeout,
                cri,
            ));
            let local = listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| args.listen_address.clone());
            info!(
                "listening on {local}; sandboxes in {}, pods from {}",
                args.sandboxes_dir.display(),
                args.runtime_endpoint.display()
            );
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
            let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
            tokio::select! {
                _ = server::serve(listener, monitor) => {}
                _ = term.recv() => info!("SIGTERM: exiting"),
                _ = int.recv() => info!("SIGINT: exiting"),
            }
            Ok::<(), String>(())
        })
        .map_or_else(|e| fail(1, &e), |()| ExitCode::SUCCESS)
}
