//! The main thread's wait: for the VM's exit event, or for a stop signal (SIGTERM, SIGINT,
//! SIGHUP), which are blocked in every thread and read from a signalfd.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use vmm_sys_util::eventfd::EventFd;

use crate::error::{os_err, VmmError};

/// What woke the main thread.
pub enum Wake {
    /// The exit event fired.
    Exit,
    /// A stop signal arrived (its number).
    Signal(u32),
    /// Nothing happened within the timeout.
    Timeout,
}

/// SIGTERM, SIGINT and SIGHUP, blocked in every thread and read from a signalfd.
pub struct StopSignals {
    fd: File,
}

impl StopSignals {
    /// Blocks the stop signals in the calling thread (and the threads it starts later).
    pub fn block() -> Result<Self, VmmError> {
        // SAFETY: the sigset is initialised by sigemptyset before use; the masks and the
        // signalfd are set up with checked return values.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(os_err("block stop signals")(std::io::Error::last_os_error()));
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            if fd < 0 {
                return Err(os_err("create a signalfd")(std::io::Error::last_os_error()));
            }
            Ok(StopSignals {
                fd: File::from_raw_fd(fd),
            })
        }
    }

    /// Waits up to `timeout_ms` for `exit` or a stop signal.
    pub fn wait(&self, exit: &EventFd, timeout_ms: i32) -> Result<Wake, VmmError> {
        let mut fds = [
            libc::pollfd {
                fd: exit.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(Wake::Timeout);
            }
            return Err(os_err("wait for the VM")(e));
        }
        if fds[0].revents != 0 {
            return Ok(Wake::Exit);
        }
        if fds[1].revents != 0 {
            let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
            use std::io::Read;
            (&self.fd)
                .read_exact(&mut info)
                .map_err(os_err("read the signalfd"))?;
            let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
            return Ok(Wake::Signal(signo));
        }
        Ok(Wake::Timeout)
    }
}
