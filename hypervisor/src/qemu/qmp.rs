//! Just enough QMP to know that QEMU is up: its greeting arrives once machine setup
//! (kernel loading, vhost-user handshakes) is done and the main loop runs.

use std::path::Path;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;

/// What reading the greeting found.
pub(crate) enum Greeting {
    /// QEMU answered: it is running the guest.
    Ready,
    /// Nothing to read yet (socket missing or refused); try again.
    NotYet,
    /// The connection closed without a greeting: QEMU is going away.
    Closed,
}

/// Connects to the QMP socket and reads one line. The caller bounds the wait with a
/// timeout and checks the QEMU pid between attempts.
pub(crate) async fn read_greeting(socket: &Path) -> Greeting {
    let Ok(stream) = UnixStream::connect(socket).await else {
        return Greeting::NotYet;
    };
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line).await {
        Ok(n) if n > 0 && line.contains("\"QMP\"") => Greeting::Ready,
        _ => Greeting::Closed,
    }
}
