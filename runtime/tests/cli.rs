//! Runs the built `kata-runtime` on this machine and checks its lines against the facts
//! of the host, found here independently (which files exist, what `/dev/kvm` is).
//!
//! A private configuration points at a fake kernel and initrd (the checks read their
//! headers), the real QEMU and virtiofsd, and `/bin/true` as vsock backend and kata-vmm;
//! a private containerd configuration holds the deploy snippet. So every line has a known
//! expected verdict here; KVM's is taken from `/dev/kvm` (this machine's is emulated and
//! too slow for Linux: a warning under QEMU with `auto`, a failure for the builtin VMM).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kata-runtime");
const QEMU: &str = "/usr/bin/qemu-system-x86_64";
const VIRTIOFSD: &str = "/opt/kata-tools/bin/virtiofsd";
const SNIPPET_V2: &str = include_str!("../../deploy/containerd/kata-containerd-1.x.toml");

struct Host {
    dir: tempfile::TempDir,
    config: PathBuf,
    builtin_config: PathBuf,
    containerd_config: PathBuf,
    path_env: String,
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(
        p("vmlinux"),
        b"\x7fELF\x02\x01\x01....Linux version 6.1.0-fake (t@h) #1 SMP\n\0",
    )
    .unwrap();
    std::fs::write(p("initrd.img"), b"07070100000001").unwrap();
    std::fs::create_dir(p("bin")).unwrap();
    write_exec(&p("bin/containerd-shim-kata-v2"), "#!/bin/sh\nexit 0\n");
    std::os::unix::fs::symlink(
        "containerd-shim-kata-v2",
        p("bin/containerd-shim-kata-builtin-v2"),
    )
    .unwrap();
    // An install under the temporary prefix, as kata-deploy's under /opt/kata: each shim
    // finds its file among the prefix's defaults by its name.
    let defaults = p("share/defaults/kata-containers");
    std::fs::create_dir_all(&defaults).unwrap();
    let common = format!(
        "kernel = \"{k}\"\ninitrd = \"{i}\"\nvirtio_fs_daemon = \"{VIRTIOFSD}\"\n",
        k = p("vmlinux").display(),
        i = p("initrd.img").display()
    );
    let config = defaults.join("configuration.toml");
    std::fs::write(
        &config,
        format!("[hypervisor.qemu]\npath = \"{QEMU}\"\nvsock_backend = \"/bin/true\"\n{common}"),
    )
    .unwrap();
    let builtin_config = defaults.join("configuration-builtin.toml");
    std::fs::write(
        &builtin_config,
        format!("[runtime]\nhypervisor_name = \"builtin\"\n[hypervisor.builtin]\npath = \"/bin/true\"\n{common}"),
    )
    .unwrap();
    let containerd_config = p("containerd.toml");
    let bin = p("bin");
    let snippet = SNIPPET_V2
        .replace(
            "runtime_type = \"io.containerd.kata.v2\"",
            &format!(
                "runtime_type = \"io.containerd.kata.v2\"\n  runtime_path = \"{}/containerd-shim-kata-v2\"",
                bin.display()
            ),
        )
        .replace(
            "runtime_type = \"io.containerd.kata-builtin.v2\"",
            &format!(
                "runtime_type = \"io.containerd.kata-builtin.v2\"\n  runtime_path = \"{}/containerd-shim-kata-builtin-v2\"",
                bin.display()
            ),
        );
    std::fs::write(&containerd_config, format!("version = 2\n{snippet}")).unwrap();
    let path_env = format!(
        "{}:{}",
        p("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Host {
        dir,
        config,
        builtin_config,
        containerd_config,
        path_env,
    }
}

struct Run {
    code: i32,
    stdout: String,
}

impl Run {
    /// `(status, detail, fix)` of the requirement's line.
    fn line(&self, requirement: &str) -> (String, String, String) {
        let lines: Vec<&str> = self.stdout.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let mut cols = line.split("  ").map(str::trim).filter(|c| !c.is_empty());
            let (Some(status), Some(req)) = (cols.next(), cols.next()) else {
                continue;
            };
            if req == requirement && !line.starts_with(' ') {
                let detail = cols.collect::<Vec<_>>().join("  ");
                let fix = lines[i + 1..]
                    .iter()
                    .take_while(|l| l.starts_with("      "))
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join("\n");
                return (status.to_string(), detail, fix);
            }
        }
        panic!("no {requirement:?} line in:\n{}", self.stdout);
    }
}

fn kata_runtime(path_env: &str, args: &[&str]) -> Run {
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(args)
        .env("PATH", path_env)
        .env_remove("KATA_CONF_FILE")
        .output()
        .unwrap();
    // The requirement is "under a second"; the bound is loose so that a loaded machine
    // does not fail it, but it catches a probe that waits for a slow KVM (it once did: 20 s).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{args:?} took {:?}",
        started.elapsed()
    );
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    };
    eprintln!(
        "$ kata-runtime {}\n{}(exit {})",
        args.join(" "),
        run.stdout,
        run.code
    );
    run
}

fn kvm_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

#[test]
fn check_on_this_host_with_a_private_configuration() {
    let h = host();
    let (config, containerd) = (
        h.config.display().to_string(),
        h.containerd_config.display().to_string(),
    );
    let run = kata_runtime(
        &h.path_env,
        &[
            "--config",
            &config,
            "check",
            "--containerd-config",
            &containerd,
        ],
    );

    let mut expect_fail = false;
    let mut expect = |req: &str, ok: bool, detail: &str| {
        let (status, d, fix) = run.line(req);
        let want = if ok { "ok" } else { "FAIL" };
        assert_eq!(status, want, "{req}: {d}");
        assert!(d.contains(detail), "{req}: {d:?} lacks {detail:?}");
        if !ok {
            assert!(!fix.is_empty(), "{req} fails without saying what to do");
            expect_fail = true;
        }
    };
    let have = |p: &str| Path::new(p).exists();
    expect("configuration", have(QEMU) && have(VIRTIOFSD), &config);
    expect(
        "qemu",
        have(QEMU),
        if have(QEMU) {
            "QEMU emulator version"
        } else {
            QEMU
        },
    );
    expect("qemu microvm", have(QEMU), "");
    expect(
        "virtiofsd",
        have(VIRTIOFSD),
        if have(VIRTIOFSD) {
            "virtiofsd 1."
        } else {
            VIRTIOFSD
        },
    );
    expect("vsock", true, "vhost-user backend /bin/true");
    expect("tun", have("/dev/net/tun"), "/dev/net/tun");
    expect("guest kernel", true, "Linux 6.1.0-fake, ELF vmlinux");
    expect("guest initrd", true, "newc cpio");
    let containerd_here =
        std::env::split_paths(&h.path_env).any(|d| d.join("containerd").is_file());
    expect("containerd", containerd_here, "containerd");
    expect(
        "containerd shim",
        true,
        &h.dir.path().join("bin").display().to_string(),
    );
    expect(
        "containerd runtime",
        true,
        &format!(
            "kata ({config}: configuration.toml by the shim's name), kata-builtin ({}: \
             configuration-builtin.toml by the shim's name)",
            h.builtin_config.display()
        ),
    );

    // KVM: a warning under QEMU with `auto` unless it runs at full speed; never a failure.
    let (status, detail, _) = run.line("kvm");
    if kvm_usable() {
        assert!(detail.contains("M guest instructions/s"), "{detail}");
    } else {
        assert!(detail.contains("KVM cannot run guests"), "{detail}");
    }
    assert!(status == "ok" || status == "warn", "{status}: {detail}");
    assert_eq!(run.code, i32::from(expect_fail), "{}", run.stdout);
    let last = run.stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("kata-runtime check: this host can"),
        "{last}"
    );
}

#[test]
fn check_fails_the_builtin_vmm_on_a_kvm_that_is_not_full_speed() {
    let h = host();
    let (builtin, containerd) = (
        h.builtin_config.display().to_string(),
        h.containerd_config.display().to_string(),
    );
    let run = kata_runtime(
        &h.path_env,
        &[
            "check",
            "--config",
            &builtin,
            "--containerd-config",
            &containerd,
        ],
    );
    let (vmm, detail, _) = run.line("kata-vmm");
    assert_eq!(vmm, "ok", "{detail}");
    let (status, detail, fix) = run.line("kvm");
    if status == "ok" {
        assert!(detail.contains("full speed"), "{detail}");
    } else {
        assert_eq!(status, "FAIL", "{detail}");
        assert!(detail.contains("needs a full-speed KVM"), "{detail}");
        assert!(fix.contains("hypervisor_name = \"qemu\""), "{fix}");
        assert_eq!(run.code, 1);
    }
    let (vsock, detail, _) = run.line("vsock");
    assert_eq!(vsock, "ok");
    assert!(detail.contains("served by kata-vmm itself"), "{detail}");
}

#[test]
fn check_prints_the_snippet_when_containerd_has_no_kata_runtime() {
    let h = host();
    let runc_only = h.dir.path().join("runc-only.toml");
    std::fs::write(
        &runc_only,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
    )
    .unwrap();
    let config = h.config.display().to_string();
    let run = kata_runtime(
        &h.path_env,
        &[
            "check",
            "--config",
            &config,
            "--containerd-config",
            &runc_only.display().to_string(),
        ],
    );
    let (status, detail, fix) = run.line("containerd runtime");
    assert_eq!(status, "FAIL");
    assert!(
        detail.contains("no runtime with runtime_type = \"io.containerd.kata.v2\""),
        "{detail}"
    );
    assert!(
        fix.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]"),
        "{fix}"
    );
    assert!(
        fix.contains("runtime_type = \"io.containerd.kata.v2\""),
        "{fix}"
    );
    assert_eq!(run.code, 1);
}

/// This machine as it is: whatever is installed system-wide, and containerd's own file.
#[test]
fn check_on_this_host_as_installed() {
    let path_env = std::env::var("PATH").unwrap_or_default();
    let run = kata_runtime(&path_env, &["check"]);
    let installed = [kata_config::ETC_CONF_FILE, kata_config::DEFAULT_CONF_FILE]
        .iter()
        .any(|p| Path::new(p).is_file());
    if !installed {
        let (status, detail, fix) = run.line("configuration");
        assert_eq!(status, "FAIL");
        assert!(detail.contains("no configuration file found"), "{detail}");
        assert!(fix.contains("make install"), "{fix}");
    }
    let etc = std::fs::read_to_string("/etc/containerd/config.toml").unwrap_or_default();
    if !etc.contains("io.containerd.kata.v2") {
        let (status, _, fix) = run.line("containerd runtime");
        assert_eq!(status, "FAIL");
        assert!(
            fix.contains("runtime_type = \"io.containerd.kata.v2\""),
            "{fix}"
        );
    }
    let failed = run.stdout.lines().any(|l| l.starts_with("FAIL"));
    assert_eq!(run.code, i32::from(failed), "{}", run.stdout);
    if !installed || !etc.contains("io.containerd.kata.v2") {
        assert_eq!(run.code, 1);
    }
}

#[test]
fn env_prints_toml_with_the_sources_of_the_values() {
    let h = host();
    let (config, containerd) = (
        h.config.display().to_string(),
        h.containerd_config.display().to_string(),
    );
    let run = kata_runtime(
        &h.path_env,
        &[
            "env",
            "--config",
            &config,
            "--containerd-config",
            &containerd,
        ],
    );
    assert_eq!(run.code, 0);
    let env: toml::Table = toml::from_str(&run.stdout).expect("env prints TOML");
    for table in [
        "Meta",
        "Runtime",
        "Hypervisor",
        "Kernel",
        "Initrd",
        "Agent",
        "VirtioFs",
        "Vsock",
        "Shim",
        "Containerd",
        "Host",
        "Config",
    ] {
        assert!(
            env.get(table).is_some_and(toml::Value::is_table),
            "no [{table}]"
        );
    }
    assert_eq!(env["Config"]["Path"].as_str(), Some(config.as_str()));
    assert_eq!(env["Config"]["ChosenBy"].as_str(), Some("--config"));
    let values = &env["Config"]["Values"];
    assert_eq!(values["hypervisor.qemu.path"]["Value"].as_str(), Some(QEMU));
    assert_eq!(
        values["hypervisor.qemu.path"]["Source"].as_str(),
        Some(config.as_str())
    );
    assert_eq!(
        values["hypervisor.qemu.default_memory"]["Value"].as_integer(),
        Some(512)
    );
    assert_eq!(
        values["hypervisor.qemu.default_memory"]["Source"].as_str(),
        Some("default")
    );
    assert_eq!(env["Kernel"]["Version"].as_str(), Some("6.1.0-fake"));
    assert_eq!(env["Hypervisor"]["Name"].as_str(), Some("qemu"));
    let runtimes: Vec<&str> = env["Containerd"]["Runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.get("Name")?.as_str())
        .collect();
    if env["Containerd"]["Path"].as_str() != Some("") {
        assert_eq!(runtimes, ["kata", "kata-builtin"]);
    }
    if Path::new(VIRTIOFSD).exists() {
        assert!(env["VirtioFs"]["Version"]
            .as_str()
            .unwrap()
            .starts_with("1."));
    }
    let accel = env["Hypervisor"]["AcceleratorInUse"].as_str().unwrap();
    assert!(accel == "kvm" || accel == "tcg", "{accel}");
    if !kvm_usable() {
        assert_eq!(accel, "tcg");
    }

    let json = kata_runtime(
        &h.path_env,
        &[
            "env",
            "--json",
            "--config",
            &config,
            "--containerd-config",
            &containerd,
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&json.stdout).expect("env --json prints JSON");
    assert_eq!(
        json["Config"]["Values"]["hypervisor.qemu.path"]["Source"],
        config.as_str()
    );
}
