//! The tc redirects between a pod's veth and its tap (Kata's tcfilter model): an ingress
//! qdisc on each, and on each a u32 filter that matches every frame and redirects it to
//! the other's egress (mirred). Removing the veth's ingress qdisc removes its filter; the
//! tap goes with its own.

use rtnetlink::Handle;

use super::{netlink, NetworkError};

/// `parent ffff:`, the ingress qdisc's handle.
const INGRESS_PARENT: u32 = 0xffff_0000;

/// `protocol all`, as tc carries it (network byte order).
fn protocol_all() -> u16 {
    (libc::ETH_P_ALL as u16).to_be()
}

/// Redirects every frame arriving on `a` out of `b`, and every frame arriving on `b` out
/// of `a`.
pub async fn redirect_both_ways(
    handle: &Handle,
    (a, a_name): (u32, &str),
    (b, b_name): (u32, &str),
) -> Result<(), NetworkError> {
    for (from, from_name, to, to_name) in [(a, a_name, b, b_name), (b, b_name, a, a_name)] {
        let index = i32::try_from(from)
            .map_err(|_| NetworkError::Thread(format!("interface index {from} out of range")))?;
        handle
            .qdisc()
            .add(index)
            .ingress()
            .execute()
            .await
            .map_err(netlink(format!("add an ingress qdisc to {from_name}")))?;
        handle
            .traffic_filter(index)
            .add()
            .parent(INGRESS_PARENT)
            .protocol(protocol_all())
            .redirect(to)
            .map_err(netlink(format!(
                "build the redirect from {from_name} to {to_name}"
            )))?
            .execute()
            .await
            .map_err(netlink(format!("redirect {from_name} to {to_name}")))?;
    }
    Ok(())
}

/// Removes `index`'s ingress qdisc and with it the redirect; no qdisc is fine.
pub async fn remove_redirect(handle: &Handle, index: u32, name: &str) -> Result<(), NetworkError> {
    let Ok(index) = i32::try_from(index) else {
        return Ok(());
    };
    let mut del = handle.qdisc().del(index);
    del.message_mut().header.parent = rtnetlink::packet_route::tc::TcHandle::INGRESS;
    match del.execute().await {
        Ok(()) => Ok(()),
        Err(e) if super::is_errno(&e, &[libc::ENOENT, libc::EINVAL, libc::ENODEV]) => Ok(()),
        Err(e) => Err(netlink(format!("remove the ingress qdisc of {name}"))(e)),
    }
}
