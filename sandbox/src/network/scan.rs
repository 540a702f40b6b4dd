//! Reads what CNI made in the pod's network namespace: its interfaces (with a MAC), their
//! IPv4 addresses, the main table's routes through them and the static neighbours.
//!
//! Left out on purpose: `lo` and the shim's own taps; routes the guest kernel makes by
//! itself from an address (protocol `kernel`); IPv6 (the guest kernel has none).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use protocols::agent::{Neighbor, Route};
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteProtocol, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, RouteMessageBuilder};

use super::{netlink, NetworkError, TAP_SUFFIX};

/// An interface of the pod, as CNI left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    pub index: u32,
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// "10.88.0.5/16".
    pub addresses: Vec<String>,
}

/// Everything the guest needs to be on the pod's network.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scanned {
    pub links: Vec<PodLink>,
    /// Routes on the link first, then those through a gateway (which need the former).
    pub routes: Vec<Route>,
    pub neighbors: Vec<Neighbor>,
}

pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Reads the namespace `handle` is in.
pub async fn scan(handle: &Handle) -> Result<Scanned, NetworkError> {
    let mut links = Vec::new();
    let mut stream = handle.link().get().execute();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(netlink("list the pod's interfaces"))?
    {
        if msg.header.flags.contains(LinkFlags::Loopback) {
            continue;
        }
        let mut name = String::new();
        let mut mac = None;
        let mut mtu = 0;
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => name = n.clone(),
                LinkAttribute::Address(a) => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
                LinkAttribute::Mtu(m) => mtu = *m,
                _ => {}
            }
        }
        let Some(mac) = mac else { continue };
        if name.ends_with(TAP_SUFFIX) {
            continue;
        }
        links.push(PodLink {
            index: msg.header.index,
            name,
            mac,
            mtu,
            addresses: Vec::new(),
        });
    }
    links.sort_by_key(|l| l.index);
    let names: HashMap<u32, String> = links.iter().map(|l| (l.index, l.name.clone())).collect();

    let mut stream = handle.address().get().execute();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(netlink("list the pod's addresses"))?
    {
        if msg.header.family != AddressFamily::Inet {
            continue;
        }
        let Some(link) = links.iter_mut().find(|l| l.index == msg.header.index) else {
            continue;
        };
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = local.or_else(|| {
            msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            })
        });
        if let Some(ip) = address {
            link.addresses
                .push(format!("{ip}/{}", msg.header.prefix_len));
        }
    }

    let mut routes = Vec::new();
    let dump = RouteMessageBuilder::<Ipv4Addr>::new().build();
    let mut stream = handle.route().get(dump).execute();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(netlink("list the pod's routes"))?
    {
        if let Some(route) = route_of(&msg.header, &msg.attributes, &names) {
            routes.push(route);
        }
    }
    // Link routes first: a gateway must be reachable when its route is added.
    routes.sort_by_key(|r| !r.gateway.is_empty());

    let mut neighbors = Vec::new();
    let mut stream = handle
        .neighbours()
        .get()
        .set_address_family(AddressFamily::Inet)
        .execute();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(netlink("list the pod's neighbours"))?
    {
        if msg.header.state != NeighbourState::Permanent {
            continue;
        }
        let Some(device) = names.get(&msg.header.ifindex) else {
            continue;
        };
        let ip = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        let mac = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(m) if m.len() == 6 => Some(format_mac(m)),
            _ => None,
        });
        if let (Some(ip), Some(mac)) = (ip, mac) {
            neighbors.push(Neighbor {
                ip: ip.to_string(),
                mac,
                device: device.clone(),
                ..Default::default()
            });
        }
    }
    Ok(Scanned {
        links,
        routes,
        neighbors,
    })
}

/// The main table's unicast IPv4 route through one of the pod's links, unless the guest
/// kernel makes it by itself.
fn route_of(
    header: &RouteHeader,
    attributes: &[RouteAttribute],
    names: &HashMap<u32, String>,
) -> Option<Route> {
    let table = attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN)
        || header.kind != RouteType::Unicast
        || header.protocol == RouteProtocol::Kernel
    {
        return None;
    }
    let ip = |want: fn(&RouteAttribute) -> Option<&RouteAddress>| {
        attributes.iter().find_map(want).and_then(|a| match a {
            RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
            _ => None,
        })
    };
    let device = attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => names.get(i).cloned(),
        _ => None,
    })?;
    let destination = ip(|a| match a {
        RouteAttribute::Destination(d) => Some(d),
        _ => None,
    })
    .map(|d| format!("{d}/{}", header.destination_prefix_length))
    .unwrap_or_default();
    let gateway = ip(|a| match a {
        RouteAttribute::Gateway(g) => Some(g),
        _ => None,
    })
    .map(|g| g.to_string())
    .unwrap_or_default();
    let source = ip(|a| match a {
        RouteAttribute::PrefSource(s) => Some(s),
        _ => None,
    })
    .map(|s| s.to_string())
    .unwrap_or_default();
    let metric = attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Priority(p) => Some(*p),
            _ => None,
        })
        .unwrap_or(0);
    Some(Route {
        destination,
        gateway,
        device,
        source,
        scope: u8::from(header.scope).into(),
        metric,
        ..Default::default()
    })
}
