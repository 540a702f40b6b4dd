//! Bad inputs, as users give them through ctr (and, where containerd itself never lets
//! them through, through the shim's Task API): each fails with an error that says what is
//! wrong, in words a user can act on, and leaves nothing of its sandbox on the host.
//!
//! Bad inputs about the agent's side (namespace types, mount destinations through
//! symlinks) are tested in `agent_isolation.rs`.

use std::time::Duration;

use containerd_shim_protos::shim::shim::CreateTaskRequest;
use e2e_tests::*;

/// Far above a boot here (QEMU/TCG): a failing create must not hang.
const LIMIT: Duration = Duration::from_secs(90);

/// `ctr run --rm [extra] busybox id cmd`, expected to fail; returns ctr's stderr after
/// checking that the sandbox left nothing and that the container record can go.
fn run_fails(c: &Containerd, id: &str, extra: &[&str], cmd: &[&str]) -> String {
    let args = c.run_args(id, extra, cmd);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c
        .ctr_within(&refs, LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert!(
        !out.status.success(),
        "ctr {} succeeded: {}",
        args.join(" "),
        stdout(&out)
    );
    let err = stderr(&out);
    eprintln!("{id}: {}", err.trim());
    cleaned_up(c, id);
    err
}

/// After a failed create: no task, the container record can be removed, nothing is left.
fn cleaned_up(c: &Containerd, id: &str) {
    assert_eq!(c.task_status(id), None, "a task {id} is left");
    // ctr keeps the container record of a failed `run --rm` only sometimes.
    let _ = c.ctr(&["container", "rm", id]);
    assert_no_leftovers(id);
}

/// Whether `text` says that something does not exist, in any of the usual words.
fn says_missing(text: &str) -> bool {
    let lower = text.to_lowercase();
    ["no such file", "does not exist", "not found"]
        .iter()
        .any(|w| lower.contains(w))
}

/// Whether `text` holds every word of `words`, case-insensitively.
fn says_all(text: &str, words: &[&str]) -> bool {
    let lower = text.to_lowercase();
    words.iter().all(|w| lower.contains(&w.to_lowercase()))
}

#[test]
fn a_missing_command_or_cwd_is_a_clear_error() {
    let _cleanup = [
        SandboxCleanup::new("bad-cmd"),
        SandboxCleanup::new("bad-cwd"),
    ];
    let c = Containerd::start("bad-cmd");
    let err = run_fails(&c, "bad-cmd", &[], &["/nonexistent"]);
    assert!(
        says_all(&err, &["/nonexistent"]) && says_missing(&err),
        "the error does not say that /nonexistent is missing: {err}"
    );
    let err = run_fails(&c, "bad-cwd", &["--cwd", "/nonexistent"], &["true"]);
    assert!(
        says_all(&err, &["cwd", "/nonexistent"]) && says_missing(&err),
        "the error does not say that the cwd /nonexistent is missing: {err}"
    );
}

#[test]
fn a_missing_bind_source_is_a_clear_error() {
    let _cleanup = SandboxCleanup::new("bad-bind");
    let c = Containerd::start("bad-bind");
    let src = c.dir.join("no-such-source").display().to_string();
    let mount = format!("type=bind,src={src},dst=/mnt,options=rbind:ro");
    let err = run_fails(&c, "bad-bind", &["--mount", &mount], &["true"]);
    assert!(
        says_all(&err, &[&src]) && says_missing(&err),
        "the error does not name the missing bind source {src}: {err}"
    );
}

/// A container spec of its own for `ctr run --config` (ctr 1.6 has no `--user`): the
/// default spec with `uid`, a busybox bound from the host at `/bb` (with `--config`,
/// containerd prepares no image rootfs) and `args`.
fn spec_with_user(c: &Containerd, id: &str, uid: u64, args: &[&str]) -> std::path::PathBuf {
    let bb = c.dir.join("bb");
    std::fs::create_dir_all(&bb).expect("mkdir bb");
    std::fs::copy("/bin/busybox", bb.join("busybox")).expect("copying the host's busybox");
    let out = c.ctr(&["oci", "spec"]);
    assert!(out.status.success(), "ctr oci spec: {}", stderr(&out));
    let mut spec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("spec JSON");
    spec["process"]["user"]["uid"] = uid.into();
    spec["process"]["args"] = args.into();
    spec["linux"]["cgroupsPath"] = format!("/default/{id}").into();
    spec["mounts"]
        .as_array_mut()
        .expect("mounts")
        .push(serde_json::json!({
            "destination": "/bb",
            "type": "bind",
            "source": bb,
            "options": ["rbind", "ro"]
        }));
    let path = c.dir.join(format!("{id}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).expect("JSON")).expect("spec file");
    path
}

fn run_with_spec(c: &Containerd, id: &str, spec: &std::path::Path) -> std::process::Output {
    let fifo = c.dir.join("fifo").display().to_string();
    let spec = spec.display().to_string();
    let args = [
        "run",
        "--runtime",
        RUNTIME,
        "--fifo-dir",
        &fifo,
        "--rm",
        "--config",
        &spec,
        id,
    ];
    c.ctr_within(&args, LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()))
}

/// A uid missing from the image's passwd runs as that uid (as with runc); a uid the kernel
/// cannot represent (4294967295 is `(uid_t)-1`) is a clear error.
#[test]
fn an_impossible_user_is_a_clear_error() {
    let _cleanup = [
        SandboxCleanup::new("user-ok"),
        SandboxCleanup::new("user-bad"),
    ];
    let c = Containerd::start("bad-user");
    let spec = spec_with_user(&c, "user-ok", 12345, &["/bb/busybox", "id", "-u"]);
    let out = run_with_spec(&c, "user-ok", &spec);
    assert!(
        out.status.success(),
        "a spec of our own did not run: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out).trim(), "12345");
    assert_no_leftovers("user-ok");

    let spec = spec_with_user(&c, "user-bad", 4294967295, &["/bb/busybox", "true"]);
    let out = run_with_spec(&c, "user-bad", &spec);
    assert!(!out.status.success(), "uid 4294967295 ran");
    let err = stderr(&out);
    eprintln!("user-bad: {}", err.trim());
    assert!(
        says_all(&err, &["uid", "4294967295"]),
        "the error does not name the uid: {err}"
    );
    cleaned_up(&c, "user-bad");
}

/// One bad configuration: the keys set on top of the working one, and the words the
/// create's error must contain (besides the file's path).
struct BadConfig {
    what: &'static str,
    edits: Vec<(&'static str, &'static str, String)>,
    words: Vec<&'static str>,
}

fn bad_configs() -> Vec<BadConfig> {
    let nowhere = |p: &str| toml_str(&format!("/nonexistent/{p}"));
    let q = "hypervisor.qemu";
    vec![
        BadConfig {
            what: "absurd memory",
            edits: vec![(q, "default_memory", "999999999".into())],
            // QEMU's own "cannot allocate memory" does not tell which setting to fix.
            words: vec!["default_memory", "999999999"],
        },
        BadConfig {
            what: "absurd vcpus",
            edits: vec![(q, "default_vcpus", "10000".into())],
            words: vec!["default_vcpus", "10000"],
        },
        BadConfig {
            what: "missing kernel",
            edits: vec![(q, "kernel", nowhere("vmlinux"))],
            words: vec!["hypervisor.qemu.kernel", "/nonexistent/vmlinux"],
        },
        BadConfig {
            what: "missing initrd",
            edits: vec![(q, "initrd", nowhere("initrd.img"))],
            words: vec!["hypervisor.qemu.initrd", "/nonexistent/initrd.img"],
        },
        BadConfig {
            what: "missing VMM binary",
            edits: vec![(q, "path", nowhere("qemu-system-x86_64"))],
            words: vec!["hypervisor.qemu.path", "/nonexistent/qemu-system-x86_64"],
        },
        BadConfig {
            what: "missing virtiofsd",
            edits: vec![(q, "virtio_fs_daemon", nowhere("virtiofsd"))],
            words: vec!["hypervisor.qemu.virtio_fs_daemon", "/nonexistent/virtiofsd"],
        },
        BadConfig {
            what: "missing vsock backend",
            edits: vec![(q, "vsock_backend", nowhere("kata-vsock"))],
            words: vec!["hypervisor.qemu.vsock_backend", "/nonexistent/kata-vsock"],
        },
        BadConfig {
            what: "unknown key",
            edits: vec![(q, "no_such_key", "1".into())],
            words: vec!["no_such_key"],
        },
    ]
}

/// Each bad configuration fails the create with an error naming the file and the key or
/// value, and leaves nothing; the working configuration then still runs. Every case is
/// tried; the failures are reported together.
#[test]
fn bad_configurations_fail_the_create_saying_where_and_why() {
    let cases = bad_configs();
    let ids: Vec<String> = (0..cases.len()).map(|i| format!("bad-conf{i}")).collect();
    let _cleanup: Vec<SandboxCleanup> = ids.iter().map(|id| SandboxCleanup::new(id)).collect();
    let c = Containerd::start("bad-conf");
    // The shim reads its configuration at each sandbox's create: rewrite it between runs.
    let good = std::fs::read_to_string(c.conf_file()).expect("configuration");
    let conf = c.conf_file().display().to_string();
    let mut failures = Vec::new();
    for (case, id) in cases.iter().zip(&ids) {
        let mut config = RuntimeConfig::qemu();
        for (section, key, value) in &case.edits {
            config = config.set(section, key, value);
        }
        std::fs::write(c.conf_file(), config.render()).expect("writing the configuration");
        let err = run_fails(&c, id, &[], &["true"]);
        let mut words = case.words.clone();
        words.push(&conf);
        if !says_all(&err, &words) {
            failures.push(format!("{}: expected {words:?} in: {err}", case.what));
        }
    }
    std::fs::write(c.conf_file(), good).expect("restoring the configuration");
    let out = c.run("bad-conf-good", &["--rm"], &["true"]);
    assert!(
        out.status.success(),
        "the working configuration: {}",
        stderr(&out)
    );
    assert_no_leftovers("bad-conf-good");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `ctr run --runtime-config-path FILE` (containerd's runtime options, as a RuntimeClass
/// passes them): the file is used instead of the default one, and a bad value in it fails
/// the create naming the file, the key and what is allowed.
#[test]
fn the_runtime_config_path_option_is_used_and_checked() {
    let ids = ["rcp-small", "rcp-lots", "rcp-missing"];
    let _cleanup: Vec<SandboxCleanup> = ids.iter().map(|id| SandboxCleanup::new(id)).collect();
    let c = Containerd::start("rcp");

    // A working file with less memory than the default (512 MiB): the guest sees it.
    assert_runtime_config_path_used(&c, "rcp-small", "containerd 1.6");
    assert_no_leftovers("rcp-small");

    let lots = c.dir.join("lots.toml");
    let text = RuntimeConfig::qemu()
        .set("hypervisor.qemu", "default_memory", "\"lots\"")
        .render();
    std::fs::write(&lots, text).expect("writing lots.toml");
    let lots = lots.display().to_string();
    let err = run_fails(&c, "rcp-lots", &["--runtime-config-path", &lots], &["true"]);
    assert!(
        says_all(&err, &[&lots, "default_memory", "lots"]),
        "the error does not name the file, the key and the value: {err}"
    );
    let lower = err.to_lowercase();
    assert!(
        ["integer", "number", "u32", "mib"]
            .iter()
            .any(|w| lower.contains(w)),
        "the error does not say what default_memory allows: {err}"
    );

    let missing = c.dir.join("missing.toml").display().to_string();
    let err = run_fails(
        &c,
        "rcp-missing",
        &["--runtime-config-path", &missing],
        &["true"],
    );
    assert!(
        says_all(&err, &[&missing]),
        "the error does not name the missing file: {err}"
    );
}

/// A bundle directory for a container of sandbox `sandbox`, made by hand as a CRI would
/// (annotations), with or without its config.json.
fn member_bundle(c: &Containerd, sandbox: &str, name: &str, with_spec: bool) -> String {
    let bundle = c.dir.join("bundles").join(name);
    std::fs::create_dir_all(bundle.join("rootfs")).expect("mkdir bundle");
    if with_spec {
        let text = std::fs::read(c.bundle(sandbox).join("config.json")).expect("sandbox spec");
        let mut spec: serde_json::Value = serde_json::from_slice(&text).expect("spec JSON");
        spec["annotations"] = serde_json::json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": sandbox,
        });
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&spec).expect("JSON"),
        )
        .expect("writing config.json");
    }
    bundle.display().to_string()
}

fn create_request(id: &str, bundle: &str) -> CreateTaskRequest {
    CreateTaskRequest {
        id: id.into(),
        bundle: bundle.into(),
        ..Default::default()
    }
}

/// containerd always writes config.json, so only a direct client of the Task API can
/// leave it out: the shim answers with an error naming the file, and its sandbox goes on.
#[test]
fn a_bundle_without_config_json_is_refused() {
    let _cleanup = SandboxCleanup::new("nocfg-sb");
    let c = Containerd::start("nocfg");
    start_detached(&c, "nocfg-sb", &[], &["sleep", "1000"]);
    let bundle = member_bundle(&c, "nocfg-sb", "nocfg-member", false);
    let err = task_client(&c, "nocfg-sb")
        .create(ttrpc_ctx(), &create_request("nocfg-member", &bundle))
        .expect_err("a create without config.json succeeded");
    let text = format!("{err:?}");
    eprintln!("nocfg-member: {text}");
    assert!(
        says_all(&text, &[&format!("{bundle}/config.json")]) && says_missing(&text),
        "the error does not name the missing config.json: {text}"
    );
    assert!(leftovers("nocfg-member").is_empty());
    let out = exec(&c, "nocfg-sb", "after", &[], &["echo", "fine"]);
    assert_eq!(stdout(&out), "fine\n", "{}", stderr(&out));
    remove_detached(&c, "nocfg-sb");
    assert_no_leftovers("nocfg-sb");
}

/// Ids that would be paths: containerd refuses them itself, with its own clear message,
/// so ctr users never reach the shim with one; a direct client of the Task API does, and
/// the shim must refuse them before it makes any file or mount.
#[test]
fn ids_with_a_slash_or_dotdot_are_refused() {
    let _cleanup = SandboxCleanup::new("ids-sb");
    let c = Containerd::start("ids");
    for id in ["a/b", "..", "a..b"] {
        let args = c.run_args(id, &["--rm"], &["true"]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = c.ctr_within(&refs, LIMIT).unwrap_or_else(|e| panic!("{e}"));
        let err = stderr(&out);
        eprintln!("ctr run {id:?}: {}", err.trim());
        assert!(!out.status.success(), "ctr ran a container with id {id:?}");
        assert!(
            says_all(&err, &["invalid", id]),
            "unclear refusal of {id:?}: {err}"
        );
    }

    start_detached(&c, "ids-sb", &[], &["sleep", "1000"]);
    let shared = "/run/kata-containers/shared/sandboxes";
    let entries = || {
        ["ids-sb", "ids-sb/mounts", "ids-sb/shared"]
            .iter()
            .map(|d| {
                std::fs::read_dir(format!("{shared}/{d}"))
                    .map(|d| d.count())
                    .unwrap_or(0)
            })
            .collect::<Vec<_>>()
    };
    let before = entries();
    for (n, id) in ["../ids-escape", "ids/slash", ".."].iter().enumerate() {
        let bundle = member_bundle(&c, "ids-sb", &format!("member{n}"), true);
        let err = task_client(&c, "ids-sb")
            .create(ttrpc_ctx(), &create_request(id, &bundle))
            .expect_err("the shim accepted a path as a container id");
        let text = format!("{err:?}");
        eprintln!("Task API create {id:?}: {text}");
        assert!(
            text.contains("InvalidArgument") || text.contains("INVALID_ARGUMENT"),
            "not an invalid-argument error for {id:?}: {text}"
        );
        assert!(text.contains(id), "the error does not name {id:?}: {text}");
    }
    for path in [
        format!("{shared}/ids-escape"),
        format!("{shared}/ids-sb/ids-escape"),
        "/run/vc/sbs/ids-escape".to_string(),
        "/run/vc/sbs/ids-sb/ids-escape".to_string(),
    ] {
        assert!(
            !std::path::Path::new(&path).exists(),
            "{path} was made for a refused id"
        );
    }
    assert_eq!(
        before,
        entries(),
        "new entries in {shared}/ids-sb, its mounts or its shared dir"
    );
    let out = exec(&c, "ids-sb", "after", &[], &["echo", "fine"]);
    assert_eq!(stdout(&out), "fine\n", "{}", stderr(&out));
    remove_detached(&c, "ids-sb");
    assert_no_leftovers("ids-sb");
}
