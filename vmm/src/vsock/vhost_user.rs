//! The vsock device as a vhost-user backend (QEMU's `vhost-user-vsock-device`).
//!
//! Everything runs on vhost-user-backend's single vring worker thread: queue kicks and the
//! muxer's epoll fd (registered as `BACKEND_EVENT`) arrive there, so the device needs no
//! locking of its own. Host work that comes before the driver has started the rx queue (an
//! early `CONNECT`) stays in the muxer; the first rx kick delivers it.

use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, RwLock};

use log::{debug, warn};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_NOTIFY_ON_EMPTY;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::device::VsockDevice;
use super::{EVENT_QUEUE, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

/// Largest queue the frontend may set up (QEMU uses 128).
const MAX_QUEUE_SIZE: usize = 1024;
/// Event id of the muxer's fd; ids up to NUM_QUEUES belong to vhost-user-backend.
pub const BACKEND_EVENT: u16 = NUM_QUEUES as u16 + 1;

#[derive(Debug, Error)]
pub enum VhostUserVsockError {
    #[error("could not create the vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    #[error("the vhost-user daemon has no worker thread to poll the vsock muxer on")]
    NoWorker,
    #[error("could not poll the vsock muxer from the vhost-user worker: {0}")]
    RegisterMuxer(io::Error),
    #[error("could not listen for the vhost-user frontend on {path}: {error}")]
    Listen { path: String, error: io::Error },
    #[error("serving the vhost-user frontend failed: {error}")]
    Serve { error: vhost_user_backend::Error },
}

/// The vhost-user backend of one vsock device.
pub struct VhostUserVsockBackend {
    device: VsockDevice,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
}

impl VhostUserVsockBackend {
    pub fn new(device: VsockDevice) -> Self {
        VhostUserVsockBackend { device, mem: None }
    }

    fn vring_ready(vring: &VringRwLock) -> bool {
        let state = vring.get_ref();
        state.get_queue().ready() && state.is_enabled()
    }

    fn process(&mut self, device_event: u16, vrings: &[VringRwLock]) -> io::Result<()> {
        if device_event == BACKEND_EVENT {
            self.device
                .process_host_events()
                .map_err(io::Error::other)?;
        }
        let Some(atomic) = self.mem.as_ref() else {
            debug!("vsock: event {device_event} before the guest memory is known; kept for later");
            return Ok(());
        };
        let mem = atomic.memory();
        if device_event == TX_QUEUE as u16 || device_event == BACKEND_EVENT {
            if let Some(tx) = vrings.get(TX_QUEUE).filter(|v| Self::vring_ready(v)) {
                let notify = {
                    let mut state = tx.get_mut();
                    self.device
                        .process_tx(state.get_queue_mut(), &*mem)
                        .map_err(io::Error::other)?
                };
                if notify {
                    tx.signal_used_queue()?;
                }
            }
        }
        // Everything may have produced packets for the guest; an rx kick brings buffers.
        if self.device.has_pending_rx() {
            if let Some(rx) = vrings.get(RX_QUEUE).filter(|v| Self::vring_ready(v)) {
                let notify = {
                    let mut state = rx.get_mut();
                    self.device
                        .process_rx(state.get_queue_mut(), &*mem)
                        .map_err(io::Error::other)?
                };
                if notify {
                    rx.signal_used_queue()?;
                }
            }
        }
        Ok(())
    }
}

impl VhostUserBackendMut for VhostUserVsockBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        VsockDevice::device_features()
            | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG
    }

    fn reset_device(&mut self) {
        self.device.reset();
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // The vrings' queues track it; the device uses their notification helpers.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut buf = vec![0u8; size as usize];
        self.device.read_config(u64::from(offset), &mut buf);
        buf
    }

    /// Lets the daemon stop the vring worker when it is dropped (after the frontend left);
    /// without it the drop would wait for the worker forever.
    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(pair) => Some(pair),
            Err(e) => {
                warn!("vsock: no exit event for the vring worker ({e}); it stops with the process");
                None
            }
        }
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if !evset.contains(EventSet::IN) {
            warn!("vsock: unexpected event set {evset:?} for event {device_event}");
            return Ok(());
        }
        if device_event == EVENT_QUEUE as u16 {
            // The event queue only carries TRANSPORT_RESET, which we never send.
            return Ok(());
        }
        self.process(device_event, vrings)
    }
}

/// Binds the vhost-user socket `socket`, replacing a stale file left by an earlier run.
/// Separate from [`serve`] so that a caller can confine itself (seccomp) in between: once
/// both sockets are bound, serving opens nothing.
pub fn listen(socket: &str) -> Result<Listener, VhostUserVsockError> {
    let err = |error| VhostUserVsockError::Listen {
        path: socket.to_string(),
        error,
    };
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(err(e)),
        _ => {}
    }
    // A listener made from a std one does not unlink its path when dropped: that would be
    // unlink(2) under kata-vsock's seccomp filter. The socket file stays until its directory
    // is removed, or the next bind replaces it.
    let listener = std::os::unix::net::UnixListener::bind(socket).map_err(err)?;
    Ok(Listener::from(listener))
}

/// Serves `device` to the one frontend that connects to `listener`, until it disconnects.
/// The vhost-user threads start here, so they inherit whatever filter the caller installed.
pub fn serve(device: VsockDevice, mut listener: Listener) -> Result<(), VhostUserVsockError> {
    let muxer_fd = device.as_raw_fd();
    let backend = Arc::new(RwLock::new(VhostUserVsockBackend::new(device)));
    let mut daemon = VhostUserDaemon::new(
        "kata-vsock".into(),
        backend,
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(VhostUserVsockError::Daemon)?;
    let handlers = daemon.get_epoll_handlers();
    let worker = handlers.first().ok_or(VhostUserVsockError::NoWorker)?;
    worker
        .register_listener(muxer_fd, EventSet::IN, u64::from(BACKEND_EVENT))
        .map_err(VhostUserVsockError::RegisterMuxer)?;
    daemon
        .start(&mut listener)
        .map_err(|error| VhostUserVsockError::Serve { error })?;
    // A frontend that goes away, cleanly or in the middle of a message, ends the service
    // (as VhostUserDaemon::serve treats it); the process exits right after, which also
    // ends the vring worker.
    match daemon.wait() {
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => Ok(()),
        Err(error) => Err(VhostUserVsockError::Serve { error }),
    }
}
