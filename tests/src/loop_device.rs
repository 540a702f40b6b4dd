//! A loop device over a temporary file: a host block device for the raw block volume
//! tests, detached (and its file removed) when dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct LoopDevice {
    device: Option<PathBuf>,
    file: tempfile::NamedTempFile,
}

impl LoopDevice {
    /// A loop device over a new zero-filled file of `size` bytes.
    pub fn new(size: u64) -> Self {
        let file = tempfile::Builder::new()
            .prefix("kata-e2e-disk-")
            .tempfile()
            .expect("creating the loop device's file");
        file.as_file()
            .set_len(size)
            .expect("sizing the loop device's file");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file.path())
            .output()
            .expect("running losetup");
        assert!(
            out.status.success(),
            "losetup --find --show {}: {}",
            file.path().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        LoopDevice {
            device: Some(device),
            file,
        }
    }

    /// The device node, e.g. /dev/loop3.
    pub fn path(&self) -> &Path {
        self.device.as_deref().unwrap_or(Path::new(""))
    }

    /// Detaches the device (flushing it into the file) and returns the file's bytes.
    pub fn detach_and_read(mut self) -> Vec<u8> {
        self.detach();
        std::fs::read(self.file.path()).expect("reading the loop device's file")
    }

    fn detach(&mut self) {
        if let Some(dev) = self.device.take() {
            match Command::new("losetup").arg("-d").arg(&dev).status() {
                Ok(s) if s.success() => {}
                other => eprintln!("losetup -d {}: {other:?}", dev.display()),
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The descriptors of process `pid` open on `path` (their numbers).
pub fn fds_open_on(pid: i32, path: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}
