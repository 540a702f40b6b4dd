//! Containment of a sandbox's host processes (issue 29): a guest that breaks out of its VM
//! into QEMU or kata-vsock holds an unprivileged uid of its sandbox's own, with no
//! capabilities, no way to gain any, a seccomp filter, and (kata-vsock) no network; the
//! virtiofsd that serves its files keeps its namespace sandbox and seccomp and loses the
//! capability to open files by handle. Read from outside, through `/proc`, of two
//! sandboxes running at once, through a real containerd.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_tests::*;

/// CAP_DAC_READ_SEARCH's bit: what opens files by handle (`open_by_handle_at`).
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
/// QEMU's seccomp sandbox as the shim passes it.
const QEMU_SANDBOX: &str =
    "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// One thread's `/proc/<pid>/task/<tid>/status`.
#[derive(Debug)]
struct ThreadStatus {
    tid: String,
    name: String,
    /// Real, effective, saved and file system ids.
    uids: Vec<u32>,
    gids: Vec<u32>,
    groups: String,
    cap_eff: u64,
    cap_prm: u64,
    cap_bnd: u64,
    no_new_privs: String,
    seccomp: String,
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
}

fn ids(status: &str, name: &str) -> Vec<u32> {
    field(status, name)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn caps(status: &str, name: &str) -> u64 {
    u64::from_str_radix(field(status, name), 16).unwrap()
}

/// Every thread of `pid`.
fn threads(pid: i32) -> Vec<ThreadStatus> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
    {
        // A thread may end between the listing and the read.
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        out.push(ThreadStatus {
            tid: entry.file_name().to_string_lossy().into_owned(),
            name: field(&status, "Name").to_string(),
            uids: ids(&status, "Uid"),
            gids: ids(&status, "Gid"),
            groups: field(&status, "Groups").to_string(),
            cap_eff: caps(&status, "CapEff"),
            cap_prm: caps(&status, "CapPrm"),
            cap_bnd: caps(&status, "CapBnd"),
            no_new_privs: field(&status, "NoNewPrivs").to_string(),
            seccomp: field(&status, "Seccomp").to_string(),
        });
    }
    assert!(!out.is_empty(), "{pid} has no threads");
    out
}

/// Checks every thread of `pid` (`what` of sandbox `id`) runs confined; returns its uid.
fn assert_confined(id: &str, what: &str, pid: i32) -> u32 {
    let all = threads(pid);
    let uid = all[0].uids[0];
    let mut wrong = Vec::new();
    for t in &all {
        let confined = uid != 0
            && t.uids.iter().all(|&u| u == uid)
            && t.gids.iter().all(|&g| g == uid)
            && t.groups.is_empty()
            && t.cap_eff == 0
            && t.cap_prm == 0
            && t.cap_bnd == 0
            && t.no_new_privs == "1";
        if !confined {
            wrong.push(format!("{t:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{id}: threads of {what} ({pid}) not confined to one unprivileged uid:\n{}",
        wrong.join("\n")
    );
    // Seccomp separately: kata-vsock's filter is another part of issue 29.
    let unfiltered: Vec<String> = all
        .iter()
        .filter(|t| t.seccomp != "2")
        .map(|t| format!("{} ({}): Seccomp {}", t.tid, t.name, t.seccomp))
        .collect();
    assert!(
        unfiltered.is_empty(),
        "{id}: threads of {what} ({pid}) without a seccomp filter:\n{}",
        unfiltered.join("\n")
    );
    uid
}

/// `pid` sees a minimal root of its own: no host configuration, no home directories, no
/// other sandbox's files; a `/dev` of a few nodes.
fn assert_minimal_root(id: &str, what: &str, pid: i32) {
    assert_ne!(
        namespace(&pid.to_string(), "mnt"),
        namespace("self", "mnt"),
        "{id}: {what} shares the host's mount namespace"
    );
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    for hidden in [
        "etc/passwd",
        "etc/shadow",
        "root",
        "home",
        "var",
        "sys",
        "run/vc/sbs",
    ] {
        assert!(
            !root.join(hidden).exists(),
            "{id}: {what} ({pid}) sees the host's /{hidden}"
        );
    }
    let mut dev: Vec<String> = std::fs::read_dir(root.join("dev"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dev.sort();
    assert!(
        dev.iter().all(
            |d| ["full", "null", "random", "urandom", "zero", "kvm", "net"].contains(&d.as_str())
        ),
        "{id}: {what}'s /dev holds {dev:?}"
    );
    let run_dir = vm_run_dir(id);
    let inside = root.join(run_dir.strip_prefix("/").unwrap());
    assert!(
        inside.join("qmp.sock").exists() || inside.join("kata.hvsock").exists(),
        "{id}: {what} does not see its run directory {}",
        run_dir.display()
    );
}

fn namespace(pid: &str, ns: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap()
}

/// The processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if field(&status, "PPid") == pid.to_string() {
            out.push(child);
        }
    }
    out
}

/// virtiofsd's serving process (the child `--sandbox namespace` forks, or virtiofsd
/// itself): seccomp, no new privileges, no CAP_DAC_READ_SEARCH, its own mount and
/// network namespaces.
fn assert_virtiofsd_sandboxed(id: &str, pid: i32) {
    let serving = children(pid).first().copied().unwrap_or(pid);
    for t in threads(serving) {
        assert_eq!(t.seccomp, "2", "{id}: virtiofsd {serving} {t:?}");
        assert_eq!(t.no_new_privs, "1", "{id}: virtiofsd {serving} {t:?}");
        assert_eq!(
            t.cap_eff & CAP_DAC_READ_SEARCH,
            0,
            "{id}: virtiofsd {serving} may open files by handle: {t:?}"
        );
    }
    for ns in ["mnt", "net"] {
        assert_ne!(
            namespace(&serving.to_string(), ns),
            namespace("self", ns),
            "{id}: virtiofsd {serving} shares the host's {ns} namespace"
        );
    }
}

/// One QMP exchange on a connection: sends `command`, returns the first reply (events
/// skipped).
fn qmp(conn: &mut BufReader<UnixStream>, command: &str) -> String {
    conn.get_mut()
        .write_all(format!("{command}\n").as_bytes())
        .unwrap();
    loop {
        let mut line = String::new();
        let n = conn.read_line(&mut line).unwrap();
        assert!(n > 0, "QMP closed the connection after {command}");
        if line.contains("\"return\"") || line.contains("\"error\"") {
            return line;
        }
    }
}

/// A QMP `migrate` to `exec:` asks QEMU to run a shell command: nothing may run. (Our
/// VMs' vhost-user devices block migration before QEMU would spawn; the bridge helper
/// below reaches the spawn itself.)
fn assert_migrate_to_exec_spawns_nothing(id: &str, run_dir: &Path) {
    let marker = PathBuf::from(format!("/tmp/containment-{id}-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let mut conn = qmp_connect(run_dir);
    let migrate = qmp(
        &mut conn,
        &format!(
            r#"{{"execute":"migrate","arguments":{{"uri":"exec:touch {}"}}}}"#,
            marker.display()
        ),
    );
    // Either the command fails at once, or the migration does; nothing ran either way.
    let status = if migrate.contains("\"error\"") {
        migrate.clone()
    } else {
        poll(Duration::from_secs(60), Duration::from_millis(200), || {
            let s = qmp(&mut conn, r#"{"execute":"query-migrate"}"#);
            (s.contains("failed") || s.contains("completed")).then_some(s)
        })
        .unwrap_or_else(|| panic!("{id}: the migration neither failed nor completed"))
    };
    eprintln!(
        "{id}: migrate to exec: {}; then {}",
        migrate.trim(),
        status.trim()
    );
    assert!(
        !status.contains("completed"),
        "{id}: QEMU migrated to a command: {status}"
    );
    assert!(
        !marker.exists(),
        "{id}: QEMU ran the migration's command: {} exists",
        marker.display()
    );
}

/// QEMU's bridge helper is a command QEMU forks and runs on request (`netdev_add` of a
/// `bridge`; a helper with a space runs through `sh -c`), as unsandboxed QEMU does:
/// refused with spawn=deny, and QEMU runs on.
fn assert_bridge_helper_spawns_nothing(id: &str, run_dir: &Path, vmm: i32) {
    let marker = PathBuf::from(format!(
        "/tmp/containment-helper-{id}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&marker);
    let mut conn = qmp_connect(run_dir);
    let reply = qmp(
        &mut conn,
        &format!(
            r#"{{"execute":"netdev_add","arguments":{{"type":"bridge","id":"escape","br":"br0","helper":"/usr/bin/touch {} #"}}}}"#,
            marker.display()
        ),
    );
    eprintln!("{id}: netdev_add with a bridge helper: {}", reply.trim());
    assert!(reply.contains("\"error\""), "{id}: {reply}");
    assert!(
        !marker.exists(),
        "{id}: QEMU ran its bridge helper: {} exists",
        marker.display()
    );
    assert!(alive(vmm), "{id}: QEMU died refusing to spawn");
}

/// A QMP connection past capabilities negotiation.
fn qmp_connect(run_dir: &Path) -> BufReader<UnixStream> {
    let stream = UnixStream::connect(run_dir.join("qmp.sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut conn = BufReader::new(stream);
    let mut greeting = String::new();
    conn.read_line(&mut greeting).unwrap();
    assert!(greeting.contains("\"QMP\""), "{greeting}");
    let caps = qmp(&mut conn, r#"{"execute":"qmp_capabilities"}"#);
    assert!(caps.contains("\"return\""), "{caps}");
    conn
}

#[test]
fn two_sandboxes_run_as_unprivileged_uids_of_their_own() {
    let names = ["contain-a", "contain-b"];
    let _cleanup = names.map(SandboxCleanup::new);
    let c = Containerd::start("containment");
    for id in names {
        start_detached(&c, id, &[], &["sleep", "600"]);
    }
    let mut uids = Vec::new();
    for id in names {
        let pids = persisted_pids(id).unwrap_or_else(|| panic!("{id}: no persist.json"));
        let vmm = pids.vmm_pid;
        let vmm_uid = assert_confined(id, "the VMM", vmm);
        let cmdline = std::fs::read(format!("/proc/{vmm}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains(QEMU_SANDBOX),
            "{id}: QEMU without its seccomp sandbox: {cmdline}"
        );
        assert!(cmdline.contains("dump-guest-core=off"), "{cmdline}");
        assert_minimal_root(id, "the VMM", vmm);

        let vsock =
            pid_of(id, Part::VsockBackend).unwrap_or_else(|| panic!("{id}: no kata-vsock running"));
        assert!(pids.helper_pids.contains(&vsock), "{id}: {pids:?}");
        let vsock_uid = assert_confined(id, "kata-vsock", vsock);
        assert_eq!(vsock_uid, vmm_uid, "{id}: one uid per sandbox");
        assert_minimal_root(id, "kata-vsock", vsock);
        for ns in ["net", "mnt"] {
            assert_ne!(
                namespace(&vsock.to_string(), ns),
                namespace("self", ns),
                "{id}: kata-vsock shares the host's {ns} namespace"
            );
        }
        let links = std::fs::read_to_string(format!("/proc/{vsock}/net/dev")).unwrap();
        let links: Vec<&str> = links
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(str::trim)
            .collect();
        assert_eq!(links, ["lo"], "{id}: kata-vsock's network");

        let run_dir = vm_run_dir(id);
        let meta = std::fs::metadata(&run_dir).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.gid()),
            (0o700, vmm_uid, vmm_uid),
            "{id}: {}",
            run_dir.display()
        );
        for virtiofsd in [Part::Virtiofsd, Part::RootfsVirtiofsd] {
            if let Some(pid) = pid_of(id, virtiofsd) {
                assert_virtiofsd_sandboxed(id, pid);
            }
        }
        uids.push(vmm_uid);
    }
    assert_ne!(uids[0], uids[1], "two sandboxes share a uid");

    let run_dir = vm_run_dir(names[0]);
    assert_migrate_to_exec_spawns_nothing(names[0], &run_dir);
    let vmm = persisted_pids(names[0]).unwrap().vmm_pid;
    assert_bridge_helper_spawns_nothing(names[0], &run_dir, vmm);
    // The sandbox still serves its container.
    let out = exec(&c, names[0], "after-qmp", &[], &["echo", "alive"]);
    assert_eq!(stdout(&out), "alive\n", "{}", stderr(&out));

    for (id, uid) in names.iter().zip(&uids) {
        remove_detached(&c, id);
        assert_no_leftovers(id);
        assert!(
            !Path::new(&format!("/run/vc/ids/{uid}")).exists(),
            "{id}: uid {uid} is still claimed after the sandbox's end"
        );
    }
}
