//! The device thread: waits on every virtio queue's ioeventfd, and on devices' host-side
//! event fds (the vsock muxer's epoll, a tap), and hands each event to the transport that owns
//! it. Host fds are level-triggered unless their device asks for edge-triggered reports.

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
        let (evts, host_fd, edge): (Vec<EventFd>, _, _) = match transport.lock() {
            // A vhost-user backend reads these itself.
            Ok(t) if t.queues_served_elsewhere() => {
                (Vec::new(), t.host_event_fd(), t.host_event_edge_triggered())
            }
            Ok(t) => (
                t.queue_evts()
                    .iter()
                    .map(|e| e.try_clone().map_err(NotifierError::Clone))
                    .collect::<Result<_, _>>()?,
                t.host_event_fd(),
                t.host_event_edge_triggered(),
            ),
            Err(_) => return Ok(()),
        };
        for (index, evt) in evts.into_iter().enumerate() {
            self.watch(evt.as_raw_fd(), EventSet::IN)?;
            self.sources
                .push((Source::Queue(evt, index), transport.clone()));
        }
        if let Some(fd) = host_fd {
            let events = if edge {
                EventSet::IN | EventSet::EDGE_TRIGGERED
            } else {
                EventSet::IN
            };
            self.watch(fd, events)?;
            self.sources.push((Source::Host, transport.clone()));
        }
        Ok(())
    }

    fn watch(&self, fd: std::os::fd::RawFd, events: EventSet) -> Result<(), NotifierError> {
        let token = self.sources.len() as u64;
        self.epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
            .map_err(NotifierError::Epoll)
    }

    /// Waits for and dispatches notifications, forever (or until epoll fails).
    pub fn run(&self) -> NotifierError {
        let mut events = vec![EpollEvent::default(); self.sources.len().max(1)];
        loop {
            if let Err(e) = self.dispatch(-1, &mut events) {
                return e;
            }
        }
    }

    /// Waits up to `timeout_ms` (-1: forever) for events and dispatches them; returns how
    /// many there were.
    pub(crate) fn dispatch(
        &self,
        timeout_ms: i32,
        events: &mut [EpollEvent],
    ) -> Result<usize, NotifierError> {
        let n = match self.epoll.wait(timeout_ms, events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(NotifierError::Epoll(e)),
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
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::mmio::tests::{handshake, test_mem};
    use crate::devices::virtio::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};
    use std::os::fd::RawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use virtio_queue::Queue;
    use vm_memory::GuestMemoryMmap;

    /// A device whose host fd is an eventfd that stays readable (nobody reads it); counts
    /// host events.
    struct Readable {
        sizes: [u16; 1],
        fd: EventFd,
        edge: bool,
        events: Arc<AtomicUsize>,
    }

    impl VirtioDevice for Readable {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &self.sizes
        }
        fn device_features(&self) -> u64 {
            VIRTIO_F_VERSION_1
        }
        fn process_queue(&mut self, _: usize, _: &mut [Queue], _: &GuestMemoryMmap) -> bool {
            false
        }
        fn host_event_fd(&self) -> Option<RawFd> {
            Some(self.fd.as_raw_fd())
        }
        fn host_event_edge_triggered(&self) -> bool {
            self.edge
        }
        fn process_host_event(&mut self, _: &mut [Queue], _: &GuestMemoryMmap) -> bool {
            self.events.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Host events dispatched in three 50 ms rounds while the fd stays readable.
    fn host_events_while_readable(edge: bool) -> usize {
        let events = Arc::new(AtomicUsize::new(0));
        let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        fd.write(1).unwrap();
        let device = Readable {
            sizes: [16],
            fd,
            edge,
            events: events.clone(),
        };
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut transport = MmioTransport::new(Box::new(device), test_mem(), irq).unwrap();
        handshake(&mut transport, 16);
        let mut notifier = QueueNotifier::new().unwrap();
        notifier.add(&Arc::new(Mutex::new(transport))).unwrap();
        let mut buf = vec![EpollEvent::default(); 4];
        for _ in 0..3 {
            notifier.dispatch(50, &mut buf).unwrap();
        }
        events.load(Ordering::Relaxed)
    }

    #[test]
    fn level_triggered_host_fds_are_reported_while_readable() {
        assert_eq!(host_events_while_readable(false), 3);
    }

    #[test]
    fn edge_triggered_host_fds_are_reported_once_per_change() {
        assert_eq!(host_events_while_readable(true), 1);
    }
}
