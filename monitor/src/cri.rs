//! The pods' CRI metadata (name, namespace, uid) by sandbox id, from ListPodSandbox on the
//! runtime endpoint: cached, refreshed when a sandbox the cache does not know appears
//! (at most once a second) and at least once a minute, so that pods come and go with it.

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::log::{debug, warning};

/// How long ListPodSandbox may take.
const CALL_LIMIT: Duration = Duration::from_secs(2);
/// The cache is refreshed at least this often.
const MAX_AGE: Duration = Duration::from_secs(60);
/// A sandbox the cache does not know triggers a refresh, at most this often.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// A pod's `PodSandboxMetadata`, as the `cri_*` labels carry it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodMeta>,
    last_attempt: Option<Instant>,
    last_success: Option<Instant>,
}

pub struct Cri {
    socket: PathBuf,
    channel: Channel,
    state: tokio::sync::Mutex<State>,
    pub calls: AtomicU64,
    pub failures: AtomicU64,
}

/// Checks that `socket` is a unix socket something listens on; the error says what is
/// wrong and what to do.
pub fn check_endpoint(socket: &Path) -> Result<(), String> {
    let shown = socket.display();
    let meta = std::fs::metadata(socket).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "the runtime endpoint {shown} does not exist: is containerd running? \
                 Give its CRI socket with --runtime-endpoint"
            )
        } else {
            format!("the runtime endpoint {shown}: {e}")
        }
    })?;
    if !meta.file_type().is_socket() {
        return Err(format!(
            "the runtime endpoint {shown} is not a unix socket: give containerd's CRI socket \
             with --runtime-endpoint"
        ));
    }
    std::os::unix::net::UnixStream::connect(socket).map_err(|e| {
        format!(
            "nothing answers on the runtime endpoint {shown} ({e}): is containerd running? \
             Give its CRI socket with --runtime-endpoint"
        )
    })?;
    Ok(())
}

impl Cri {
    /// A client of the CRI on `socket`; it connects on its first call (and reconnects
    /// after containerd restarts).
    pub fn new(socket: &Path) -> Result<Self, String> {
        let path = socket.to_path_buf();
        // The URI is required by tonic but unused: the connector dials the socket.
        let endpoint = Endpoint::try_from("http://[::1]:50051")
            .map_err(|e| format!("the CRI client: {e}"))?
            .connect_timeout(CALL_LIMIT);
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        Ok(Cri {
            socket: socket.to_path_buf(),
            channel: endpoint.connect_with_connector_lazy(connector),
            state: tokio::sync::Mutex::new(State::default()),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    async fn list(&self) -> Result<HashMap<String, PodMeta>, String> {
        let mut client = RuntimeServiceClient::new(self.channel.clone());
        let call = client.list_pod_sandbox(api::ListPodSandboxRequest { filter: None });
        let answer = tokio::time::timeout(CALL_LIMIT, call)
            .await
            .map_err(|_| format!("no answer within {}s", CALL_LIMIT.as_secs()))?
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
        Ok(answer
            .into_inner()
            .items
            .into_iter()
            .map(|pod| {
                let m = pod.metadata.unwrap_or_default();
                let meta = PodMeta {
                    name: m.name,
                    namespace: m.namespace,
                    uid: m.uid,
                };
                (pod.id, meta)
            })
            .collect())
    }

    /// The metadata of each of `ids` (empty for a sandbox the CRI does not know: one
    /// started by `ctr`, or when the CRI does not answer), refreshing the cache first if
    /// it does not know one of them or is old.
    pub async fn metadata(&self, ids: &[String]) -> HashMap<String, PodMeta> {
        if ids.is_empty() {
            return HashMap::new(); // no sandbox, no call
        }
        let mut state = self.state.lock().await;
        let now = Instant::now();
        let unknown = ids.iter().any(|id| !state.pods.contains_key(id));
        let stale = state
            .last_success
            .is_none_or(|t| now.duration_since(t) >= MAX_AGE);
        let may_retry = state
            .last_attempt
            .is_none_or(|t| now.duration_since(t) >= MIN_INTERVAL);
        if (unknown || stale) && may_retry {
            state.last_attempt = Some(now);
            self.calls.fetch_add(1, Ordering::Relaxed);
            match self.list().await {
                Ok(pods) => {
                    debug!("CRI: {} pod sandboxes", pods.len());
                    state.pods = pods;
                    state.last_success = Some(Instant::now());
                }
                Err(e) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    warning!(
                        "ListPodSandbox on {} failed: {e}; the pods' cri_* labels stay as last known",
                        self.socket.display()
                    );
                }
            }
        }
        ids.iter()
            .map(|id| (id.clone(), state.pods.get(id).cloned().unwrap_or_default()))
            .collect()
    }
}
