//! Containers and their processes as the Task service tracks them: created, running,
//! paused, stopped, each with its stdio relays. The host side of a container (its rootfs
//! and binds on the share) is the sandbox library's ([`kata_sandbox::host_mounts`]).

use std::path::PathBuf;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::io::{Relays, StdioPaths};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Paused,
    Stopped,
}

#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub status: u32,
    pub at: SystemTime,
}

/// A process of a container (its init, or an exec) as containerd sees it: created,
/// running (or paused), stopped with an exit. Its transitions are the methods below; the
/// Task RPCs ask for them.
pub struct Process {
    pub stdio: StdioPaths,
    /// The OCI process (JSON) of an exec; None for the init process.
    pub spec: Option<Vec<u8>>,
    status: Status,
    /// A Start is under way (the agent has been asked, no answer yet).
    starting: bool,
    exit_tx: watch::Sender<Option<Exit>>,
    pub relays: Option<Relays>,
}

/// A transition the process's state does not allow.
#[derive(Debug, thiserror::Error)]
pub enum Transition {
    #[error("was already started")]
    AlreadyStarted,
    #[error("is {0:?}")]
    Not(Status),
}

impl Process {
    pub fn new(stdio: StdioPaths, spec: Option<Vec<u8>>) -> Self {
        let (exit_tx, _) = watch::channel(None);
        Process {
            stdio,
            spec,
            status: Status::Created,
            starting: false,
            exit_tx,
            relays: None,
        }
    }

    pub fn exit(&self) -> Option<Exit> {
        *self.exit_tx.borrow()
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// Created, and no Start under way: nothing runs in the guest for it yet.
    pub fn never_started(&self) -> bool {
        self.status == Status::Created && !self.starting
    }

    /// Its exit, as it comes.
    pub fn exits(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_tx.subscribe()
    }

    /// A Start begins: only once, from Created.
    pub fn begin_start(&mut self) -> Result<(), Transition> {
        if !self.never_started() {
            return Err(Transition::AlreadyStarted);
        }
        self.starting = true;
        Ok(())
    }

    /// The guest started it.
    pub fn started(&mut self) {
        self.starting = false;
        if self.status == Status::Created {
            self.status = Status::Running;
        }
    }

    /// The guest could not start it: as with runc, it is stopped (status 255), so that
    /// containerd can delete it (it refuses to delete a merely created task).
    pub fn start_failed(&mut self) {
        self.starting = false;
        self.relays = None;
        self.stopped(255);
    }

    /// It ended with `status`: the exit recorded, or None if it had ended already (an
    /// exit is reported once).
    pub fn stopped(&mut self, status: u32) -> Option<Exit> {
        if self.status == Status::Stopped {
            return None;
        }
        self.status = Status::Stopped;
        let exit = Exit {
            status,
            at: SystemTime::now(),
        };
        self.exit_tx.send_replace(Some(exit));
        Some(exit)
    }

    /// Paused or resumed: `from` becomes `to`, if it still is `from`.
    pub fn pause_transition(&mut self, from: Status, to: Status) -> Result<(), Transition> {
        if self.status != from {
            return Err(Transition::Not(self.status));
        }
        self.status = to;
        Ok(())
    }
}

pub struct Container {
    pub bundle: PathBuf,
    /// Host mount points made for this container, unmounted in reverse order.
    pub mounts: Vec<PathBuf>,
    /// Its directory in the share (`<share>/mounts/<id>`), removed at delete.
    pub share_dir: PathBuf,
    /// Host block devices attached to the VM for it, detached at delete.
    pub block_devices: Vec<String>,
    pub init: Process,
    pub execs: std::collections::HashMap<String, Process>,
    /// The host pid it reports, for a pod's other containers than the sandbox container
    /// (see [`kata_sandbox::pid_anchor`]); None: it reports the VMM's.
    pub anchor: Option<kata_sandbox::pid_anchor::PidAnchor>,
    /// The limits Task.Update has given it since it was created (an in-place resize);
    /// None: its bundle's.
    pub given: Option<kata_sandbox::resize::Limits>,
}

/// Why a container takes no exec now.
#[derive(Debug, thiserror::Error)]
pub enum ExecRefused {
    #[error("is paused: resume it before exec")]
    Paused,
    #[error("is not running")]
    NotRunning,
    #[error("already has an exec with this id")]
    IdInUse,
}

impl Container {
    /// Registers exec `exec_id` (created, not started): only in a running container,
    /// under an id it does not use yet.
    pub fn add_exec(
        &mut self,
        exec_id: &str,
        stdio: StdioPaths,
        spec: Vec<u8>,
    ) -> Result<(), ExecRefused> {
        match self.init.status {
            Status::Running => {}
            Status::Paused => return Err(ExecRefused::Paused),
            _ => return Err(ExecRefused::NotRunning),
        }
        if self.execs.contains_key(exec_id) {
            return Err(ExecRefused::IdInUse);
        }
        self.execs
            .insert(exec_id.to_string(), Process::new(stdio, Some(spec)));
        Ok(())
    }

    pub fn process(&self, exec_id: &str) -> Option<&Process> {
        if exec_id.is_empty() {
            Some(&self.init)
        } else {
            self.execs.get(exec_id)
        }
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Option<&mut Process> {
        if exec_id.is_empty() {
            Some(&mut self.init)
        } else {
            self.execs.get_mut(exec_id)
        }
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;

    fn process() -> Process {
        Process::new(StdioPaths::default(), None)
    }

    #[test]
    fn a_process_starts_once_and_stops_once() {
        let mut p = process();
        assert!(p.never_started());
        p.begin_start().unwrap();
        assert!(!p.never_started(), "a Start is under way");
        assert!(matches!(p.begin_start(), Err(Transition::AlreadyStarted)));
        p.started();
        assert_eq!(p.status(), Status::Running);
        p.pause_transition(Status::Running, Status::Paused).unwrap();
        assert!(p.pause_transition(Status::Running, Status::Paused).is_err());
        let exits = p.exits();
        let exit = p.stopped(0).expect("the first exit is recorded");
        assert_eq!(exit.status, 0);
        assert!(p.stopped(9).is_none(), "an exit is reported once");
        assert_eq!(exits.borrow().map(|e| e.status), Some(0));
        assert!(matches!(
            p.pause_transition(Status::Paused, Status::Running),
            Err(Transition::Not(Status::Stopped))
        ));
    }

    #[test]
    fn a_failed_start_stops_the_process_with_255() {
        let mut p = process();
        p.begin_start().unwrap();
        p.start_failed();
        assert_eq!(p.status(), Status::Stopped);
        assert_eq!(p.exit().map(|e| e.status), Some(255));
        assert!(matches!(p.begin_start(), Err(Transition::AlreadyStarted)));
    }

    #[test]
    fn execs_come_only_into_a_running_container_under_a_new_id() {
        let mut c = Container {
            bundle: PathBuf::new(),
            mounts: Vec::new(),
            share_dir: PathBuf::new(),
            block_devices: Vec::new(),
            init: process(),
            execs: Default::default(),
            anchor: None,
            given: None,
        };
        let add = |c: &mut Container, id: &str| c.add_exec(id, StdioPaths::default(), Vec::new());
        assert!(matches!(add(&mut c, "e1"), Err(ExecRefused::NotRunning)));
        c.init.begin_start().unwrap();
        c.init.started();
        add(&mut c, "e1").unwrap();
        assert!(matches!(add(&mut c, "e1"), Err(ExecRefused::IdInUse)));
        c.init
            .pause_transition(Status::Running, Status::Paused)
            .unwrap();
        assert!(matches!(add(&mut c, "e2"), Err(ExecRefused::Paused)));
        assert!(c.process("e1").is_some_and(Process::never_started));
    }
}
