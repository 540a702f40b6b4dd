//! Benchmark source for `make bench` (bench/): when the agent is PID 1 it also listens on
//! vsock port 1025 and, for each connection, writes zeros as fast as it can until the
//! peer closes. The host reads them through the sandbox's hybrid vsock socket
//! (`CONNECT 1025`) to measure the raw vsock ceiling of the VM, the channel container
//! stdout travels through. One plain thread per connection; no async, no new deps.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};

use nix::sys::socket::{
    accept4, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, VsockAddr,
};

pub const BENCH_SINK_PORT: u32 = 1025;

/// Starts the listener thread; failures are reported on stderr (the console) and ignored:
/// the agent's real work must never depend on this.
pub fn start() {
    let spawned = std::thread::Builder::new()
        .name("bench-sink".into())
        .spawn(|| {
            if let Err(e) = serve() {
                eprintln!("kata-agent: bench sink on vsock port {BENCH_SINK_PORT}: {e}");
            }
        });
    if let Err(e) = spawned {
        eprintln!("kata-agent: cannot start the bench sink thread: {e}");
    }
}

fn serve() -> nix::Result<()> {
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(
        fd.as_raw_fd(),
        &VsockAddr::new(libc::VMADDR_CID_ANY, BENCH_SINK_PORT),
    )?;
    listen(&fd, Backlog::new(4)?)?;
    loop {
        let conn = match accept4(fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(c) => c,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        let mut out = unsafe { File::from_raw_fd(conn) };
        let _ = std::thread::Builder::new()
            .name("bench-sink-conn".into())
            .spawn(move || {
                let zeros = vec![0u8; 64 * 1024];
                // Ends with EPIPE/ECONNRESET once the peer closes.
                while out.write_all(&zeros).is_ok() {}
            });
    }
}
