//! `containerd-shim-kata-v2`: containerd's shim for running each pod in its own VM.
//!
//! containerd runs it with `start` (spawn or find the sandbox's daemon), `delete` (clean
//! up after a dead daemon), or as the daemon that serves the Task API over ttrpc.

mod agent;
mod cgroup;
mod command;
mod container;
mod events;
mod io;
mod launch;
mod log;
mod mount;
mod network;
mod options;
mod persist;
mod sandbox;
mod service;
mod spec;
mod stats;
mod task;
mod watchdog;

#[tokio::main]
async fn main() {
    let config = containerd_shim::Config {
        // The shim logs with slog into the bundle's log fifo itself.
        no_setup_logger: true,
        ..Default::default()
    };
    containerd_shim::asynchronous::run::<service::Service>("io.containerd.kata.v2", Some(config))
        .await;
}
