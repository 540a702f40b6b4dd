//! Volumes with the CRI's read-only meanings, enforced on the host (issue 29, item 5):
//! `ro` makes a volume's top read-only and leaves the host's submounts below it as they
//! are (as runc does); `rro` makes all of it read-only. Neither the container nor root in
//! the guest (the debug console, writing straight into the virtio-fs share) can write
//! where the container may not, and the host's files stay as they were. Host `/proc` and
//! `/sys` as bind sources are refused with what to do; a sandbox-id annotation that is no
//! valid id is refused before anything is made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_tests::*;

/// How long one `kata-runtime exec` (the guest's root shell) may take.
const SHELL_LIMIT: Duration = Duration::from_secs(120);

const EROFS: &str = "Read-only file system";

/// A host directory to bind as a volume: a file `top`, and a tmpfs at `tmpfs` holding a
/// file `inner` (what critest's read-only specs build). Unmounted and removed on drop,
/// also when the test fails.
struct HostVolume {
    dir: PathBuf,
}

impl HostVolume {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kata-vol-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tmpfs")).expect("create the volume directory");
        std::fs::write(dir.join("top"), "host\n").expect("write the volume's top file");
        let v = HostVolume { dir };
        nix::mount::mount(
            Some("tmpfs"),
            &v.dir.join("tmpfs"),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount the volume's tmpfs (the tests run as root)");
        std::fs::write(v.dir.join("tmpfs/inner"), "host\n").expect("write the tmpfs's file");
        v
    }

    /// `--mount` for ctr: the volume at `dst` with `options` (`:`-separated).
    fn mount(&self, dst: &str, options: &str) -> String {
        format!(
            "type=bind,src={},dst={dst},options={options}",
            self.dir.display()
        )
    }

    /// The names in the volume and in its tmpfs, sorted.
    fn listing(&self) -> (Vec<String>, Vec<String>) {
        let names = |d: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .map(|r| {
                    r.filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        (names(&self.dir), names(&self.dir.join("tmpfs")))
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.join(rel)).unwrap_or_default()
    }
}

impl Drop for HostVolume {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir.join("tmpfs"), nix::mount::MntFlags::MNT_DETACH);
        let tmpfs_gone = !mount_points()
            .iter()
            .any(|m| Path::new(m) == self.dir.join("tmpfs"));
        if tmpfs_gone {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A shell function that runs a command and prints `RESULT label ok` or `RESULT label
/// <its error>`, then the checks, one per line.
fn script(checks: &[(&str, String)]) -> String {
    let mut s = String::from(
        "t() { if out=$( (eval \"$2\") 2>&1 ); then echo \"RESULT $1 ok\"; \
         else echo \"RESULT $1 $out\"; fi; }\n",
    );
    for (label, cmd) in checks {
        s.push_str(&format!("t {label} '{cmd}'\n"));
    }
    s
}

/// Each label's outcome in `text` (the lines the script printed).
fn outcome(text: &str, label: &str) -> String {
    let prefix = format!("RESULT {label} ");
    text.lines()
        .map(|l| l.trim_matches(|c: char| c == '\r' || c.is_whitespace()))
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no result for {label} in:\n{text}"))
        .to_string()
}

/// Runs `input` in the guest's root shell (`kata-runtime exec ID`, the debug console);
/// its stdout. The process is killed by its pid if it does not end in time.
fn guest_root_shell(c: &Containerd, id: &str, input: &str) -> String {
    let out = finish_shell(debug_shell(id, &format!("{input}exit\n")), SHELL_LIMIT);
    assert!(
        out.status.success(),
        "kata-runtime exec {id}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    stdout(&out)
}

/// A runtime configuration with the debug console on and the debug initrd (its shell).
fn debug_config() -> RuntimeConfig {
    let initrd = std::env::var("KATA_TEST_DEBUG_INITRD")
        .expect("KATA_TEST_DEBUG_INITRD is not set: run the end-to-end tests with `make test`");
    RuntimeConfig::qemu()
        .set("agent.kata", "debug_console_enabled", "true")
        .set("hypervisor.qemu", "initrd", &toml_str(&initrd))
}

#[test]
fn read_only_volumes_hold_against_the_container_and_root_in_the_guest() {
    let id = "vol-ro";
    let _cleanup = SandboxCleanup::new(id);
    let ro = HostVolume::new("ro");
    let rro = HostVolume::new("rro");
    let c = Containerd::start_configured("vol-ro", &debug_config());
    start_detached(
        &c,
        id,
        &[
            "--mount",
            &ro.mount("/volro", "rbind:rprivate:ro"),
            "--mount",
            &rro.mount("/volrro", "rbind:rprivate:rro"),
        ],
        &["sleep", "600"],
    );

    // The container.
    let checks = [
        ("ro-top", "echo container > /volro/top".to_string()),
        ("ro-new", "touch /volro/new".to_string()),
        (
            "ro-tmpfs",
            "echo container > /volro/tmpfs/from-container".to_string(),
        ),
        ("rro-top", "echo container > /volrro/top".to_string()),
        ("rro-new", "touch /volrro/new".to_string()),
        (
            "rro-tmpfs-new",
            "touch /volrro/tmpfs/from-container".to_string(),
        ),
        (
            "rro-tmpfs-inner",
            "echo container > /volrro/tmpfs/inner".to_string(),
        ),
    ];
    let out = exec(&c, id, "writes", &[], &["sh", "-c", &script(&checks)]);
    let text = stdout(&out);
    eprintln!("in the container:\n{text}");
    assert!(out.status.success(), "{}", stderr(&out));
    for label in [
        "ro-top",
        "ro-new",
        "rro-top",
        "rro-new",
        "rro-tmpfs-new",
        "rro-tmpfs-inner",
    ] {
        let got = outcome(&text, label);
        assert!(got.contains(EROFS), "{label}: {got}");
    }
    // As with runc: the host's tmpfs under a read-only (not recursively) volume is
    // writable from the container.
    assert_eq!(outcome(&text, "ro-tmpfs"), "ok");

    // Root in the guest, straight into the share, past the container's own mounts: the
    // host's copy of the volume that virtiofsd serves says no.
    let share = format!("{}/{id}/mounts", "/run/kata-containers/shared/containers");
    let g = |rel: &str| format!("echo guest > $(echo {share}/*-volro){rel}");
    let gr = |rel: &str| format!("echo guest > $(echo {share}/*-volrro){rel}");
    let checks = [
        ("g-ro-top", g("/top")),
        ("g-ro-new", g("/guest-new")),
        ("g-ro-tmpfs", g("/tmpfs/from-guest")),
        ("g-rro-top", gr("/top")),
        ("g-rro-tmpfs", gr("/tmpfs/inner")),
        ("g-rro-tmpfs-new", gr("/tmpfs/from-guest")),
    ];
    let text = guest_root_shell(&c, id, &script(&checks));
    eprintln!("as root in the guest:\n{text}");
    for label in [
        "g-ro-top",
        "g-ro-new",
        "g-rro-top",
        "g-rro-tmpfs",
        "g-rro-tmpfs-new",
    ] {
        let got = outcome(&text, label);
        assert!(got.contains(EROFS), "{label}: {got}");
    }
    assert_eq!(outcome(&text, "g-ro-tmpfs"), "ok");

    // The host: only the writable tmpfs of the `ro` volume changed.
    assert_eq!(
        ro.listing(),
        (
            vec!["tmpfs".into(), "top".into()],
            vec!["from-container".into(), "from-guest".into(), "inner".into()]
        )
    );
    assert_eq!(ro.read("tmpfs/from-container"), "container\n");
    assert_eq!(
        rro.listing(),
        (vec!["tmpfs".into(), "top".into()], vec!["inner".into()])
    );
    for v in [&ro, &rro] {
        assert_eq!(v.read("top"), "host\n");
        assert_eq!(v.read("tmpfs/inner"), "host\n");
    }

    // The host's own mounts under a volume stay the host's: while the container runs, the
    // tmpfs can be unmounted and its directory removed, as under runc (critest's read-only
    // specs clean up so); the sandbox holds nothing of them in the host's namespace.
    for v in [&ro, &rro] {
        nix::mount::umount2(&v.dir.join("tmpfs"), nix::mount::MntFlags::MNT_DETACH)
            .expect("unmount the volume's tmpfs on the host");
        std::fs::remove_dir(v.dir.join("tmpfs"))
            .unwrap_or_else(|e| panic!("remove {}/tmpfs: {e}", v.dir.display()));
    }
    let out = exec(&c, id, "after", &[], &["cat", "/volro/top"]);
    assert_eq!(stdout(&out), "host\n", "{}", stderr(&out));

    remove_detached(&c, id);
    assert_no_leftovers(id);
}

#[test]
fn host_proc_and_sys_sources_are_refused_with_what_to_do() {
    let c = Containerd::start("vol-proc");
    for (id, src) in [("vol-proc", "/proc"), ("vol-sys", "/sys/kernel")] {
        let _cleanup = SandboxCleanup::new(id);
        let mount = format!("type=bind,src={src},dst=/host,options=rbind:ro");
        let out = c.run(id, &["--rm", "--mount", &mount], &["true"]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{id} ran: {err}");
        let tree = if src == "/proc" { "/proc" } else { "/sys" };
        assert!(
            err.contains(&format!(
                "bind source {src} is the host kernel's {tree}, which a VM sandbox does not serve"
            )) && err.contains("(/host)")
                && err.contains("RuntimeClass"),
            "{id}: {err}"
        );
        let _ = c.ctr(&["container", "rm", id]);
        assert_no_leftovers(id);
    }
}

#[test]
fn an_invalid_sandbox_id_annotation_is_refused() {
    let id = "vol-badsb";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("vol-badsb");
    let out = c.run(
        id,
        &[
            "--rm",
            "--annotation",
            "io.kubernetes.cri.container-type=container",
            "--annotation",
            "io.kubernetes.cri.sandbox-id=../../escape",
        ],
        &["true"],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "ran: {err}");
    assert!(
        err.contains("annotation io.kubernetes.cri.sandbox-id names sandbox \"../../escape\", which is not a valid id"),
        "{err}\n{}",
        c.log_tail()
    );
    let _ = c.ctr(&["container", "rm", id]);
    assert_no_leftovers(id);
    assert!(!Path::new("/run/kata-containers/shared/sandboxes/escape").exists());
}
