//! A pooled VM put on the pod's network (issue 30).
//!
//! A pooled VM was booted before its pod, with one NIC on a tap in a network namespace
//! of the pool's own. At claim, the pod's namespace is read first ([`PodScan::read`]):
//! only a pod with exactly one interface can take a pooled VM. The tap then moves into
//! the pod's namespace (rtnetlink, by namespace descriptor), where it is wired to the
//! pod's veth with the same tc redirects a cold start makes ([`PodNetwork::adopt`]). The
//! VMM keeps its descriptor of the tap, which moving does not close. The guest NIC still
//! has the pool's MAC: the agent finds it by that MAC and gives it the veth's
//! ([`PodNetwork::pooled_sandbox_request`]).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rtnetlink::LinkUnspec;

use super::{index_of, netlink, netns, scan, unwire, Endpoint, NetworkError, NetworkState};
use super::{PodNetwork, TAP_SUFFIX};

/// The pod's namespace as CNI left it, read before a pooled VM is claimed for it.
#[derive(Debug, Clone)]
pub struct PodScan {
    netns: PathBuf,
    scanned: scan::Scanned,
}

impl PodScan {
    /// Reads the pod's namespace `netns`.
    pub async fn read(netns: &Path) -> Result<PodScan, NetworkError> {
        let path = netns.to_path_buf();
        let scanned = tokio::task::spawn_blocking(move || {
            netns::with_netlink(
                &path,
                move |handle| async move { scan::scan(&handle).await },
            )
        })
        .await
        .map_err(|e| NetworkError::Thread(e.to_string()))??;
        Ok(PodScan {
            netns: netns.to_path_buf(),
            scanned,
        })
    }

    /// How many interfaces (with a MAC) the pod has.
    pub fn interfaces(&self) -> usize {
        self.scanned.links.len()
    }
}

impl PodNetwork {
    /// Moves the pooled VM's tap `tap` out of the pool's namespace `from` into the pod's
    /// and wires it to the pod's one interface, as [`PodNetwork::setup`] wires a tap of
    /// its own; the tap keeps its name, which is a cold start's (`tap0_kata`). All or
    /// nothing: on failure the tap is deleted (the pooled VM is of no use any more).
    pub async fn adopt(pod: PodScan, from: &Path, tap: &str) -> Result<PodNetwork, NetworkError> {
        let [link] = &pod.scanned.links[..] else {
            return Err(NetworkError::NoInterface(format!(
                "a pooled VM has one NIC and the pod has {} interfaces",
                pod.scanned.links.len()
            )));
        };
        if !tap.ends_with(TAP_SUFFIX) {
            return Err(NetworkError::NoInterface(format!(
                "the pooled VM's tap {tap} is not one of the shim's (*{TAP_SUFFIX})"
            )));
        }
        let target = File::open(&pod.netns).map_err(|source| NetworkError::Netns {
            path: pod.netns.clone(),
            source,
        })?;
        let (name, from_path) = (tap.to_string(), from.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let ns = from_path.clone();
            netns::with_netlink(&ns, |handle| async move {
                let index = index_of(&handle, &name).await?.ok_or_else(|| {
                    NetworkError::NoInterface(format!(
                        "the pooled VM's tap {name} is not in {}",
                        from_path.display()
                    ))
                })?;
                handle
                    .link()
                    .set(
                        LinkUnspec::new_with_index(index)
                            .setns_by_fd(target.as_raw_fd())
                            .build(),
                    )
                    .execute()
                    .await
                    .map_err(netlink(format!(
                        "move the pooled VM's tap {name} into the pod's namespace"
                    )))
            })
        })
        .await
        .map_err(|e| NetworkError::Thread(e.to_string()))??;

        let ep = Endpoint {
            veth: link.name.clone(),
            tap: tap.to_string(),
            mac: scan::format_mac(&link.mac),
            mtu: link.mtu,
            addresses: link.addresses.clone(),
        };
        let (wired, veth_index, veth_name) = (ep.clone(), link.index, link.name.clone());
        let path = pod.netns.clone();
        tokio::task::spawn_blocking(move || {
            netns::with_netlink(&path, move |handle| async move {
                let result = async {
                    let tap_index = index_of(&handle, &wired.tap).await?.ok_or_else(|| {
                        NetworkError::NoInterface(format!("tap {} vanished", wired.tap))
                    })?;
                    let mut up = LinkUnspec::new_with_index(tap_index).up();
                    if wired.mtu > 0 {
                        up = up.mtu(wired.mtu);
                    }
                    handle
                        .link()
                        .set(up.build())
                        .execute()
                        .await
                        .map_err(netlink(format!("bring {} up", wired.tap)))?;
                    super::tc::redirect_both_ways(
                        &handle,
                        (veth_index, &veth_name),
                        (tap_index, &wired.tap),
                    )
                    .await
                }
                .await;
                if result.is_err() {
                    let _ = unwire(&handle, &wired).await;
                }
                result
            })
        })
        .await
        .map_err(|e| NetworkError::Thread(e.to_string()))??;
        Ok(PodNetwork {
            state: NetworkState {
                netns: pod.netns,
                endpoints: vec![ep],
                port_forward: None,
            },
            routes: pod.scanned.routes,
            neighbors: pod.scanned.neighbors,
        })
    }

    /// [`PodNetwork::sandbox_request`] for a pooled VM whose one NIC has `pool_mac`: the
    /// agent finds the NIC by it and gives it the pod's MAC first.
    pub fn pooled_sandbox_request(
        &self,
        hostname: &str,
        pool_mac: &str,
    ) -> protocols::agent::CreateSandboxRequest {
        let mut request = self.sandbox_request(hostname);
        for nic in &mut request.interfaces {
            if !nic.mac.eq_ignore_ascii_case(pool_mac) {
                nic.current_mac = pool_mac.to_string();
            }
        }
        request
    }
}
