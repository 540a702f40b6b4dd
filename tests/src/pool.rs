//! A VM pool of a test's own: its directory, the runtime configuration naming it, and a
//! real factory (`kata-runtime factory init` from `KATA_TEST_SHIM_DIR`) ended by its pid
//! when dropped, also when the test fails.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::{alive, kata_runtime, leftovers, mount_points, poll, signal, toml_str, wait_gone};
use crate::{Background, RuntimeConfig};

/// How long a pool may take to fill (boots under TCG on a loaded host are slow).
pub const POOL_FILL_LIMIT: Duration = Duration::from_secs(300);
/// How long a factory may take to stop its VMs.
pub const FACTORY_STOP_LIMIT: Duration = Duration::from_secs(90);

/// A pool directory and the configuration (with `[factory]` naming it) its factory and
/// the test's containerd both read, so that their VMs are of one pool key.
pub struct TestPool {
    /// The test's directory (removed when dropped): the pool, the configuration, the
    /// factory's log.
    base: PathBuf,
    pub dir: PathBuf,
    pub size: usize,
    /// The runtime configuration with the pool's `[factory]` section.
    pub config: RuntimeConfig,
    /// That configuration's file.
    pub config_file: PathBuf,
    log: PathBuf,
}

impl TestPool {
    /// A pool of `size` VMs of `config` (the test's usual QEMU configuration, say).
    pub fn new(name: &str, config: RuntimeConfig, size: usize) -> TestPool {
        let base = std::env::temp_dir().join(format!("kata-pool-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&base).expect("creating the test's directory");
        let dir = base.join("pool");
        let config = config
            .set("factory", "vm_cache_number", &size.to_string())
            .set(
                "factory",
                "vm_cache_dir",
                &toml_str(&dir.display().to_string()),
            );
        let config_file = base.join("configuration.toml");
        std::fs::write(&config_file, config.render()).expect("writing the configuration");
        TestPool {
            log: base.join("factory.log"),
            base,
            dir,
            size,
            config,
            config_file,
        }
    }

    /// `kata-runtime --config <the pool's> factory <args>`.
    pub fn kata_runtime(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(kata_runtime());
        cmd.arg("--config")
            .arg(&self.config_file)
            .arg("factory")
            .args(args);
        cmd
    }

    /// Every ready VM's record.
    pub fn ready(&self) -> Vec<Value> {
        self.ready_files().into_iter().map(|(_, v)| v).collect()
    }

    /// Every ready VM's ready file (a claim renames it) and record.
    pub fn ready_files(&self) -> Vec<(PathBuf, Value)> {
        let mut found = Vec::new();
        for key in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(key.path().join("ready"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = f.path();
                if path.extension().is_some_and(|x| x == "json") {
                    if let Some(v) = std::fs::read(&path)
                        .ok()
                        .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
                    {
                        found.push((path, v));
                    }
                }
            }
        }
        found
    }

    /// Waits until the pool is full and none of `gone` is among its ready VMs; their
    /// records.
    pub fn wait_full(&self, factory: &mut TestFactory, gone: &[String]) -> Vec<Value> {
        let got = poll(POOL_FILL_LIMIT, Duration::from_millis(200), || {
            let ready = self.ready();
            let stale = ready.iter().any(|v| gone.contains(&vm_id(v)));
            (ready.len() == self.size && !stale).then_some(ready)
        });
        got.unwrap_or_else(|| {
            panic!(
                "the pool did not fill to {} (ready: {:?}); factory running: {}; its log:\n{}",
                self.size,
                self.ready().iter().map(vm_id).collect::<Vec<_>>(),
                factory.bg.running(),
                factory.log()
            )
        })
    }

    /// What is left of the pool: files in its directory and mounts below it.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            left.push(format!("in the pool directory: {}", entry.path().display()));
        }
        let dir = self.dir.display().to_string();
        left.extend(
            mount_points()
                .into_iter()
                .filter(|m| m.starts_with(&dir))
                .map(|m| format!("mount {m}")),
        );
        left
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        // Only once nothing is mounted below it (a factory that failed to clean up).
        let base = self.base.display().to_string();
        if !mount_points().iter().any(|m| m.starts_with(&base)) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// A running `kata-runtime factory init` of a [`TestPool`]: SIGTERM when dropped
/// (SIGKILL if it does not stop), then `factory destroy` removes what it left.
pub struct TestFactory {
    bg: Background,
    pub pid: i32,
    log: PathBuf,
    destroy: Command,
}

impl TestFactory {
    pub fn start(pool: &TestPool) -> TestFactory {
        let log = std::fs::File::create(&pool.log).expect("creating the factory's log");
        let child = pool
            .kata_runtime(&["init"])
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting kata-runtime factory init");
        let bg = Background::new(child);
        let pid = bg.pid();
        TestFactory {
            bg,
            pid,
            log: pool.log.clone(),
            destroy: pool.kata_runtime(&["destroy"]),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGTERM and waits until it is gone.
    pub fn stop(&mut self) {
        if alive(self.pid) {
            signal(self.pid, Signal::SIGTERM);
            if !wait_gone(self.pid, FACTORY_STOP_LIMIT) {
                signal(self.pid, Signal::SIGKILL);
                wait_gone(self.pid, Duration::from_secs(10));
            }
        }
        let _ = self.bg.wait_within(Duration::from_secs(5));
    }
}

impl Drop for TestFactory {
    fn drop(&mut self) {
        self.stop();
        let _ = self.destroy.output();
    }
}

/// A pooled VM record's id.
pub fn vm_id(v: &Value) -> String {
    v["id"].as_str().unwrap_or_default().to_string()
}

/// A pooled VM record's VMM pid.
pub fn vm_pid(v: &Value) -> i32 {
    v["info"]["vmm_pid"].as_i64().unwrap_or(0) as i32
}

/// The pooled VM sandbox `id` runs on, as its `persist.json` records it.
pub fn pooled_vm_of(sandbox: &str) -> Option<String> {
    let text = std::fs::read(format!("/run/vc/sbs/{sandbox}/persist.json")).ok()?;
    let v: Value = serde_json::from_slice(&text).ok()?;
    v["pooled"]["vm_id"].as_str().map(str::to_string)
}

/// The run directory of sandbox `id`'s VM (sockets, console log): `/run/vc/vm/<id>`, or
/// the pooled VM's `/run/vc/vm/<vm id>` when the sandbox started from the pool.
pub fn vm_run_dir(sandbox: &str) -> std::path::PathBuf {
    std::path::Path::new("/run/vc/vm").join(pooled_vm_of(sandbox).unwrap_or_else(|| sandbox.into()))
}

/// What is left on the host of pooled VM `id` or of a sandbox `id`: processes, mounts,
/// directories and uid claims naming it.
pub fn vm_leftovers(id: &str) -> Vec<String> {
    let mut left = leftovers(id);
    for m in mount_points() {
        if m.contains(id) {
            left.push(format!("mount {m}"));
        }
    }
    for claim in std::fs::read_dir("/run/vc/ids")
        .into_iter()
        .flatten()
        .flatten()
    {
        if std::fs::read_to_string(claim.path()).is_ok_and(|owner| owner == id) {
            left.push(format!("uid claim {}", claim.path().display()));
        }
    }
    left
}

/// Waits (up to 15 s) until nothing of the VMs or sandboxes `ids` is left.
pub fn assert_vms_gone(ids: &[String]) {
    let all = || -> Vec<String> { ids.iter().flat_map(|id| vm_leftovers(id)).collect() };
    if poll(Duration::from_secs(15), Duration::from_millis(100), || {
        all().is_empty().then_some(())
    })
    .is_none()
    {
        panic!("left behind:\n{}", all().join("\n"));
    }
}
