//! Full file systems: the sandbox's state and run directories (`/run/vc`) or containerd's
//! state directory (the bundle) full at create fail the create with a message naming the file system and what is full, and leave
//! nothing; a running sandbox whose logs can no longer be written keeps running and
//! answering, says so once, and is removed whole.
//!
//! The host's `/run/vc` is never filled (other tests run beside these): each case points
//! its shims' state roots at a small tmpfs of its own with `KATA_TEST_RUN_VC`, which
//! containerd passes on to the shims it starts; containerd's state directory is a tmpfs
//! of its private instance. About 20 s in all.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use e2e_tests::*;

/// A small tmpfs of the test's own, unmounted (lazily, whatever still holds it) and
/// removed when dropped. Declare it before the [`Containerd`], which then stops first.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kata-e2e-{name}-fs-{}", std::process::id()));
        Self::mount_at(dir, size)
    }

    fn mount_at(dir: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&dir).expect("creating the tmpfs mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs on {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    /// Fills the file system: a file grows until the kernel answers ENOSPC.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.join("fill")).expect("creating the filler");
        let chunk = vec![0u8; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.dir.display()),
            }
        }
    }

    /// Gives the file system `n` inodes in all (its root directory takes one); false
    /// when it holds more already.
    fn limit_inodes(&self, n: u32) -> bool {
        Command::new("mount")
            .args(["-o", &format!("remount,nr_inodes={n}")])
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Frees `bytes` of the filler again.
    fn free(&self, bytes: u64) {
        let f = self.dir.join("fill");
        let len = std::fs::metadata(&f).expect("the filler").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|f| f.set_len(len.saturating_sub(bytes)))
            .expect("shrinking the filler");
    }

    /// What of sandbox `id` is on the file system: its state and run directories.
    fn entries_of(&self, id: &str) -> Vec<String> {
        ["sbs", "vm"]
            .iter()
            .map(|root| self.dir.join(root).join(id))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect()
    }

    fn env(&self) -> [(&'static str, String); 1] {
        [("KATA_TEST_RUN_VC", self.dir.display().to_string())]
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // containerd's own stop may have unmounted it already.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn containerd_on(name: &str, fs: &Tmpfs) -> Containerd {
    let env = fs.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Containerd::start_with_env(name, &RuntimeConfig::qemu(), &env)
}

/// The `linux.cgroupsPath` ctr's default spec gives container `id`: `/<namespace>/<id>`.
fn ctr_cgroup(id: &str) -> String {
    format!("/default/{id}")
}

fn assert_nothing_on(fs: &Tmpfs, id: &str) {
    let left = poll(Duration::from_secs(15), Duration::from_millis(100), || {
        fs.entries_of(id).is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "sandbox {id} left on the test's run root: {:?}",
        fs.entries_of(id)
    );
}

#[test]
fn a_full_run_vc_fails_the_create_naming_it_and_leaves_nothing() {
    let id = "full-state";
    let _cleanup = SandboxCleanup::new(id);
    let fs = Tmpfs::mount("full-state", "1m");
    fs.fill();
    let c = containerd_on("full-state", &fs);
    let out = c.run(id, &["--rm"], &["true"]);
    assert!(!out.status.success(), "the create succeeded on a full disk");
    let err = stderr(&out);
    eprintln!("ctr run: {err}");
    let state = fs.dir.join("sbs").join(id);
    for want in [
        format!(
            "the sandbox state {} is on a full file system",
            state.display()
        ),
        format!("(mounted at {})", fs.dir.display()),
        "no space (0 KiB of 1024 KiB free)".to_string(),
        "free space or inodes there".to_string(),
    ] {
        assert!(
            err.contains(&want),
            "{want:?} missing from: {err}\n{}",
            c.log_tail()
        );
    }
    assert_nothing_left(id, Some(&ctr_cgroup(id)));
    assert_nothing_on(&fs, id);
    let _ = c.ctr(&["container", "rm", id]);
}

/// Every file and directory a create makes in the run root, one after the other, is
/// the one that finds no inode: each time the create fails saying the file system is
/// full and leaves nothing, until there are inodes enough and it runs (18 such steps
/// with QEMU: state, run directory, helpers' logs, pid files and sockets). About 8 s.
#[test]
fn each_write_of_a_create_on_a_full_run_root_fails_it_cleanly() {
    let id = "full-inodes";
    let _cleanup = SandboxCleanup::new(id);
    let fs = Tmpfs::mount("full-inodes", "64m");
    let c = containerd_on("full-inodes", &fs);
    let mut failures = Vec::new();
    let mut ran = false;
    for n in 2..64 {
        if !fs.limit_inodes(n) {
            continue;
        }
        let out = c.run(id, &["--rm"], &["true"]);
        if out.status.success() {
            eprintln!("{n} inodes: the sandbox ran");
            ran = true;
            break;
        }
        let err = stderr(&out);
        let step = err
            .split(": No space left on device")
            .next()
            .unwrap_or(&err)
            .rsplit("full-inodes: ")
            .next()
            .unwrap_or("")
            .to_string();
        eprintln!("{n} inodes: {step}");
        assert!(
            err.contains(&format!(
                "is on a full file system (mounted at {})",
                fs.dir.display()
            )) && err.contains("no inodes ("),
            "with {n} inodes: {err}\n{}",
            c.log_tail()
        );
        assert_nothing_left(id, Some(&ctr_cgroup(id)));
        assert_nothing_on(&fs, id);
        let _ = c.ctr(&["container", "rm", id]);
        failures.push(step);
    }
    assert!(ran, "the sandbox never ran: {failures:?}");
    assert!(
        failures.len() >= 3,
        "too few steps failed on a full run root: {failures:?}"
    );
    assert_nothing_left(id, Some(&ctr_cgroup(id)));
    assert_nothing_on(&fs, id);
}

#[test]
fn a_running_sandbox_whose_logs_hit_a_full_disk_keeps_answering() {
    let id = "full-logs";
    let _cleanup = SandboxCleanup::new(id);
    let fs = Tmpfs::mount("full-logs", "64m");
    let c = containerd_on("full-logs", &fs);
    start_detached(&c, id, &[], &["sh", "-c", "while :; do sleep 1; done"]);
    let console = fs.dir.join("vm").join(id).join("console.log");
    assert!(console.exists(), "no {}", console.display());
    let offset = c.log_len();
    fs.fill();
    // With debug on (the tests' configuration), the agent logs each request on the guest
    // console, which can no longer be written.
    for i in 0..3 {
        let out = exec(&c, id, &format!("e{i}"), &[], &["echo", "alive"]);
        assert!(
            out.status.success(),
            "exec: {}\n{}",
            stderr(&out),
            c.log_tail()
        );
        assert_eq!(stdout(&out), "alive\n");
    }
    let said = poll(Duration::from_secs(10), Duration::from_millis(200), || {
        let log = c.log_since(offset);
        log.contains("cannot write the log of the guest console")
            .then_some(log)
    })
    .unwrap_or_else(|| {
        panic!(
            "the shim did not say the console log failed:\n{}",
            c.log_tail()
        )
    });
    assert_eq!(
        said.matches("cannot write the log of the guest console")
            .count(),
        1,
        "said more than once:\n{said}"
    );
    assert!(said.contains(&console.display().to_string()), "{said}");
    remove_detached(&c, id);
    assert_nothing_left(id, Some(&ctr_cgroup(id)));
    assert_nothing_on(&fs, id);
}

/// containerd's state directory (where it makes each container's bundle) full: with
/// room for containerd's own bundle files (config.json takes one page) but not for the
/// shim's, start fails naming the bundle's file system, and nothing is left, neither
/// of the sandbox nor in the bundle.
#[test]
fn a_full_containerd_state_dir_fails_the_start_naming_it_and_leaves_nothing() {
    let id = "full-bundle";
    let _cleanup = SandboxCleanup::new(id);
    let name = "full-bundle";
    let fs = Tmpfs::mount_at(Containerd::dir_for(name).join("state"), "1m");
    let c = Containerd::start(name);
    fs.fill();
    fs.free(4096);
    let out = c.run(id, &["--rm"], &["true"]);
    assert!(!out.status.success(), "the create succeeded on a full disk");
    let err = stderr(&out);
    eprintln!("ctr run: {err}");
    for want in [
        "writing the bundle's address".to_string(),
        format!("is on a full file system (mounted at {})", fs.dir.display()),
        "free space or inodes there".to_string(),
    ] {
        assert!(
            err.contains(&want),
            "{want:?} missing from: {err}\n{}",
            c.log_tail()
        );
    }
    assert_nothing_left(id, Some(&ctr_cgroup(id)));
    let _ = c.ctr(&["container", "rm", id]);
    let bundles = fs.dir.join("io.containerd.runtime.v2.task/default");
    let left = poll(Duration::from_secs(10), Duration::from_millis(100), || {
        (!bundles.join(id).exists()).then_some(())
    });
    assert!(
        left.is_some(),
        "the bundle {} is left",
        bundles.join(id).display()
    );
}
