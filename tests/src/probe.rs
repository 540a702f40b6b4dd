//! Small programs the tests compile statically on the host (or write out byte by byte)
//! and bind into a container (busybox has no vsock client): `/probe/<name>` inside it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A compiled probe; its directory is removed when dropped.
pub struct StaticProbe {
    dir: PathBuf,
    name: String,
}

impl StaticProbe {
    /// Compiles `source` with `gcc -static` as `name` (needs gcc and libc6-dev).
    pub fn build(name: &str, source: &str) -> StaticProbe {
        let probe = StaticProbe::empty(name);
        let src = probe.dir.join(format!("{name}.c"));
        std::fs::write(&src, source).expect("write the probe source");
        let out = Command::new("gcc")
            .args(["-static", "-O1", "-Wall", "-o"])
            .arg(probe.dir.join(name))
            .arg(&src)
            .output()
            .expect("run gcc (needs gcc and libc6-dev)");
        assert!(
            out.status.success(),
            "compiling the probe {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        probe
    }

    /// A fresh directory for the probe `name`, unique per call: tests of one binary run
    /// in parallel, each with its own copy.
    fn empty(name: &str) -> StaticProbe {
        static BUILT: AtomicUsize = AtomicUsize::new(0);
        let n = BUILT.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("kata-e2e-probe-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the probe dir");
        StaticProbe {
            dir,
            name: name.to_string(),
        }
    }

    /// Writes `bytes` as the executable `name` in a fresh directory (a program built by
    /// the test itself, no compiler involved).
    pub fn from_bytes(name: &str, bytes: &[u8]) -> StaticProbe {
        let probe = StaticProbe::empty(name);
        probe.replace(bytes);
        probe
    }

    /// Rewrites the program in place (same inode), as an editor or a `cp` over it would.
    pub fn replace(&self, bytes: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.join(&self.name);
        std::fs::write(&path, bytes).expect("write the probe");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("make the probe executable");
    }

    /// The `ctr run --mount` option that shows the probe at /probe in the container.
    pub fn mount(&self) -> String {
        format!(
            "type=bind,src={},dst=/probe,options=rbind:ro",
            self.dir.display()
        )
    }

    /// The host directory holding the probe (what a container mounts at /probe).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Where the container finds it.
    pub fn path_in_container(&self) -> String {
        format!("/probe/{}", self.name)
    }
}

impl Drop for StaticProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
