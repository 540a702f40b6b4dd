//! The Helm chart's installer, `deploy/kata-deploy.sh`, on a node's files without a cluster
//! (the chart itself runs in `make k8s`, case `helm-install`): for containerd 2.1 and 2.3
//! (config versions 3 and 4), install adds one `imports` line whose drop-in the real
//! containerd of that version merges, for 1.7 (version 2, whose imports replace whole
//! plugin sections) a block at the file's end (`containerd config dump`: the kata runtimes
//! with their shim and configuration under the prefix, runc still there), the runtime reads the
//! configuration drop-ins it wrote; a second install changes nothing and restarts nothing;
//! uninstall leaves the configuration byte for byte as before and nothing under the
//! prefix. A node it cannot serve is refused with a message and left untouched. No VM:
//! about a second per version.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use e2e_tests::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (run through make e2e)"))
}

/// A node's files in a temporary directory: the installer's payload (as the image holds
/// it), a containerd configuration, and a log of the restart command's runs.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = Self { dir };
        let a = node.artifacts();
        let shim_dir = PathBuf::from(var("KATA_TEST_SHIM_DIR"));
        let copy = |from: &Path, to: &Path| {
            std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
            std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        };
        for b in ["containerd-shim-kata-v2", "kata-runtime", "kata-vsock"] {
            copy(&shim_dir.join(b), &a.join("bin").join(b));
        }
        let share = a.join("share/kata-containers");
        copy(Path::new(&var("KATA_TEST_KERNEL")), &share.join("vmlinux"));
        copy(
            Path::new(&var("KATA_TEST_INITRD")),
            &share.join("kata-initrd.img"),
        );
        for s in ["kata-containerd-1.x.toml", "kata-containerd-2.x.toml"] {
            copy(
                &repo().join("deploy/containerd").join(s),
                &share.join("deploy/containerd").join(s),
            );
        }
        let defaults = a.join("share/defaults/kata-containers");
        copy(
            &repo().join("config/configuration.toml"),
            &defaults.join("configuration.toml"),
        );
        copy(
            &repo().join("deploy/configuration-builtin.toml"),
            &defaults.join("configuration-builtin.toml"),
        );
        std::fs::write(node.config(), config).expect("config");
        node
    }

    fn artifacts(&self) -> PathBuf {
        self.dir.path().join("artifacts")
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    fn prefix(&self) -> PathBuf {
        self.dir.path().join("opt/kata")
    }
    fn restarts(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("restarts"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Runs `kata-deploy.sh ACTION` with ENV over the defaults.
    fn run(&self, action: &str, env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new("sh");
        cmd.arg(repo().join("deploy/kata-deploy.sh"))
            .arg(action)
            .env("NODE_NAME", "test-node")
            .env("PREFIX", self.prefix())
            .env("HOST_ROOT", "/")
            .env("ARTIFACTS", self.artifacts())
            .env("CONTAINERD_CONFIG", self.config())
            .env(
                "CONTAINERD_RESTART",
                format!(
                    "echo restarted >>{}",
                    self.dir.path().join("restarts").display()
                ),
            )
            // No API server here: labelling is the cluster test's.
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("running kata-deploy.sh")
    }

    fn install(&self) -> Output {
        let out = self.run("install", &[]);
        assert!(out.status.success(), "install failed: {}", stderr(&out));
        out
    }
}

/// containerd `version`'s view of `config` with its imports merged.
fn dump(version: &str, config: &Path) -> String {
    let out = Command::new(containerd_bin_dir(version).join("containerd"))
        .args(["--config"])
        .arg(config)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump");
    assert!(
        out.status.success(),
        "containerd {version} config dump: {}",
        stderr(&out)
    );
    stdout(&out)
}

fn install_and_uninstall(version: &str, config_version: u32, cri_runtime_plugin: &str) {
    // Without its last newline: put back without it too.
    let config = format!(
        "# the node's own\nversion = {config_version}\n\n[plugins.\"{cri_runtime_plugin}\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\""
    );
    let node = Node::new(&config);
    let prefix = node.prefix();
    let p = prefix.display().to_string();

    let out = node.install();
    assert_eq!(node.restarts(), 1, "one restart for the install");
    let text = std::fs::read_to_string(node.config()).expect("config");
    if config_version == 2 {
        // containerd 1.x would let an imported CRI section replace the file's whole one.
        assert!(text.starts_with(&config), "{text}");
        assert!(!text.contains("imports"), "{text}");
    } else {
        assert!(
            text.contains(&format!("imports = [\"{p}/containerd/kata-deploy.toml\"]")),
            "{text}"
        );
    }
    let merged = dump(version, &node.config());
    let kata = merged
        .split("runtimes.kata]")
        .nth(1)
        .unwrap_or_else(|| panic!("containerd {version} has no kata runtime:\n{merged}"));
    let shim = format!("{p}/bin/containerd-shim-kata-v2");
    assert!(
        kata.contains(&shim),
        "kata's runtime_path is not {shim}:\n{merged}"
    );
    // No options table: each shim finds its file among the prefix's defaults by its name.
    let conf = format!("{p}/share/defaults/kata-containers/configuration.toml");
    assert!(!merged.contains("ConfigPath"), "{merged}");
    let builtin = merged
        .split("runtimes.kata-builtin]")
        .nth(1)
        .unwrap_or_else(|| panic!("containerd {version} has no kata-builtin runtime:\n{merged}"));
    let builtin_shim = format!("{p}/bin/containerd-shim-kata-builtin-v2");
    assert!(
        builtin.contains(&builtin_shim) && builtin.contains("io.containerd.kata-builtin.v2"),
        "kata-builtin's runtime_path is not {builtin_shim}:\n{merged}"
    );
    assert_eq!(
        std::fs::read_link(&builtin_shim).ok(),
        Some("containerd-shim-kata-v2".into()),
        "{builtin_shim} is not a link to the shim"
    );
    assert!(merged.contains("runtimes.runc]"), "runc is gone:\n{merged}");

    // The runtime reads the configuration drop-in with the paths under the prefix.
    let env = Command::new(prefix.join("bin/kata-runtime"))
        .args(["env", "--config", &conf])
        .output()
        .expect("kata-runtime env");
    let env = stdout(&env);
    let kernel = env
        .lines()
        .find(|l| l.starts_with("\"hypervisor.qemu.kernel\""))
        .unwrap_or_default();
    assert!(
        kernel.contains(&format!("{p}/share/kata-containers/vmlinux"))
            && kernel.contains("config.d/10-kata-deploy.toml"),
        "{kernel}"
    );

    // Again: nothing changes, nothing restarts.
    let out2 = node.install();
    assert!(
        stderr(&out2).contains("nothing changed"),
        "{}",
        stderr(&out2)
    );
    assert_eq!(node.restarts(), 1, "a second install restarted containerd");
    drop(out);

    let out = node.run("uninstall", &[]);
    assert!(out.status.success(), "uninstall: {}", stderr(&out));
    assert_eq!(node.restarts(), 2, "one restart for the uninstall");
    assert_eq!(
        std::fs::read_to_string(node.config()).expect("config"),
        config,
        "the configuration is not as before"
    );
    assert!(!prefix.exists(), "{p} is left");
}

#[test]
fn containerd_1_7_config_version_2() {
    install_and_uninstall("1.7", 2, "io.containerd.grpc.v1.cri");
}

#[test]
fn containerd_2_1_config_version_3() {
    install_and_uninstall("2.1", 3, "io.containerd.cri.v1.runtime");
}

#[test]
fn containerd_2_3_config_version_4() {
    install_and_uninstall("2.3", 4, "io.containerd.cri.v1.runtime");
}

#[test]
fn an_existing_imports_line_is_kept_and_put_back() {
    let config = "version = 4\nimports = [\"/etc/containerd/other.toml\"]\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
    let node = Node::new(config);
    node.install();
    let text = std::fs::read_to_string(node.config()).expect("config");
    let line = text.lines().nth(1).unwrap_or_default();
    assert!(
        line.starts_with(&format!(
            "imports = [\"{}/containerd/kata-deploy.toml\", \"/etc/containerd/other.toml\"]",
            node.prefix().display()
        )),
        "{text}"
    );
    assert_eq!(text.matches("imports").count(), 1, "{text}");
    let out = node.run("uninstall", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(node.config()).expect("config"),
        config
    );
    assert!(!node.prefix().exists());
}

/// Variables set for one run of the installer.
type Env<'a> = &'a [(&'a str, &'a str)];

/// Each node the installer cannot serve: refused with MESSAGE, nothing written.
#[test]
fn a_node_it_cannot_serve_is_refused_and_left_untouched() {
    let good = "version = 3\n";
    let cases: &[(&str, &str, Env)] = &[
        ("root = \"/x\"\n", "no 'version = N' line", &[]),
        ("version = 7\n", "config version 7", &[]),
        (
            "version = 3\nimports = [\n  \"/a.toml\",\n]\n",
            "spanning several lines",
            &[],
        ),
        (
            good,
            "hypervisor.qemu.accelerator",
            &[(
                "RUNTIME_CONFIG",
                "[hypervisor.qemu]\naccelerator = \"fast\"",
            )],
        ),
        (
            good,
            "unknown field `no_such_key`",
            &[("RUNTIME_CONFIG", "no_such_key = 1")],
        ),
        (
            good,
            "CONTAINERD_FLAVOUR",
            &[("CONTAINERD_FLAVOUR", "docker")],
        ),
    ];
    for (config, message, env) in cases {
        let node = Node::new(config);
        let out = node.run("install", env);
        assert!(!out.status.success(), "{message}: install succeeded");
        assert!(
            stderr(&out).contains(message),
            "expected '{message}' in: {}",
            stderr(&out)
        );
        assert_eq!(
            std::fs::read_to_string(node.config()).expect("config"),
            *config,
            "{message}: the configuration changed"
        );
        assert!(!node.prefix().exists(), "{message}: the prefix was written");
        assert_eq!(node.restarts(), 0, "{message}: containerd restarted");
    }
}

#[test]
fn a_node_without_qemu_is_refused() {
    let node = Node::new("version = 3\n");
    // The node's root: a containerd configuration, no QEMU.
    let host = node.dir.path().join("host");
    for d in ["proc", "etc/containerd", "usr/bin"] {
        std::fs::create_dir_all(host.join(d)).expect("mkdir");
    }
    std::fs::write(host.join("etc/containerd/config.toml"), "version = 3\n").expect("config");
    let out = node.run(
        "install",
        &[
            ("HOST_ROOT", &host.display().to_string()),
            ("CONTAINERD_CONFIG", "/etc/containerd/config.toml"),
            ("PREFIX", "/opt/kata"),
        ],
    );
    assert!(!out.status.success(), "install succeeded");
    assert!(
        stderr(&out).contains("no /usr/bin/qemu-system-x86_64"),
        "{}",
        stderr(&out)
    );
    assert!(!host.join("opt").exists(), "the prefix was written");
    assert_eq!(node.restarts(), 0);
}

/// A new image over an installed node (`helm upgrade`): changed files replaced, files the
/// new payload lacks removed, containerd not restarted (its configuration is the same).
#[test]
fn a_new_payload_replaces_files_without_a_restart() {
    let node = Node::new("version = 4\n");
    node.install();
    let a = node.artifacts();
    let builtin = "share/defaults/kata-containers/configuration-builtin.toml";
    let mut text = std::fs::read_to_string(a.join(builtin)).expect("read");
    text.push_str("# a newer release\n");
    std::fs::write(a.join(builtin), &text).expect("write");
    let gone = "share/kata-containers/deploy/containerd/kata-containerd-1.x.toml";
    std::fs::remove_file(a.join(gone)).expect("rm");

    let out = node.install();
    assert!(
        stderr(&out).contains("updated the files"),
        "{}",
        stderr(&out)
    );
    assert_eq!(node.restarts(), 1, "the upgrade restarted containerd");
    assert_eq!(
        std::fs::read_to_string(node.prefix().join(builtin)).expect("read"),
        text
    );
    assert!(!node.prefix().join(gone).exists(), "{gone} is left");

    let out = node.run("uninstall", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!node.prefix().exists());
}
