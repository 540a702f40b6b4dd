//! OOM-kill events for GetOOMEvent.
//!
//! Each container's `memory.events` is watched with inotify (the kernel signals a modify
//! event on it whenever a counter changes). On every event, and once more when the
//! container's process exits and when the container goes away, the `oom_kill` counter is
//! read and compared with the last value seen: each increase queues that many events
//! with the container's id. The comparison happens under one lock, so a kill is queued
//! exactly once whichever path sees it first. Without inotify the files are polled every
//! 100 ms.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use slog::{info, warn, Logger};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

use super::keyed_value;

const EVENTS_FILE: &str = "memory.events";
/// How often files are read when inotify cannot tell us.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often an inotify-driven watcher wakes anyway (to poll files it could not watch).
const IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// Queues one container id per OOM kill; [`OomWatcher::next`] takes them in order.
pub struct OomWatcher {
    inner: Arc<Inner>,
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>,
}

struct Inner {
    log: Logger,
    inotify: Option<AsyncFd<OwnedFd>>,
    watches: Mutex<HashMap<String, Watch>>,
    queue: mpsc::UnboundedSender<String>,
}

struct Watch {
    events_file: PathBuf,
    /// The inotify watch descriptor; `None` = polled.
    wd: Option<i32>,
    /// The `oom_kill` count already queued.
    seen: u64,
}

impl OomWatcher {
    /// Starts the watcher task on the current tokio runtime.
    pub fn start(log: Logger) -> OomWatcher {
        let inotify = match inotify_init().and_then(|fd| {
            // SAFETY: the OwnedFd is an open inotify fd, owned by the AsyncFd from here
            // on, so it stays open and the same for the AsyncFd's whole life.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(io::Error::from)
        }) {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!(log, "no inotify; polling memory.events every 100 ms"; "error" => %e);
                None
            }
        };
        let (queue, events) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            log,
            inotify,
            watches: Mutex::new(HashMap::new()),
            queue,
        });
        tokio::spawn(run(inner.clone()));
        OomWatcher {
            inner,
            events: tokio::sync::Mutex::new(events),
        }
    }

    /// Starts watching the cgroup `dir` of container `id`. A cgroup without the memory
    /// controller has no OOM kills to report and is skipped.
    pub fn watch(&self, id: &str, dir: &Path) {
        let events_file = dir.join(EVENTS_FILE);
        let Ok(text) = std::fs::read_to_string(&events_file) else {
            info!(self.inner.log, "no memory.events; OOM kills go unreported";
                "container_id" => id);
            return;
        };
        let seen = keyed_value(&text, "oom_kill").unwrap_or(0);
        let wd = self.inner.inotify.as_ref().and_then(|fd| {
            add_watch(fd.get_ref(), &events_file)
                .map_err(|e| {
                    warn!(self.inner.log, "cannot watch memory.events; polling it";
                        "container_id" => id, "error" => %e)
                })
                .ok()
        });
        let watch = Watch {
            events_file,
            wd,
            seen,
        };
        if let Some(old) = self.inner.lock().insert(id.to_string(), watch) {
            self.inner.remove_watch(&old);
        }
    }

    /// Queues any OOM kill of container `id` not seen yet (e.g. right after its process
    /// exited, so the event is not later than the exit).
    pub fn check(&self, id: &str) {
        self.inner.check(&mut self.inner.lock(), id);
    }

    /// Takes a last look at container `id` and stops watching it; call before its
    /// cgroup is removed.
    pub fn unwatch(&self, id: &str) {
        let mut watches = self.inner.lock();
        self.inner.check(&mut watches, id);
        if let Some(old) = watches.remove(id) {
            self.inner.remove_watch(&old);
        }
    }

    /// Waits for the next OOM kill and returns the container's id.
    pub async fn next(&self) -> String {
        match self.events.lock().await.recv().await {
            Some(id) => id,
            // The sender lives in `inner`, which lives as long as `self`.
            None => std::future::pending().await,
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Watch>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, watches: &mut HashMap<String, Watch>, id: &str) {
        let Some(watch) = watches.get_mut(id) else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(&watch.events_file) else {
            return; // the cgroup is gone; unwatch took the last look
        };
        let count = keyed_value(&text, "oom_kill").unwrap_or(0);
        while watch.seen < count {
            watch.seen += 1;
            warn!(self.log, "container process OOM-killed"; "container_id" => id);
            // Cannot fail: the receiver lives as long as this sender.
            let _ = self.queue.send(id.to_string());
        }
    }

    fn check_wds(&self, wds: &[i32]) {
        let mut watches = self.lock();
        let ids: Vec<String> = watches
            .iter()
            .filter(|(_, w)| w.wd.is_some_and(|wd| wds.contains(&wd)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.check(&mut watches, &id);
        }
    }

    fn check_polled(&self) {
        let mut watches = self.lock();
        let ids: Vec<String> = watches
            .iter()
            .filter(|(_, w)| w.wd.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.check(&mut watches, &id);
        }
    }

    fn remove_watch(&self, watch: &Watch) {
        if let (Some(fd), Some(wd)) = (&self.inotify, watch.wd) {
            // Fails harmlessly if the kernel already dropped the watch (cgroup removed).
            // SAFETY: inotify_rm_watch takes two integers and touches no memory of ours.
            unsafe { libc::inotify_rm_watch(fd.get_ref().as_raw_fd(), wd) };
        }
    }
}

/// The watcher task: reacts to inotify events, and polls files it could not watch.
async fn run(inner: Arc<Inner>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Some(fd) = &inner.inotify else {
            tokio::time::sleep(POLL_INTERVAL).await;
            inner.check_polled();
            continue;
        };
        let polling = inner.lock().values().any(|w| w.wd.is_none());
        let wait = if polling {
            POLL_INTERVAL
        } else {
            IDLE_INTERVAL
        };
        if let Ok(ready) = tokio::time::timeout(wait, fd.readable()).await {
            let mut guard = match ready {
                Ok(guard) => guard,
                Err(e) => {
                    warn!(inner.log, "inotify wait failed"; "error" => %e);
                    tokio::time::sleep(POLL_INTERVAL).await;
                    continue;
                }
            };
            match guard.try_io(|fd| {
                nix::unistd::read(fd.get_ref().as_raw_fd(), &mut buf).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => inner.check_wds(&event_wds(&buf[..n])),
                Ok(Err(e)) => warn!(inner.log, "read inotify events"; "error" => %e),
                Err(_would_block) => {}
            }
        }
        if polling {
            inner.check_polled();
        }
    }
}

/// The watch descriptors of the `struct inotify_event`s in `buf`.
pub fn event_wds(buf: &[u8]) -> Vec<i32> {
    const HEADER: usize = 16; // wd, mask, cookie, len: 4 bytes each
    let mut wds = Vec::new();
    let mut offset = 0;
    while offset + HEADER <= buf.len() {
        let field = |i: usize| {
            let start = offset + 4 * i;
            [buf[start], buf[start + 1], buf[start + 2], buf[start + 3]]
        };
        let wd = i32::from_ne_bytes(field(0));
        let name_len = u32::from_ne_bytes(field(3)) as usize;
        if !wds.contains(&wd) {
            wds.push(wd);
        }
        offset += HEADER + name_len;
    }
    wds
}

fn inotify_init() -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes flags only and returns a new fd or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn add_watch(fd: &OwnedFd, path: &Path) -> io::Result<i32> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `fd` is an
    // open inotify fd; the kernel only reads the string.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(wd: i32, name_len: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&wd.to_ne_bytes());
        v.extend_from_slice(&(libc::IN_MODIFY).to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&name_len.to_ne_bytes());
        v.extend(std::iter::repeat_n(0u8, name_len as usize));
        v
    }

    #[test]
    fn parses_inotify_events() {
        let mut buf = event(3, 0);
        buf.extend(event(5, 16));
        buf.extend(event(3, 0));
        assert_eq!(event_wds(&buf), vec![3, 5]);
        assert!(event_wds(&buf[..10]).is_empty());
    }

    fn test_log() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    #[tokio::test]
    async fn one_event_per_oom_kill_through_inotify() {
        let dir = std::env::temp_dir().join(format!("cg-oom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let events = dir.join(EVENTS_FILE);
        std::fs::write(&events, "oom 0\noom_kill 0\n").expect("seed");
        let watcher = OomWatcher::start(test_log());
        watcher.watch("c1", &dir);

        std::fs::write(&events, "oom 2\noom_kill 2\n").expect("bump");
        let timeout = Duration::from_secs(5);
        for _ in 0..2 {
            let id = tokio::time::timeout(timeout, watcher.next())
                .await
                .expect("event");
            assert_eq!(id, "c1");
        }
        // Seen already: an explicit check and the final look add nothing.
        watcher.check("c1");
        std::fs::write(&events, "oom 3\noom_kill 3\n").expect("bump");
        watcher.unwatch("c1");
        assert_eq!(
            tokio::time::timeout(timeout, watcher.next())
                .await
                .expect("event"),
            "c1"
        );
        watcher.check("c1");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), watcher.next())
                .await
                .is_err(),
            "no duplicates"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
