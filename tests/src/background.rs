//! A child process (usually `ctr`) that runs while the test acts: its output is collected
//! as it comes, it can be waited for with a limit, and it is killed if the test leaves it
//! running (also when the test fails).

use std::process::Output;
use std::time::{Duration, Instant};

/// A child process (usually `ctr`) whose output is collected in the background and which is
/// killed, by its pid, if the test leaves it running.
pub struct Background {
    child: Option<std::process::Child>,
    out: Collected,
    err: Collected,
}

/// What a reader thread has collected of one output stream so far.
struct Collected {
    buf: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Collected {
    fn start(r: Option<impl std::io::Read + Send + 'static>) -> Self {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buf.clone();
        let reader = r.map(|mut r| {
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut b) = sink.lock() {
                        b.extend_from_slice(&chunk[..n]);
                    }
                }
            })
        });
        Collected { buf, reader }
    }

    fn so_far(&self) -> Vec<u8> {
        self.buf.lock().map(|b| b.clone()).unwrap_or_default()
    }

    fn finish(&mut self) -> Vec<u8> {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.so_far()
    }
}

impl Background {
    pub fn new(mut child: std::process::Child) -> Self {
        let out = Collected::start(child.stdout.take());
        let err = Collected::start(child.stderr.take());
        Background {
            child: Some(child),
            out,
            err,
        }
    }

    /// The process's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// What it has written to stdout so far.
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.out.so_far()).into_owned()
    }

    /// Its output once it has ended, waiting up to `limit`; `None` (and the process killed)
    /// when it did not end in time.
    pub fn wait_within(&mut self, limit: Duration) -> Option<Output> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break None,
            }
        };
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        };
        Some(Output {
            status,
            stdout: self.out.finish(),
            stderr: self.err.finish(),
        })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
