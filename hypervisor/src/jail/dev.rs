//! The private `/dev` of a confined child: a small read-only tmpfs with only the nodes it
//! uses, [`DevNode::BASIC`] and the ones asked for (`/dev/kvm`, `/dev/net/tun`, the
//! sandbox's uid's alone). Prepared in the parent ([`PrivateDev::new`]), made in the child
//! ([`PrivateDev::make`]).

use std::ffi::CString;
use std::io;
use std::os::unix::fs::MetadataExt;

use super::{cstring, sys};
use crate::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevNode {
    Null,
    Zero,
    Full,
    Random,
    Urandom,
    /// `/dev/kvm`, the sandbox's uid's alone.
    Kvm,
    /// `/dev/net/tun`, the sandbox's uid's alone (it attaches only to taps it owns).
    Tun,
}

impl DevNode {
    /// The nodes every confined process gets.
    pub const BASIC: [DevNode; 5] = [
        DevNode::Null,
        DevNode::Zero,
        DevNode::Full,
        DevNode::Random,
        DevNode::Urandom,
    ];

    fn host_path(self) -> &'static str {
        match self {
            DevNode::Null => "/dev/null",
            DevNode::Zero => "/dev/zero",
            DevNode::Full => "/dev/full",
            DevNode::Random => "/dev/random",
            DevNode::Urandom => "/dev/urandom",
            DevNode::Kvm => "/dev/kvm",
            DevNode::Tun => "/dev/net/tun",
        }
    }

    /// The sandbox's own, 0600; else everyone's, 0666 (as on the host).
    fn private(self) -> bool {
        matches!(self, DevNode::Kvm | DevNode::Tun)
    }
}

/// One node to make: path, mode, device number, whether the sandbox's uid owns it.
#[derive(Debug)]
struct Node {
    path: CString,
    mode: libc::mode_t,
    rdev: libc::dev_t,
    owned: bool,
}

/// The nodes of a private `/dev` and where it goes.
#[derive(Debug)]
pub(super) struct PrivateDev {
    nodes: Vec<Node>,
    dev_dir: CString,
    /// `/dev/net`, when `/dev/net/tun` is one of the nodes.
    dev_net: Option<CString>,
}

impl PrivateDev {
    /// [`DevNode::BASIC`] and `extra`, under `prefix` (empty: at `/dev` itself).
    pub(super) fn new(prefix: &str, extra: &[DevNode]) -> Result<PrivateDev, Error> {
        let mut nodes = Vec::new();
        for node in DevNode::BASIC.iter().chain(extra) {
            let host = node.host_path();
            let meta = std::fs::metadata(host).map_err(|e| {
                Error::Containment(format!("cannot stat {host} for the private /dev: {e}"))
            })?;
            nodes.push(Node {
                path: cstring(&format!("{prefix}{host}"))?,
                mode: libc::S_IFCHR | if node.private() { 0o600 } else { 0o666 },
                rdev: meta.rdev(),
                owned: node.private(),
            });
        }
        Ok(PrivateDev {
            nodes,
            dev_dir: cstring(&format!("{prefix}/dev"))?,
            dev_net: if extra.contains(&DevNode::Tun) {
                Some(cstring(&format!("{prefix}/dev/net"))?)
            } else {
                None
            },
        })
    }

    /// Mounts the tmpfs, makes the nodes (the private ones owned by `uid` and `gid`) and
    /// makes it read-only. In the child: async-signal-safe calls only.
    pub(super) fn make(&self, uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
        sys::mount(
            Some(c"tmpfs"),
            &self.dev_dir,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"mode=0755,size=16k,nr_inodes=32"),
        )?;
        if let Some(dev_net) = &self.dev_net {
            sys::mkdir(dev_net, 0o755)?;
        }
        for node in &self.nodes {
            sys::device_node(
                &node.path,
                node.mode,
                node.rdev,
                node.owned.then_some((uid, gid)),
            )?;
        }
        sys::mount(
            None,
            &self.dev_dir,
            None,
            libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
            None,
        )
    }
}
