//! The Kubernetes streaming protocol over WebSocket, client side, as containerd's CRI
//! stream server speaks it for Exec, Attach and PortForward (the URL the CRI call answers).
//!
//! Framing (`channel.k8s.io`, binary): every WebSocket message starts with one byte, the
//! channel, followed by that channel's data. Exec and attach: 0 stdin, 1 stdout, 2 stderr,
//! 3 error (with the `v4.` protocol, a JSON `metav1.Status` telling how the process ended),
//! 4 resize (JSON `{"Width":W,"Height":H}`); the server opens with an empty message on the
//! lowest writable channel. Port-forward (`?port=N`): per port a data channel (2i) and an
//! error channel (2i+1); the first message on each carries the port as 2 little-endian
//! bytes. Version 4 has no way to close stdin alone: closing the WebSocket ends it all.
//!
//! We always ask for `v4.channel.k8s.io`: containerd's server takes it for all three
//! (port-forward over WebSocket accepts "", `v4.channel.k8s.io` and
//! `v4.base64.channel.k8s.io`; `portforward.k8s.io` names the SPDY flavour).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use super::{CriClient, CriError};

/// The subprotocol we speak for exec, attach and port-forward: binary channel framing,
/// version 4 (exit status as JSON on the error channel).
pub const CHANNEL_PROTOCOL: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// What the server sent so far, message by message per channel, and whether (and why)
/// the connection ended.
#[derive(Default)]
struct Received {
    frames: BTreeMap<u8, Vec<Vec<u8>>>,
    /// `Some` once the connection ended: the close reason or the error ("" for a clean
    /// close without reason).
    closed: Option<String>,
}

impl Received {
    fn channel(&self, ch: u8, skip: usize) -> Vec<u8> {
        self.frames
            .get(&ch)
            .map(|f| f.iter().skip(skip).flatten().copied().collect())
            .unwrap_or_default()
    }
}

struct Shared {
    state: Mutex<Received>,
    changed: Condvar,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut Received)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
        self.changed.notify_all();
    }
}

/// One WebSocket to the stream server, read and written by tasks on the client's runtime.
struct ChannelConn {
    shared: Arc<Shared>,
    outgoing: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    url: String,
}

impl ChannelConn {
    fn open(client: &CriClient, url: &str) -> Result<Self, CriError> {
        let ws_url = match url.split_once("://") {
            Some(("http", rest)) => format!("ws://{rest}"),
            Some(("ws", _)) => url.to_string(),
            _ => {
                return Err(CriError::Stream(format!(
                    "unsupported stream URL {url:?} (expected http://, the stream server \
                     without TLS)"
                )))
            }
        };
        let mut request = ws_url
            .as_str()
            .into_client_request()
            .map_err(|e| CriError::Stream(format!("{url}: {e}")))?;
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static(CHANNEL_PROTOCOL),
        );
        let rt = client.runtime();
        let (ws, response) = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                tokio_tungstenite::connect_async(request),
            )
            .await
            .map_err(|_| CriError::Stream(format!("{url}: no WebSocket handshake within 30s")))?
            .map_err(|e| CriError::Stream(format!("{url}: {e}")))
        })?;
        let negotiated = response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if negotiated != CHANNEL_PROTOCOL {
            return Err(CriError::Stream(format!(
                "{url}: the server chose subprotocol {negotiated:?}, not {CHANNEL_PROTOCOL}"
            )));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(Received::default()),
            changed: Condvar::new(),
        });
        let (mut sink, mut stream) = ws.split();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
        let writer = rt.spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
            // The test closed the session: a Close frame ends the exec's stdin (and the
            // whole session) on the server.
            let _ = sink.close().await;
        });
        let sink_state = shared.clone();
        let reader = rt.spawn(async move {
            let end = loop {
                match stream.next().await {
                    Some(Ok(Message::Binary(b))) => {
                        if let Some((&ch, data)) = b.split_first() {
                            let data = data.to_vec();
                            sink_state.update(|s| s.frames.entry(ch).or_default().push(data));
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        break frame.map(|f| f.reason.to_string()).unwrap_or_default();
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("connection error: {e}"),
                    None => break String::new(),
                }
            };
            sink_state.update(|s| s.closed = Some(end));
        });
        Ok(ChannelConn {
            shared,
            outgoing: Some(tx),
            tasks: vec![writer, reader],
            url: url.to_string(),
        })
    }

    fn send(&self, ch: u8, data: &[u8]) -> Result<(), CriError> {
        let mut frame = Vec::with_capacity(data.len() + 1);
        frame.push(ch);
        frame.extend_from_slice(data);
        self.outgoing
            .as_ref()
            .ok_or_else(|| CriError::Stream(format!("{}: session closed", self.url)))?
            .send(Message::binary(frame))
            .map_err(|_| CriError::Stream(format!("{}: the connection has ended", self.url)))
    }

    /// Waits up to `limit` until `f` gives a value from what was received.
    fn wait_for<T>(&self, limit: Duration, mut f: impl FnMut(&Received) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + limit;
        let mut state = self.shared.state.lock().ok()?;
        loop {
            if let Some(v) = f(&state) {
                return Some(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .ok()?
                .0;
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Received) -> T) -> Option<T> {
        self.shared.state.lock().ok().map(|s| f(&s))
    }

    /// Sends a Close frame; the server ends the session.
    fn close(&mut self) {
        self.outgoing = None;
    }
}

impl Drop for ChannelConn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How an exec ended, from the v4 status on the error channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecStatus {
    /// The exit code (0 for `"status": "Success"`).
    pub exit_code: i32,
    /// The status JSON as sent.
    pub raw: String,
}

/// A live exec or attach session (see [`CriClient::exec_stream`]).
pub struct ExecStream {
    conn: ChannelConn,
}

impl ExecStream {
    pub(crate) fn open(client: &CriClient, url: &str) -> Result<Self, CriError> {
        Ok(ExecStream {
            conn: ChannelConn::open(client, url)?,
        })
    }

    /// Writes `data` to the process's stdin (the session must have asked for stdin).
    pub fn write_stdin(&self, data: &[u8]) -> Result<(), CriError> {
        self.conn.send(STDIN, data)
    }

    /// Tells a TTY session the terminal's size.
    pub fn resize(&self, width: u16, height: u16) -> Result<(), CriError> {
        let json = format!("{{\"Width\":{width},\"Height\":{height}}}");
        self.conn.send(RESIZE, json.as_bytes())
    }

    /// Everything received on stdout so far.
    pub fn stdout(&self) -> Vec<u8> {
        self.conn.with(|r| r.channel(STDOUT, 0)).unwrap_or_default()
    }

    /// Everything received on stderr so far.
    pub fn stderr(&self) -> Vec<u8> {
        self.conn.with(|r| r.channel(STDERR, 0)).unwrap_or_default()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout()).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr()).into_owned()
    }

    /// Waits up to `limit` until stdout contains `needle`.
    pub fn wait_stdout(&self, needle: &str, limit: Duration) -> bool {
        self.conn
            .wait_for(limit, |r| {
                String::from_utf8_lossy(&r.channel(STDOUT, 0))
                    .contains(needle)
                    .then_some(())
            })
            .is_some()
    }

    /// Whether the server has ended the session.
    pub fn is_closed(&self) -> bool {
        self.conn.with(|r| r.closed.is_some()).unwrap_or(true)
    }

    /// Closes the session from our side (the process's stdin ends with it).
    pub fn close(&mut self) {
        self.conn.close();
    }

    /// Waits up to `limit` for the session to end and reads the exit status it reported.
    pub fn finish(&self, limit: Duration) -> Result<ExecStatus, CriError> {
        let ended = self
            .conn
            .wait_for(limit, |r| r.closed.clone())
            .ok_or_else(|| {
                CriError::Stream(format!(
                    "the session did not end within {:.0}s; stdout so far: {:?}",
                    limit.as_secs_f64(),
                    self.stdout_text()
                ))
            })?;
        let raw = self
            .conn
            .with(|r| String::from_utf8_lossy(&r.channel(ERROR, 0)).into_owned())
            .unwrap_or_default();
        if raw.trim().is_empty() {
            return Err(CriError::Stream(format!(
                "the session ended ({ended:?}) without a status on the error channel"
            )));
        }
        parse_status(&raw).map(|exit_code| ExecStatus { exit_code, raw })
    }
}

/// The exit code a v4 `metav1.Status` reports: 0 for Success, the `ExitCode` cause's
/// number for a non-zero exit; an error for any other failure (its message).
pub fn parse_status(raw: &str) -> Result<i32, CriError> {
    let v: serde_json::Value = serde_json::from_str(raw.trim())
        .map_err(|e| CriError::Stream(format!("bad status JSON {raw:?}: {e}")))?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    let code = v["details"]["causes"].as_array().and_then(|causes| {
        causes
            .iter()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.trim().parse::<i32>().ok())
    });
    code.ok_or_else(|| {
        CriError::Stream(format!(
            "the exec failed: {}",
            v["message"].as_str().unwrap_or(raw)
        ))
    })
}

/// A live port-forward of one port (see [`CriClient::port_forward_stream`]): bytes sent go
/// to `localhost:PORT` in the pod, its answer comes back; the server ends the session when
/// the pod side closes the connection.
pub struct PortForwardStream {
    conn: ChannelConn,
    port: u16,
}

const PF_DATA: u8 = 0;
const PF_ERROR: u8 = 1;

impl PortForwardStream {
    pub(crate) fn open(client: &CriClient, url: &str, port: u16) -> Result<Self, CriError> {
        let sep = if url.contains('?') { '&' } else { '?' };
        let conn = ChannelConn::open(client, &format!("{url}{sep}port={port}"))?;
        let s = PortForwardStream { conn, port };
        // Each channel opens with the port, 2 bytes little-endian.
        for ch in [PF_DATA, PF_ERROR] {
            let first = s
                .conn
                .wait_for(Duration::from_secs(30), |r| {
                    r.frames.get(&ch).and_then(|f| f.first().cloned())
                })
                .ok_or_else(|| {
                    CriError::Stream(format!("no port header on channel {ch} within 30s"))
                })?;
            if first != port.to_le_bytes() {
                return Err(CriError::Stream(format!(
                    "channel {ch} opened with {first:?}, not port {port} as 2 little-endian bytes"
                )));
            }
        }
        Ok(s)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends `data` to the pod's port.
    pub fn send(&self, data: &[u8]) -> Result<(), CriError> {
        self.conn.send(PF_DATA, data)
    }

    /// What the pod's port sent so far.
    pub fn data(&self) -> Vec<u8> {
        self.conn
            .with(|r| r.channel(PF_DATA, 1))
            .unwrap_or_default()
    }

    /// What the server reported on the error channel (why the forward failed).
    pub fn error_text(&self) -> String {
        self.conn
            .with(|r| String::from_utf8_lossy(&r.channel(PF_ERROR, 1)).into_owned())
            .unwrap_or_default()
    }

    /// Waits up to `limit` until the data received contains `needle`.
    pub fn wait_data(&self, needle: &str, limit: Duration) -> bool {
        self.conn
            .wait_for(limit, |r| {
                String::from_utf8_lossy(&r.channel(PF_DATA, 1))
                    .contains(needle)
                    .then_some(())
            })
            .is_some()
    }

    /// Waits up to `limit` for the session to end; the data and the error text received.
    pub fn finish(&self, limit: Duration) -> Result<(Vec<u8>, String), CriError> {
        self.conn
            .wait_for(limit, |r| r.closed.clone())
            .ok_or_else(|| {
                CriError::Stream(format!(
                    "the port-forward did not end within {:.0}s; data so far: {:?}",
                    limit.as_secs_f64(),
                    String::from_utf8_lossy(&self.data())
                ))
            })?;
        Ok((self.data(), self.error_text()))
    }

    /// Closes the session from our side.
    pub fn close(&mut self) {
        self.conn.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_status_gives_the_exit_code() {
        assert_eq!(
            parse_status(r#"{"metadata":{},"status":"Success"}"#).ok(),
            Some(0)
        );
        let failure = r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 5], exit code 5","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"5"}]}}"#;
        assert_eq!(parse_status(failure).ok(), Some(5));
        let other = r#"{"metadata":{},"status":"Failure","message":"container not running"}"#;
        let err = parse_status(other).expect_err("a failure without exit code is an error");
        assert!(err.message().contains("container not running"), "{err}");
    }

    #[test]
    fn received_frames_are_joined_per_channel() {
        let mut r = Received::default();
        r.frames
            .insert(1, vec![vec![], b"ab".to_vec(), b"c".to_vec()]);
        r.frames.insert(2, vec![b"x".to_vec()]);
        assert_eq!(r.channel(1, 0), b"abc");
        assert_eq!(r.channel(1, 2), b"c");
        assert_eq!(r.channel(2, 0), b"x");
        assert!(r.channel(3, 0).is_empty());
    }
}
