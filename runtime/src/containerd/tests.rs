use super::*;
use crate::report::Status;

fn parse(text: &str) -> toml::Table {
    toml::from_str(text).unwrap()
}

fn containerd(version: &str, entries: Result<Vec<RuntimeEntry>, String>) -> Containerd {
    Containerd {
        binary: Some(PathBuf::from("/usr/bin/containerd")),
        version: Ok(version.into()),
        config: PathBuf::from(DEFAULT_CONFIG),
        entries,
        config_version: Some(2),
    }
}

#[test]
fn the_v2_deploy_snippet_declares_kata_and_kata_builtin() {
    let doc = parse(&format!("version = 2\n{SNIPPET_V2}"));
    assert_eq!(config_version(&doc), 2);
    let entries = kata_runtimes(&doc);
    assert_eq!(
        entries,
        vec![
            // No options table (containerd 2.3+ cannot create user-namespaced
            // containers through one): the runtime type names the shim, whose name picks
            // the configuration file.
            RuntimeEntry {
                name: "kata".into(),
                config_path: None,
                shim: "containerd-shim-kata-v2".into(),
                runtime_path: None,
            },
            RuntimeEntry {
                name: "kata-builtin".into(),
                config_path: None,
                shim: "containerd-shim-kata-builtin-v2".into(),
                runtime_path: None,
            },
        ]
    );
    assert!(
        SNIPPET_V2.contains(r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]"#)
    );
    assert!(!SNIPPET_V2.contains(".options]") && !SNIPPET_V3.contains(".options]"));
    assert_eq!(
        kata_config::file_name_for_shim(&entries[1].shim),
        "configuration-builtin.toml"
    );
}

#[test]
fn only_our_runtime_types_are_ours() {
    assert_eq!(
        kata_shim_of("io.containerd.kata.v2").as_deref(),
        Some("containerd-shim-kata-v2")
    );
    assert_eq!(
        kata_shim_of("io.containerd.kata-qemu.v2").as_deref(),
        Some("containerd-shim-kata-qemu-v2")
    );
    for other in [
        "io.containerd.runc.v2",
        "io.containerd.kata.v1",
        "io.containerd.katana.v2",
        "kata",
    ] {
        assert_eq!(kata_shim_of(other), None, "{other}");
    }
}

#[test]
fn the_v3_deploy_snippet_uses_the_containerd_2_plugin() {
    let doc = parse(&format!("version = 3\n{SNIPPET_V3}"));
    let names: Vec<String> = kata_runtimes(&doc).into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["kata", "kata-builtin"]);
    assert!(
        SNIPPET_V3.contains(r#"[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata]"#)
    );
    assert!(!SNIPPET_V3.contains("grpc.v1.cri"));
}

/// containerd 2.3 and later write configuration version 4 (their listeners became
/// plugins); the CRI's runtime tables are those of version 3, so the 2.x snippet serves both.
#[test]
fn the_v3_deploy_snippet_serves_configuration_version_4() {
    let doc = parse(&format!("version = 4\n{SNIPPET_V3}"));
    assert_eq!(config_version(&doc), 4);
    let names: Vec<String> = kata_runtimes(&doc).into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["kata", "kata-builtin"]);
    let mut c = containerd("2.3.7", Ok(Vec::new()));
    assert_eq!(c.snippet(), SNIPPET_V3);
    c.version = Err("containerd is not in PATH".into());
    c.config_version = Some(4);
    assert_eq!(c.snippet(), SNIPPET_V3);
    c.config_version = Some(2);
    assert_eq!(c.snippet(), SNIPPET_V2);
}

#[test]
fn runc_only_and_other_runtime_types_are_not_kata() {
    let doc = parse(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-old]
  runtime_type = "io.containerd.kata.v1"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gvisor]
  runtime_type = "io.containerd.runsc.v1"
"#,
    );
    assert!(kata_runtimes(&doc).is_empty());
    assert!(kata_runtimes(&toml::Table::new()).is_empty());
}

#[test]
fn version_1_files_and_empty_config_paths_are_understood() {
    let doc = parse(
        r#"
[plugins.cri.containerd.runtimes.kata]
  runtime_type = "io.containerd.kata.v2"
  [plugins.cri.containerd.runtimes.kata.options]
    ConfigPath = ""
"#,
    );
    assert_eq!(config_version(&doc), 1);
    assert_eq!(
        kata_runtimes(&doc),
        vec![RuntimeEntry {
            name: "kata".into(),
            config_path: None,
            shim: "containerd-shim-kata-v2".into(),
            runtime_path: None,
        }]
    );
}

#[test]
fn versions_from_debian_and_upstream_builds() {
    assert_eq!(
        parse_version(
            "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n"
        )
        .as_deref(),
        Some("1.6.20~ds1")
    );
    assert_eq!(
        parse_version("containerd github.com/containerd/containerd/v2 v2.1.9 abc\n").as_deref(),
        Some("2.1.9")
    );
    assert_eq!(parse_version("containerd: unknown flag"), None);
    assert_eq!(parse_version(""), None);
}

#[test]
fn a_missing_entry_fails_with_the_snippet_for_this_containerd() {
    let lines = containerd("1.6.20~ds1", Ok(Vec::new())).lines(Some(Path::new("/usr/local/bin/x")));
    let entry = &lines[2];
    assert_eq!(entry.requirement, "containerd runtime");
    assert_eq!(entry.status, Status::Fail);
    let fix = entry.fix.as_deref().unwrap();
    assert!(
        fix.contains(r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]"#),
        "{fix}"
    );
    assert!(fix.contains("kata-containerd-1.x.toml"), "{fix}");
    assert!(!fix.contains("# "), "comments are left out: {fix}");

    let lines = containerd("2.1.9", Ok(Vec::new())).lines(None);
    assert_eq!(lines[1].status, Status::Fail, "no shim in PATH");
    assert!(lines[2]
        .fix
        .as_deref()
        .unwrap()
        .contains("io.containerd.cri.v1.runtime"));
}

#[test]
fn entries_with_a_loadable_config_path_pass_and_broken_ones_fail() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("configuration.toml");
    std::fs::write(&good, "[runtime]\nhypervisor_name = \"builtin\"\n").unwrap();
    let ok = containerd(
        "1.7.24",
        Ok(vec![RuntimeEntry {
            name: "kata".into(),
            config_path: Some(good.display().to_string()),
            shim: "containerd-shim-kata-v2".into(),
            runtime_path: None,
        }]),
    )
    .lines(Some(Path::new("/usr/local/bin/containerd-shim-kata-v2")));
    assert!(ok.iter().all(|l| l.status == Status::Ok), "{ok:?}");
    assert!(
        ok[2].detail.starts_with("kata (ConfigPath "),
        "{}",
        ok[2].detail
    );

    let missing = dir.path().join("missing.toml");
    let bad = containerd(
        "1.7.24",
        Ok(vec![RuntimeEntry {
            name: "kata-builtin".into(),
            config_path: Some(missing.display().to_string()),
            shim: "containerd-shim-kata-builtin-v2".into(),
            runtime_path: None,
        }]),
    )
    .lines(None);
    assert_eq!(bad[2].status, Status::Fail);
    assert!(
        bad[2].detail.contains("runtime kata-builtin"),
        "{}",
        bad[2].detail
    );
    assert!(bad[2].detail.contains("missing.toml"), "{}", bad[2].detail);
}

#[test]
fn an_unreadable_configuration_fails_with_the_reason() {
    let c = containerd(
        "1.6.20",
        Err("containerd cannot load /etc/containerd/config.toml: x".into()),
    );
    let line = &c.lines(None)[2];
    assert_eq!(line.status, Status::Fail);
    assert!(line.detail.contains("cannot load"), "{}", line.detail);
}

#[test]
fn inspect_reads_a_file_that_does_not_exist_as_no_entries() {
    let c = Containerd::inspect(Path::new("/nonexistent/containerd.toml"));
    let err = c.entries.unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn the_runtime_classes_name_the_deploy_runtimes_and_set_an_overhead() {
    let yaml = include_str!("../../../deploy/kubernetes/runtimeclass.yaml");
    let handlers: Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.strip_prefix("handler: "))
        .collect();
    for snippet in [SNIPPET_V2, SNIPPET_V3] {
        let doc = parse(snippet);
        let names: Vec<String> = kata_runtimes(&doc).into_iter().map(|e| e.name).collect();
        assert_eq!(names, handlers);
    }
    assert_eq!(
        yaml.matches("apiVersion: node.k8s.io/v1").count(),
        handlers.len()
    );
    // Every class carries a memory overhead in MiB (the measured figure the comment cites).
    let overheads = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("memory: \""))
        .filter_map(|v| v.strip_suffix("Mi\""))
        .filter(|n| n.parse::<u32>().is_ok_and(|n| n > 0))
        .count();
    assert_eq!(overheads, handlers.len());
}
