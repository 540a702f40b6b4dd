//! The container stage: a single-threaded process forked from the agent's zygote (or,
//! without one, the agent re-executed as `kata-agent __container-stage`).
//!
//! The agent is a multi-threaded tokio process, where forking and then calling anything
//! but async-signal-safe functions is unsound. So stages come from a copy of the agent
//! forked before any thread existed (see `spawner`); a stage runs single-threaded
//! and may unshare, setns, fork, mount and pivot freely.
//! Its stdio (fds 0-2) already is the container's stdio; it talks to the agent only over
//! the sync socket (see [`protocol`]).
//!
//! A different executor (e.g. youki's libcontainer) would replace this module and
//! `spawner` behind the same messages.

pub mod caps;
mod devices;
pub mod error;
mod launch;
mod mounts;
mod passwd;
pub mod paths;
pub mod protocol;
pub mod rlimits;
mod seccomp;
pub mod spawner;
mod sys;
pub mod sysctl;
mod userns;

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};

use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::{fork, ForkResult};

use crate::spec::{Process, Spec};
pub use error::StageError;
use protocol::{recv_message, send_message, StageConfig, StageMessage, StageMode};

/// Runs the stage and never returns.
pub fn main() -> ! {
    // SAFETY: the agent placed the sync socket at SYNC_FD before exec; we own it now.
    let sync = unsafe { OwnedFd::from_raw_fd(protocol::SYNC_FD) };
    // The container process keeps the socket until execve closes it: that end-of-stream
    // is how the agent learns that exec succeeded.
    let _ = nix::fcntl::fcntl(
        protocol::SYNC_FD,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let result = run(sync.as_fd());
    if let Err(e) = result {
        let _ = send_message(sync.as_fd(), &e.into());
        std::process::exit(1);
    }
    std::process::exit(0);
}

fn run(sync: BorrowedFd<'_>) -> Result<(), StageError> {
    // SAFETY: the agent placed the config pipe at CONFIG_FD; nothing else owns it.
    let mut config_pipe = unsafe { File::from_raw_fd(protocol::CONFIG_FD) };
    let mut bytes = Vec::new();
    config_pipe
        .read_to_end(&mut bytes)
        .map_err(|e| StageError::Os {
            action: "read the stage config from the agent".into(),
            source: e,
        })?;
    drop(config_pipe);
    let config: StageConfig = serde_json::from_slice(&bytes).map_err(StageError::Config)?;
    take_stdio(sync)?;

    if let Some(cgroup) = &config.cgroup {
        // Joining before fork puts the container process in the cgroup before it execs.
        std::fs::write(
            format!("{cgroup}/cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| StageError::io("join cgroup", cgroup, e))?;
    }

    match config.mode {
        StageMode::Create { spec } => create(sync, *spec),
        StageMode::Exec {
            process,
            init_pid,
            seccomp,
        } => {
            let userns = user_namespace_of(init_pid)?;
            enter_namespaces_of(init_pid)?;
            fork_and(sync, |sync| {
                let launch = launch::Launch::prepare(sync, &process, seccomp.as_ref())?;
                launch
                    .check_in_rootfs()?
                    .in_user_namespace(userns)
                    .exec(sync)
            })
        }
    }
}

/// Puts the process's stdio (and start pipe) the agent sent at 0-2 (and START_FD).
fn take_stdio(sync: BorrowedFd<'_>) -> Result<(), StageError> {
    let fds =
        protocol::recv_fds(sync).map_err(|e| StageError::sys("receive the process's stdio", e))?;
    let targets = [0, 1, 2, protocol::START_FD];
    let moves: Vec<_> = fds
        .iter()
        .zip(targets)
        .map(|(fd, target)| (fd.as_raw_fd(), target))
        .collect();
    protocol::place_fds(&moves).map_err(|e| StageError::Os {
        action: "place the process's stdio".into(),
        source: e,
    })?;
    for fd in fds {
        // A descriptor received at a number it was then placed on now is the placed one:
        // keep it open. The others are copies and close here.
        if targets.contains(&fd.as_raw_fd()) {
            let _ = fd.into_raw_fd();
        }
    }
    Ok(())
}

fn log(sync: BorrowedFd<'_>, line: String) {
    let _ = send_message(sync, &StageMessage::Log(line));
}

/// Creates the container's namespaces, then forks its init process.
fn create(sync: BorrowedFd<'_>, spec: Spec) -> Result<(), StageError> {
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWPID;
    let mut join = Vec::new();
    for ns in spec.linux.iter().flat_map(|l| l.namespaces.iter()) {
        // Spec::from_json refused unknown types already.
        let flag =
            namespace_flag(&ns.typ).ok_or_else(|| StageError::UnknownNamespace(ns.typ.clone()))?;
        match ns.path.as_deref().filter(|p| !p.is_empty()) {
            Some(path) => {
                flags.remove(flag);
                join.push((path.to_string(), flag));
            }
            None if ns.typ == "network" => {
                // The guest's network belongs to the whole sandbox. (A cgroup namespace
                // is unshared below, after joining the cgroup, so its root is the
                // container's.)
                log(sync, format!("not creating a {} namespace", ns.typ));
            }
            // Made below with its mappings ([`userns`]), joined by the container
            // process last.
            None if ns.typ == "user" => {}
            None => flags.insert(flag),
        }
    }
    // A user namespace named by path is the host's (the shim drops such paths): every
    // container with one gets its own here, with the spec's mappings.
    join.retain(|(_, flag)| *flag != CloneFlags::CLONE_NEWUSER);
    let maps = userns::IdMaps::of_spec(&spec)?;
    let userns = maps.as_ref().map(userns::IdMaps::create).transpose()?;
    for (path, flag) in &join {
        let file = File::open(path).map_err(|e| StageError::io("open namespace", path, e))?;
        setns(file.as_fd(), *flag)
            .map_err(|e| StageError::sys(format!("join namespace {path}"), e))?;
    }
    unshare(flags).map_err(|e| StageError::sys(format!("unshare namespaces {flags:?}"), e))?;
    fork_and(sync, move |sync| {
        let process = spec
            .process
            .as_ref()
            .ok_or(StageError::MissingField("process"))?;
        let seccomp = spec.linux.as_ref().and_then(|l| l.seccomp.as_ref());
        let launch = launch::Launch::prepare(sync, process, seccomp)?;
        let idmap = maps.as_ref().zip(userns.as_ref());
        mounts::prepare_rootfs(sync, &spec, idmap)?;
        let launch = launch.check_in_rootfs()?.in_user_namespace(userns);
        if let Some(hostname) = spec.hostname.as_deref().filter(|h| !h.is_empty()) {
            nix::unistd::sethostname(hostname)
                .map_err(|e| StageError::sys(format!("set hostname {hostname:?}"), e))?;
        }
        send_message(sync, &StageMessage::Ready)
            .map_err(|e| StageError::sys("report ready to the agent", e))?;
        // SAFETY: the agent placed the start pipe at START_FD; only this process reads it.
        let mut start = unsafe { File::from_raw_fd(protocol::START_FD) };
        let mut byte = [0u8; 1];
        match start.read(&mut byte) {
            Ok(1) => {}
            // The agent dropped the container before starting it.
            _ => std::process::exit(1),
        }
        drop(start);
        launch.exec(sync)
    })
}

/// Joins the namespaces of a running container for `exec`; mnt last, since it changes
/// what `/proc` means.
fn enter_namespaces_of(pid: i32) -> Result<(), StageError> {
    let kinds = [
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("pid", CloneFlags::CLONE_NEWPID),
        ("cgroup", CloneFlags::CLONE_NEWCGROUP), // after joining the cgroup, in run()
        ("mnt", CloneFlags::CLONE_NEWNS),
    ];
    let mut files = Vec::new();
    for (name, flag) in kinds {
        let path = format!("/proc/{pid}/ns/{name}");
        let file = File::open(&path).map_err(|e| StageError::io("open", &path, e))?;
        files.push((path, file, flag));
    }
    for (path, file, flag) in files {
        setns(file.as_fd(), flag)
            .map_err(|e| StageError::sys(format!("join namespace {path}"), e))?;
    }
    Ok(())
}

/// The user namespace of a running container's init, when it is not the guest's own: an
/// exec joins it as the container's process did (last, see `launch`).
fn user_namespace_of(pid: i32) -> Result<Option<File>, StageError> {
    let theirs = format!("/proc/{pid}/ns/user");
    let same = std::fs::read_link(&theirs).map_err(|e| StageError::io("read", &theirs, e))?
        == std::fs::read_link("/proc/self/ns/user")
            .map_err(|e| StageError::io("read", "/proc/self/ns/user", e))?;
    if same {
        return Ok(None);
    }
    File::open(&theirs)
        .map(Some)
        .map_err(|e| StageError::io("open", theirs, e))
}

/// Forks; the child runs `child` (which only returns on error), the parent reports the
/// child's pid and exits once the agent has acknowledged it.
fn fork_and(
    sync: BorrowedFd<'_>,
    child: impl FnOnce(BorrowedFd<'_>) -> Result<(), StageError>,
) -> Result<(), StageError> {
    // SAFETY: the stage is single-threaded (it was just exec'd and started no threads),
    // so the child may run arbitrary code.
    match unsafe { fork() }.map_err(|e| StageError::sys("fork the container process", e))? {
        ForkResult::Child => {
            let err = match child(sync) {
                Ok(()) => StageError::ReturnedWithoutExec,
                Err(e) => e,
            };
            let _ = send_message(sync, &err.into());
            std::process::exit(127);
        }
        ForkResult::Parent { child } => {
            send_message(sync, &StageMessage::Pid(child.as_raw()))
                .map_err(|e| StageError::sys("report the container's pid to the agent", e))?;
            // Wait for the ack (or the agent going away); its content does not matter.
            let _ = recv_message(sync);
            Ok(())
        }
    }
}

/// What the stage would refuse in `spec` field by field (capability names, rlimits,
/// sysctls), found before anything of the container is made. The agent calls it after
/// `Spec::from_json`, which checks the spec's shape.
pub fn preflight(spec: &Spec) -> Result<(), StageError> {
    if let Some(process) = &spec.process {
        preflight_process(process)?;
    }
    if let Some(linux) = &spec.linux {
        sysctl::validate(&linux.sysctl)?;
    }
    Ok(())
}

/// [`preflight`] for an exec's process.
pub fn preflight_process(process: &Process) -> Result<(), StageError> {
    if let Some(caps) = &process.capabilities {
        caps::CapabilitySets::parse(caps)?;
    }
    rlimits::parse(&process.rlimits)?;
    Ok(())
}

fn namespace_flag(typ: &str) -> Option<CloneFlags> {
    Some(match typ {
        "pid" => CloneFlags::CLONE_NEWPID,
        "network" => CloneFlags::CLONE_NEWNET,
        "mount" => CloneFlags::CLONE_NEWNS,
        "ipc" => CloneFlags::CLONE_NEWIPC,
        "uts" => CloneFlags::CLONE_NEWUTS,
        "user" => CloneFlags::CLONE_NEWUSER,
        "cgroup" => CloneFlags::CLONE_NEWCGROUP,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(process: &str, linux: &str) -> Spec {
        let json = format!(
            r#"{{"process":{{"args":["sh"],"cwd":"/"{process}}},"root":{{"path":"/r"}}{linux}}}"#
        );
        Spec::from_json(json.as_bytes()).expect("a spec of the right shape")
    }

    #[test]
    fn preflight_refuses_what_the_stage_would() {
        assert!(preflight(&spec("", "")).is_ok());
        let bad_cap = r#","capabilities":{"bounding":["CAP_NOPE"]}"#;
        let e = preflight(&spec(bad_cap, "")).unwrap_err();
        assert!(e.to_string().contains("CAP_NOPE"), "{e}");
        let soft_above_hard = r#","rlimits":[{"type":"RLIMIT_NOFILE","soft":2,"hard":1}]"#;
        let e = preflight(&spec(soft_above_hard, "")).unwrap_err();
        assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
        let host_sysctl = r#","linux":{"sysctl":{"vm.swappiness":"0"}}"#;
        let e = preflight(&spec("", host_sysctl)).unwrap_err();
        assert!(e.to_string().contains("vm.swappiness"), "{e}");
        let process = spec(bad_cap, "").process.expect("process");
        assert!(preflight_process(&process).is_err());
    }
}
