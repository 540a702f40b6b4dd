//! A shim's log as containerd reads it: the bundle's `log` fifo, drained in the
//! background, so that a test driving the shim binary without containerd can show what
//! the shim said when it fails.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bundle's `log` fifo and what has been read of it; the reader thread ends with it.
pub struct ShimLog {
    text: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl ShimLog {
    /// Makes the fifo at `path` and reads it until dropped. Opened read-write, as a
    /// reader that is always there: the shim opens its side without waiting, and a shim
    /// that ends is no end of the log (a daemon started after it writes to it too).
    pub fn open(path: &Path) -> Self {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("making the shim's log fifo");
        let mut fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .expect("opening the shim's log fifo");
        let text = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, stopped) = (text.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match fifo.read(&mut chunk) {
                    Ok(n) if n > 0 => {
                        if let Ok(mut t) = sink.lock() {
                            t.extend_from_slice(&chunk[..n]);
                        }
                        continue;
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                    _ => {}
                }
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        ShimLog {
            text,
            stop,
            reader: Some(reader),
        }
    }

    /// The last `lines` lines the shim logged.
    pub fn tail(&self, lines: usize) -> String {
        let text = self.text.lock().map(|t| t.clone()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ShimLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}
