//! What a sandbox holds on the host, seen from outside the shim: its processes (the shim,
//! the VMM and the helpers, told apart by command line), the pids its `persist.json`
//! records, its mounts and directories. The leak checks every case ends with, the faults
//! the reliability tests inject (signals by pid), and the clean-up that runs when a test
//! fails half-way.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Host directories that hold one entry per sandbox.
pub const SANDBOX_ROOTS: [&str; 3] = [
    "/run/vc/sbs",
    "/run/vc/vm",
    "/run/kata-containers/shared/sandboxes",
];

/// Where containerd's shims listen (`/run/containerd/s/<sha256>`).
pub const SHIM_SOCKET_DIR: &str = "/run/containerd/s";

/// The part of a sandbox a host process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// containerd-shim-kata-v2 serving the sandbox.
    Shim,
    /// The VMM (qemu-system-x86_64 or kata-vmm).
    Vmm,
    /// virtiofsd sharing the sandbox's files (the share: volumes, and root filesystems
    /// when there is no rootfs share).
    Virtiofsd,
    /// The second virtiofsd, of the rootfs share (`virtiofsd-rootfs.sock`), which root
    /// filesystems come through when `virtio_fs_rootfs_cache` differs from
    /// `virtio_fs_cache` (the default).
    RootfsVirtiofsd,
    /// kata-vsock, the vhost-user vsock backend.
    VsockBackend,
}

impl Part {
    /// How the part is called in logs and errors.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Part::Shim => &["shim"],
            Part::Vmm => &["VM", "qemu"],
            Part::Virtiofsd | Part::RootfsVirtiofsd => &["virtiofsd"],
            Part::VsockBackend => &["kata-vsock"],
        }
    }
}

/// A host process of a sandbox.
#[derive(Clone, Debug)]
pub struct SandboxProcess {
    pub pid: i32,
    pub part: Part,
    pub cmdline: String,
}

fn cmdline_of(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .collect()
}

/// What `cmdline` is of sandbox `id`, if it is one of its processes.
fn classify(id: &str, cmdline: &str) -> Option<Part> {
    if cmdline.contains("containerd-shim-kata-v2") && cmdline.contains(&format!("-id {id} ")) {
        return Some(Part::Shim);
    }
    if !cmdline.contains(&format!("/run/vc/vm/{id}/")) {
        return None;
    }
    let program = cmdline.split_whitespace().next().unwrap_or("");
    if program.contains("virtiofsd") && cmdline.contains("/virtiofsd-rootfs.sock") {
        Some(Part::RootfsVirtiofsd)
    } else if program.contains("virtiofsd") {
        Some(Part::Virtiofsd)
    } else if program.contains("kata-vsock") {
        Some(Part::VsockBackend)
    } else if program.contains("qemu-system") || program.contains("kata-vmm") {
        Some(Part::Vmm)
    } else {
        None
    }
}

/// The live host processes of sandbox `id`, found by their command lines (those of a
/// VM from the pool name the pooled VM's id, which its `persist.json` records).
pub fn sandbox_processes(id: &str) -> Vec<SandboxProcess> {
    let vm = crate::pooled_vm_of(id);
    all_pids()
        .into_iter()
        .filter_map(|pid| {
            let cmdline = cmdline_of(pid)?;
            let part = classify(id, &cmdline).or_else(|| {
                let vm = vm.as_deref()?;
                classify(vm, &cmdline).filter(|p| *p != Part::Shim)
            })?;
            Some(SandboxProcess { pid, part, cmdline })
        })
        .collect()
}

/// The pids `/run/vc/sbs/<id>/persist.json` records.
#[derive(Clone, Debug, Default)]
pub struct PersistedPids {
    pub shim_pid: i32,
    pub vmm_pid: i32,
    pub helper_pids: Vec<i32>,
}

/// The pids the shim recorded for sandbox `id`, once the file exists.
pub fn persisted_pids(id: &str) -> Option<PersistedPids> {
    let text = std::fs::read(format!("/run/vc/sbs/{id}/persist.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let int = |v: &serde_json::Value| v.as_i64().unwrap_or(0) as i32;
    Some(PersistedPids {
        shim_pid: int(&v["shim_pid"]),
        vmm_pid: int(&v["vmm_pid"]),
        helper_pids: v["helper_pids"]
            .as_array()
            .map(|a| a.iter().map(int).collect())
            .unwrap_or_default(),
    })
}

/// The pid of `part` of sandbox `id`: the one `persist.json` records (the shim watches
/// that one), else the oldest process of that part.
pub fn pid_of(id: &str, part: Part) -> Option<i32> {
    let procs = sandbox_processes(id);
    let recorded = persisted_pids(id).unwrap_or_default();
    let mut candidates: Vec<i32> = procs
        .iter()
        .filter(|p| p.part == part)
        .map(|p| p.pid)
        .collect();
    candidates.sort_unstable();
    let wanted = match part {
        Part::Shim => vec![recorded.shim_pid],
        Part::Vmm => vec![recorded.vmm_pid],
        Part::Virtiofsd | Part::RootfsVirtiofsd | Part::VsockBackend => recorded.helper_pids,
    };
    candidates
        .iter()
        .copied()
        .find(|pid| wanted.contains(pid))
        .or_else(|| candidates.first().copied())
}

/// Sends `signal` to `pid`; false if there is no such process.
pub fn signal(pid: i32, signal: Signal) -> bool {
    kill(Pid::from_raw(pid), signal).is_ok()
}

/// Whether `pid` is alive (a zombie counts as gone: it runs nothing).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
            state != Some('Z') && state != Some('X')
        }
        Err(_) => false,
    }
}

/// Polls `f` every `every` until it gives a value or `limit` has passed.
pub fn poll<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits up to `limit` for `pid` to end; false if it is still alive.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    poll(limit, Duration::from_millis(20), || {
        (!alive(pid)).then_some(())
    })
    .is_some()
}

/// Mount points in `/proc/self/mountinfo` (field 5), with the kernel's octal escapes undone.
pub fn mount_points() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| {
            p.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\")
        })
        .collect()
}

/// What is left on the host of sandbox `id`: processes, mounts, directories.
pub fn leftovers(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let markers = [
        format!("/run/vc/vm/{id}/"),
        format!("sandbox-{id} "),
        format!("/sandboxes/{id}/"),
    ];
    for pid in all_pids() {
        let Some(cmdline) = cmdline_of(pid) else {
            continue;
        };
        let shim =
            cmdline.contains("containerd-shim-kata-v2") && cmdline.contains(&format!("-id {id} "));
        if shim || markers.iter().any(|m| cmdline.contains(m.as_str())) {
            found.push(format!("process {pid}: {cmdline}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        if line.contains(&format!("/sandboxes/{id}/"))
            || line.contains(&format!("/sandboxes/{id} "))
        {
            found.push(format!("mount: {line}"));
        }
    }
    for root in SANDBOX_ROOTS {
        let d = format!("{root}/{id}");
        if Path::new(&d).exists() {
            found.push(format!("directory {d}"));
        }
    }
    found
}

/// The uid claims (`/run/vc/ids`, each file holding its sandbox's id) of sandbox `id`.
pub fn uid_claims_of(id: &str) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir("/run/vc/ids") else {
        return Vec::new();
    };
    dir.flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|owner| owner == id))
        .collect()
}

/// The directories of cgroup `path` (a `linux.cgroupsPath` such as `/default/ID`) that
/// exist in the host's hierarchies (v1 controllers and the unified one).
pub fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Vec::new();
    }
    let root = Path::new("/sys/fs/cgroup");
    let mut roots = vec![root.to_path_buf()];
    if let Ok(dir) = std::fs::read_dir(root) {
        roots.extend(dir.flatten().map(|e| e.path()));
    }
    roots
        .into_iter()
        .map(|r| r.join(rel))
        .filter(|d| d.is_dir())
        .collect()
}

/// Waits (up to 15 s) until nothing of sandbox `id` is left: [`leftovers`], its uid
/// claims, and the directories of its cgroup `cgroups_path` (when it had one).
pub fn assert_nothing_left(id: &str, cgroups_path: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left = leftovers(id);
        left.extend(
            uid_claims_of(id)
                .iter()
                .map(|c| format!("uid claim {}", c.display())),
        );
        left.extend(
            cgroup_dirs(cgroups_path.unwrap_or(""))
                .iter()
                .map(|d| format!("cgroup {}", d.display())),
        );
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("sandbox {id} left behind:\n{}", left.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to 15 s, for the shim's own shutdown) until nothing of sandbox `id` is left.
pub fn assert_no_leftovers(id: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = leftovers(id);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("sandbox {id} left behind:\n{}", left.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes whatever sandbox `id` left on the host when dropped: a test that failed half-way
/// (or a shim that leaked) must not leave processes, mounts or directories to the next
/// test. Declare it before the [`crate::Containerd`], so that containerd (and the shim's
/// own clean-up) goes first.
pub struct SandboxCleanup {
    id: String,
}

impl SandboxCleanup {
    pub fn new(id: &str) -> Self {
        SandboxCleanup { id: id.to_string() }
    }
}

impl Drop for SandboxCleanup {
    fn drop(&mut self) {
        let id = &self.id;
        for p in sandbox_processes(id) {
            // A process a fault test froze would not act on anything but SIGKILL anyway.
            signal(p.pid, Signal::SIGKILL);
            let _ = wait_gone(p.pid, Duration::from_secs(5));
        }
        let mut mounts: Vec<String> = mount_points()
            .into_iter()
            .filter(|m| {
                SANDBOX_ROOTS
                    .iter()
                    .any(|r| m.starts_with(&format!("{r}/{id}/")))
            })
            .collect();
        // Deepest (latest) first.
        mounts.reverse();
        for claim in uid_claims_of(id) {
            let _ = std::fs::remove_file(claim);
        }
        for m in &mounts {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        for root in SANDBOX_ROOTS {
            let dir = PathBuf::from(format!("{root}/{id}"));
            if !dir.exists() {
                continue;
            }
            // Never recurse into a directory that still has something mounted below it:
            // that could be a container's rootfs or a host directory bound into it.
            let prefix = format!("{}/", dir.display());
            if mount_points().iter().any(|m| m.starts_with(&prefix)) {
                eprintln!(
                    "clean-up: {} still has mounts; left in place",
                    dir.display()
                );
                continue;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Host-wide counts that grow when sandboxes leak, for soak tests.
#[derive(Clone, Debug, Default)]
pub struct HostUsage {
    /// Entries under [`SANDBOX_ROOTS`], all sandboxes of the host together.
    pub sandbox_dirs: usize,
    /// Sockets in [`SHIM_SOCKET_DIR`].
    pub shim_sockets: usize,
    /// Lines of `/proc/self/mountinfo`.
    pub mounts: usize,
    /// Open files of the containerd process.
    pub containerd_fds: usize,
    /// Resident memory of the containerd process, in KiB.
    pub containerd_rss_kib: u64,
    /// The host's `MemAvailable` (`/proc/meminfo`), in KiB.
    pub mem_available_kib: u64,
    /// uid claims in `/run/vc/ids`.
    pub uid_claims: usize,
    /// Named network namespaces in `/run/netns` (where the CRI puts its pods').
    pub netns: usize,
    /// Cgroups of the host: directories in its cgroup hierarchies.
    pub cgroups: usize,
}

fn entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

impl HostUsage {
    /// The counts now, with the containerd of pid `containerd`.
    pub fn take(containerd: i32) -> Self {
        let status =
            std::fs::read_to_string(format!("/proc/{containerd}/status")).unwrap_or_default();
        let rss = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        HostUsage {
            sandbox_dirs: SANDBOX_ROOTS.iter().map(|d| entries(d)).sum(),
            shim_sockets: entries(SHIM_SOCKET_DIR),
            mounts: mount_points().len(),
            containerd_fds: entries(&format!("/proc/{containerd}/fd")),
            containerd_rss_kib: rss,
            mem_available_kib: mem_available_kib(),
            uid_claims: entries("/run/vc/ids"),
            netns: entries("/run/netns"),
            cgroups: cgroup_count(),
        }
    }
}

/// `MemAvailable` of `/proc/meminfo`, in KiB (0 if unreadable).
fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The host's cgroups: directories in every hierarchy mounted under `/sys/fs/cgroup`
/// (symbolic links to a hierarchy counted once). Not `/proc/cgroups`' `num_cgroups`, which
/// counts removed memory cgroups too as long as page cache is charged to them.
fn cgroup_count() -> usize {
    fn dirs(dir: &Path) -> usize {
        1 + std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| dirs(&e.path()))
            .sum::<usize>()
    }
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| dirs(&e.path()))
        .sum()
}

/// Each thread of process `pid`: its name, state and what it waits in (`wchan`), for a
/// failure's message when a daemon stops answering.
pub fn thread_states(pid: i32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("process {pid} is gone");
    };
    let mut lines: Vec<String> = tasks
        .flatten()
        .map(|t| {
            let read = |f: &str| {
                std::fs::read_to_string(t.path().join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            // stat: "tid (comm) S ...": the state follows the last ')'.
            let stat = read("stat");
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            format!(
                "{} {} {state} {}",
                t.file_name().to_string_lossy(),
                read("comm"),
                read("wchan")
            )
        })
        .collect();
    lines.sort();
    format!(
        "threads of {pid} (tid name state wchan):\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_told_apart_by_their_command_line() {
        let id = "s1";
        let shim = "/bin/containerd-shim-kata-v2 -namespace default -id s1 -address /x ";
        assert_eq!(classify(id, shim), Some(Part::Shim));
        let qemu =
            "/usr/bin/qemu-system-x86_64 -M microvm -chardev socket,path=/run/vc/vm/s1/qmp.sock";
        assert_eq!(classify(id, qemu), Some(Part::Vmm));
        let fsd = "/usr/local/bin/virtiofsd --socket-path /run/vc/vm/s1/virtiofsd.sock";
        assert_eq!(classify(id, fsd), Some(Part::Virtiofsd));
        let rootfs_fsd =
            "/usr/local/bin/virtiofsd --socket-path /run/vc/vm/s1/virtiofsd-rootfs.sock";
        assert_eq!(classify(id, rootfs_fsd), Some(Part::RootfsVirtiofsd));
        let vsock = "/t/kata-vsock --vm guest-cid=3,socket=/run/vc/vm/s1/vhost-vsock.sock";
        assert_eq!(classify(id, vsock), Some(Part::VsockBackend));
        // Another sandbox whose id starts the same.
        assert_eq!(classify(id, &qemu.replace("/s1/", "/s10/")), None);
        assert_eq!(classify(id, &shim.replace("-id s1 ", "-id s10 ")), None);
    }
}
