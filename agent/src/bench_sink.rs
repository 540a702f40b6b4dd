//! Benchmark source for `make bench` (bench/): when the guest kernel command line carries
//! `agent.bench_sink=1` (bench.py sets it through `kernel_params`), the agent as PID 1
//! also listens on vsock port 1025 and, for each connection from the host, writes zeros
//! as fast as it can until the peer closes. The host reads them through the sandbox's
//! hybrid vsock socket (`CONNECT 1025`) to measure the raw vsock ceiling of the VM, the
//! channel container stdout travels through. A production sandbox has no such port; when
//! there is one, it serves the host only, like the API (see `host_only`). It writes as the
//! stdio streams do, a pipe-full (`stdio::PIPE_SIZE`) per write on a socket with their
//! window (`stdio::streams::set_output_window`), so that it measures the channel and not
//! its own system calls (64 KiB writes, each a system call and a wake-up, held it to
//! about two thirds of the channel under TCG). One plain thread per connection; no async.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;

use kata_agent::host_only::{accept_from_host, blocking_listener};
use kata_agent::stdio::streams::set_output_window;
use kata_agent::stdio::PIPE_SIZE;
use slog::{info, warn, Logger};

use protocols::{BENCH_SINK_PARAM as ENABLE_PARAM, BENCH_SINK_VSOCK_PORT as BENCH_SINK_PORT};

/// Whether the kernel command line `cmdline` (/proc/cmdline) asks for the sink.
pub fn requested(cmdline: &str) -> bool {
    cmdline.split_whitespace().any(|word| word == ENABLE_PARAM)
}

/// Starts the listener thread; failures are logged and ignored: the agent's real work
/// must never depend on this.
pub fn start(log: Logger) {
    info!(log, "bench sink enabled"; "port" => BENCH_SINK_PORT, "by" => ENABLE_PARAM);
    let thread_log = log.clone();
    let spawned = std::thread::Builder::new()
        .name("bench-sink".into())
        .spawn(move || {
            if let Err(e) = serve(&thread_log) {
                warn!(thread_log, "bench sink stopped"; "port" => BENCH_SINK_PORT, "error" => %e);
            }
        });
    if let Err(e) = spawned {
        warn!(log, "cannot start the bench sink thread"; "error" => %e);
    }
}

fn serve(log: &Logger) -> nix::Result<()> {
    let listener = blocking_listener(BENCH_SINK_PORT)?;
    // Accepted sockets inherit it.
    if let Err(e) = set_output_window(listener.as_raw_fd()) {
        warn!(log, "bench sink keeps the default vsock window"; "error" => %e);
    }
    loop {
        let mut out = File::from(accept_from_host(log, &listener, BENCH_SINK_PORT)?);
        let _ = std::thread::Builder::new()
            .name("bench-sink-conn".into())
            .spawn(move || {
                let zeros = vec![0u8; PIPE_SIZE as usize];
                // Ends with EPIPE/ECONNRESET once the peer closes.
                while out.write_all(&zeros).is_ok() {}
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_parameter_enables_the_sink() {
        assert!(requested("console=ttyS0 agent.bench_sink=1 quiet\n"));
        assert!(requested("agent.bench_sink=1"));
        assert!(!requested("console=ttyS0 reboot=t panic=-1 quiet\n"));
        assert!(!requested("agent.bench_sink=0"));
        assert!(!requested("agent.bench_sink"));
        assert!(!requested("xagent.bench_sink=1 agent.bench_sink=10"));
    }
}
