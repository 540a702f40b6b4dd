//! The hybrid vsock handshake (Firecracker's, which Kata uses), the host's side: connect
//! to the VMM's unix socket, send [`connect_line`], read one line; [`check_reply`] says
//! whether the guest accepted. After an accepted reply the stream is the guest port's.
//!
//! The shim and `kata-runtime` both speak it through these two functions; the VMM's side
//! (kata-vsock, kata-vmm) answers it in `vmm::vsock`. Read the reply byte by byte: what
//! follows its newline already belongs to the guest.

/// The longest reply line worth reading (`OK <host port>\n` is about 16 bytes).
pub const MAX_REPLY_LINE: usize = 4096;

/// What the host writes to ask for guest vsock `port`.
pub fn connect_line(port: u32) -> String {
    format!("CONNECT {port}\n")
}

/// Why a reply is not an acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The VMM side closed the connection without a line (nothing listens on the port,
    /// or the VMM is going away).
    Closed,
    /// It answered something other than `OK ...`.
    Answered(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Closed => f.write_str("closed the connection"),
            Refused::Answered(line) => write!(f, "answered {line:?}"),
        }
    }
}

/// `OK <host port>` (in either case) means the guest accepted.
pub fn check_reply(reply: &str) -> Result<(), Refused> {
    if reply.to_ascii_uppercase().starts_with("OK") {
        return Ok(());
    }
    match reply.trim_end() {
        "" => Err(Refused::Closed),
        other => Err(Refused::Answered(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_lines() {
        assert_eq!(connect_line(1024), "CONNECT 1024\n");
        assert_eq!(check_reply("OK 1073741824\n"), Ok(()));
        assert_eq!(check_reply("ok 5\n"), Ok(()));
        assert_eq!(check_reply(""), Err(Refused::Closed));
        assert_eq!(
            check_reply("ERR no listener\n"),
            Err(Refused::Answered("ERR no listener".into()))
        );
        assert_eq!(Refused::Answered("x".into()).to_string(), "answered \"x\"");
    }
}
