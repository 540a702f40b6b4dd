//! Harness of the end-to-end tests: a private containerd per test (started and stopped by
//! `scripts/containerd-private.sh`), `ctr` invocations as a user types them, and the
//! leak checks every case ends with.
//!
//! `make test` provides the inputs through the environment: `KATA_TEST_KERNEL`,
//! `KATA_TEST_INITRD`, `KATA_TEST_SHIM_DIR` (holds `containerd-shim-kata-v2`,
//! `kata-vsock` and `kata-vmm`) and
//! `KATA_TEST_IMAGE` (the busybox image archive); the CRI tests also
//! `KATA_TEST_PAUSE_IMAGE` (the pod sandbox image archive, `scripts/pause-image.sh`).

mod background;
mod cri;
mod debug_shell;
mod host;
mod loop_device;
mod pool;
mod probe;
mod runtime_config;
mod shim_log;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use background::Background;
pub use cri::*;
pub use debug_shell::{debug_shell, finish_shell, kata_runtime};
pub use host::*;
pub use loop_device::{fds_open_on, LoopDevice};
pub use pool::*;
pub use probe::StaticProbe;
pub use runtime_config::{toml_str, Backend, RuntimeConfig};
pub use shim_log::ShimLog;

pub const IMAGE: &str = "docker.io/library/busybox:latest";
pub const RUNTIME: &str = "io.containerd.kata.v2";

pub(crate) fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the end-to-end tests with `make test`"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where tests put the figures the CI log shows (`target/e2e-figures/<name>.txt`): `make
/// e2e` and `make test` print these files after the tests, which cargo's output would hide
/// for a test that passes.
pub fn figures_file(name: &str) -> PathBuf {
    repo_root()
        .join("target/e2e-figures")
        .join(format!("{name}.txt"))
}

/// Prints `text` on stderr and writes it to [`figures_file`] `name` (replacing what an
/// earlier run wrote); a failure to write is said, not fatal.
pub fn publish_figures(name: &str, text: &str) {
    eprintln!("{text}");
    let path = figures_file(name);
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|_| std::fs::write(&path, text));
    if let Err(e) = written {
        eprintln!("writing {}: {e}", path.display());
    }
}

/// A private containerd with the busybox image imported, stopped (with everything it
/// started) when dropped, also when the test fails.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    path_env: String,
    conf_file: PathBuf,
    /// Extra environment of `containerd-private.sh` (e.g. `CONTAINERD_ENABLE_CRI=1`).
    script_env: Vec<(String, String)>,
}

/// How [`Containerd::start_instance`] starts a private containerd beyond its name and
/// runtime configuration.
#[derive(Clone, Debug, Default)]
pub(crate) struct StartOptions<'a> {
    /// A directory whose `containerd` and `ctr` come first in `PATH`.
    pub bin_dir: Option<&'a Path>,
    /// Extra environment of `containerd-private.sh` (and so of containerd and its shims).
    pub script_env: Vec<(String, String)>,
    /// Import `KATA_TEST_IMAGE` into the `default` namespace (what `ctr` uses).
    pub import_default: bool,
}

impl Containerd {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, Backend::Qemu)
    }

    /// A private containerd whose runtime uses `backend`.
    pub fn start_with(name: &str, backend: Backend) -> Self {
        Self::start_configured(name, &RuntimeConfig::for_backend(backend))
    }

    /// A private containerd whose runtime reads `config` (which need not be valid: tests
    /// of bad configurations use this too).
    pub fn start_configured(name: &str, config: &RuntimeConfig) -> Self {
        Self::start_from(name, config, None)
    }

    /// A private containerd of another version than the system's, with the default (QEMU)
    /// runtime: `version` is a directory of `KATA_TEST_CONTAINERD_DIR` ("1.7", "2.1", "2.3",
    /// "2.4") that `scripts/containerd-versions.sh` unpacked from Debian's package or built
    /// with `go install`. That containerd, its own `ctr` and its own runc shim come first in
    /// `PATH`, for the daemon, the shim and every `ctr` call. Panics (never skips) when the
    /// version is not there.
    pub fn start_version(name: &str, version: &str) -> Self {
        let bin = containerd_bin_dir(version);
        Self::start_from(name, &RuntimeConfig::for_backend(Backend::Qemu), Some(&bin))
    }

    /// A private containerd whose daemon (and so every shim it starts) has `env` on top
    /// of the usual environment.
    pub fn start_with_env(name: &str, config: &RuntimeConfig, env: &[(&str, &str)]) -> Self {
        Self::start_instance(
            name,
            config,
            StartOptions {
                bin_dir: None,
                script_env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                import_default: true,
            },
        )
    }

    fn start_from(name: &str, config: &RuntimeConfig, bin_dir: Option<&Path>) -> Self {
        Self::start_instance(
            name,
            config,
            StartOptions {
                bin_dir,
                script_env: Vec::new(),
                import_default: true,
            },
        )
    }

    /// The directory of the private containerd of test `name`.
    pub fn dir_for(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("kata-e2e-{name}-{}", std::process::id()))
    }

    /// The runtime configuration file (`KATA_CONF_FILE`) of the instance in `dir`.
    pub(crate) fn conf_file_in(dir: &Path) -> PathBuf {
        dir.join("configuration.toml")
    }

    pub(crate) fn start_instance(name: &str, config: &RuntimeConfig, opts: StartOptions) -> Self {
        let bin_dir = opts.bin_dir;
        let dir = Self::dir_for(name);
        std::fs::create_dir_all(&dir).expect("creating the test dir");
        let conf_file = Self::conf_file_in(&dir);
        std::fs::write(&conf_file, config.render()).expect("writing the test configuration");
        let mut path_env = format!(
            "{}:{}",
            env("KATA_TEST_SHIM_DIR"),
            std::env::var("PATH").unwrap_or_default()
        );
        if let Some(bin) = bin_dir {
            path_env = format!("{}:{path_env}", bin.display());
        }
        let c = Containerd {
            socket: dir.join("containerd.sock"),
            dir,
            path_env,
            conf_file,
            script_env: opts.script_env,
        };
        let out = c.script("start");
        assert!(
            out.status.success(),
            "starting containerd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !opts.import_default {
            return c;
        }
        let out = c.ctr(&["images", "import", &env("KATA_TEST_IMAGE")]);
        assert!(
            out.status.success(),
            "importing the image failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn script(&self, action: &str) -> Output {
        Command::new("bash")
            .arg(repo_root().join("scripts/containerd-private.sh"))
            .arg(action)
            .arg(&self.dir)
            .env("PATH", &self.path_env)
            .env("KATA_CONF_FILE", &self.conf_file)
            .envs(self.script_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("running containerd-private.sh")
    }

    /// `ctr` against this containerd. From 1.7 on, ctr prints the daemon's deprecation
    /// warnings on stderr before its own output (2.2 and later: "cgroup v1 is deprecated",
    /// on this host's cgroup v1): they are turned off, as containerd lets users do, so
    /// that stderr is the container's.
    pub fn ctr_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("-a")
            .arg(&self.socket)
            .args(args)
            .env("PATH", &self.path_env)
            .env("CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS", "1");
        cmd
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_cmd(args)
            .stdin(Stdio::null())
            .output()
            .expect("running ctr")
    }

    /// `ctr run --runtime io.containerd.kata.v2 --rm [extra] IMAGE id cmd...`.
    pub fn run_args(&self, id: &str, extra: &[&str], cmd: &[&str]) -> Vec<String> {
        let fifo = self.dir.join("fifo");
        let mut args: Vec<String> = vec![
            "run".into(),
            "--runtime".into(),
            RUNTIME.into(),
            "--fifo-dir".into(),
            fifo.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(IMAGE.into());
        args.push(id.into());
        args.extend(cmd.iter().map(|s| s.to_string()));
        args
    }

    /// `ctr run` as a child process with piped stdio, for tests that talk to it.
    pub fn spawn_run(&self, id: &str, extra: &[&str], cmd: &[&str]) -> std::process::Child {
        let args = self.run_args(id, extra, cmd);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctr_cmd(&refs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ctr run")
    }

    pub fn run(&self, id: &str, extra: &[&str], cmd: &[&str]) -> Output {
        let args = self.run_args(id, extra, cmd);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctr(&refs)
    }

    /// The whole containerd log, with the shim's lines.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// The containerd log (where the shim's log lines land), for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Containerd {
    /// The containerd daemon's pid.
    pub fn pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.join("containerd.pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .expect("reading containerd.pid")
    }

    /// The runtime configuration file the shim reads (`KATA_CONF_FILE`).
    pub fn conf_file(&self) -> &Path {
        &self.conf_file
    }

    /// The bundle containerd made for container `id` (namespace `default`).
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.dir
            .join("state/io.containerd.runtime.v2.task/default")
            .join(id)
    }

    /// The socket the shim of sandbox `id` listens on, as containerd names it:
    /// `/run/containerd/s/<sha256 of "<containerd address>/<namespace>/<id>">`.
    pub fn shim_socket(&self, id: &str) -> PathBuf {
        let key = format!("{}/default/{id}", self.socket.display());
        let mut child = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running sha256sum");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("sha256sum stdin");
            stdin
                .write_all(key.as_bytes())
                .expect("writing to sha256sum");
        }
        let out = child.wait_with_output().expect("sha256sum output");
        let hex = stdout(&out)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        Path::new(SHIM_SOCKET_DIR).join(hex)
    }

    /// Stops the containerd daemon alone (SIGTERM, as systemd does), leaving its shims and
    /// their sandboxes running; [`Containerd::start_daemon`] brings it back.
    pub fn stop_daemon(&self) {
        let pid = self.pid();
        signal(pid, nix::sys::signal::Signal::SIGTERM);
        if !wait_gone(pid, Duration::from_secs(15)) {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            assert!(
                wait_gone(pid, Duration::from_secs(5)),
                "containerd {pid} survived SIGKILL"
            );
        }
    }

    /// Starts the containerd daemon again on the same root, state and socket.
    pub fn start_daemon(&self) {
        let out = self.script("start");
        assert!(
            out.status.success(),
            "restarting containerd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ctr args` as a background process (see [`Background`]).
    pub fn ctr_background(&self, args: &[&str]) -> Background {
        let child = self
            .ctr_cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ctr");
        Background::new(child)
    }

    /// `ctr args`, given up (and killed) after `limit`: `Err` says it hung.
    pub fn ctr_within(&self, args: &[&str], limit: Duration) -> Result<Output, String> {
        let started = Instant::now();
        let mut bg = self.ctr_background(args);
        bg.wait_within(limit).ok_or_else(|| {
            format!(
                "`ctr {}` did not answer within {:.1}s",
                args.join(" "),
                started.elapsed().as_secs_f64()
            )
        })
    }

    /// The STATUS column of `ctr task ls` for `id`; `None` when containerd lists no such
    /// task. Panics when `ctr task ls` itself hangs for 20 s.
    pub fn task_status(&self, id: &str) -> Option<String> {
        let out = self
            .ctr_within(&["task", "ls"], Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log_tail()));
        stdout(&out).lines().find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some(id)).then(|| cols.nth(1).unwrap_or("").to_string())
        })
    }

    /// The containerd log from byte `offset` on (see [`Containerd::log_len`]).
    pub fn log_since(&self, offset: usize) -> String {
        let log = self.log();
        log.get(offset..).unwrap_or("").to_string()
    }

    /// How long the containerd log is now, for [`Containerd::log_since`].
    pub fn log_len(&self) -> usize {
        self.log().len()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let out = self.script("stop");
        if !out.status.success() {
            eprintln!(
                "stopping containerd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Where the containerd, ctr and runc shim of `version` ("1.7", "2.1", "2.3", "2.4") are:
/// `$KATA_TEST_CONTAINERD_DIR/<version>/usr/bin`. Panics, saying how to get them, when they
/// are missing: a version that could not be fetched fails the test, never skips it.
pub fn containerd_bin_dir(version: &str) -> PathBuf {
    let bin = Path::new(&env("KATA_TEST_CONTAINERD_DIR"))
        .join(version)
        .join("usr/bin");
    for b in ["containerd", "ctr", "containerd-shim-runc-v2"] {
        assert!(
            bin.join(b).is_file(),
            "containerd {version}: {} is missing; `bash scripts/containerd-versions.sh` gets it \
             (from Debian's mirror, or with `go install` from the Go module proxy; `make test` \
             runs it)",
            bin.join(b).display()
        );
    }
    bin
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// MD5 of `data` as `md5sum` prints it (the guest uses busybox md5sum).
pub fn md5_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running md5sum");
    let mut stdin = child.stdin.take().expect("md5sum stdin");
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().expect("md5sum output");
    let _ = writer.join();
    first_word(&String::from_utf8_lossy(&out.stdout))
}

/// The first whitespace-separated word of `s` (a checksum tool's sum), or "".
pub fn first_word(s: &str) -> String {
    s.split_whitespace().next().unwrap_or("").to_string()
}

/// `ctr run --rm --runtime-config-path FILE` of container `id`, where FILE is a
/// configuration whose VM has 256 MiB (the default being 512): checks that the run
/// succeeded and that the guest got the file's size. `what` names the case in failures.
pub fn assert_runtime_config_path_used(c: &Containerd, id: &str, what: &str) {
    let small = c.dir.join("small.toml");
    let text = RuntimeConfig::qemu()
        .set("hypervisor.qemu", "default_memory", "256")
        .render();
    std::fs::write(&small, text).expect("writing small.toml");
    let small = small.display().to_string();
    let out = c.run(
        id,
        &["--rm", "--runtime-config-path", &small],
        &["grep", "MemTotal", "/proc/meminfo"],
    );
    assert!(
        out.status.success(),
        "{what}: ctr run --runtime-config-path {small}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let kib: u64 = stdout(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        kib > 0 && kib < 300 * 1024,
        "{what}: the guest has {kib} KiB ({:?}): default_memory = 256 of the runtime \
         options' ConfigPath was not used",
        stdout(&out)
    );
}

/// A direct client of the shim's Task API for container `id`, for the calls ctr 1.6
/// cannot make (Update, CloseIO); containerd's CRI makes the same calls.
pub fn task_client(
    c: &Containerd,
    id: &str,
) -> containerd_shim_protos::shim::shim_ttrpc::TaskClient {
    let bundle = c
        .dir
        .join("state/io.containerd.runtime.v2.task/default")
        .join(id);
    let address =
        std::fs::read_to_string(bundle.join("address")).expect("reading the shim address");
    let client = ttrpc::Client::connect(address.trim()).expect("connecting to the shim");
    containerd_shim_protos::shim::shim_ttrpc::TaskClient::new(client)
}

pub fn ttrpc_ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(30_000_000_000)
}

/// `ctr events` running in the background; `topics()` is what it printed so far.
pub struct EventWatch {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl EventWatch {
    pub fn start(c: &Containerd) -> Self {
        let mut child = c
            .ctr_cmd(&["events"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ctr events");
        let mut stdout = child.stdout.take().expect("ctr events stdout");
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = out.clone();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        // Give ctr time to subscribe before the test acts.
        std::thread::sleep(Duration::from_millis(500));
        EventWatch {
            child,
            out,
            reader: Some(reader),
        }
    }

    /// Waits up to 30 s for a line with `topic` that names `id`.
    pub fn wait_for(&self, topic: &str, id: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let seen = self
                .out
                .lock()
                .map(|s| s.lines().any(|l| l.contains(topic) && l.contains(id)))
                .unwrap_or(false);
            if seen {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    pub fn text(&self) -> String {
        self.out.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The exit status of the `/tasks/exit` event of process `id` (the container id for
    /// its init, else the exec id) of `container`, waiting up to `limit` for it.
    pub fn exit_status(&self, container: &str, id: &str, limit: Duration) -> Option<u32> {
        poll(limit, Duration::from_millis(100), || {
            let text = self.text();
            text.lines()
                .filter(|l| l.contains("/tasks/exit"))
                .filter_map(|l| l.find('{').map(|i| &l[i..]))
                .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
                .find(|e| e["container_id"] == container && e["id"] == id)
                .map(|e| e["exit_status"].as_u64().unwrap_or(0) as u32)
        })
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Waits up to 60 s until `ctr task ls` shows `id` with `status`.
pub fn wait_status(c: &Containerd, id: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ls = stdout(&c.ctr(&["task", "ls"]));
        if ls
            .lines()
            .any(|l| l.split_whitespace().next() == Some(id) && l.contains(status))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never became {status}: {ls}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `cmd` detached (`ctr run -d`) as container `id` and waits until it runs.
pub fn start_detached(c: &Containerd, id: &str, extra: &[&str], cmd: &[&str]) {
    let mut flags = vec!["-d"];
    flags.extend_from_slice(extra);
    let out = c.run(id, &flags, cmd);
    assert!(
        out.status.success(),
        "ctr run -d {id}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    wait_status(c, id, "RUNNING");
}

/// Kills, deletes and removes a detached container, then checks nothing is left.
pub fn remove_detached(c: &Containerd, id: &str) {
    let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    wait_status(c, id, "STOPPED");
    let out = c.ctr(&["task", "rm", id]);
    assert!(out.status.success(), "task rm {id}: {}", stderr(&out));
    let out = c.ctr(&["container", "rm", id]);
    assert!(out.status.success(), "container rm {id}: {}", stderr(&out));
}

/// `ctr task exec` of `cmd` in `id`; returns the output.
pub fn exec(c: &Containerd, id: &str, exec_id: &str, extra: &[&str], cmd: &[&str]) -> Output {
    let fifo = c.dir.join("fifo").display().to_string();
    let mut args = vec!["task", "exec", "--fifo-dir", &fifo, "--exec-id", exec_id];
    args.extend_from_slice(extra);
    args.push(id);
    args.extend_from_slice(cmd);
    c.ctr(&args)
}
