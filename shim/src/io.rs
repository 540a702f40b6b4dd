//! Relays a process's stdio between containerd's fifos on the host and the agent.
//!
//! Output is pulled with `ReadStdout`/`ReadStderr` long polls and written to the fifo;
//! the relay finishes only at the guest's end of stream, so the shim reports an exit
//! after every byte has been delivered. Input is read from the stdin fifo and pushed with
//! `WriteStdin`; end of file there (or CloseIO) becomes `CloseStdin` in the guest.

use std::sync::Arc;
use std::time::Duration;

use slog::{debug, warn, Logger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::agent::Agent;

/// The agent a relay talks to.
type AgentRef = Arc<dyn Agent>;

/// Bytes asked for per read request: large enough to amortise a round trip, well under
/// ttrpc's 4 MiB message limit (the agent reads its pipes in chunks of the same size).
const READ_CHUNK: u32 = protocols::STDIO_CHUNK as u32;
const WRITE_CHUNK: usize = 128 << 10;
/// Replies read ahead of the fifo: enough to keep one request in flight while writing.
const READS_AHEAD: usize = 1;

/// The fifo paths containerd gave for one process (empty = not wanted).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// The running relays of one process.
pub struct Relays {
    outputs: Vec<JoinHandle<()>>,
    stdin: Option<StdinRelay>,
}

struct StdinRelay {
    close: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Relays {
    /// Starts the relays for process `exec_id` of container `cid`.
    pub fn start(
        agent: &AgentRef,
        cid: &str,
        exec_id: &str,
        paths: &StdioPaths,
        log: &Logger,
    ) -> Self {
        let fifo = |p: &String| (!p.is_empty()).then(|| p.clone());
        let mut outputs = vec![spawn_output(
            agent,
            cid,
            exec_id,
            false,
            fifo(&paths.stdout),
            log,
        )];
        // A terminal merges stderr into stdout.
        if !paths.terminal {
            outputs.push(spawn_output(
                agent,
                cid,
                exec_id,
                true,
                fifo(&paths.stderr),
                log,
            ));
        }
        let stdin = (!paths.stdin.is_empty()).then(|| {
            let close = Arc::new(Notify::new());
            let task = spawn_input(agent, cid, exec_id, &paths.stdin, close.clone(), log);
            StdinRelay { close, task }
        });
        Relays { outputs, stdin }
    }

    /// Waits until every output stream has reached its end.
    pub async fn wait_outputs(&mut self) {
        for task in self.outputs.drain(..) {
            let _ = task.await;
        }
    }

    /// CloseIO: stop forwarding stdin and close it in the guest.
    pub fn close_stdin(&mut self) {
        if let Some(s) = &self.stdin {
            s.close.notify_one();
        }
    }

    /// Stops the stdin relay of a process that has exited.
    pub fn stop_stdin(&mut self) {
        if let Some(s) = self.stdin.take() {
            s.close.notify_one();
            s.task.abort();
        }
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.stop_stdin();
        for t in &self.outputs {
            t.abort();
        }
    }
}

/// Copies one output stream of the process to the fifo at `path`. Without a fifo (the
/// host does not want the stream) it is still read to its end, so the guest pipe never
/// fills up and blocks the process.
fn spawn_output(
    agent: &AgentRef,
    cid: &str,
    exec_id: &str,
    stderr: bool,
    path: Option<String>,
    log: &Logger,
) -> JoinHandle<()> {
    let (agent, cid, exec_id) = (agent.clone(), cid.to_string(), exec_id.to_string());
    let log = log.clone();
    tokio::spawn(async move {
        let name = if stderr { "stderr" } else { "stdout" };
        let mut fifo = match path {
            Some(path) => open_output_fifo(path, name, &log).await,
            None => None,
        };
        // The next read is in flight while a chunk is written to the fifo: the round trip
        // to the guest overlaps containerd's reading, and the guest never waits for it.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(READS_AHEAD);
        let reader = {
            let (log, cid, exec_id) = (log.clone(), cid.clone(), exec_id.clone());
            tokio::spawn(async move {
                loop {
                    match agent.read_stream(&cid, &exec_id, stderr, READ_CHUNK).await {
                        Ok(data) if data.is_empty() => break,
                        Ok(data) => {
                            if tx.send(data).await.is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            warn!(log, "reading {name} from the guest failed"; "container" => &cid, "exec" => &exec_id, "error" => %e);
                            break;
                        }
                    }
                }
            })
        };
        // If this relay is aborted (its process removed), the read ahead goes with it.
        let _reader_guard = AbortOnDrop(reader.abort_handle());
        let mut total: u64 = 0;
        while let Some(data) = rx.recv().await {
            total += data.len() as u64;
            if let Some(f) = fifo.as_mut() {
                // The fifo applies containerd's back-pressure to the guest.
                if let Err(e) = f.write_all(&data).await {
                    warn!(log, "{name} reader went away, discarding the rest"; "error" => %e);
                    fifo = None;
                }
            }
        }
        let _ = reader.await;
        debug!(log, "{name} relay done"; "container" => &cid, "exec" => &exec_id, "bytes" => total);
    })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long an output relay waits for containerd's reader of a fifo to appear. containerd
/// (and ctr) open their read ends before they create the task, so this only matters when
/// the reader went away, say a `ctr` that died after create.
const READER_WAIT: Duration = Duration::from_millis(500);

/// Opens an output fifo for writing, without blocking: a blocking open whose reader went
/// away would hold a thread forever and keep the shim from exiting. None (logged) when
/// it cannot be used, or nobody reads it: the output is then discarded.
async fn open_output_fifo(path: String, name: &str, log: &Logger) -> Option<pipe::Sender> {
    let deadline = tokio::time::Instant::now() + READER_WAIT;
    loop {
        match pipe::OpenOptions::new().open_sender(&path) {
            Ok(s) => return Some(s),
            // ENXIO: no reader (yet).
            Err(e)
                if e.raw_os_error() == Some(libc::ENXIO)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                warn!(log, "cannot open {name} fifo, output is discarded"; "path" => &path, "error" => %e);
                return None;
            }
        }
    }
}

fn spawn_input(
    agent: &AgentRef,
    cid: &str,
    exec_id: &str,
    path: &str,
    close: Arc<Notify>,
    log: &Logger,
) -> JoinHandle<()> {
    let (agent, cid, exec_id, path) = (
        agent.clone(),
        cid.to_string(),
        exec_id.to_string(),
        path.to_string(),
    );
    let log = log.clone();
    tokio::spawn(async move {
        // Opened without blocking: reads wait (in the reactor, not on a thread) until a
        // writer comes, and end once it has gone. A blocking open whose writer never
        // comes (a `ctr` that died, its fifo already removed) would hold a thread forever
        // and keep the shim from exiting.
        let mut fifo = match pipe::OpenOptions::new().open_receiver(&path) {
            Ok(r) => r,
            Err(e) => {
                warn!(log, "cannot open stdin fifo"; "path" => &path, "error" => %e);
                let _ = agent.close_stdin(&cid, &exec_id).await;
                return;
            }
        };
        let mut buf = vec![0u8; WRITE_CHUNK];
        loop {
            let n = tokio::select! {
                r = fifo.read(&mut buf) => r.unwrap_or(0),
                _ = close.notified() => 0,
            };
            if n == 0 {
                break;
            }
            if let Err(e) = agent.write_stdin(&cid, &exec_id, buf[..n].to_vec()).await {
                warn!(log, "writing stdin to the guest failed"; "error" => %e);
                return;
            }
        }
        if let Err(e) = agent.close_stdin(&cid, &exec_id).await {
            debug!(log, "closing stdin in the guest failed"; "error" => %e);
        }
    })
}
