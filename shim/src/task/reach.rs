//! Requests that finish whatever happens to their caller, and the daemon's own end when
//! nobody can reach it any more.
//!
//! ttrpc drops a request's handler when the request's connection closes (containerd
//! killed, or restarted, mid-create). A create cut at an await left a booted VM and no
//! container: nothing a restarted containerd could see or delete. So the RPCs that change
//! the sandbox (create, start, delete, shutdown, pause, resume) run in a task of their
//! own ([`to_completion`]): the work always finishes (a create is then a task containerd
//! sees as CREATED once it reconnects, or, failed, is undone) and only the answer is lost.
//!
//! containerd reaches a daemon through its bundle's `address`: the caller that started
//! it, or a containerd restarted since, which connects to the shim of every bundle as it
//! starts (1.6: Connect; 1.7 and 2.x: Connect and Pids). A daemon that nobody will reach
//! must not keep a VM, nor itself, forever (runc's shim does: containerd's gap). The
//! daemon ends on its own, undoing its sandbox as Shutdown does, when:
//! - its bundle is gone: containerd removed it without running `delete` (at restart,
//!   for a bundle whose container record is gone), so nothing can name the daemon again;
//! - it has had no task (no sandbox, container or create under way) for
//!   [`NO_TASK_LIMIT`]: containerd went away between `start` and `create`, or the create
//!   failed and nobody came to shut the daemon down;
//! - the caller of a request that changes the sandbox went away before the answer, and
//!   no request came in for [`ABANDONED_LIMIT`] after that request's work finished: a
//!   containerd that restarted would have reconnected by then.
//!
//! A daemon with running containers and no requests is never ended: that is a running
//! sandbox whose containerd is away.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use slog::{error, warn};

use super::state::{failed, Result};
use super::Inner;
use crate::container::Status;

/// How long a daemon may have no task before it ends. containerd sends the Create right
/// after `start` returns (milliseconds); a busy host is given ample room beyond that.
pub const NO_TASK_LIMIT: Duration = Duration::from_secs(30);
/// How long a daemon whose caller went away mid-request waits for anyone to reach it
/// before it undoes its sandbox. containerd restarted by systemd (`RestartSec=5`)
/// reconnects within seconds of its start.
pub const ABANDONED_LIMIT: Duration = Duration::from_secs(60);
/// How often the daemon checks whether it can still be reached.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Why the daemon ends on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreached {
    BundleGone(PathBuf),
    NoTask(Duration),
    Abandoned { rpc: &'static str, since: Duration },
}

impl std::fmt::Display for Unreached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreached::BundleGone(b) => write!(
                f,
                "its bundle {} was removed without `delete`: nothing can reach this shim again",
                b.display()
            ),
            Unreached::NoTask(d) => write!(
                f,
                "no task for {}s: containerd never created one (it went away between start \
                 and create) or the create failed and nobody shut the shim down",
                d.as_secs()
            ),
            Unreached::Abandoned { rpc, since } => write!(
                f,
                "the caller of {rpc} went away before the answer and nobody has reached this \
                 shim for {}s since (a restarted containerd reconnects at once)",
                since.as_secs()
            ),
        }
    }
}

/// What the daemon knows of its callers.
#[derive(Debug)]
pub struct Contact {
    seen: Mutex<Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Since when the daemon has had no task (None while it has one).
    idle_since: Option<Instant>,
    /// The last request whose caller went away, and when its work finished; cleared by
    /// any request that comes in later.
    abandoned: Option<(&'static str, Instant)>,
    /// When the last request came in.
    heard: Instant,
}

impl Contact {
    pub fn new(now: Instant) -> Self {
        Contact {
            seen: Mutex::new(Seen {
                idle_since: Some(now),
                abandoned: None,
                heard: now,
            }),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request came in: someone reaches the daemon.
    pub fn heard(&self) {
        let mut seen = self.seen();
        seen.abandoned = None;
        seen.heard = Instant::now();
    }

    /// The caller of `rpc` went away (at `gone`) before its answer; its work finished at
    /// `at` (or is still under way). A request heard since `gone` means someone came
    /// back: then nothing is abandoned.
    fn abandoned(&self, rpc: &'static str, gone: Instant, at: Instant) {
        let mut seen = self.seen();
        if seen.heard <= gone {
            seen.abandoned = Some((rpc, at));
        }
    }

    /// Why the daemon should end now, if it should, given what it has (`tasks`) and
    /// `bundle`: its path, and whether it is there.
    pub fn verdict(
        &self,
        now: Instant,
        tasks: Tasks,
        bundle: Option<(&PathBuf, bool)>,
    ) -> Option<Unreached> {
        let mut seen = self.seen();
        if let Some((path, false)) = bundle {
            return Some(Unreached::BundleGone(path.clone()));
        }
        if tasks != Tasks::None {
            seen.idle_since = None;
        } else {
            let since = *seen.idle_since.get_or_insert(now);
            let idle = now.saturating_duration_since(since);
            if idle >= NO_TASK_LIMIT {
                return Some(Unreached::NoTask(idle));
            }
        }
        let (rpc, at) = seen.abandoned?;
        let since = now.saturating_duration_since(at);
        (since >= ABANDONED_LIMIT && tasks != Tasks::Busy)
            .then_some(Unreached::Abandoned { rpc, since })
    }
}

/// What a daemon has, as far as its end is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tasks {
    /// No sandbox, no container, no create under way.
    None,
    /// A sandbox or containers, none of whose processes runs: created and never
    /// started, or ended.
    Idle,
    /// A process runs (or is paused), or a create is under way: never ended for want
    /// of callers.
    Busy,
}

/// Marks a request's caller gone when its handler is dropped before the answer.
struct Caller {
    /// When the caller went away, if it did.
    gone: Arc<Mutex<Option<Instant>>>,
    answered: bool,
    inner: Arc<Inner>,
    rpc: &'static str,
}

impl Drop for Caller {
    fn drop(&mut self) {
        // A daemon on its way out drops the connections itself.
        if !self.answered && !self.inner.ending.load(Ordering::SeqCst) {
            let now = Instant::now();
            *self.gone.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            // Stamped now, and again when the work finishes.
            self.inner.contact.abandoned(self.rpc, now, now);
            warn!(self.inner.log, "the caller went away before the answer; the request finishes anyway"; "rpc" => self.rpc);
        }
    }
}

/// Runs `work`, request `rpc`'s changes to the sandbox, in a task of its own, so that it
/// finishes even when ttrpc drops the request's handler (see the module doc).
pub(super) async fn to_completion<T, F>(inner: &Arc<Inner>, rpc: &'static str, work: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let gone = Arc::new(Mutex::new(None));
    let mut caller = Caller {
        gone: gone.clone(),
        answered: false,
        inner: inner.clone(),
        rpc,
    };
    let task_inner = inner.clone();
    let handle = tokio::spawn(async move {
        let result = work.await;
        let went = *gone.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(went) = went {
            task_inner.contact.abandoned(rpc, went, Instant::now());
            let outcome = match &result {
                Ok(_) => "done".to_string(),
                Err(e) => format!("failed: {e}"),
            };
            warn!(task_inner.log, "a request whose caller went away has finished"; "rpc" => rpc, "outcome" => outcome);
        }
        result
    });
    let result = handle.await.map_err(|e| {
        // A bug: said loudly, where containerd keeps the shim's log.
        error!(inner.log, "a request's work did not finish"; "rpc" => rpc, "error" => %e);
        failed(format!(
            "{rpc} did not finish: {e}; the shim's log (in containerd's) has the details"
        ))
    });
    caller.answered = true;
    result?
}

impl Inner {
    pub(super) fn tasks(&self) -> Tasks {
        let st = self.lock();
        if st.sandbox.is_none() && st.is_empty() {
            return Tasks::None;
        }
        let runs = st.containers.values().any(|c| {
            std::iter::once(&c.init)
                .chain(c.execs.values())
                .any(|p| matches!(p.status(), Status::Running | Status::Paused))
        });
        if runs || !st.creating.is_empty() {
            Tasks::Busy
        } else {
            Tasks::Idle
        }
    }

    /// Ends the daemon, undoing its sandbox, once nobody can reach it (see the module
    /// doc). `bundle` is the daemon's bundle (its working directory).
    pub(super) fn end_when_unreached(self: &Arc<Self>, bundle: Option<PathBuf>) {
        let weak: Weak<Inner> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CHECK_EVERY).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                if inner.ending.load(Ordering::SeqCst) {
                    return;
                }
                let there = bundle.as_ref().map(|b| (b, b.is_dir()));
                let Some(why) = inner.contact.verdict(Instant::now(), inner.tasks(), there) else {
                    continue;
                };
                let _life = inner.lifecycle.lock().await;
                // A create may have come in while the verdict waited for the lock.
                if matches!(why, Unreached::NoTask(_)) && inner.tasks() != Tasks::None {
                    continue;
                }
                error!(inner.log, "ending the shim and its sandbox: {why}"; "reason" => %why);
                inner.end_locked().await;
                return;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_daemon_without_a_task_ends_after_the_limit() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        assert_eq!(c.verdict(t0 + S, Tasks::None, None), None);
        assert_eq!(
            c.verdict(t0 + NO_TASK_LIMIT, Tasks::None, None),
            Some(Unreached::NoTask(NO_TASK_LIMIT))
        );
    }

    #[test]
    fn a_task_restarts_the_idle_clock() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        assert_eq!(c.verdict(t0 + NO_TASK_LIMIT - S, Tasks::Busy, None), None);
        // The last container went at this check: the clock starts here.
        let t1 = t0 + NO_TASK_LIMIT;
        assert_eq!(c.verdict(t1, Tasks::None, None), None);
        assert_eq!(c.verdict(t1 + NO_TASK_LIMIT - S, Tasks::None, None), None);
        assert!(c.verdict(t1 + NO_TASK_LIMIT, Tasks::None, None).is_some());
    }

    #[test]
    fn running_containers_without_callers_are_never_ended() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        assert_eq!(
            c.verdict(t0 + 1000 * NO_TASK_LIMIT, Tasks::Busy, None),
            None
        );
    }

    #[test]
    fn an_abandoned_request_ends_the_daemon_unless_someone_reconnects() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        c.abandoned("create", t0, t0);
        assert_eq!(c.verdict(t0 + ABANDONED_LIMIT - S, Tasks::Idle, None), None);
        assert_eq!(
            c.verdict(t0 + ABANDONED_LIMIT, Tasks::Idle, None),
            Some(Unreached::Abandoned {
                rpc: "create",
                since: ABANDONED_LIMIT
            })
        );
        // A restarted containerd's Connect, before the limit.
        let c = Contact::new(t0);
        c.abandoned("create", t0, t0);
        c.heard();
        assert_eq!(
            c.verdict(t0 + 10 * ABANDONED_LIMIT, Tasks::Idle, None),
            None
        );
        // ... also when it came while the create was still under way.
        let c = Contact::new(t0);
        let gone = Instant::now();
        c.abandoned("create", gone, gone);
        c.heard();
        c.abandoned("create", gone, Instant::now());
        assert_eq!(
            c.verdict(gone + 10 * ABANDONED_LIMIT, Tasks::Idle, None),
            None
        );
    }

    #[test]
    fn an_abandoned_request_never_ends_running_containers() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        c.abandoned("start", t0, t0);
        assert_eq!(
            c.verdict(t0 + 10 * ABANDONED_LIMIT, Tasks::Busy, None),
            None
        );
    }

    #[test]
    fn a_removed_bundle_ends_the_daemon_at_once() {
        let t0 = Instant::now();
        let c = Contact::new(t0);
        let b = PathBuf::from("/run/containerd/x");
        assert_eq!(c.verdict(t0, Tasks::Busy, Some((&b, true))), None);
        assert_eq!(
            c.verdict(t0, Tasks::Busy, Some((&b, false))),
            Some(Unreached::BundleGone(b.clone()))
        );
    }
}
