//! Pod networking against the real kernel: a network namespace made the way CNI makes
//! one (a veth with an address, a default route and a static neighbour), wired, checked
//! by what crosses it, and unwired. Needs root and iproute2, as the shim itself does.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;

/// A network namespace with a veth `eth0` inside (10.250.N.2/24, peer 10.250.N.1 on the
/// host), removed with everything in it when dropped.
struct CniNetns {
    name: String,
    peer: String,
    subnet: u8,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_out(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("running ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tc_out(args: &[&str]) -> String {
    let out = Command::new("tc").args(args).output().expect("running tc");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl CniNetns {
    fn new(tag: u8) -> CniNetns {
        let pid = std::process::id();
        let ns = CniNetns {
            name: format!("kata-net-{pid}-{tag}"),
            peer: format!("kv{}{tag}", pid % 100_000),
            subnet: 200 + tag,
        };
        let s = ns.subnet;
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link", "add", &ns.peer, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        ip(&["addr", "add", &format!("10.250.{s}.1/24"), "dev", &ns.peer]);
        ip(&["link", "set", &ns.peer, "up"]);
        let n = ["-n", ns.name.as_str()];
        ip(&[&n[..], &["link", "set", "lo", "up"]].concat());
        ip(&[&n[..], &["link", "set", "eth0", "mtu", "1400", "up"]].concat());
        ip(&[
            &n[..],
            &["addr", "add", &format!("10.250.{s}.2/24"), "dev", "eth0"],
        ]
        .concat());
        ip(&[
            &n[..],
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("10.250.{s}.1"),
                "dev",
                "eth0",
            ],
        ]
        .concat());
        ip(&[
            &n[..],
            &[
                "neigh",
                "add",
                &format!("10.250.{s}.9"),
                "lladdr",
                "02:00:00:00:00:09",
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        ]
        .concat());
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    fn mac(&self) -> String {
        let text = ip_out(&["-n", &self.name, "-o", "link", "show", "eth0"]);
        let after = text.split("link/ether ").nth(1).expect("eth0 has a MAC");
        after.split_whitespace().next().expect("mac").to_string()
    }
}

impl Drop for CniNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.peer])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn a_cni_namespace_is_read_wired_and_unwired() {
    assert!(
        is_root(),
        "pod networking tests need root (as the shim does)"
    );
    let ns = CniNetns::new(1);
    let s = ns.subnet;
    let net = PodNetwork::setup(&ns.path()).await.expect("setup");

    // What the VM gets.
    let mac = ns.mac();
    assert_eq!(
        net.nics(),
        vec![NetDevice {
            tap: "tap0_kata".into(),
            mac: mac.clone()
        }]
    );
    let req = net.sandbox_request("web-1");
    assert_eq!(req.hostname, "web-1");
    assert_eq!(req.interfaces.len(), 1);
    let eth0 = &req.interfaces[0];
    assert_eq!(
        (eth0.name.as_str(), eth0.mac.as_str(), eth0.mtu),
        ("eth0", mac.as_str(), 1400)
    );
    assert_eq!(eth0.addresses, vec![format!("10.250.{s}.2/24")]);
    // The subnet route is the kernel's (the guest makes its own); the default route is
    // CNI's.
    assert_eq!(req.routes.len(), 1, "{:?}", req.routes);
    assert_eq!(req.routes[0].destination, "");
    assert_eq!(req.routes[0].gateway, format!("10.250.{s}.1"));
    assert_eq!(req.routes[0].device, "eth0");
    assert_eq!(req.neighbors.len(), 1, "{:?}", req.neighbors);
    assert_eq!(req.neighbors[0].ip, format!("10.250.{s}.9"));
    assert_eq!(req.neighbors[0].mac, "02:00:00:00:00:09");

    // The tap is up with the veth's MTU, and tc redirects both ways.
    let tap = ip_out(&["-n", &ns.name, "-o", "link", "show", "tap0_kata"]);
    assert!(tap.contains("mtu 1400") && tap.contains(",UP"), "{tap}");
    for (dev, to) in [("eth0", "tap0_kata"), ("tap0_kata", "eth0")] {
        let filters = tc_out(&["-n", &ns.name, "filter", "show", "dev", dev, "ingress"]);
        assert!(filters.contains("protocol all"), "{dev}: {filters}");
        assert!(
            filters.contains(&format!("Egress Redirect to device {to}")),
            "{dev}: {filters}"
        );
    }

    // A frame sent to the pod's address from the host arrives on the tap (where the VM
    // would read it): the ARP request for 10.250.N.2.
    let netns = ns.path();
    let reader = std::thread::spawn(move || {
        netns::run_in(&netns, || {
            let tun = OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .map_err(|e| NetworkError::Thread(e.to_string()))?;
            let mut req = [0u8; 40];
            req[..9].copy_from_slice(b"tap0_kata");
            let flags = (libc::IFF_TAP | libc::IFF_NO_PI) as u16;
            req[16..18].copy_from_slice(&flags.to_ne_bytes());
            let set = nix::request_code_write!(b'T', 202, std::mem::size_of::<libc::c_int>());
            // SAFETY: TUNSETIFF reads the 40-byte ifreq laid out in `req`.
            let rc =
                unsafe { libc::ioctl(tun.as_raw_fd(), set as libc::c_ulong, req.as_mut_ptr()) };
            assert!(
                rc >= 0,
                "attach to tap0_kata: {}",
                std::io::Error::last_os_error()
            );
            let mut tun = tun;
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut frame = [0u8; 2048];
            while Instant::now() < deadline {
                let n = tun
                    .read(&mut frame)
                    .map_err(|e| NetworkError::Thread(e.to_string()))?;
                // EtherType ARP (0x0806), target protocol address at offset 38.
                if n >= 42 && frame[12..14] == [0x08, 0x06] {
                    return Ok(frame[38..42].to_vec());
                }
            }
            Ok(Vec::new())
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    // Any traffic to the pod's address starts with ARP; the connection itself fails.
    let pod: std::net::SocketAddr = format!("10.250.{s}.2:80").parse().expect("address");
    let _ = std::net::TcpStream::connect_timeout(&pod, Duration::from_secs(2));
    let target = reader.join().expect("reader thread").expect("read the tap");
    assert_eq!(
        target,
        vec![10, 250, s, 2],
        "no ARP request for the pod reached the tap"
    );

    teardown(&net.state, 0).await.expect("teardown");
    assert!(
        !ip_out(&["-n", &ns.name, "link", "show"]).contains("tap0_kata"),
        "the tap is left"
    );
    let qdiscs = tc_out(&["-n", &ns.name, "qdisc", "show", "dev", "eth0"]);
    assert!(!qdiscs.contains("ingress"), "{qdiscs}");
    // Idempotent, also once the namespace is gone.
    teardown(&net.state, 0).await.expect("second teardown");
    drop(ns);
    teardown(&net.state, 0)
        .await
        .expect("teardown without a namespace");
}

#[tokio::test]
async fn a_namespace_without_interfaces_is_refused_and_left_as_it_was() {
    assert!(
        is_root(),
        "pod networking tests need root (as the shim does)"
    );
    let name = format!("kata-net-{}-empty", std::process::id());
    ip(&["netns", "add", &name]);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _del = Del(name.clone());
    let e = PodNetwork::setup(&PathBuf::from("/var/run/netns").join(&name))
        .await
        .expect_err("no interface");
    assert!(e.to_string().contains("no interface"), "{e}");
    assert!(!ip_out(&["-n", &name, "link", "show"]).contains("_kata"));

    let e = PodNetwork::setup(&PathBuf::from("/var/run/netns/no-such-netns"))
        .await
        .expect_err("missing netns");
    assert!(
        e.to_string().contains("/var/run/netns/no-such-netns"),
        "{e}"
    );
}

/// Attaches to tap `name` in the calling thread's namespace, as a VMM does (not blocking).
fn attach_tap(name: &str) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .expect("open /dev/net/tun");
    let mut req = [0u8; 40];
    req[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI) as u16;
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    let set = nix::request_code_write!(b'T', 202, std::mem::size_of::<libc::c_int>());
    // SAFETY: TUNSETIFF reads the 40-byte ifreq laid out in `req`.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), set as libc::c_ulong, req.as_mut_ptr()) };
    assert!(
        rc >= 0,
        "attach to {name}: {}",
        std::io::Error::last_os_error()
    );
    tun
}

#[tokio::test]
async fn a_pooled_vms_tap_moves_into_the_pod_and_its_vmm_reads_the_pod_traffic() {
    assert!(
        is_root(),
        "pod networking tests need root (as the shim does)"
    );
    let ns = CniNetns::new(3);
    let s = ns.subnet;
    // The pool's namespace, with the VM's tap, which its VMM holds open.
    let pool = format!("kata-pool-{}", std::process::id());
    ip(&["netns", "add", &pool]);
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _del = Del(pool.clone());
    let pool_path = PathBuf::from("/var/run/netns").join(&pool);
    let mut vmm = netns::run_in(&pool_path, || {
        tap::create_persistent("tap0_kata").map_err(|e| NetworkError::Thread(e.to_string()))?;
        Ok(attach_tap("tap0_kata"))
    })
    .expect("the pool's tap");

    let scan = PodScan::read(&ns.path()).await.expect("scan");
    assert_eq!(scan.interfaces(), 1);
    let net = PodNetwork::adopt(scan, &pool_path, "tap0_kata")
        .await
        .expect("adopt");
    assert!(!ip_out(&["-n", &pool, "link", "show"]).contains("tap0_kata"));
    let tap = ip_out(&["-n", &ns.name, "-o", "link", "show", "tap0_kata"]);
    assert!(tap.contains("mtu 1400") && tap.contains(",UP"), "{tap}");
    for (dev, to) in [("eth0", "tap0_kata"), ("tap0_kata", "eth0")] {
        let filters = tc_out(&["-n", &ns.name, "filter", "show", "dev", dev, "ingress"]);
        assert!(
            filters.contains(&format!("Egress Redirect to device {to}")),
            "{dev}: {filters}"
        );
    }
    // The guest finds its NIC by the MAC it was booted with and takes the veth's.
    let req = net.pooled_sandbox_request("web", "02:aa:00:00:00:01");
    assert_eq!(req.interfaces[0].mac, ns.mac());
    assert_eq!(req.interfaces[0].current_mac, "02:aa:00:00:00:01");
    assert_eq!(req.routes.len(), 1, "{:?}", req.routes);

    // The VMM's descriptor, opened before the move, reads what reaches the pod.
    let pod: std::net::SocketAddr = format!("10.250.{s}.2:80").parse().expect("address");
    let prober = std::thread::spawn(move || {
        let _ = std::net::TcpStream::connect_timeout(&pod, Duration::from_secs(2));
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut frame = [0u8; 2048];
    let mut target = Vec::new();
    while Instant::now() < deadline && target.is_empty() {
        match vmm.read(&mut frame) {
            // EtherType ARP (0x0806), target protocol address at offset 38.
            Ok(n) if n >= 42 && frame[12..14] == [0x08, 0x06] => target = frame[38..42].to_vec(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("reading the moved tap: {e}"),
        }
    }
    prober.join().expect("prober");
    assert_eq!(
        target,
        vec![10, 250, s, 2],
        "no ARP for the pod reached the VMM"
    );

    teardown(&net.state, 0).await.expect("teardown");
    assert!(!ip_out(&["-n", &ns.name, "link", "show"]).contains("tap0_kata"));
}

#[tokio::test]
async fn a_pod_with_two_interfaces_cannot_take_a_pooled_vm() {
    assert!(
        is_root(),
        "pod networking tests need root (as the shim does)"
    );
    let ns = CniNetns::new(4);
    ip(&[
        "-n", &ns.name, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p",
    ]);
    let scan = PodScan::read(&ns.path()).await.expect("scan");
    assert_eq!(scan.interfaces(), 3, "eth0, eth1 and its peer");
    let e = PodNetwork::adopt(scan, &ns.path(), "tap0_kata")
        .await
        .expect_err("more than one interface");
    assert!(e.to_string().contains("the pod has 3 interfaces"), "{e}");
    assert!(!ip_out(&["-n", &ns.name, "link", "show"]).contains("_kata"));
}
