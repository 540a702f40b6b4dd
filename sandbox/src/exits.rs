//! Child exits, as the host process's reaper announces them.
//!
//! A process that hosts sandboxes reaps its children itself (the shim: containerd-shim's
//! SIGCHLD reaper), so `waitpid` here may find a child already gone. The host process
//! feeds each exit it reaps to [`announce`]; the watchdog and the network helpers
//! [`subscribe`] before they start a process or check on one, so no exit is missed. A
//! host process that announces nothing (a unit test) leaves those waits to their own
//! `waitpid` and `/proc` checks.

use std::sync::Mutex;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// One child's exit: its pid and its status (the exit code, or 128 + the signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub pid: i32,
    pub code: i32,
}

struct Subscriber {
    id: u64,
    tx: UnboundedSender<Exit>,
}

/// The subscribers, and the next subscription's id.
static SUBSCRIBERS: Mutex<(u64, Vec<Subscriber>)> = Mutex::new((0, Vec::new()));

/// Every exit announced from its creation until it is dropped.
pub struct Subscription {
    id: u64,
    pub rx: UnboundedReceiver<Exit>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Ok(mut subs) = SUBSCRIBERS.lock() {
            subs.1.retain(|s| s.id != self.id);
        }
    }
}

/// Starts hearing of exits.
pub fn subscribe() -> Subscription {
    let (tx, rx) = unbounded_channel();
    let mut subs = SUBSCRIBERS.lock().unwrap_or_else(|p| p.into_inner());
    let id = subs.0;
    subs.0 += 1;
    subs.1.push(Subscriber { id, tx });
    Subscription { id, rx }
}

/// Tells every subscriber that child `pid` exited with `code`.
pub fn announce(pid: i32, code: i32) {
    let mut subs = SUBSCRIBERS.lock().unwrap_or_else(|p| p.into_inner());
    // A subscriber whose receiver is gone is dropped on the way.
    subs.1.retain(|s| s.tx.send(Exit { pid, code }).is_ok());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_subscriber_hears_an_exit_until_it_unsubscribes() {
        let mut a = subscribe();
        let b = subscribe();
        announce(-7, 137);
        assert_eq!(a.rx.recv().await, Some(Exit { pid: -7, code: 137 }));
        let b_id = b.id;
        drop(b);
        let ids: Vec<u64> = SUBSCRIBERS.lock().unwrap().1.iter().map(|s| s.id).collect();
        assert!(!ids.contains(&b_id), "{ids:?}");
        announce(-8, 0);
        assert_eq!(a.rx.recv().await, Some(Exit { pid: -8, code: 0 }));
    }
}
