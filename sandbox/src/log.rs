//! The shim's logger: slog JSON lines into the bundle's `log` fifo, which containerd
//! copies into its own log. Every line names the sandbox.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slog::{o, Drain, Logger};

/// Room for one record: slog-json writes a record token by token, and a record goes out in
/// one write(2) if it fits.
const RECORD_BYTES: usize = 16 * 1024;

/// Writes to the fifo if it could be opened, else nowhere (a shim must never block on
/// its own logging). A record is held until its newline and written whole: containerd
/// copies each shim's fifo into its one log as it reads it, so a record that reached the
/// fifo in pieces could be cut by another shim's lines when many shims log at once.
struct Sink<W: Write>(Option<LineWriter<W>>);

impl<W: Write> Sink<W> {
    fn new(out: Option<W>) -> Sink<W> {
        Sink(out.map(|w| LineWriter::with_capacity(RECORD_BYTES, w)))
    }
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = self.0.as_mut() {
            if f.write_all(buf).is_err() {
                self.0 = None;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// JSON lines on stderr, one write(2) per record (see `Sink`), for the shim's daemons
/// whose stderr is their log.
pub fn stderr_lines() -> impl Write + Send + 'static {
    Sink::new(Some(std::io::stderr()))
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
    logger_into(Some(Fifo::new(path)), sandbox_id, debug)
}

/// How often a fifo without a reader is tried again.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// The log fifo, opened again when its reader went away and a new one came: containerd
/// killed or restarted opens the fifo of every shim it reloads. Records written while
/// nobody reads are dropped.
struct Fifo {
    path: PathBuf,
    file: Option<File>,
    next_try: Instant,
}

impl Fifo {
    fn new(path: &Path) -> Self {
        Fifo {
            path: path.to_path_buf(),
            file: open_fifo_writer(path),
            next_try: Instant::now() + REOPEN_EVERY,
        }
    }
}

impl Write for Fifo {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.file.is_none() && Instant::now() >= self.next_try {
            self.file = open_fifo_writer(&self.path);
            self.next_try = Instant::now() + REOPEN_EVERY;
        }
        if let Some(f) = self.file.as_mut() {
            if f.write_all(buf).is_err() {
                self.file = None;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logger_into<W: Write + Send + 'static>(
    out: Option<W>,
    sandbox_id: &str,
    debug: &DebugSwitch,
) -> Logger {
    let json = slog_json::Json::new(Sink::new(out))
        .add_default_keys()
        .build();
    let switch = debug.0.clone();
    let drain = slog::Filter::new(json, move |r: &slog::Record| {
        r.level().is_at_least(slog::Level::Info) || switch.load(Ordering::Relaxed)
    });
    Logger::root(
        Mutex::new(drain).fuse(),
        o!("source" => "kata-shim", "sandbox" => sandbox_id.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use slog::info;

    /// Every write(2) the logger makes, as it made it.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_record_reaches_the_fifo_in_one_write() {
        let calls = Calls::default();
        let log = logger_into(Some(calls.clone()), "sb1", &DebugSwitch::default());
        info!(log, "VM claimed from pool"; "phase" => "VM claimed from pool", "vm" => "pool-1");
        info!(log, "second"; "text" => "a\nb");
        let got = calls.0.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "one write per record: {got:?}");
        for (w, msg) in got.iter().zip(["VM claimed from pool", "second"]) {
            assert_eq!(w.last(), Some(&b'\n'));
            let v: serde_json::Value = serde_json::from_slice(w).unwrap();
            assert_eq!(v["msg"], msg);
            assert_eq!(v["sandbox"], "sb1");
        }
    }

    #[test]
    fn debug_lines_follow_the_switch() {
        let calls = Calls::default();
        let switch = DebugSwitch::default();
        let log = logger_into(Some(calls.clone()), "sb1", &switch);
        slog::debug!(log, "hidden");
        switch.set(true);
        slog::debug!(log, "shown");
        let got = calls.0.lock().unwrap().concat();
        let text = String::from_utf8(got).unwrap();
        assert!(!text.contains("hidden") && text.contains("shown"), "{text}");
    }

    #[test]
    fn the_fifo_is_opened_again_once_a_new_reader_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let open_reader = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .unwrap()
        };
        let reader = open_reader();
        let mut fifo = Fifo::new(&path);
        fifo.write_all(b"one\n").unwrap();
        // containerd killed: the write fails (EPIPE) and the record is dropped.
        drop(reader);
        fifo.write_all(b"lost\n").unwrap();
        assert!(fifo.file.is_none());
        // containerd started again and reloading the shim: its reader is back.
        let mut reader = open_reader();
        fifo.next_try = Instant::now();
        fifo.write_all(b"two\n").unwrap();
        let mut got = [0u8; 64];
        let n = std::io::Read::read(&mut reader, &mut got).unwrap();
        assert_eq!(&got[..n], b"two\n");
    }

    #[test]
    fn a_failed_write_stops_logging_without_failing_the_caller() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = Sink::new(Some(Broken));
        assert_eq!(sink.write(b"{}\n").unwrap(), 3);
        assert!(sink.0.is_none());
        assert_eq!(sink.write(b"{}\n").unwrap(), 3);
    }
}
