//! The shim's logger: slog JSON lines into the bundle's `log` fifo, which containerd
//! copies into its own log. Every line names the sandbox.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use slog::{o, Drain, Logger};

/// Writes to the fifo if it could be opened, else nowhere (a shim must never block on
/// its own logging).
struct Sink(Mutex<Option<File>>);

impl Write for &Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut g) = self.0.lock() {
            if let Some(f) = g.as_mut() {
                if f.write_all(buf).is_err() {
                    *g = None;
                }
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Turns debug lines on at run time (the config file can enable them after start).
#[derive(Clone, Default)]
pub struct DebugSwitch(Arc<AtomicBool>);

impl DebugSwitch {
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// Opens the fifo at `path` for writing if a reader (containerd) holds its other side,
/// never blocking on the open; writes then block, so that no line is lost to EAGAIN.
pub fn open_fifo_writer(path: &Path) -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own, with flags read from it just before.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    Some(f)
}

/// Opens `path` (containerd holds its read side) and builds the root logger.
pub fn fifo_logger(path: &Path, sandbox_id: &str, debug: &DebugSwitch) -> Logger {
    let file = open_fifo_writer(path);
    let sink: &'static Sink = Box::leak(Box::new(Sink(Mutex::new(file))));
    let json = slog_json::Json::new(sink).add_default_keys().build();
    let switch = debug.0.clone();
    let drain = slog::Filter::new(json, move |r: &slog::Record| {
        r.level().is_at_least(slog::Level::Info) || switch.load(Ordering::Relaxed)
    });
    Logger::root(
        Mutex::new(drain).fuse(),
        o!("source" => "kata-shim", "sandbox" => sandbox_id.to_string()),
    )
}
