//! Helpers shared by the integration tests: sandbox directories that clean up after
//! themselves, and process lookups by command line.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hypervisor::kill_and_reap;
pub use hypervisor::test_skip::skipped;
use hypervisor::VmConfig;
use procinfo::pid::is_running;

pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";
pub const VIRTIOFSD: &str = "/usr/local/bin/virtiofsd";

/// Our vsock backend: from the build (`make test` sets KATA_TEST_SHIM_DIR), else installed.
pub fn vsock_backend() -> PathBuf {
    std::env::var_os("KATA_TEST_SHIM_DIR")
        .map(|d| PathBuf::from(d).join("kata-vsock"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/kata-vsock"))
}

/// Guests and helper daemons are heavy on 2 shared cores; one test at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether the helper daemons are installed; if not, the test is reported as skipped.
pub fn helpers_installed() -> bool {
    for bin in [PathBuf::from(VIRTIOFSD), vsock_backend()] {
        if !bin.exists() {
            let hint = if bin.ends_with("kata-vsock") {
                " (set KATA_TEST_SHIM_DIR to the build's target dir, or make install)"
            } else {
                " (make setup)"
            };
            return skipped(&format!("needs {}{hint}", bin.display()));
        }
    }
    true
}

/// The binaries a sandbox runs.
pub struct Binaries {
    pub qemu: PathBuf,
    pub virtiofsd: PathBuf,
    pub vsock: PathBuf,
}

impl Default for Binaries {
    fn default() -> Self {
        Self {
            qemu: QEMU.into(),
            virtiofsd: VIRTIOFSD.into(),
            vsock: vsock_backend(),
        }
    }
}

/// Pids of processes whose command line mentions `needle`.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if !cmdline.is_empty() && String::from_utf8_lossy(&cmdline).contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// A sandbox's directories; on drop, kills anything still mentioning the run directory.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub pids: Vec<i32>,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        std::fs::create_dir(dir.path().join("shared")).unwrap();
        Self {
            dir,
            pids: Vec::new(),
        }
    }

    pub fn vm_config(&self) -> VmConfig {
        VmConfig {
            sandbox_id: "test-sandbox".into(),
            run_dir: self.dir.path().join("run"),
            shared_dir: self.dir.path().join("shared"),
            debug: false,
            ..Default::default()
        }
    }

    pub fn config(&self, kernel: &Path, initrd: &Path) -> kata_config::Config {
        self.config_with(&Binaries::default(), kernel, initrd)
    }

    pub fn config_with(
        &self,
        bins: &Binaries,
        kernel: &Path,
        initrd: &Path,
    ) -> kata_config::Config {
        let text = format!(
            "[hypervisor.qemu]\npath = {:?}\nkernel = {kernel:?}\ninitrd = {initrd:?}\n\
             default_memory = 256\nvirtio_fs_daemon = {:?}\nvsock_backend = {:?}\n",
            bins.qemu, bins.virtiofsd, bins.vsock
        );
        kata_config::Config::from_str(&text, "test.toml").unwrap()
    }

    /// An executable shell script in the sandbox directory.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    pub fn leftovers(&self) -> Vec<i32> {
        let mut pids = pids_mentioning(&self.dir.path().join("run").to_string_lossy());
        pids.extend(self.pids.iter().filter(|&&p| is_running(p)));
        pids
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let pids = self.leftovers();
        if !pids.is_empty() {
            eprintln!("cleaning up leftover processes {pids:?}");
            kill_and_reap(&pids, Duration::from_millis(500));
        }
    }
}

pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
