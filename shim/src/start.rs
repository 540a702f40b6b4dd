//! The `start` action, as every containerd from 1.6 on runs it.
//!
//! containerd runs `containerd-shim-kata-v2 -namespace NS -id ID -address ADDR
//! -publish-binary BIN [-debug] start` in the container's bundle and reads the shim's
//! address back from its stdout (stdout and stderr together, so nothing else may be
//! printed there). What it writes on stdin depends on the version:
//! - 1.6 to 2.2: the runtime options as a protobuf `Any` (`runtimeoptions.v1.Options`
//!   with `ConfigPath`), or nothing when the runtime entry has none;
//! - 2.3 and later: a `BootstrapParams` message (`containerd.runtime.bootstrap.v1`) naming
//!   the instance, its namespace, containerd's addresses, where the socket goes, and the
//!   runtime options among its `extensions`; such a containerd accepts a binary
//!   `BootstrapResult` back and still takes a plain address.
//!
//! Stdin that is neither is logged and ignored: a start never fails on it. For a pod's
//! sandbox container, start spawns the daemon that serves the pod and waits until it
//! listens; for the pod's other containers it answers the sandbox daemon's address. A
//! start that fails after spawning ends the daemon by its pid and removes what it wrote.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim::Flags;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::Message;
use protocols::bootstrap::{BootstrapParams, BootstrapResult};
use slog::{info, warn, Logger};

use kata_sandbox::persist::SandboxState;
use kata_sandbox::spec;

/// containerd's own shims read at most this much of stdin.
const STDIN_LIMIT: u64 = 10 << 20;

/// How long a spawned daemon may take to listen on its socket.
const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The bundle file through which `start` hands the runtime options it was given to the
/// daemon (for a CreateTask that carries none).
pub const START_OPTIONS_FILE: &str = "start-options.json";

/// `BootstrapParams.log_level` at or below which containerd asks for debug logs.
const LOG_LEVEL_DEBUG: i32 = -4;

/// What containerd said on stdin, whichever version it was.
#[derive(Debug, Default, PartialEq)]
pub struct StartParams {
    /// containerd speaks the bootstrap protocol (2.3+): answer with a `BootstrapResult`.
    pub bootstrap: bool,
    /// The runtime options, if any came.
    pub options: Option<Any>,
    /// containerd's ttrpc address, for the daemon's events (else `$TTRPC_ADDRESS`).
    pub ttrpc_address: Option<String>,
    /// Where the shim's socket goes (else containerd's default, /run/containerd/s).
    pub socket_dir: Option<PathBuf>,
    /// containerd asks for debug logs (besides `-debug`).
    pub debug: bool,
    /// What was on stdin that is neither, and why it was ignored.
    pub ignored: Option<String>,
}

/// Reads what containerd wrote on stdin for shim `id` in `namespace`.
pub fn parse_stdin(input: &[u8], id: &str, namespace: &str) -> StartParams {
    if input.is_empty() {
        return StartParams::default();
    }
    // An `Any` parses as BootstrapParams too (fields 1 and 2 are strings in both), so
    // bytes count as bootstrap parameters when they name this instance, and as someone
    // else's when they carry what only containerd's bootstrap sets (its version, its
    // addresses); anything else may still be an `Any`.
    let foreign = match BootstrapParams::parse_from_bytes(input) {
        Ok(p) if p.instance_id == id && p.namespace == namespace => {
            return StartParams {
                bootstrap: true,
                options: runtime_options(&p),
                ttrpc_address: Some(p.containerd_ttrpc_address.clone()).filter(|a| !a.is_empty()),
                socket_dir: p
                    .socket_dir
                    .as_deref()
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from),
                debug: p.log_level <= LOG_LEVEL_DEBUG,
                ignored: None,
            };
        }
        Ok(p)
            if !p.containerd_version.is_empty()
                || !p.containerd_ttrpc_address.is_empty()
                || !p.containerd_grpc_address.is_empty() =>
        {
            Some(format!(
                "bootstrap parameters for {}/{} (this shim is {namespace}/{id})",
                p.namespace, p.instance_id
            ))
        }
        _ => None,
    };
    let ignored = match (foreign, Any::parse_from_bytes(input)) {
        (None, Ok(any)) if !any.type_url.is_empty() => {
            return StartParams {
                options: Some(any),
                ..Default::default()
            }
        }
        (Some(foreign), _) => foreign,
        (None, _) => format!(
            "{} bytes that are neither bootstrap parameters nor runtime options",
            input.len()
        ),
    };
    StartParams {
        ignored: Some(ignored),
        ..Default::default()
    }
}

/// The runtime options among the bootstrap extensions: containerd's (with `ConfigPath`)
/// if there, else the first.
fn runtime_options(p: &BootstrapParams) -> Option<Any> {
    let all: Vec<Any> = p
        .extensions
        .iter()
        .filter_map(|e| e.value.as_ref())
        .map(|v| Any {
            type_url: v.type_url.clone(),
            value: v.value.clone(),
            ..Default::default()
        })
        .collect();
    all.iter()
        .find(|a| a.type_url.ends_with(crate::options::RUNTIME_OPTIONS_TYPE))
        .or(all.first())
        .cloned()
}

/// The shim socket address for `id`: containerd's naming (a hash of its address,
/// namespace and id), in `socket_dir` when containerd names one.
pub fn socket_address(
    containerd_address: &str,
    namespace: &str,
    id: &str,
    socket_dir: Option<&Path>,
) -> String {
    let default = containerd_shim::socket_address(containerd_address, namespace, id);
    match socket_dir {
        Some(dir) => {
            let name = default.rsplit('/').next().unwrap_or_default();
            format!("unix://{}", dir.join(name).display())
        }
        None => default,
    }
}

/// What start writes on stdout for `address`.
pub fn response(address: &str, bootstrap: bool) -> Vec<u8> {
    if !bootstrap {
        return address.as_bytes().to_vec();
    }
    let result = BootstrapResult {
        version: 2,
        address: address.to_string(),
        protocol: "ttrpc".to_string(),
        ..Default::default()
    };
    // Writing a message into a Vec cannot fail; fall back to the plain address anyway.
    result
        .write_to_bytes()
        .unwrap_or_else(|_| address.as_bytes().to_vec())
}

/// Whether a shim answers on `address` (`unix://PATH`).
pub fn answers(address: &str) -> bool {
    std::os::unix::net::UnixStream::connect(address.trim_start_matches("unix://")).is_ok()
}

/// Reads the sandbox id of the container whose bundle is the current directory; an
/// invalid sandbox id annotation is an error (it would name paths on the host).
pub fn sandbox_id_of_bundle(id: &str) -> Result<String, spec::SpecError> {
    std::fs::read("config.json")
        .ok()
        .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .map(|s| spec::sandbox_of(&s, id))
        .unwrap_or_else(|| Ok(id.to_string()))
}

/// Reads stdin, at most [`STDIN_LIMIT`] bytes.
pub fn read_stdin() -> Vec<u8> {
    let mut input = Vec::new();
    let _ = std::io::stdin().take(STDIN_LIMIT).read_to_end(&mut input);
    input
}

/// The `start` action for the container whose sandbox is `sandbox_id`
/// ([`sandbox_id_of_bundle`]): the bytes for stdout, or what went wrong.
pub fn start(
    flags: &Flags,
    sandbox_id: &str,
    input: &[u8],
    log: &Logger,
) -> Result<Vec<u8>, String> {
    let params = parse_stdin(input, &flags.id, &flags.namespace);
    if let Some(what) = &params.ignored {
        warn!(log, "start: ignoring stdin: {what}"; "container" => &flags.id);
    }
    let socket_dir = params.socket_dir.as_deref();
    let address = if sandbox_id == flags.id {
        start_daemon(flags, &params, log)?
    } else {
        join_sandbox(flags, sandbox_id, socket_dir)?
    };
    info!(log, "start: shim address {address}";
        "container" => &flags.id, "bootstrap" => params.bootstrap);
    Ok(response(&address, params.bootstrap))
}

/// A pod's other container: its sandbox's daemon serves it; nothing is spawned.
fn join_sandbox(
    flags: &Flags,
    sandbox_id: &str,
    socket_dir: Option<&Path>,
) -> Result<String, String> {
    // The sandbox's bundle is a sibling of this one and names the daemon's address.
    let sibling = Path::new("..").join(sandbox_id).join("address");
    let address = std::fs::read_to_string(&sibling)
        .ok()
        .map(|a| a.trim().to_string())
        .filter(|a| a.starts_with("unix://"))
        .unwrap_or_else(|| {
            socket_address(&flags.address, &flags.namespace, sandbox_id, socket_dir)
        });
    if !answers(&address) {
        return Err(format!(
            "sandbox {sandbox_id} of container {} has no running shim at {address}; start the sandbox container first",
            flags.id
        ));
    }
    std::fs::write("address", &address).map_err(|e| bundle_write_error("address file", &e))?;
    if let Ok(state) = SandboxState::load(sandbox_id) {
        let _ = std::fs::write("shim.pid", state.shim_pid.to_string());
    }
    Ok(address)
}

/// The sandbox container: spawns the daemon and waits until it listens.
fn start_daemon(flags: &Flags, params: &StartParams, log: &Logger) -> Result<String, String> {
    let address = socket_address(
        &flags.address,
        &flags.namespace,
        &flags.id,
        params.socket_dir.as_deref(),
    );
    if answers(&address) {
        // A daemon for this id already serves (containerd retried a start).
        std::fs::write("address", &address).map_err(|e| bundle_write_error("address file", &e))?;
        return Ok(address);
    }
    if let Some(dir) = &params.socket_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("creating the socket directory {}: {e}", dir.display()))?;
    }
    write_start_options(params.options.as_ref(), log);
    let mut daemon = ServingShim::spawn(flags, params, &address)?;
    match daemon.wait_ready(&address).and_then(|()| {
        std::fs::write("address", &address)
            .and_then(|()| std::fs::write("shim.pid", daemon.pid().to_string()))
            .map_err(|e| bundle_write_error("address and shim.pid", &e))
    }) {
        Ok(()) => {
            daemon.release();
            Ok(address)
        }
        Err(e) => {
            daemon.end();
            remove_socket(&address, true);
            for f in ["address", "shim.pid", START_OPTIONS_FILE] {
                let _ = std::fs::remove_file(f);
            }
            Err(e)
        }
    }
}

/// Writing `what` into the bundle (containerd's state directory, start's working
/// directory) failed: said with the file system when it is full.
fn bundle_write_error(what: &str, e: &std::io::Error) -> String {
    let bundle = std::env::current_dir().unwrap_or_default();
    let text = format!("writing the bundle's {what} in {}: {e}", bundle.display());
    match kata_sandbox::full_disk::explain(&text, &[("containerd's bundle", bundle)]) {
        Some(more) => format!("{text}: {more}"),
        None => text,
    }
}

/// Hands the start's runtime options to the daemon through the bundle.
fn write_start_options(options: Option<&Any>, log: &Logger) {
    let Some(any) = options else {
        return;
    };
    let path = match crate::options::config_path_of(any) {
        Ok(Some(path)) => path,
        Ok(None) => return,
        Err(e) => {
            warn!(log, "start: ignoring runtime options: {e}");
            return;
        }
    };
    let text = serde_json::json!({ "config_path": path }).to_string();
    if let Err(e) = std::fs::write(START_OPTIONS_FILE, text) {
        warn!(log, "start: cannot write {START_OPTIONS_FILE}: {e}");
    }
}

/// The `ConfigPath` that start handed to the daemon, if any.
pub fn start_config_path() -> Option<PathBuf> {
    let text = std::fs::read(START_OPTIONS_FILE).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("config_path")?.as_str().map(PathBuf::from)
}

/// Removes the shim socket at `address` (`unix://PATH`); with `only_if_dead`, only when no
/// daemon answers on it.
pub fn remove_socket(address: &str, only_if_dead: bool) {
    let Some(path) = address.strip_prefix("unix://") else {
        return;
    };
    if !only_if_dead || !answers(address) {
        let _ = std::fs::remove_file(path);
    }
}

/// The type URL containerd's `typeurl` registers for the OCI runtime features
/// (`features.Features` of runtime-spec, marshalled as JSON).
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// Mount options the shim and the agent implement: `rro` on the host with
/// `mount_setattr(AT_RECURSIVE)` (and read-only in the guest); `ro` on the host for the
/// volume's top; the rest in the guest.
pub const MOUNT_OPTIONS: &[&str] = &[
    "bind",
    "dev",
    "dirsync",
    "exec",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "nosuid",
    "private",
    "rbind",
    "relatime",
    "ro",
    "rprivate",
    "rro",
    "rshared",
    "rslave",
    "rw",
    "shared",
    "slave",
    "strictatime",
    "suid",
    "sync",
];

/// The runtime features (runtime-spec `features.md`) as JSON: what containerd's CRI
/// reads from `-info`. `mountOptions` holding `rro` turns on recursive read-only
/// mounts; a `user` namespace together with `mountExtensions.idmap.enabled` makes the
/// handler's `userNamespaces` true (containerd 2.x `supportsCRIUserns`), which kubelet
/// needs to accept `hostUsers: false`, and containerd checks the second before it creates
/// a container whose mounts carry ID mappings. Both hold in the guest: its kernel (6.12,
/// with guest/patches/0007) ID-maps virtio-fs mounts, which virtiofsd 1.14 allows.
///
/// `user_namespaces` false leaves the `user` namespace out (see [`user_namespaces_work`]).
pub fn features_json(user_namespaces: bool) -> String {
    let mut namespaces = vec!["cgroup", "ipc", "mount", "network", "pid", "uts"];
    if user_namespaces {
        namespaces.insert(5, "user");
    }
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.3.0",
        "mountOptions": MOUNT_OPTIONS,
        "linux": {
            "namespaces": namespaces,
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "mountExtensions": {"idmap": {"enabled": true}},
        },
    })
    .to_string()
}

/// Whether a user-namespaced pod's containers can be created through the runtime entry
/// whose options containerd sent to `-info`: containerd's CRI (2.3 and 2.4,
/// `container_start_linux.go`) sets their I/O owner by reading the entry's options as
/// runc's, and fails the create with `can't unmarshal type "runtimeoptions.v1.Options"`
/// when the entry has an `options` table (ours: `ConfigPath`). Announcing user
/// namespaces there would let kubelet accept pods that then fail, so the handler says
/// no, and kubelet refuses the pod with its reason instead. Without options (the shim
/// then finds its configuration through $KATA_CONF_FILE or the default lookup),
/// containerd sends none, or runc's own.
pub fn user_namespaces_work(options: &[u8]) -> bool {
    !Any::parse_from_bytes(options)
        .is_ok_and(|a| a.type_url.ends_with(crate::options::RUNTIME_OPTIONS_TYPE))
}

/// The `-info` answer: a `containerd.types.RuntimeInfo` (api/types/introspection.proto)
/// naming the runtime and `version`, echoing the runtime options containerd wrote on
/// stdin (an `Any`, as its runc shim does), with [`features_json`] as an `Any` of
/// [`FEATURES_TYPE_URL`]. Encoded by hand: the message is not among the generated
/// protos.
pub fn runtime_info(name: &str, version: &str, options: &[u8]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
        varint(out, (field << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    let mut ver = Vec::new();
    bytes_field(&mut ver, 1, version.as_bytes());
    let mut features = Vec::new();
    bytes_field(&mut features, 1, FEATURES_TYPE_URL.as_bytes());
    bytes_field(
        &mut features,
        2,
        features_json(user_namespaces_work(options)).as_bytes(),
    );
    let mut out = Vec::new();
    bytes_field(&mut out, 1, name.as_bytes());
    bytes_field(&mut out, 2, &ver);
    // Only an Any with a type goes back (what containerd sent, byte for byte).
    if Any::parse_from_bytes(options).is_ok_and(|a| !a.type_url.is_empty()) {
        bytes_field(&mut out, 3, options);
    }
    bytes_field(&mut out, 4, &features);
    out
}

/// The shim that serves the sandbox, spawned by `start`; ended by its pid unless released.
struct ServingShim {
    child: Option<Child>,
}

impl ServingShim {
    fn spawn(flags: &Flags, params: &StartParams, address: &str) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("finding the shim binary: {e}"))?;
        let mut cmd = Command::new(exe);
        // The name containerd ran us by selects the configuration (`options`): kept.
        if let Some(argv0) = std::env::args_os().next() {
            cmd.arg0(argv0);
        }
        cmd.args(["-namespace", &flags.namespace, "-id", &flags.id])
            .args(["-address", &flags.address, "-socket", address]);
        if flags.debug || params.debug {
            cmd.arg("-debug");
        }
        if let Some(ttrpc) = &params.ttrpc_address {
            cmd.env("TTRPC_ADDRESS", ttrpc);
        } else if std::env::var_os("TTRPC_ADDRESS").is_none() {
            cmd.env("TTRPC_ADDRESS", format!("{}.ttrpc", flags.address));
        }
        // The daemon closes its stdout (our pipe) once it listens. Its stderr goes to
        // containerd's log through the bundle's log fifo, never to our stdout, which
        // containerd reads as the address.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(
                kata_sandbox::log::open_fifo_writer(Path::new("log"))
                    .map(Stdio::from)
                    .unwrap_or_else(Stdio::null),
            )
            // Its own process group: signals to containerd's group do not reach it.
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawning the shim daemon: {e}"))?;
        // Like containerd's shims: the kernel's OOM killer takes the shim before containerd.
        let _ = containerd_shim::cgroup::adjust_oom_score(child.id());
        Ok(ServingShim { child: Some(child) })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Waits until the daemon closed its stdout and answers on `address`.
    fn wait_ready(&mut self, address: &str) -> Result<(), String> {
        let Some(child) = self.child.as_mut() else {
            return Err("no daemon".into());
        };
        if let Some(mut out) = child.stdout.take() {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = out.read_to_end(&mut sink);
                let _ = tx.send(());
            });
            if rx.recv_timeout(DAEMON_READY_TIMEOUT).is_err() {
                return Err(format!(
                    "the shim daemon (pid {}) did not listen on {address} within {}s; containerd's log has its lines",
                    child.id(),
                    DAEMON_READY_TIMEOUT.as_secs()
                ));
            }
        }
        // The socket is bound before the daemon closes its stdout; give a dying daemon
        // a moment to be seen as such.
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "the shim daemon exited ({status}) before serving on {address}; containerd's log has its error"
                ));
            }
            if answers(address) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the shim daemon (pid {}) does not answer on {address}",
                    child.id()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Leaves the daemon running: it serves the sandbox from now on.
    fn release(&mut self) {
        self.child = None;
    }

    /// Kills the daemon by its pid and reaps it.
    fn end(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ServingShim {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // The exact bytes containerd 2.3.7's own code (pkg/shim.Command) writes on a shim's
    // stdin at start, for id "3f2a" in namespace "k8s.io": made by
    // shim/testdata/bootstrap-bytes (a Go program over containerd's module).
    const BOOTSTRAP_PLAIN: &str = "0a043366326112066b38732e696f220d322e332e372b756e6b6e6f776e2a252f72756e2f636f6e7461696e6572642f636f6e7461696e6572642e736f636b2e7474727063321f2f72756e2f636f6e7461696e6572642f636f6e7461696e6572642e736f636b3a112f746d702f676f6c64656e32332f67656e";
    // The same with runtime options (ConfigPath /etc/kata-containers/fast.toml), log
    // level debug and socket_dir /run/containerd/s (which 2.4 always sets).
    const BOOTSTRAP_OPTIONS_DEBUG: &str = "0a043366326112066b38732e696f18fcffffffffffffffff01220d322e332e372b756e6b6e6f776e2a252f72756e2f636f6e7461696e6572642f636f6e7461696e6572642e736f636b2e7474727063321f2f72756e2f636f6e7461696e6572642f636f6e7461696e6572642e736f636b3a112f746d702f676f6c64656e32332f67656e423f0a3d0a1972756e74696d656f7074696f6e732e76312e4f7074696f6e731220121e2f6574632f6b6174612d636f6e7461696e6572732f666173742e746f6d6c4a112f72756e2f636f6e7461696e6572642f73";
    // What containerd 1.6 to 2.2 write: the runtime options alone, as an Any.
    const LEGACY_OPTIONS: &str = "0a1972756e74696d656f7074696f6e732e76312e4f7074696f6e731220121e2f6574632f6b6174612d636f6e7461696e6572732f666173742e746f6d6c";

    fn config_path(p: &StartParams) -> Option<PathBuf> {
        crate::options::config_path_of(p.options.as_ref()?).unwrap()
    }

    /// `-info` as containerd 2.3.7 reads it (core/runtime/v2 `getRuntimeInfo`, then the
    /// CRI's `introspectRuntimeFeatures`): these bytes were checked once against
    /// containerd's own Go types (api/types.RuntimeInfo, typeurl with runtime-spec's
    /// features.Features registered as in core/runtime/typeurl.go), which found "rro"
    /// among mountOptions; a private containerd 2.3.7's CRI status shows the handler's
    /// `userNamespaces` true from them (scripts/critest.sh's UserNamespaces specs run).
    const GOLDEN_INFO_HEAD: &[u8] = b"\n\x15io.containerd.kata.v2\x12\x07\n\x050.1.0\"\x84\x04\nCtypes.containerd.io/opencontainers/runtime-spec/1/features/Features\x12\xbc\x03";
    const GOLDEN_FEATURES: &str = r#"{"linux":{"apparmor":{"enabled":false},"mountExtensions":{"idmap":{"enabled":true}},"namespaces":["cgroup","ipc","mount","network","pid","user","uts"],"selinux":{"enabled":false}},"mountOptions":["bind","dev","dirsync","exec","noatime","nodev","nodiratime","noexec","nosuid","private","rbind","relatime","ro","rprivate","rro","rshared","rslave","rw","shared","slave","strictatime","suid","sync"],"ociVersionMax":"1.3.0","ociVersionMin":"1.0.0"}"#;

    /// The fields of a message, decoded generically (every field here is
    /// length-delimited).
    fn fields(mut b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = varint(&mut b);
            assert_eq!(key & 7, 2, "field {} is not length-delimited", key >> 3);
            let len = varint(&mut b) as usize;
            out.push((key >> 3, b[..len].to_vec()));
            b = &b[len..];
        }
        out
    }

    #[test]
    fn info_answers_the_runtime_features_containerd_reads_rro_and_user_namespaces_from() {
        let bytes = runtime_info("io.containerd.kata.v2", "0.1.0", &[]);
        let mut golden = GOLDEN_INFO_HEAD.to_vec();
        golden.extend_from_slice(GOLDEN_FEATURES.as_bytes());
        assert_eq!(bytes, golden);

        // RuntimeInfo: name (1), version (2), features (4, an Any).
        let info = fields(&bytes);
        assert_eq!(info[0], (1, b"io.containerd.kata.v2".to_vec()));
        assert_eq!(fields(&info[1].1), vec![(1, b"0.1.0".to_vec())]);
        assert_eq!(info[2].0, 4);
        let any = Any::parse_from_bytes(&info[2].1).unwrap();
        assert_eq!(any.type_url, FEATURES_TYPE_URL);
        let features: serde_json::Value = serde_json::from_slice(&any.value).unwrap();
        let opts = features["mountOptions"].as_array().unwrap();
        assert!(opts.iter().any(|o| o == "rro"), "{features}");
        // User namespaces and ID-mapped mounts: what makes the CRI's handler feature
        // `userNamespaces` true.
        let ns = features["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.iter().any(|n| n == "user"), "{features}");
        assert_eq!(
            features["linux"]["mountExtensions"]["idmap"]["enabled"],
            true
        );
    }

    #[test]
    fn user_namespaces_are_announced_only_where_containerd_can_create_their_containers() {
        let ns = |options: &[u8]| -> bool {
            let info = fields(&runtime_info("io.containerd.kata.v2", "0.1.0", options));
            let any = Any::parse_from_bytes(&info.last().unwrap().1).unwrap();
            let features: serde_json::Value = serde_json::from_slice(&any.value).unwrap();
            assert_eq!(
                features["linux"]["mountExtensions"]["idmap"]["enabled"],
                true
            );
            let list = features["linux"]["namespaces"].as_array().unwrap().clone();
            list.iter().any(|n| n == "user")
        };
        // A runtime entry without options: containerd sends nothing at start-up, and
        // runc's options (the I/O owner) at a user-namespaced container's create.
        assert!(ns(&[]));
        let runc = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: b"(\xe8\x07".to_vec(),
            ..Default::default()
        };
        assert!(ns(&runc.write_to_bytes().unwrap()));
        // An options table (ConfigPath): containerd's CRI would fail the containers.
        let ours = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: b"\x12\x0f/etc/kata.toml".to_vec(),
            ..Default::default()
        };
        assert!(!ns(&ours.write_to_bytes().unwrap()));
    }

    #[test]
    fn info_echoes_the_runtime_options_containerd_sent() {
        let options = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: b"\n\x0f/etc/kata.toml".to_vec(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap();
        let info = fields(&runtime_info("io.containerd.kata.v2", "0.1.0", &options));
        assert_eq!(info[2], (3, options));
        assert_eq!(info[3].0, 4);
        // Bytes that are no Any are not echoed.
        let info = fields(&runtime_info("io.containerd.kata.v2", "0.1.0", b"\xff\xff"));
        assert_eq!(info.iter().map(|f| f.0).collect::<Vec<_>>(), vec![1, 2, 4]);
    }

    #[test]
    fn containerd_2_3_bootstrap_parameters_are_read() {
        let p = parse_stdin(&hex(BOOTSTRAP_PLAIN), "3f2a", "k8s.io");
        assert!(p.bootstrap && !p.debug, "{p:?}");
        assert_eq!(p.options, None);
        assert_eq!(
            p.ttrpc_address.as_deref(),
            Some("/run/containerd/containerd.sock.ttrpc")
        );
        assert_eq!(p.socket_dir, None);
        assert_eq!(p.ignored, None);
    }

    #[test]
    fn runtime_options_come_from_the_bootstrap_extensions() {
        let p = parse_stdin(&hex(BOOTSTRAP_OPTIONS_DEBUG), "3f2a", "k8s.io");
        assert!(p.bootstrap && p.debug, "{p:?}");
        assert_eq!(
            config_path(&p),
            Some(PathBuf::from("/etc/kata-containers/fast.toml"))
        );
        assert_eq!(p.socket_dir, Some(PathBuf::from("/run/containerd/s")));
    }

    #[test]
    fn older_containerds_options_are_an_any() {
        let p = parse_stdin(&hex(LEGACY_OPTIONS), "3f2a", "k8s.io");
        assert!(!p.bootstrap, "{p:?}");
        assert_eq!(
            config_path(&p),
            Some(PathBuf::from("/etc/kata-containers/fast.toml"))
        );
        assert_eq!(p.ignored, None);
        assert_eq!(parse_stdin(b"", "3f2a", "k8s.io"), StartParams::default());
    }

    #[test]
    fn bootstrap_parameters_for_another_instance_are_ignored() {
        let p = parse_stdin(&hex(BOOTSTRAP_OPTIONS_DEBUG), "other", "k8s.io");
        assert!(!p.bootstrap && p.options.is_none(), "{p:?}");
        assert!(
            p.ignored.as_deref().unwrap_or("").contains("k8s.io/3f2a"),
            "{p:?}"
        );
        let p = parse_stdin(&hex(BOOTSTRAP_PLAIN), "3f2a", "default");
        assert!(!p.bootstrap, "{p:?}");
    }

    #[test]
    fn garbage_is_ignored_not_fatal() {
        for junk in [
            &b"\xff\xff\xff\xff"[..],
            b"{\"ConfigPath\": \"/x\"}",
            b"\x0a\x99",
            &[0u8; 64][..],
        ] {
            let p = parse_stdin(junk, "3f2a", "k8s.io");
            assert!(!p.bootstrap && p.options.is_none(), "{junk:?}: {p:?}");
            assert!(p.ignored.is_some(), "{junk:?}: {p:?}");
        }
    }

    #[test]
    fn the_answer_is_a_bootstrap_result_only_when_asked() {
        let addr = "unix:///run/containerd/s/abc";
        assert_eq!(response(addr, false), addr.as_bytes());
        let r = BootstrapResult::parse_from_bytes(&response(addr, true)).unwrap();
        assert_eq!(
            (r.version, r.address.as_str(), r.protocol.as_str()),
            (2, addr, "ttrpc")
        );
    }

    #[test]
    fn the_socket_goes_where_containerd_says() {
        let default = socket_address("/run/containerd/containerd.sock", "k8s.io", "3f2a", None);
        assert!(
            default.starts_with("unix:///run/containerd/s/"),
            "{default}"
        );
        let moved = socket_address(
            "/run/containerd/containerd.sock",
            "k8s.io",
            "3f2a",
            Some(Path::new("/run/c/s")),
        );
        assert_eq!(
            moved.rsplit('/').next(),
            default.rsplit('/').next(),
            "{moved} vs {default}"
        );
        assert!(moved.starts_with("unix:///run/c/s/"), "{moved}");
    }
}
