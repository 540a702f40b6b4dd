//! The pod's network inside the guest.
//!
//! On the host, CNI gave the pod's network namespace a veth with addresses, routes and
//! perhaps static neighbours; the shim copied each veth's MAC to one virtio-net NIC of the
//! VM and sends here what it found (`CreateSandboxRequest`). This module makes the guest's
//! network the same, over rtnetlink: each NIC, found by MAC, gets the pod's name, MTU and
//! addresses and goes up (a NIC the VM had before its pod, a pooled VM's, is found by its
//! `current_mac` and first takes the pod's MAC); `lo` goes up; then the routes and
//! neighbours are added. The containers share this (the guest's) network namespace, so
//! they see the pod's network.
//!
//! Re-applying the same request is harmless: an address, route or neighbour that exists
//! already is left alone.

use std::collections::HashMap;
use std::net::IpAddr;

use futures::TryStreamExt;
use protocols::agent::{Interface, Neighbor, Route};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::neighbour::NeighbourState;
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

/// Why the pod's network could not be set up in the guest.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("{what} {value:?} of {owner} is not valid: {why}")]
    Invalid {
        what: &'static str,
        value: String,
        owner: String,
        why: String,
    },
    #[error(
        "no network interface of the guest has MAC {mac} (wanted for {name}); the guest's \
         interfaces are: {present}"
    )]
    NoSuchNic {
        mac: String,
        name: String,
        present: String,
    },
    #[error("route to {destination}: device {device:?} is none of the pod's interfaces ({known})")]
    UnknownDevice {
        destination: String,
        device: String,
        known: String,
    },
    #[error("failed to open a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("failed to {action}: {source}")]
    Netlink {
        action: String,
        #[source]
        source: rtnetlink::Error,
    },
}

impl NetworkError {
    fn invalid(what: &'static str, value: &str, owner: &str, why: impl Into<String>) -> Self {
        NetworkError::Invalid {
            what,
            value: value.to_string(),
            owner: owner.to_string(),
            why: why.into(),
        }
    }
}

fn netlink(action: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetworkError {
    let action = action.into();
    move |source| NetworkError::Netlink { action, source }
}

/// Whether netlink refused because the object exists already.
fn exists(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m)
        if m.code.map(|c| c.get()) == Some(-libc::EEXIST))
}

/// "aa:bb:cc:dd:ee:ff" → six bytes.
pub fn parse_mac(text: &str, owner: &str) -> Result<[u8; 6], NetworkError> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 {
        return Err(NetworkError::invalid(
            "MAC address",
            text,
            owner,
            "expected six hex bytes separated by ':'",
        ));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|_| {
            NetworkError::invalid(
                "MAC address",
                text,
                owner,
                format!("{part:?} is not a hex byte"),
            )
        })?;
    }
    Ok(mac)
}

fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// "10.88.0.5/16" → (address, prefix length).
pub fn parse_cidr(text: &str, owner: &str) -> Result<(IpAddr, u8), NetworkError> {
    let (addr, len) = text.split_once('/').ok_or_else(|| {
        NetworkError::invalid("address", text, owner, "expected ADDRESS/PREFIX_LENGTH")
    })?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|e| NetworkError::invalid("address", text, owner, format!("{e}")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len: u8 = len.parse().ok().filter(|l| *l <= max).ok_or_else(|| {
        NetworkError::invalid(
            "address",
            text,
            owner,
            format!("the prefix length must be 0 to {max}"),
        )
    })?;
    Ok((addr, len))
}

fn parse_ip(text: &str, what: &'static str, owner: &str) -> Result<IpAddr, NetworkError> {
    text.parse()
        .map_err(|e| NetworkError::invalid(what, text, owner, format!("{e}")))
}

/// Applies the pod's network to the guest's network namespace.
pub async fn configure(
    interfaces: &[Interface],
    routes: &[Route],
    neighbors: &[Neighbor],
) -> Result<(), NetworkError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(NetworkError::Socket)?;
    let conn = tokio::spawn(connection);
    let result = Netlink { handle }
        .configure(interfaces, routes, neighbors)
        .await;
    conn.abort();
    result
}

struct Netlink {
    handle: Handle,
}

impl Netlink {
    async fn configure(
        &self,
        interfaces: &[Interface],
        routes: &[Route],
        neighbors: &[Neighbor],
    ) -> Result<(), NetworkError> {
        let links = self.links().await?;
        if let Some(lo) = links.iter().find(|l| l.name == "lo") {
            self.set(LinkUnspec::new_with_index(lo.index).up(), "bring lo up")
                .await?;
        }
        // Each NIC by MAC (its current one when it is to change), checked before
        // anything changes.
        let mut wanted = Vec::new();
        for nic in interfaces {
            let mac = parse_mac(&nic.mac, &nic.name)?;
            let current = if nic.current_mac.is_empty() {
                mac
            } else {
                parse_mac(&nic.current_mac, &nic.name)?
            };
            for a in &nic.addresses {
                parse_cidr(a, &nic.name)?;
            }
            // By the current MAC, or by the pod's once it has it (the same request again).
            let link = links
                .iter()
                .find(|l| l.mac == current)
                .or_else(|| links.iter().find(|l| l.mac == mac))
                .ok_or_else(|| NetworkError::NoSuchNic {
                    mac: if nic.current_mac.is_empty() {
                        nic.mac.clone()
                    } else {
                        format!("{} or {}", nic.current_mac, nic.mac)
                    },
                    name: nic.name.clone(),
                    present: links
                        .iter()
                        .map(|l| format!("{} ({})", l.name, format_mac(&l.mac)))
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            let new_mac = (link.mac != mac).then_some(mac);
            wanted.push((nic, link.index, new_mac));
        }
        // Renamed in two rounds (to a temporary name, then to the pod's), so that two
        // NICs may swap names (the pod's eth1 on the guest's eth0). A NIC that is to
        // take the pod's MAC takes it here, while down, before any address is on it.
        for (i, (nic, index, new_mac)) in wanted.iter().enumerate() {
            let mut link = LinkUnspec::new_with_index(*index)
                .down()
                .name(format!("kata-nic{i}"));
            if let Some(mac) = new_mac {
                link = link.address(mac.to_vec());
            }
            self.set(
                link,
                format!(
                    "rename the NIC of {} ({}) and set its MAC",
                    nic.name, nic.mac
                ),
            )
            .await?;
        }
        let wanted: Vec<(&Interface, u32)> = wanted.into_iter().map(|(n, i, _)| (n, i)).collect();
        let mut devices = HashMap::new();
        for (nic, index) in &wanted {
            let mut link = LinkUnspec::new_with_index(*index).name(nic.name.clone());
            if nic.mtu > 0 {
                link = link.mtu(nic.mtu);
            }
            self.set(
                link,
                format!("name the NIC {} and set its MTU {}", nic.name, nic.mtu),
            )
            .await?;
            for a in &nic.addresses {
                let (addr, len) = parse_cidr(a, &nic.name)?;
                match self.handle.address().add(*index, addr, len).execute().await {
                    Err(e) if !exists(&e) => {
                        return Err(netlink(format!("add address {a} to {}", nic.name))(e))
                    }
                    _ => {}
                }
            }
            self.set(
                LinkUnspec::new_with_index(*index).up(),
                format!("bring {} up", nic.name),
            )
            .await?;
            devices.insert(nic.name.as_str(), *index);
        }
        for route in routes {
            self.add_route(route, &devices).await?;
        }
        for n in neighbors {
            self.add_neighbor(n, &devices).await?;
        }
        Ok(())
    }

    async fn set(
        &self,
        link: rtnetlink::LinkMessageBuilder<LinkUnspec>,
        action: impl Into<String>,
    ) -> Result<(), NetworkError> {
        self.handle
            .link()
            .set(link.build())
            .execute()
            .await
            .map_err(netlink(action))
    }

    async fn links(&self) -> Result<Vec<Link>, NetworkError> {
        let mut out = Vec::new();
        let mut stream = self.handle.link().get().execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(netlink("list the guest's NICs"))?
        {
            out.push(Link::from(&msg));
        }
        Ok(out)
    }

    async fn add_route(&self, r: &Route, devices: &HashMap<&str, u32>) -> Result<(), NetworkError> {
        let what = if r.destination.is_empty() {
            "default".to_string()
        } else {
            r.destination.clone()
        };
        let index = *devices
            .get(r.device.as_str())
            .ok_or_else(|| NetworkError::UnknownDevice {
                destination: what.clone(),
                device: r.device.clone(),
                known: devices.keys().copied().collect::<Vec<_>>().join(", "),
            })?;
        let owner = format!("the route to {what}");
        let bad = |field: &'static str, value: &str| {
            let (value, owner) = (value.to_string(), owner.clone());
            move |e| NetworkError::invalid(field, &value, &owner, route_message_error(e))
        };
        let destination = match r.destination.as_str() {
            "" => None,
            d => Some(parse_cidr(d, &owner)?),
        };
        let gateway = match r.gateway.as_str() {
            "" => None,
            g => Some(parse_ip(g, "gateway", &owner)?),
        };
        let source = match r.source.as_str() {
            "" => None,
            s => Some(parse_ip(s, "source", &owner)?),
        };
        // The family comes from whichever address the route has (IPv4 when none does,
        // as for "default dev eth0"); the builder checks the others against it.
        let v6 = destination
            .map(|(a, _)| a)
            .or(gateway)
            .or(source)
            .is_some_and(|a| a.is_ipv6());
        let mut b = RouteMessageBuilder::<IpAddr>::new();
        b.get_mut().header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        if let Some((addr, len)) = destination {
            b = b
                .destination_prefix(addr, len)
                .map_err(bad("destination", &r.destination))?;
        }
        if let Some(gw) = gateway {
            b = b.gateway(gw).map_err(bad("gateway", &r.gateway))?;
        }
        if let Some(src) = source {
            b = b.pref_source(src).map_err(bad("source", &r.source))?;
        }
        b = b
            .output_interface(index)
            .scope(RouteScope::from(u8::try_from(r.scope).unwrap_or(0)));
        if r.metric > 0 {
            b = b.priority(r.metric);
        }
        let msg = b.build();
        match self.handle.route().add(msg).execute().await {
            Err(e) if !exists(&e) => Err(netlink(format!(
                "add {owner} via {:?} dev {}",
                r.gateway, r.device
            ))(e)),
            _ => Ok(()),
        }
    }

    async fn add_neighbor(
        &self,
        n: &Neighbor,
        devices: &HashMap<&str, u32>,
    ) -> Result<(), NetworkError> {
        let owner = format!("the neighbour {}", n.ip);
        let index = *devices
            .get(n.device.as_str())
            .ok_or_else(|| NetworkError::UnknownDevice {
                destination: n.ip.clone(),
                device: n.device.clone(),
                known: devices.keys().copied().collect::<Vec<_>>().join(", "),
            })?;
        let ip = parse_ip(&n.ip, "address", &owner)?;
        let mac = parse_mac(&n.mac, &owner)?;
        match self
            .handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .state(NeighbourState::Permanent)
            .execute()
            .await
        {
            Err(e) if !exists(&e) => Err(netlink(format!(
                "add {owner} ({}) on {}",
                n.mac, n.device
            ))(e)),
            _ => Ok(()),
        }
    }
}

/// rtnetlink's route builder error, whose type it does not export.
fn route_message_error(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// What this module needs of a guest link.
struct Link {
    index: u32,
    name: String,
    mac: Vec<u8>,
}

impl From<&LinkMessage> for Link {
    fn from(msg: &LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: Vec::new(),
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) => link.mac = a.clone(),
                _ => {}
            }
        }
        link
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_mac("0a:58:0A:f4:00:05", "eth0").expect("a MAC"),
            [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x05]
        );
        let e = parse_mac("0a:58:0a:f4:00", "eth0").expect_err("five bytes");
        assert!(e.to_string().contains("six hex bytes"), "{e}");
        let e = parse_mac("0a:58:0a:f4:00:zz", "eth0").expect_err("not hex");
        assert!(e.to_string().contains("\"zz\" is not a hex byte"), "{e}");
        assert!(e.to_string().contains("of eth0"), "{e}");
    }

    #[test]
    fn cidrs_parse_with_their_family_limit() {
        assert_eq!(
            parse_cidr("10.88.0.5/16", "eth0").expect("v4"),
            ("10.88.0.5".parse().expect("ip"), 16)
        );
        assert_eq!(
            parse_cidr("fd00::5/64", "eth0").expect("v6"),
            ("fd00::5".parse().expect("ip"), 64)
        );
        for bad in [
            "10.88.0.5",
            "10.88.0.5/33",
            "fd00::5/129",
            "x/8",
            "10.0.0.1/-1",
        ] {
            let e = parse_cidr(bad, "eth0").expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}

/// `configure` against the real kernel, in a network namespace of the test's own with
/// veths standing for the VM's virtio-net ones. Needs root and iproute2.
#[cfg(test)]
mod netns_tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsFd;
    use std::process::Command;

    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }

    fn ip(args: &[&str]) -> String {
        let out = Command::new("ip").args(args).output().expect("running ip");
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A NIC `name` with `mac` in `ns` (a veth, whose other end `peer` stays there too).
    fn nic(ns: &str, name: &str, mac: &str, peer: &str) {
        let link = [
            "link", "add", name, "address", mac, "type", "veth", "peer", "name", peer,
        ];
        ip(&[&["-n", ns][..], &link[..]].concat());
    }

    /// Runs `configure` inside the namespace `ns`.
    fn configure_in(
        ns: &str,
        interfaces: Vec<Interface>,
        routes: Vec<Route>,
        neighbors: Vec<Neighbor>,
    ) -> Result<(), NetworkError> {
        let file = File::open(format!("/var/run/netns/{ns}")).expect("open the netns");
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the netns");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(configure(&interfaces, &routes, &neighbors))
        })
        .join()
        .expect("configure thread")
    }

    #[test]
    fn nics_found_by_mac_get_the_pods_names_addresses_routes_and_neighbours() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "guest network tests need root"
        );
        let ns = Netns(format!("kata-agent-net-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        // The VM's NICs as the guest kernel names them: eth0 has the pod's eth1 MAC and
        // eth1 the pod's eth0 MAC, so the names must swap.
        nic(&ns.0, "eth0", "02:00:00:00:00:02", "p0");
        nic(&ns.0, "eth1", "02:00:00:00:00:01", "p1");
        let interfaces = vec![
            Interface {
                mac: "02:00:00:00:00:01".into(),
                name: "eth0".into(),
                mtu: 1400,
                addresses: vec!["10.88.0.5/16".into()],
                ..Default::default()
            },
            Interface {
                mac: "02:00:00:00:00:02".into(),
                name: "eth1".into(),
                mtu: 1500,
                addresses: vec!["192.168.7.3/24".into()],
                ..Default::default()
            },
        ];
        let routes = vec![
            Route {
                destination: "172.16.0.0/12".into(),
                device: "eth1".into(),
                scope: 253,
                ..Default::default()
            },
            Route {
                gateway: "10.88.0.1".into(),
                device: "eth0".into(),
                ..Default::default()
            },
        ];
        let neighbors = vec![Neighbor {
            ip: "10.88.0.9".into(),
            mac: "02:00:00:00:00:09".into(),
            device: "eth0".into(),
            ..Default::default()
        }];
        configure_in(&ns.0, interfaces.clone(), routes.clone(), neighbors.clone())
            .expect("configure");

        let eth0 = ip(&["-n", &ns.0, "-o", "link", "show", "eth0"]);
        assert!(
            eth0.contains("02:00:00:00:00:01") && eth0.contains("mtu 1400"),
            "{eth0}"
        );
        assert!(eth0.contains(",UP"), "{eth0}");
        let eth1 = ip(&["-n", &ns.0, "-o", "link", "show", "eth1"]);
        assert!(eth1.contains("02:00:00:00:00:02"), "{eth1}");
        let lo = ip(&["-n", &ns.0, "-o", "link", "show", "lo"]);
        assert!(lo.contains(",UP"), "{lo}");
        let addrs = ip(&["-n", &ns.0, "-o", "-4", "addr", "show"]);
        assert!(addrs.contains("eth0    inet 10.88.0.5/16"), "{addrs}");
        assert!(addrs.contains("eth1    inet 192.168.7.3/24"), "{addrs}");
        let table = ip(&["-n", &ns.0, "route", "show"]);
        assert!(table.contains("default via 10.88.0.1 dev eth0"), "{table}");
        assert!(
            table.contains("172.16.0.0/12 dev eth1 proto static scope link"),
            "{table}"
        );
        let neigh = ip(&["-n", &ns.0, "neigh", "show"]);
        assert!(
            neigh.contains("10.88.0.9 dev eth0 lladdr 02:00:00:00:00:09 PERMANENT"),
            "{neigh}"
        );

        // Applying the same again changes nothing and fails nothing.
        configure_in(&ns.0, interfaces, routes, neighbors).expect("configure again");
    }

    #[test]
    fn a_nic_found_by_its_current_mac_takes_the_pods_mac_before_its_addresses() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "guest network tests need root"
        );
        let ns = Netns(format!("kata-agent-remac-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        // A pooled VM's NIC: booted with a MAC of its own, before the pod existed.
        nic(&ns.0, "eth0", "02:aa:00:00:00:01", "p0");
        configure_in(
            &ns.0,
            vec![Interface {
                mac: "0a:58:0a:58:00:05".into(),
                current_mac: "02:aa:00:00:00:01".into(),
                name: "eth0".into(),
                addresses: vec!["10.88.0.5/16".into()],
                ..Default::default()
            }],
            Vec::new(),
            Vec::new(),
        )
        .expect("configure");
        let eth0 = ip(&["-n", &ns.0, "-o", "link", "show", "eth0"]);
        assert!(eth0.contains("link/ether 0a:58:0a:58:00:05"), "{eth0}");
        let addrs = ip(&["-n", &ns.0, "-o", "-4", "addr", "show"]);
        assert!(addrs.contains("eth0    inet 10.88.0.5/16"), "{addrs}");

        // The same request again finds the NIC by the MAC it has now.
        let again = Interface {
            mac: "0a:58:0a:58:00:05".into(),
            current_mac: "02:aa:00:00:00:01".into(),
            name: "eth0".into(),
            ..Default::default()
        };
        configure_in(&ns.0, vec![again.clone()], Vec::new(), Vec::new()).expect("again");

        // Neither MAC on any NIC: an error naming both.
        let e = configure_in(
            &ns.0,
            vec![Interface {
                mac: "0a:58:0a:58:00:06".into(),
                ..again
            }],
            Vec::new(),
            Vec::new(),
        )
        .expect_err("no NIC has either MAC");
        assert!(
            e.to_string()
                .contains("MAC 02:aa:00:00:00:01 or 0a:58:0a:58:00:06"),
            "{e}"
        );
    }

    #[test]
    fn a_mac_no_nic_has_is_an_error_naming_the_nics() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "guest network tests need root"
        );
        let ns = Netns(format!("kata-agent-nonic-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        nic(&ns.0, "eth0", "02:00:00:00:00:02", "p0");
        let e = configure_in(
            &ns.0,
            vec![Interface {
                mac: "02:00:00:00:00:07".into(),
                name: "eth0".into(),
                ..Default::default()
            }],
            Vec::new(),
            Vec::new(),
        )
        .expect_err("no such NIC");
        let text = e.to_string();
        assert!(text.contains("MAC 02:00:00:00:00:07"), "{text}");
        assert!(text.contains("eth0 (02:00:00:00:00:02)"), "{text}");
    }
}
