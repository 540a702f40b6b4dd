//! How any thread (vCPU, device, signal) tells the main thread that the VM is over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

/// Why the VM stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitReason {
    /// The process exit code: 0 for a guest power-off or reset.
    pub code: i32,
    /// A sentence for the log.
    pub message: String,
}

/// A one-shot "the VM is over" event: the first reason wins.
pub struct ExitEvent {
    evt: EventFd,
    requested: AtomicBool,
    reason: Mutex<Option<ExitReason>>,
}

impl ExitEvent {
    /// Creates the event.
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitEvent {
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
            requested: AtomicBool::new(false),
            reason: Mutex::new(None),
        })
    }

    /// Records `code` and `message` unless a reason was already recorded, and wakes the waiter.
    pub fn request(&self, code: i32, message: impl Into<String>) {
        if let Ok(mut reason) = self.reason.lock() {
            if reason.is_none() {
                *reason = Some(ExitReason {
                    code,
                    message: message.into(),
                });
            }
        }
        self.requested.store(true, Ordering::Release);
        // A full counter still wakes the waiter, so the error is of no consequence.
        let _ = self.evt.write(1);
    }

    /// Whether the VM is over; vCPUs check it so as not to run on after a reset request.
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// The recorded reason, if any.
    pub fn reason(&self) -> Option<ExitReason> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }

    /// The eventfd that becomes readable on the first request.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins() {
        let e = ExitEvent::new().unwrap();
        assert!(e.reason().is_none());
        e.request(0, "guest reset");
        e.request(1, "later");
        assert_eq!(e.reason().unwrap().code, 0);
        assert_eq!(e.eventfd().read().unwrap(), 2);
    }
}
