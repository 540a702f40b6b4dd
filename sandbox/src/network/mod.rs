//! Pod networking on the host, in Kata's tcfilter model.
//!
//! CNI leaves the pod's network namespace with a veth per interface, holding the pod's
//! addresses, routes and perhaps static neighbours. For each veth the shim makes a tap in
//! the same namespace (`tap<N>_kata`) and redirects every frame both ways between them
//! with tc: what arrives on the veth leaves through the tap into the VM, what the VM sends
//! leaves through the veth. The VM's NIC on the tap takes the veth's MAC, and the agent
//! gives it the veth's name, addresses and MTU, the routes and the neighbours
//! (`CreateSandboxRequest`), so the guest stands on the pod network where the pod would
//! have stood. The veth keeps its addresses: the host side looks as CNI left it.
//!
//! Files: [`netns`] runs code in the pod's namespace, `scan` reads what CNI made, `tap`
//! makes taps, `tc` the redirects, [`port_forward`] the host end of port-forward.
//! [`PodNetwork::setup`] is all or nothing; [`teardown`] undoes it from the persisted
//! [`NetworkState`] (also after a crashed shim) and is idempotent.

mod adopt;
mod command;
pub mod netns;
pub mod port_forward;
mod scan;
pub mod tap;
mod tc;

use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use hypervisor::NetDevice;
use protocols::agent::{CreateSandboxRequest, Interface, Neighbor, Route};
use rtnetlink::{Handle, LinkUnspec};
use serde::{Deserialize, Serialize};

pub use adopt::PodScan;
use scan::format_mac;

/// The shim's taps end with this (and only they do).
pub const TAP_SUFFIX: &str = "_kata";

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("cannot enter the pod's network namespace {}: {source}", path.display())]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open a netlink socket in the pod's network namespace: {0}")]
    Socket(#[source] std::io::Error),
    #[error("failed to {action} in the pod's network namespace: {source}")]
    Netlink {
        action: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("failed to make tap {tap} in the pod's network namespace: {source}")]
    Tap {
        tap: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the pod's network namespace has no interface for the VM: {0}")]
    NoInterface(String),
    #[error("{0}")]
    Thread(String),
}

fn netlink(action: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetworkError {
    let action = action.into();
    move |source| NetworkError::Netlink { action, source }
}

/// Whether netlink answered one of `errnos`.
fn is_errno(e: &rtnetlink::Error, errnos: &[i32]) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m)
        if m.code.is_some_and(|c| errnos.contains(&-c.get())))
}

/// One veth of the pod and the tap wired to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub veth: String,
    pub tap: String,
    /// The veth's MAC, which the VM's NIC takes.
    pub mac: String,
    pub mtu: u32,
    /// "10.88.0.5/16".
    pub addresses: Vec<String>,
}

/// What the sandbox changed in the pod's network namespace, persisted so that a crashed
/// shim's `delete` can undo it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkState {
    pub netns: PathBuf,
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub port_forward: Option<port_forward::Redirect>,
}

/// The pod's network as the VM gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodNetwork {
    pub state: NetworkState,
    routes: Vec<Route>,
    neighbors: Vec<Neighbor>,
}

impl PodNetwork {
    /// Reads the pod's namespace and wires a tap to each of its interfaces. All or
    /// nothing: on failure no tap or redirect is left.
    pub async fn setup(netns: &Path) -> Result<PodNetwork, NetworkError> {
        let path = netns.to_path_buf();
        let ns = path.clone();
        let (scanned, endpoints) = tokio::task::spawn_blocking(move || {
            netns::with_netlink(&ns, |handle| async move {
                let scanned = scan::scan(&handle).await?;
                if scanned.links.is_empty() {
                    return Err(NetworkError::NoInterface(
                        "CNI made no interface with a MAC address (only lo?)".into(),
                    ));
                }
                let mut endpoints = Vec::new();
                if let Err(e) = wire(&handle, &scanned, &mut endpoints).await {
                    for ep in &endpoints {
                        let _ = unwire(&handle, ep).await;
                    }
                    return Err(e);
                }
                Ok((scanned, endpoints))
            })
        })
        .await
        .map_err(|e| NetworkError::Thread(e.to_string()))??;
        Ok(PodNetwork {
            state: NetworkState {
                netns: path,
                endpoints,
                port_forward: None,
            },
            routes: scanned.routes,
            neighbors: scanned.neighbors,
        })
    }

    /// The VM's NICs, one per tap.
    pub fn nics(&self) -> Vec<NetDevice> {
        self.state
            .endpoints
            .iter()
            .map(|ep| NetDevice {
                tap: ep.tap.clone(),
                mac: ep.mac.clone(),
            })
            .collect()
    }

    /// What the agent needs to put the guest on the pod's network.
    pub fn sandbox_request(&self, hostname: &str) -> CreateSandboxRequest {
        CreateSandboxRequest {
            hostname: hostname.to_string(),
            interfaces: self
                .state
                .endpoints
                .iter()
                .map(|ep| Interface {
                    mac: ep.mac.clone(),
                    name: ep.veth.clone(),
                    mtu: ep.mtu,
                    addresses: ep.addresses.clone(),
                    ..Default::default()
                })
                .collect(),
            routes: self.routes.clone(),
            neighbors: self.neighbors.clone(),
            ..Default::default()
        }
    }
}

/// Makes and wires a tap per link, pushing each finished endpoint to `done`.
async fn wire(
    handle: &Handle,
    scanned: &scan::Scanned,
    done: &mut Vec<Endpoint>,
) -> Result<(), NetworkError> {
    for (i, link) in scanned.links.iter().enumerate() {
        let ep = Endpoint {
            veth: link.name.clone(),
            tap: format!("tap{i}{TAP_SUFFIX}"),
            mac: format_mac(&link.mac),
            mtu: link.mtu,
            addresses: link.addresses.clone(),
        };
        tap::create_persistent(&ep.tap).map_err(|source| NetworkError::Tap {
            tap: ep.tap.clone(),
            source,
        })?;
        // From here on, undo must remove the tap.
        done.push(ep.clone());
        let tap_index = index_of(handle, &ep.tap)
            .await?
            .ok_or_else(|| NetworkError::NoInterface(format!("tap {} vanished", ep.tap)))?;
        let mut up = LinkUnspec::new_with_index(tap_index).up();
        if link.mtu > 0 {
            up = up.mtu(link.mtu);
        }
        handle
            .link()
            .set(up.build())
            .execute()
            .await
            .map_err(netlink(format!("bring {} up", ep.tap)))?;
        tc::redirect_both_ways(handle, (link.index, &link.name), (tap_index, &ep.tap)).await?;
    }
    Ok(())
}

async fn index_of(handle: &Handle, name: &str) -> Result<Option<u32>, NetworkError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(link) => Ok(link.map(|l| l.header.index)),
        Err(e) if is_errno(&e, &[libc::ENODEV]) => Ok(None),
        Err(e) => Err(netlink(format!("look up {name}"))(e)),
    }
}

/// Removes the veth's redirect and the tap; what is gone already is fine.
async fn unwire(handle: &Handle, ep: &Endpoint) -> Result<(), NetworkError> {
    if let Some(veth) = index_of(handle, &ep.veth).await? {
        tc::remove_redirect(handle, veth, &ep.veth).await?;
    }
    if let Some(tap) = index_of(handle, &ep.tap).await? {
        match handle.link().del(tap).execute().await {
            Err(e) if !is_errno(&e, &[libc::ENODEV]) => {
                return Err(netlink(format!("delete {}", ep.tap))(e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where to reach the pod's namespace: its path, or, once containerd has removed that
/// (it may, while a dead shim's `delete` runs), the namespace of the VMM `vmm_pid`,
/// which runs in it. None: nothing reaches it any more, and it ends with everything in
/// it once its last user is gone.
fn reachable_netns(state: &NetworkState, vmm_pid: i32) -> Option<PathBuf> {
    if state.netns.exists() {
        return Some(state.netns.clone());
    }
    if vmm_pid <= 0 {
        return None;
    }
    let theirs = PathBuf::from(format!("/proc/{vmm_pid}/ns/net"));
    let inode = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
    };
    let (Some(vmm), Some(own)) = (inode(&theirs), inode(Path::new("/proc/self/ns/net"))) else {
        return None;
    };
    // A VMM in the host's namespace is not the pod's (or the pid was reused).
    (vmm != own).then_some(theirs)
}

/// Undoes what `state` records in the pod's namespace: port-forward redirect, tc
/// redirects, taps. `vmm_pid` (0: none) reaches the namespace once its path is gone.
pub async fn teardown(state: &NetworkState, vmm_pid: i32) -> Result<(), NetworkError> {
    let Some(ns) = reachable_netns(state, vmm_pid) else {
        return Ok(());
    };
    if let Some(redirect) = state.port_forward {
        port_forward::remove(&ns, redirect).await;
    }
    let endpoints = state.endpoints.clone();
    tokio::task::spawn_blocking(move || {
        netns::with_netlink(&ns, |handle| async move {
            let mut first_error = None;
            for ep in &endpoints {
                if let Err(e) = unwire(&handle, ep).await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    })
    .await
    .map_err(|e| NetworkError::Thread(e.to_string()))?
    .or_else(|e| match e {
        // Removed while we looked.
        NetworkError::Netns { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(())
        }
        e => Err(e),
    })
}

#[cfg(test)]
mod tests;
