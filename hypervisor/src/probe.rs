//! Whether this host (and a program's files) allow the containment: one confined run of
//! the program ([`probe`]). Above both `jail` (what the child does) and `process` (how it
//! is started), which do not import each other for it.

use std::path::Path;

use crate::jail::{real_path, Jail, SandboxIds};
use crate::process::{exit_description, log_tail, Daemon, Place, POLL};

/// Runs `program args` confined as a sandbox's process would be (an id of `range`, no
/// capabilities, no new privileges, a private `/dev`, an empty network namespace when
/// `new_netns`) and waits for it to exit 0: whether this host, and the program's files,
/// allow the containment. The id is claimed in a directory of its own, not in
/// [`crate::jail::ID_CLAIMS_DIR`]. Err: what failed, with the program's output.
pub fn probe(
    range: &kata_config::HostProcesses,
    program: &Path,
    args: &[&str],
    new_netns: bool,
) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kata-containment-probe-{}", std::process::id()));
    let result = probe_in(&dir, range, program, args, new_netns);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn probe_in(
    dir: &Path,
    range: &kata_config::HostProcesses,
    program: &Path,
    args: &[&str],
    new_netns: bool,
) -> Result<(), String> {
    let ids = SandboxIds::claim(&dir.join("ids"), range, "probe").map_err(|e| e.to_string())?;
    let log = dir.join("probe.log");
    let program = &real_path(program).map_err(|e| e.to_string())?;
    let daemon = Daemon {
        step: "the containment probe",
        program,
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        log: log.clone(),
        place: Place::default().jailed(Some(
            Jail::new(&ids, &[], new_netns)
                .and_then(|j| j.with_root(program, &[]))
                .map_err(|e| e.to_string())?,
        )),
    };
    let pid = daemon
        .spawn(&crate::discard_logger())
        .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let how = loop {
        if let Some(how) = exit_description(pid) {
            break how;
        }
        if std::time::Instant::now() >= deadline {
            crate::kill_and_reap(&[pid], std::time::Duration::ZERO);
            break "did not exit within 10 s".to_string();
        }
        std::thread::sleep(POLL);
    };
    let result = if how == "exited with status 0" {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?} as uid {} {how}: {}",
            program.display(),
            ids.uid,
            log_tail(&log)
        ))
    };
    ids.release();
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::jail::ids::tests::range;
    use crate::jail::own_run_dir;

    /// The fields of `/proc/<pid>/status` a confined process must show.
    fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .trim()
    }

    #[test]
    fn a_jailed_daemon_runs_as_the_sandbox_without_privileges_devices_or_network() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            crate::test_skip::skipped("needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let claims = dir.path().join("ids");
        let ids = SandboxIds::claim(&claims, &range(0x7200_0000, 4), "jailed").unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        own_run_dir(&run, &ids).unwrap();
        let out = run.join("out");
        let script = format!(
            "cat /proc/self/status; echo devices: $(ls /dev); echo links: $(tail -n +3 /proc/self/net/dev | cut -d: -f1); \
             touch /etc/h2-jail-test 2>/dev/null && echo wrote-etc; \
             echo x > /dev/null && echo devnull-ok; touch {}/made && echo made; \
             echo root: $(ls /); echo etc: $(ls /etc); test -e /proc/1/status && echo sees-init",
            run.display()
        );
        let daemon = crate::process::Daemon {
            step: "sh",
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), script],
            env: Vec::new(),
            log: out.clone(),
            place: crate::process::Place::default().jailed(Some(
                Jail::new(&ids, &[], true)
                    .unwrap()
                    .with_root(Path::new("/bin/sh"), &[&run])
                    .unwrap(),
            )),
        };
        let pid = daemon.spawn(&crate::discard_logger()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while procinfo::pid::exit_description(pid).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the jailed shell hangs"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        crate::bounded_log::settle(&out);
        let text = std::fs::read_to_string(&out).unwrap();
        let uid = ids.uid.to_string();
        assert_eq!(
            status_field(&text, "Uid")
                .split_whitespace()
                .collect::<Vec<_>>(),
            [uid.as_str(); 4],
            "{text}"
        );
        assert_eq!(
            status_field(&text, "Gid")
                .split_whitespace()
                .collect::<Vec<_>>(),
            [uid.as_str(); 4],
            "{text}"
        );
        assert_eq!(status_field(&text, "Groups"), "", "{text}");
        for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status_field(&text, caps),
                "0000000000000000",
                "{caps}: {text}"
            );
        }
        assert_eq!(status_field(&text, "NoNewPrivs"), "1", "{text}");
        let devices = text.lines().find(|l| l.starts_with("devices:")).unwrap();
        assert_eq!(devices, "devices: full null random urandom zero", "{text}");
        // An empty network namespace: its own loopback only.
        assert!(text.contains("links: lo\n"), "{text}");
        assert!(!text.contains("wrote-etc"), "{text}");
        assert!(
            text.contains("devnull-ok") && text.contains("made"),
            "{text}"
        );
        // The minimal root: /usr and the loader's links, the run directory, /proc, /dev;
        // of /etc only the loader's cache; of /proc only its own uid's processes.
        let root = text.lines().find(|l| l.starts_with("root:")).unwrap();
        for absent in ["home", "root", "var", "sys", "boot"] {
            assert!(!root.split_whitespace().any(|d| d == absent), "{root}");
        }
        let etc = text.lines().find(|l| l.starts_with("etc:")).unwrap();
        assert!(etc == "etc: ld.so.cache" || etc == "etc:", "{etc}");
        assert!(!text.contains("sees-init"), "{text}");
        let made = std::fs::metadata(run.join("made")).unwrap();
        assert_eq!((made.uid(), made.mode() & 0o777), (ids.uid, 0o600));
        let _ = std::fs::remove_file("/etc/h2-jail-test");
        ids.release();
    }
}
