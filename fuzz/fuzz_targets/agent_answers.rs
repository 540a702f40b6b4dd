//! The shim's reading of what the guest sends it: the answer to the hybrid vsock
//! `CONNECT` and the port forwarder's answer to a port (agent-client/src/client.rs), the
//! agent's stdio answer line (protocols::stdio), and the agent's ttrpc answers to every
//! request kind the shim makes, decoded by the same generated client the shim uses.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::Arbitrary;
use agent_client as agent;
use kata_fuzz::scratch_dir;
use libfuzzer_sys::fuzz_target;
use protobuf::{EnumOrUnknown, Message, MessageField};
use protocols::agent::*;
use protocols::agent_ttrpc::AgentServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Call {
    Check,
    CreateContainer,
    ExecProcess,
    SignalProcess,
    WaitProcess,
    ListProcesses,
    StatsContainer,
    GetOomEvent,
    DestroySandbox,
}

/// One ttrpc frame from the agent: either raw bytes, or a header and a `Response` with the
/// fuzzer's payload (the encoded answer message), so that decoding the answer itself is
/// reached as often as framing.
#[derive(Arbitrary, Debug)]
enum Frame {
    Raw(Vec<u8>),
    Response {
        /// `None`: the stream id of the shim's request (1).
        stream_id: Option<u32>,
        /// `None`: a response.
        msg_type: Option<u8>,
        flags: u8,
        /// `None`: the real length.
        len: Option<u32>,
        status: Option<(i32, String)>,
        payload: Vec<u8>,
    },
}

impl Frame {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Frame::Raw(b) => b.clone(),
            Frame::Response {
                stream_id,
                msg_type,
                flags,
                len,
                status,
                payload,
            } => {
                let mut resp = ttrpc::Response::new();
                if let Some((code, message)) = status {
                    let mut s = ttrpc::Status::new();
                    s.code = EnumOrUnknown::from_i32(*code);
                    s.message = message.clone();
                    resp.status = MessageField::some(s);
                }
                resp.payload = payload.clone();
                let body = resp.write_to_bytes().unwrap_or_default();
                let mut out = Vec::with_capacity(10 + body.len());
                out.extend_from_slice(&len.unwrap_or(body.len() as u32).to_be_bytes());
                out.extend_from_slice(&stream_id.unwrap_or(1).to_be_bytes());
                out.push(msg_type.unwrap_or(ttrpc::proto::MESSAGE_TYPE_RESPONSE));
                out.push(*flags);
                out.extend_from_slice(&body);
                out
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    handshake_answer: Vec<u8>,
    port_forward_answer: Vec<u8>,
    stdio_answer: String,
    call: Call,
    frames: Vec<Frame>,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("cannot build a tokio runtime for the fuzz target: {e}"),
        }
    })
}

/// Serves one connection on `stream`: sends `answer`, then reads until the shim hangs up.
async fn guest(mut stream: UnixStream, answer: Vec<u8>) {
    let _ = stream.write_all(&answer).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// The line the shim reads (at most `max` bytes, up to and with a newline), and whether it
/// is an `OK` (in any case when `any_case`).
fn answer_line(answer: &[u8], max: usize, any_case: bool) -> (usize, bool) {
    let end = answer
        .iter()
        .take(max)
        .position(|b| *b == b'\n')
        .map_or(answer.len().min(max), |i| i + 1);
    let line = String::from_utf8_lossy(&answer[..end]).into_owned();
    let ok = if any_case {
        line.to_ascii_uppercase().starts_with("OK")
    } else {
        line.starts_with("OK")
    };
    (end, ok)
}

/// What is left on `stream` for the connection once the answer was read.
async fn rest(stream: &mut UnixStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    out
}

async fn port_forward(answer: &[u8]) {
    let Ok((mut shim_end, guest_end)) = UnixStream::pair() else {
        return;
    };
    let (end, expect_ok) = answer_line(answer, 512, false);
    let server = tokio::spawn(guest(guest_end, answer.to_vec()));
    let r = agent::port_forward_answer(&mut shim_end, 8080).await;
    assert_eq!(r.is_ok(), expect_ok, "{r:?}");
    if r.is_ok() {
        // Every byte after the answer line is the forwarded connection's.
        assert_eq!(rest(&mut shim_end).await, answer[end..]);
    }
    drop(shim_end);
    let _ = server.await;
}

async fn handshake(answer: &[u8]) {
    let socket = scratch_dir().join("hybrid.sock");
    let _ = std::fs::remove_file(&socket);
    let Ok(listener) = UnixListener::bind(&socket) else {
        return;
    };
    let (end, expect_ok) = answer_line(answer, 4096, true);
    let tail = answer[end..].to_vec();
    let answer = answer.to_vec();
    let server = tokio::spawn(async move {
        if let Ok((stream, _)) = listener.accept().await {
            guest(stream, answer).await;
        }
    });
    let r = agent::hybrid_vsock_connect(&socket, protocols::AGENT_VSOCK_PORT).await;
    assert_eq!(r.is_ok(), expect_ok, "{r:?}");
    if let Ok(mut stream) = r {
        // Every byte after the `OK` line is the agent's.
        assert_eq!(rest(&mut stream).await, tail);
    }
    let _ = server.await;
}

async fn rpc(call: Call, answer: Vec<u8>) {
    let Ok((shim_end, guest_end)) = UnixStream::pair() else {
        return;
    };
    let server = tokio::spawn(guest(guest_end, answer));
    // As the shim's KataAgent::over builds it.
    let client = AgentServiceClient::new(ttrpc::r#async::Client::new(
        ttrpc::r#async::transport::Socket::from(shim_end),
    ));
    let ctx = || ttrpc::context::with_timeout(0);
    let empty = Empty::new();
    let answered = async {
        match call {
            Call::Check => client.check(ctx(), &empty).await.map(|r| r.compute_size()),
            Call::CreateContainer => client
                .create_container(ctx(), &CreateContainerRequest::new())
                .await
                .map(|r| r.compute_size()),
            Call::ExecProcess => client
                .exec_process(ctx(), &ExecProcessRequest::new())
                .await
                .map(|r| r.compute_size()),
            Call::SignalProcess => client
                .signal_process(ctx(), &SignalProcessRequest::new())
                .await
                .map(|r| r.compute_size()),
            Call::WaitProcess => client
                .wait_process(ctx(), &ProcessRequest::new())
                .await
                .map(|r| r.status as u64),
            Call::ListProcesses => client
                .list_processes(ctx(), &ContainerRequest::new())
                .await
                .map(|r| r.pids.len() as u64),
            Call::StatsContainer => client
                .stats_container(ctx(), &ContainerRequest::new())
                .await
                .map(|r| r.memory_stat.len() as u64),
            Call::GetOomEvent => client
                .get_oom_event(ctx(), &empty)
                .await
                .map(|r| r.container_id.len() as u64),
            Call::DestroySandbox => client
                .destroy_sandbox(ctx(), &empty)
                .await
                .map(|r| r.compute_size()),
        }
    };
    // An answer that never comes is the shim's deadlines' business, not a parsing fault.
    let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
    drop(client);
    server.abort();
    let _ = server.await;
}

fuzz_target!(|input: Input| {
    // The stdio answer: OK exactly, or ERR with the agent's reason.
    match protocols::stdio::parse_answer(&input.stdio_answer) {
        Ok(()) => assert!(matches!(input.stdio_answer.as_str(), "OK" | "OK\n")),
        Err(e) => assert!(!e.0.is_empty() || input.stdio_answer.starts_with("ERR ")),
    }
    let answer: Vec<u8> = input.frames.iter().take(8).flat_map(Frame::bytes).collect();
    runtime().block_on(async {
        handshake(&input.handshake_answer).await;
        port_forward(&input.port_forward_answer).await;
        rpc(input.call, answer).await;
    });
});
