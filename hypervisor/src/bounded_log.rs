//! Log files of a sandbox's host processes that never outgrow their cap.
//!
//! A guest may make QEMU, virtiofsd, kata-vmm or kata-vsock print without end (warnings
//! about what the guest's drivers do, the guest console), and `/run` is memory. So none of
//! them writes a file of its own: each gets the write end of a pipe (as stdout and
//! stderr, or the console's descriptor), and a thread of the process that started it
//! reads the other end into the log file, which never grows beyond its cap: when the
//! next output would cross the cap, the file is cut to its newest lines (about half the
//! cap, starting at a line) behind a line saying so, and written on. The tail that error
//! messages quote ([`crate::process::log_tail`]) is always kept.
//!
//! The thread ends when every write end is closed: when the process (and whatever it
//! forked) is gone. Should the shim die first, the writes fail with EPIPE and the output
//! is dropped (each of these programs ignores SIGPIPE).
//!
//! [`settle`] waits until a log holds everything its writers wrote so far, so that the
//! tail quoted right after a process died has its last words.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use slog::{warn, Logger};

use crate::Error;

/// The most a host process's log holds, in bytes (1 MiB): the console's, QEMU's,
/// virtiofsd's, kata-vmm's and kata-vsock's alike.
pub const LOG_CAP: u64 = 1 << 20;
/// What each read from the pipe takes at most.
const READ_CHUNK: usize = 16 * 1024;
/// How long [`settle`] waits for a reader that keeps finding more.
const SETTLE_LIMIT: Duration = Duration::from_millis(500);

/// The pipe's read end and the lock its reader holds from taking bytes out of the pipe
/// to having written them, which [`settle`] takes to see both at rest.
struct Drain {
    pipe: File,
    busy: Mutex<()>,
}

/// The log files whose readers run, by path.
fn drains() -> &'static Mutex<HashMap<PathBuf, Weak<Drain>>> {
    static DRAINS: OnceLock<Mutex<HashMap<PathBuf, Weak<Drain>>>> = OnceLock::new();
    DRAINS.get_or_init(Default::default)
}

/// Starts the reader for log `path` (created empty, or emptied), capped at `cap` bytes,
/// and returns the pipe's write end for the process. `what` names the writer in the
/// cut's note and in warnings. Drop every copy of the write end once the process is
/// spawned, so that the reader ends with it.
pub fn start(path: &Path, cap: u64, what: &str, logger: &Logger) -> Result<Arc<OwnedFd>, Error> {
    let run_dir = |source| Error::RunDir {
        path: path.to_path_buf(),
        source,
    };
    let ring = RingFile::create(path, cap, what).map_err(run_dir)?;
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| run_dir(e.into()))?;
    let drain = Arc::new(Drain {
        pipe: File::from(read),
        busy: Mutex::new(()),
    });
    {
        let mut all = drains().lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, d| d.strong_count() > 0);
        all.insert(path.to_path_buf(), Arc::downgrade(&drain));
    }
    let logger = logger.clone();
    let what = what.to_string();
    std::thread::Builder::new()
        .name("bounded-log".into())
        .spawn(move || run(&drain, ring, &what, &logger))
        .map_err(run_dir)?;
    Ok(Arc::new(write))
}

/// Waits (at most [`SETTLE_LIMIT`]) until log `path` holds everything its writers wrote
/// so far. A path without a running reader returns at once.
pub fn settle(path: &Path) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let drain = drains()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .and_then(Weak::upgrade);
        let Some(drain) = drain else {
            return;
        };
        {
            let _at_rest = drain.busy.lock().unwrap_or_else(|e| e.into_inner());
            if unread(&drain.pipe) == 0 {
                return;
            }
        }
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Bytes waiting in pipe `pipe` (0 when it cannot tell).
fn unread(pipe: &File) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`.
    let r = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        n.max(0) as usize
    }
}

/// Reads the pipe until every writer is gone, into the ring. A failing write is reported
/// once and the output dropped: the reader never stops before the writers, which would
/// block on a full pipe.
fn run(drain: &Drain, mut ring: RingFile, what: &str, logger: &Logger) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut failed = false;
    loop {
        // Waits outside the lock, reads and writes inside it (see `settle`).
        let mut fds = [nix::poll::PollFd::new(
            drain.pipe.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!(logger, "cannot wait for output of {what}; it is no longer logged"; "error" => %e);
                return;
            }
        }
        let _busy = drain.busy.lock().unwrap_or_else(|e| e.into_inner());
        let n = match (&drain.pipe).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!(logger, "cannot read the output of {what}; it is no longer logged";
                    "error" => %e);
                return;
            }
        };
        if let Err(e) = ring.write(&buf[..n]) {
            if !failed {
                warn!(logger, "cannot write the log of {what}; its output is dropped \
                    until writing works again (is the run directory's file system full?)";
                    "path" => ring.path.display().to_string(), "error" => %e);
            }
            failed = true;
        } else {
            failed = false;
        }
    }
}

/// A log file that stays within `cap` bytes, keeping its newest output.
struct RingFile {
    path: PathBuf,
    file: File,
    len: u64,
    cap: u64,
    /// The first line of a cut log.
    note: String,
}

impl RingFile {
    fn create(path: &Path, cap: u64, what: &str) -> std::io::Result<Self> {
        let file = create_fresh(path)?;
        let note = format!("[kata: older output of {what} was dropped to keep this log bounded]\n");
        Ok(Self {
            path: path.to_path_buf(),
            file,
            len: 0,
            // Room for the note and some output, whatever the caller asks.
            cap: cap.max(4 * note.len() as u64),
            note,
        })
    }

    fn write(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        let half = self.cap / 2;
        if data.len() as u64 > half {
            data = &data[data.len() - half as usize..];
        }
        if self.len + data.len() as u64 > self.cap {
            self.cut(half - data.len() as u64)?;
        }
        self.file.write_all(data)?;
        self.len += data.len() as u64;
        Ok(())
    }

    /// Replaces the file with the note and its last lines within `room` bytes in all.
    fn cut(&mut self, room: u64) -> std::io::Result<()> {
        let keep = room.saturating_sub(self.note.len() as u64).min(self.len);
        // From the file this ring wrote, never from whatever the path names now.
        let mut tail = vec![0u8; keep as usize];
        self.file.read_exact_at(&mut tail, self.len - keep)?;
        // Start at a line, unless the whole tail is one line.
        let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".cut");
        let tmp = PathBuf::from(tmp);
        let mut file = create_fresh(&tmp)?;
        file.write_all(self.note.as_bytes())?;
        file.write_all(&tail[start..])?;
        // Readers see the old file or the new one, never a half-written one.
        std::fs::rename(&tmp, &self.path)?;
        self.len = (self.note.len() + tail.len() - start) as u64;
        self.file = file;
        Ok(())
    }
}

/// Creates `path` anew, readable and writable by its owner only. The run directory may
/// belong to a confined process's own uid (see `crate::jail`): whatever is at `path` is
/// removed first, and the new file is made with O_EXCL, so a link planted there is never
/// followed (a process that can write the directory cannot have the shim write
/// elsewhere).
fn create_fresh(path: &Path) -> std::io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: u64) -> (tempfile::TempDir, RingFile) {
        let dir = tempfile::tempdir().unwrap();
        let r =
            RingFile::create(&dir.path().join("console.log"), cap, "the guest console").unwrap();
        (dir, r)
    }

    #[test]
    fn the_log_never_exceeds_its_cap_and_keeps_the_newest_lines() {
        let (dir, mut r) = ring(4096);
        let path = dir.path().join("console.log");
        for i in 0..5000 {
            r.write(format!("line {i}\n").as_bytes()).unwrap();
            let len = std::fs::metadata(&path).unwrap().len();
            assert!(len <= 4096, "{len} bytes after line {i}");
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&r.note), "{text}");
        assert_eq!(
            r.note,
            "[kata: older output of the guest console was dropped to keep this log bounded]\n"
        );
        assert!(text.ends_with("line 4999\n"), "{text}");
        // Whole lines only after the note.
        assert!(text[r.note.len()..].starts_with("line "), "{text}");
        assert!(text.len() > 1024, "{} bytes kept", text.len());
    }

    #[test]
    fn links_planted_in_the_run_directory_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "host file\n").unwrap();
        let path = dir.path().join("console.log");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let mut r = RingFile::create(&path, 4096, "x").unwrap();
        r.write(b"first\n").unwrap();
        // A link where the cut's new file goes, and the log itself swapped for a link.
        std::os::unix::fs::symlink(&victim, dir.path().join("console.log.cut")).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        for i in 0..1000 {
            r.write(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file\n");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("line 999\n"), "{text}");
        assert!(!text.contains("host file"), "{text}");
    }

    #[test]
    fn a_write_larger_than_the_cap_keeps_its_end() {
        let (dir, mut r) = ring(4096);
        let big: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        r.write(&big).unwrap();
        r.write(b"end\n").unwrap();
        let text = std::fs::read(dir.path().join("console.log")).unwrap();
        assert!(text.len() <= 4096);
        assert!(text.ends_with(b"end\n"));
        assert!(!dir.path().join("console.log.cut").exists());
    }

    #[test]
    fn the_reader_logs_what_the_pipe_carries_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qemu.log");
        std::fs::write(&path, "stale output of a previous run\n").unwrap();
        let write = start(&path, 8192, "QEMU", &crate::discard_logger()).unwrap();
        let fd = Arc::try_unwrap(write).unwrap();
        let mut w = File::from(fd);
        for i in 0..2000 {
            writeln!(w, "qemu line {i}").unwrap();
        }
        // The writer is still there: settle sees everything written so far.
        settle(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("qemu line 1999\n"), "not settled: {text:?}");
        assert!(text.len() <= 8192, "{} bytes", text.len());
        assert!(!text.contains("stale"), "{text}");
        drop(w);
        assert_eq!(
            crate::process::log_tail(&path).lines().last(),
            Some("qemu line 1999")
        );
    }

    #[test]
    fn a_noisy_process_s_log_stays_under_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("noisy.log");
        let daemon = crate::process::Daemon {
            step: "noisy",
            program: Path::new("/bin/sh"),
            args: vec![
                "-c".into(),
                "i=0; while [ $i -lt 3000 ]; do echo \"warning $i: the guest did something odd\"; i=$((i+1)); done; echo last words >&2; exit 3".into(),
            ],
            env: Vec::new(),
            log: log.clone(),
            place: crate::process::Place::default(),
        };
        let pid = daemon
            .spawn_capped(16 * 1024, &crate::discard_logger())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while procinfo::pid::exit_description(pid).is_none() {
            assert!(Instant::now() < deadline, "sh hangs");
            std::thread::sleep(Duration::from_millis(10));
        }
        let err = daemon.failed("it exited".into()).to_string();
        assert!(err.contains("last words"), "{err}");
        let len = std::fs::metadata(&log).unwrap().len();
        assert!(len <= 16 * 1024, "{len} bytes");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.starts_with("[kata: older output of noisy was dropped"),
            "{text}"
        );
        assert!(text.contains("warning 2999:"), "{text}");
    }
}
