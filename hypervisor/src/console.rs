//! The guest's serial console, kept in a bounded file.
//!
//! A guest (or a container that reaches `/dev/console`) may print without end. The VMM
//! therefore never writes a file of its own: it gets the write end of a pipe, on
//! descriptor [`CONSOLE_FD`], and a thread of the shim reads the other end into
//! `console.log` in the run directory, which never grows beyond [`CONSOLE_LOG_CAP`]: when
//! the next output would cross the cap, the file is cut to its newest lines (about half
//! the cap, starting at a line) behind a line saying so, and written on.
//!
//! The VMM needs no access to the run directory for its console, and the shim keeps the
//! log tail it quotes when a guest fails to boot ([`crate::process::log_tail`] reads the
//! file as before). The thread ends when every write end is closed: when the VMM is gone.
//! Should the shim die first, the VMM's writes fail with EPIPE and the output is dropped.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use slog::{warn, Logger};

use crate::Error;

/// The most `console.log` ever holds, in bytes (1 MiB).
pub const CONSOLE_LOG_CAP: u64 = 1 << 20;
/// The descriptor the VMM finds the console pipe's write end on.
pub const CONSOLE_FD: RawFd = 3;
/// What each read from the pipe takes at most.
const READ_CHUNK: usize = 16 * 1024;

/// Starts the console reader for `path` (created empty, or emptied) and returns the
/// pipe's write end, to be handed to the VMM on [`CONSOLE_FD`]; drop every copy of it once
/// the VMM is spawned, so that the reader ends with the VMM.
pub fn start(path: &Path, cap: u64, logger: &Logger) -> Result<Arc<OwnedFd>, Error> {
    let run_dir = |source| Error::RunDir {
        path: path.to_path_buf(),
        source,
    };
    let ring = RingFile::create(path, cap).map_err(run_dir)?;
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| run_dir(e.into()))?;
    let logger = logger.clone();
    std::thread::Builder::new()
        .name("guest-console".into())
        .spawn(move || drain(File::from(read), ring, &logger))
        .map_err(run_dir)?;
    Ok(Arc::new(write))
}

/// Reads the pipe until every writer is gone, into the ring. A failing write is reported
/// once and the output dropped: the reader never stops before the VMM, whose console
/// would block on a full pipe.
fn drain(mut pipe: File, mut ring: RingFile, logger: &Logger) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut failed = false;
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!(logger, "cannot read the guest console; it is no longer logged";
                    "error" => %e);
                return;
            }
        };
        if let Err(e) = ring.write(&buf[..n]) {
            if !failed {
                warn!(logger, "cannot write the guest console's log; its output is dropped \
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
}

impl RingFile {
    fn create(path: &Path, cap: u64) -> std::io::Result<Self> {
        let file = create_fresh(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            len: 0,
            // Room for the note and some output, whatever the caller asks.
            cap: cap.max(4 * NOTE.len() as u64),
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
        let keep = room.saturating_sub(NOTE.len() as u64).min(self.len);
        // From the file this ring wrote, never from whatever the path names now.
        let mut tail = vec![0u8; keep as usize];
        self.file.read_exact_at(&mut tail, self.len - keep)?;
        // Start at a line, unless the whole tail is one line.
        let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        let tmp = self.path.with_extension("log.cut");
        let mut file = create_fresh(&tmp)?;
        file.write_all(NOTE.as_bytes())?;
        file.write_all(&tail[start..])?;
        // Readers see the old file or the new one, never a half-written one.
        std::fs::rename(&tmp, &self.path)?;
        self.len = (NOTE.len() + tail.len() - start) as u64;
        self.file = file;
        Ok(())
    }
}

/// Creates `path` anew, readable and writable by its owner only. The run directory may
/// belong to the VMM's own uid (see `crate::jail`): whatever is at `path` is removed
/// first, and the new file is made with O_EXCL, so a link planted there is never
/// followed (a VMM that can write the directory cannot have the shim write elsewhere).
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

/// The first line of a cut console log.
const NOTE: &str = "[kata: older guest console output was dropped to keep this log bounded]\n";

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn ring(cap: u64) -> (tempfile::TempDir, RingFile) {
        let dir = tempfile::tempdir().unwrap();
        let r = RingFile::create(&dir.path().join("console.log"), cap).unwrap();
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
        assert!(text.starts_with(NOTE), "{text}");
        assert!(text.ends_with("line 4999\n"), "{text}");
        // Whole lines only after the note.
        assert!(text[NOTE.len()..].starts_with("line "), "{text}");
        assert!(text.len() > 1024, "{} bytes kept", text.len());
    }

    #[test]
    fn links_planted_in_the_run_directory_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "host file\n").unwrap();
        let path = dir.path().join("console.log");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let mut r = RingFile::create(&path, 4096).unwrap();
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
        let path = dir.path().join("console.log");
        std::fs::write(&path, "stale output of a previous run\n").unwrap();
        let write = start(&path, 8192, &crate::discard_logger()).unwrap();
        let fd = Arc::try_unwrap(write).unwrap();
        let mut w = File::from(fd);
        for i in 0..2000 {
            writeln!(w, "console line {i}").unwrap();
        }
        drop(w);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.ends_with("console line 1999\n") {
                assert!(text.len() <= 8192, "{} bytes", text.len());
                assert!(!text.contains("stale"), "{text}");
                break;
            }
            assert!(Instant::now() < deadline, "not logged: {text:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            crate::process::log_tail(&path).lines().last(),
            Some("console line 1999")
        );
    }
}
