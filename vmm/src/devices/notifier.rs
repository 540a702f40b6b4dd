//! The device thread: waits on every virtio queue's ioeventfd, and on devices' host-side
//! event fds (the vsock muxer's epoll), and hands each event to the transport that owns it.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::MmioTransport;

/// Errors of the device thread.
#[derive(Debug, thiserror::Error)]
pub enum NotifierError {
    /// epoll failed.
    #[error("The device thread's epoll failed: {0}")]
    Epoll(#[source] std::io::Error),
    /// An eventfd could not be duplicated.
    #[error("Cannot duplicate a queue eventfd: {0}")]
    Clone(#[source] std::io::Error),
}

/// What an epoll token stands for.
enum Source {
    /// A queue notification: the ioeventfd and the queue index.
    Queue(EventFd, usize),
    /// The device's host event fd became readable.
    Host,
}

/// Event sources and their owners.
pub struct QueueNotifier {
    epoll: Epoll,
    /// (source, transport), indexed by the epoll token.
    sources: Vec<(Source, Arc<Mutex<MmioTransport>>)>,
}

impl QueueNotifier {
    /// An empty notifier.
    pub fn new() -> Result<Self, NotifierError> {
        Ok(QueueNotifier {
            epoll: Epoll::new().map_err(NotifierError::Epoll)?,
            sources: Vec::new(),
        })
    }

    /// Watches every queue eventfd of `transport`, and its device's host event fd.
    pub fn add(&mut self, transport: &Arc<Mutex<MmioTransport>>) -> Result<(), NotifierError> {
        let (evts, host_fd): (Vec<EventFd>, _) = match transport.lock() {
            // A vhost-user backend reads these itself.
            Ok(t) if t.queues_served_elsewhere() => (Vec::new(), t.host_event_fd()),
            Ok(t) => (
                t.queue_evts()
                    .iter()
                    .map(|e| e.try_clone().map_err(NotifierError::Clone))
                    .collect::<Result<_, _>>()?,
                t.host_event_fd(),
            ),
            Err(_) => return Ok(()),
        };
        for (index, evt) in evts.into_iter().enumerate() {
            self.watch(evt.as_raw_fd())?;
            self.sources
                .push((Source::Queue(evt, index), transport.clone()));
        }
        if let Some(fd) = host_fd {
            self.watch(fd)?;
            self.sources.push((Source::Host, transport.clone()));
        }
        Ok(())
    }

    fn watch(&self, fd: std::os::fd::RawFd) -> Result<(), NotifierError> {
        let token = self.sources.len() as u64;
        self.epoll
            .ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
            .map_err(NotifierError::Epoll)
    }

    /// Waits for and dispatches notifications, forever (or until epoll fails).
    pub fn run(&self) -> NotifierError {
        let mut events = vec![EpollEvent::default(); self.sources.len().max(1)];
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return NotifierError::Epoll(e),
            };
            for event in &events[..n] {
                let Some((source, transport)) = self.sources.get(event.data() as usize) else {
                    continue;
                };
                match source {
                    Source::Queue(evt, index) => {
                        // Reading resets the counter; several writes are one notification.
                        if evt.read().is_err() {
                            continue;
                        }
                        if let Ok(mut t) = transport.lock() {
                            t.notify(*index);
                        }
                    }
                    Source::Host => {
                        if let Ok(mut t) = transport.lock() {
                            t.host_event();
                        }
                    }
                }
            }
        }
    }
}
