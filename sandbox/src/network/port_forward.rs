//! The host end of port-forward (CRI PortForward, `kubectl port-forward`).
//!
//! containerd serves a pod's port-forward by dialing `localhost:PORT` inside the pod's
//! network namespace; with the pod's network in the VM, nothing listens there. So the
//! shim listens on one loopback port of that namespace and has netfilter redirect every
//! other TCP connection to 127.0.0.1 there (`nft`, or `iptables` where nft is missing);
//! for each connection it reads the port the client dialed (SO_ORIGINAL_DST), opens the
//! agent's port forwarder over vsock ([`protocols::PORT_FORWARD_VSOCK_PORT`]), names the
//! port and then copies bytes both ways. A port nothing serves in the guest closes the
//! connection at once, as a refused connection would.

use std::net::{Ipv4Addr, TcpListener as StdTcpListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sys::socket::{getsockopt, sockopt::OriginalDst};
use serde::{Deserialize, Serialize};
use slog::{debug, Logger};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::command;
use super::{netns, NetworkError};

/// The nftables table the redirect lives in, in the pod's network namespace.
const NFT_TABLE: &str = "kata_port_forward";

/// How the redirect was installed, so that it can be removed the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Redirect {
    Nft,
    Iptables { port: u16 },
}

/// A running forwarder; dropping it stops accepting.
pub struct PortForward {
    pub redirect: Redirect,
    task: JoinHandle<()>,
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PortForwardError {
    #[error("listening in the pod's network namespace: {0}")]
    Listen(#[from] NetworkError),
    #[error(
        "neither nft nor iptables could redirect the pod's localhost to the forwarder \
         ({0}); install nftables (or iptables) on the host for port-forward"
    )]
    Redirect(String),
}

impl PortForward {
    /// Starts forwarding `netns`'s localhost to the guest whose hybrid vsock socket is
    /// `agent_socket`.
    pub async fn start(
        netns: &Path,
        agent_socket: PathBuf,
        log: Logger,
    ) -> Result<PortForward, PortForwardError> {
        let ns = netns.to_path_buf();
        let listener = tokio::task::spawn_blocking(move || {
            netns::run_in(&ns, || {
                let l = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| NetworkError::Thread(format!("bind 127.0.0.1:0: {e}")))?;
                Ok(l)
            })
        })
        .await
        .map_err(|e| NetworkError::Thread(e.to_string()))??;
        let port = listener
            .local_addr()
            .map_err(|e| NetworkError::Thread(e.to_string()))?
            .port();
        let listener =
            TcpListener::from_std(listener).map_err(|e| NetworkError::Thread(e.to_string()))?;
        let redirect = install(netns, port).await?;
        let task = tokio::spawn(accept_loop(listener, agent_socket, log));
        Ok(PortForward { redirect, task })
    }
}

fn nft_ruleset(port: u16) -> String {
    format!(
        "table ip {NFT_TABLE} {{\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tip daddr 127.0.0.1 tcp dport != {port} redirect to :{port}\n\
         \t}}\n\
         }}\n"
    )
}

fn iptables_args(action: &str, port: u16) -> Vec<String> {
    let port = port.to_string();
    [
        "-w",
        "-t",
        "nat",
        action,
        "OUTPUT",
        "-d",
        "127.0.0.1/32",
        "-p",
        "tcp",
        "!",
        "--dport",
        &port,
        "-j",
        "REDIRECT",
        "--to-ports",
        &port,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Redirects the namespace's loopback TCP to `port`.
async fn install(netns: &Path, port: u16) -> Result<Redirect, PortForwardError> {
    let nft = command::run(
        "nft",
        &["-f".into(), "-".into()],
        nft_ruleset(port).into_bytes(),
        Some(netns),
    )
    .await;
    let nft_err = match nft {
        Ok(f) if f.success() => return Ok(Redirect::Nft),
        Ok(f) => format!("nft exited with {}: {}", f.status, f.stderr.trim()),
        Err(e) => format!("nft: {e}"),
    };
    let ipt = command::run(
        "iptables",
        &iptables_args("-A", port),
        Vec::new(),
        Some(netns),
    )
    .await;
    let ipt_err = match ipt {
        Ok(f) if f.success() => return Ok(Redirect::Iptables { port }),
        Ok(f) => format!("iptables exited with {}: {}", f.status, f.stderr.trim()),
        Err(e) => format!("iptables: {e}"),
    };
    Err(PortForwardError::Redirect(format!("{nft_err}; {ipt_err}")))
}

/// Removes the redirect from `netns`; best effort (the namespace may be gone already,
/// and the redirect with it).
pub async fn remove(netns: &Path, redirect: Redirect) {
    let _ = match redirect {
        Redirect::Nft => {
            command::run(
                "nft",
                &[
                    "delete".into(),
                    "table".into(),
                    "ip".into(),
                    NFT_TABLE.into(),
                ],
                Vec::new(),
                Some(netns),
            )
            .await
        }
        Redirect::Iptables { port } => {
            command::run(
                "iptables",
                &iptables_args("-D", port),
                Vec::new(),
                Some(netns),
            )
            .await
        }
    };
}

async fn accept_loop(listener: TcpListener, agent_socket: PathBuf, log: Logger) {
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                debug!(log, "port-forward accept failed"; "error" => %e);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let socket = agent_socket.clone();
        let log = log.clone();
        tokio::spawn(async move {
            if let Err(e) = forward(conn, &socket).await {
                debug!(log, "port-forward connection ended"; "error" => %e);
            }
        });
    }
}

/// The port the client dialed before the redirect.
fn original_port(conn: &TcpStream) -> std::io::Result<u16> {
    let addr = getsockopt(&conn.as_fd(), OriginalDst)?;
    Ok(u16::from_be(addr.sin_port))
}

async fn forward(mut conn: TcpStream, agent_socket: &Path) -> std::io::Result<()> {
    let port = original_port(&conn)?;
    let mut guest =
        agent_client::hybrid_vsock_connect(agent_socket, protocols::PORT_FORWARD_VSOCK_PORT)
            .await?;
    guest.write_all(format!("{port}\n").as_bytes()).await?;
    agent_client::port_forward_answer(&mut guest, port).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut guest).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nft_redirect_spares_the_forwarders_own_port() {
        let rules = nft_ruleset(40123);
        assert!(rules.contains("table ip kata_port_forward"), "{rules}");
        assert!(rules.contains("type nat hook output"), "{rules}");
        assert!(
            rules.contains("ip daddr 127.0.0.1 tcp dport != 40123 redirect to :40123"),
            "{rules}"
        );
        assert_eq!(
            iptables_args("-A", 40123).join(" "),
            "-w -t nat -A OUTPUT -d 127.0.0.1/32 -p tcp ! --dport 40123 -j REDIRECT --to-ports 40123"
        );
    }
}
