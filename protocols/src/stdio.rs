//! Direct stdio streams: each stdio stream of a container process is its own vsock
//! connection to the agent's [`STDIO_VSOCK_PORT`](crate::STDIO_VSOCK_PORT), so output
//! travels as plain bytes, with no request per chunk.
//!
//! The host opens a connection and writes one request line naming the stream:
//!
//! ```text
//! stdout <container-id>\n              the init process's stdout
//! stderr <container-id> <exec-id>\n    an exec'd process's stderr
//! stdin <container-id> <exec-id>\n
//! ```
//!
//! The agent answers `OK\n` or `ERR <reason>\n` (and closes). After `OK`:
//! - an output stream carries the process's bytes until the process's pipe (or terminal)
//!   reaches end of file; the agent then closes the connection, which the host reads as
//!   the end of the stream once it has every byte;
//! - stdin carries the host's bytes to the process until the host shuts down its sending
//!   side (or closes), which closes the process's stdin (a terminal gets `^D` instead: it
//!   has no half-close).
//!
//! A stream is attached at most once. A stream nobody attaches is not read: the process
//! blocks once its pipe is full, as with any pipe, so the host attaches every output
//! stream of every process it starts, even one it discards. When the process is removed,
//! its attached connections are closed.

use std::fmt;

/// The longest request line accepted, newline included: two ids of containerd's
/// longest (76 characters) fit many times over.
pub const MAX_REQUEST_LINE: usize = 512;

/// The agent's answer to a request it serves.
pub const OK_LINE: &str = "OK\n";

/// Which stdio stream of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StdioStream {
    Stdin,
    Stdout,
    Stderr,
}

impl StdioStream {
    pub fn name(self) -> &'static str {
        match self {
            StdioStream::Stdin => "stdin",
            StdioStream::Stdout => "stdout",
            StdioStream::Stderr => "stderr",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "stdin" => Some(StdioStream::Stdin),
            "stdout" => Some(StdioStream::Stdout),
            "stderr" => Some(StdioStream::Stderr),
            _ => None,
        }
    }
}

impl fmt::Display for StdioStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request for one stream of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StdioRequest {
    pub container_id: String,
    /// Empty for the container's init process.
    pub exec_id: String,
    pub stream: StdioStream,
}

/// Why a request line or an answer line was not understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StdioProtocolError(pub String);

impl fmt::Display for StdioProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StdioProtocolError {}

impl StdioRequest {
    /// The request line, newline included. Errors when an id could not be read back
    /// (empty container id, whitespace or control characters, too long).
    pub fn line(&self) -> Result<String, StdioProtocolError> {
        let mut line = format!("{} {}", self.stream, self.container_id);
        if !self.exec_id.is_empty() {
            line.push(' ');
            line.push_str(&self.exec_id);
        }
        line.push('\n');
        match StdioRequest::parse(&line) {
            Ok(back) if back == *self => Ok(line),
            Ok(_) => Err(StdioProtocolError(format!(
                "the ids of {self:?} cannot be written on a stdio request line"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Parses a request line (with or without its newline).
    pub fn parse(line: &str) -> Result<Self, StdioProtocolError> {
        let bad = |why: &str| {
            StdioProtocolError(format!(
                "{why} in the stdio request {:?}; expected \"<stdin|stdout|stderr> \
                 <container-id> [<exec-id>]\"",
                line.trim_end()
            ))
        };
        if line.len() > MAX_REQUEST_LINE {
            return Err(bad(&format!("more than {MAX_REQUEST_LINE} bytes")));
        }
        let text = line.strip_suffix('\n').unwrap_or(line);
        if text.chars().any(|c| c.is_control()) {
            return Err(bad("control characters"));
        }
        let words: Vec<&str> = text.split(' ').collect();
        let (stream, container_id, exec_id) = match words.as_slice() {
            [stream, cid] => (stream, cid, ""),
            [stream, cid, exec] => (stream, cid, *exec),
            _ => return Err(bad("not two or three words")),
        };
        let stream = StdioStream::from_name(stream).ok_or_else(|| bad("an unknown stream"))?;
        if container_id.is_empty() {
            return Err(bad("an empty container id"));
        }
        if words.len() == 3 && exec_id.is_empty() {
            return Err(bad("an empty exec id"));
        }
        Ok(StdioRequest {
            container_id: container_id.to_string(),
            exec_id: exec_id.to_string(),
            stream,
        })
    }
}

/// How messages name a process: the empty `exec_id` is the container's init process.
pub fn process_name(container_id: &str, exec_id: &str) -> String {
    if exec_id.is_empty() {
        format!("the init process of container {container_id}")
    } else {
        format!("process {exec_id} of container {container_id}")
    }
}

/// The answer line refusing a request, newline included.
pub fn err_line(reason: &str) -> String {
    // One line: the reason must not end the answer early.
    let reason: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("ERR {reason}\n")
}

/// Reads an answer line (with or without its newline): `Ok` for `OK`, the agent's
/// reason for `ERR`.
pub fn parse_answer(line: &str) -> Result<(), StdioProtocolError> {
    let text = line.strip_suffix('\n').unwrap_or(line);
    if text == OK_LINE.trim_end() {
        return Ok(());
    }
    match text.strip_prefix("ERR ") {
        Some(reason) => Err(StdioProtocolError(reason.to_string())),
        None => Err(StdioProtocolError(format!(
            "the agent answered {text:?} to a stdio request (expected OK or ERR <reason>)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cid: &str, exec: &str, stream: StdioStream) -> StdioRequest {
        StdioRequest {
            container_id: cid.into(),
            exec_id: exec.into(),
            stream,
        }
    }

    #[test]
    fn lines_name_the_stream_the_container_and_the_exec() {
        let init = req("c1", "", StdioStream::Stdout);
        assert_eq!(init.line().unwrap(), "stdout c1\n");
        let exec = req("c1", "e.2-x", StdioStream::Stdin);
        assert_eq!(exec.line().unwrap(), "stdin c1 e.2-x\n");
        for r in [init, exec, req("c", "x", StdioStream::Stderr)] {
            assert_eq!(StdioRequest::parse(&r.line().unwrap()).unwrap(), r);
        }
        assert_eq!(
            StdioRequest::parse("stderr abc").unwrap(),
            req("abc", "", StdioStream::Stderr)
        );
    }

    #[test]
    fn bad_requests_say_what_was_wrong() {
        for (line, why) in [
            ("stdout\n", "not two or three words"),
            ("stdout a b c\n", "not two or three words"),
            ("stdio c1\n", "an unknown stream"),
            ("Stdout c1\n", "an unknown stream"),
            ("stdout  c1\n", "an empty container id"),
            ("stdout c1 \n", "an empty exec id"),
            ("stdout c1\r\n", "control characters"),
            ("stdout c\t1\n", "control characters"),
        ] {
            let err = StdioRequest::parse(line).unwrap_err().to_string();
            assert!(err.contains(why), "{line:?}: {err}");
            assert!(err.contains("<stdin|stdout|stderr>"), "{err}");
        }
        let long = format!("stdout {}\n", "x".repeat(MAX_REQUEST_LINE));
        assert!(StdioRequest::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("more than 512 bytes"));
    }

    #[test]
    fn ids_that_cannot_be_written_are_refused_before_sending() {
        for r in [
            req("", "", StdioStream::Stdout),
            req("a b", "", StdioStream::Stdout),
            req("a", "x y", StdioStream::Stdout),
            req("a\n", "", StdioStream::Stdout),
        ] {
            assert!(r.line().is_err(), "{r:?}");
        }
    }

    #[test]
    fn answers_are_ok_or_a_reason() {
        assert_eq!(parse_answer(OK_LINE), Ok(()));
        assert_eq!(parse_answer("OK"), Ok(()));
        let line = err_line("no process e1 in container c1\nreally");
        assert_eq!(line, "ERR no process e1 in container c1 really\n");
        assert_eq!(
            parse_answer(&line).unwrap_err().0,
            "no process e1 in container c1 really"
        );
        assert!(parse_answer("HELLO\n")
            .unwrap_err()
            .0
            .contains("expected OK or ERR"));
    }
}
