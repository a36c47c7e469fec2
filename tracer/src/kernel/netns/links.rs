//! The interfaces of a namespace: listing them (an `RTM_GETLINK` dump) and following their
//! changes (`RTNLGRP_LINK`: `RTM_NEWLINK`/`RTM_DELLINK`, rtnetlink(7)) on a socket kept open.
use std::os::fd::{AsFd, BorrowedFd};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::{
    link::{LinkAttribute, LinkLayerType, LinkMessage},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::super::KernelError;

/// One interface of a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Ethernet-like framing at TC (Ethernet and loopback); otherwise the packet starts at
    /// its IP header (tun, wireguard, ipip, …).
    pub has_eth: bool,
    /// `IFLA_LINK`: for a veth, its peer's ifindex (in the peer's namespace).
    pub peer: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the peer is in another namespace.
    pub peer_elsewhere: bool,
}

/// Largest netlink datagram read at once: a dump batch is at most a page or 32 KiB
/// (`netlink_dump`, net/netlink/af_netlink.c), link notifications far less.
const RX_BUF: usize = 64 * 1024;

/// How long a dump waits for the kernel's next batch (it is produced as the previous one
/// is read, so this is only a guard against a kernel that never says `NLMSG_DONE`).
const DUMP_WAIT_MS: u16 = 1000;

fn nl(e: std::io::Error) -> KernelError {
    KernelError::Netlink(format!("RTM_GETLINK: {e}"))
}

/// Interfaces of the calling thread's current namespace (RTM_GETLINK dump), on a socket
/// of its own.
pub fn list_links() -> Result<Vec<Link>, KernelError> {
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(nl)?;
    socket.bind_auto().map_err(nl)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(nl)?;
    Ok(dump(&socket, 1)?.0)
}

/// A `NETLINK_ROUTE` socket of one namespace, subscribed to its link changes. It keeps the
/// namespace alive while open (a socket holds a reference on its `struct net`), so whoever
/// holds one closes it as soon as the namespace is no longer reachable otherwise.
pub struct LinkSubscription {
    socket: Socket,
    sequence: u32,
}

impl LinkSubscription {
    /// Opens the subscription in the calling thread's current namespace.
    pub fn open() -> Result<Self, KernelError> {
        let sub = |e: std::io::Error| KernelError::Netlink(format!("RTNLGRP_LINK: {e}"));
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(sub)?;
        // The legacy group bitmask at bind(2): RTMGRP_LINK is bit RTNLGRP_LINK - 1.
        socket
            .bind(&SocketAddr::new(0, libc::RTMGRP_LINK as u32))
            .map_err(sub)?;
        socket.set_non_blocking(true).map_err(sub)?;
        Ok(Self {
            socket,
            sequence: 0,
        })
    }

    /// Reads every queued notification without parsing it; true if there was any, or the
    /// kernel dropped some (`ENOBUFS`: the queue overflowed, so something changed).
    pub fn drain(&self) -> bool {
        let mut rx = vec![0u8; RX_BUF];
        let mut changed = false;
        loop {
            match self.socket.recv(&mut &mut rx[..], 0) {
                Ok(0) => return changed,
                Ok(_) => changed = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return changed,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ENOBUFS and anything else: relist rather than trust the queue.
                    log::debug!("link notifications: {e}");
                    return true;
                }
            }
        }
    }

    /// Lists the namespace's interfaces over this socket (no need to enter the namespace).
    /// The flag says notifications arrived meanwhile: the list may already be stale, so
    /// the caller lists again once they have been drained.
    pub fn list(&mut self) -> Result<(Vec<Link>, bool), KernelError> {
        self.sequence = self.sequence.wrapping_add(1).max(1);
        dump(&self.socket, self.sequence)
    }
}

impl AsFd for LinkSubscription {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// Sends an RTM_GETLINK dump request numbered `sequence` and collects the answer. Messages
/// of another sequence (notifications are 0) are skipped and reported by the flag.
fn dump(socket: &Socket, sequence: u32) -> Result<(Vec<Link>, bool), KernelError> {
    let mut req = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(LinkMessage::default())),
    );
    req.header.flags = NLM_F_DUMP | NLM_F_REQUEST;
    req.header.sequence_number = sequence;
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf[..]);
    socket
        .send_to(&buf[..], &SocketAddr::new(0, 0), 0)
        .map_err(nl)?;

    let mut links = Vec::new();
    let mut notified = false;
    let mut rx = vec![0u8; RX_BUF];
    loop {
        let size = match socket.recv(&mut &mut rx[..], 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fds = [nix::poll::PollFd::new(
                    socket.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let ready = nix::poll::poll(&mut fds, DUMP_WAIT_MS)
                    .map_err(|e| nl(std::io::Error::from(e)))?;
                if ready == 0 {
                    return Err(KernelError::Netlink(
                        "RTM_GETLINK: no answer within a second".into(),
                    ));
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The subscription overflowed while dumping: the dump itself goes on.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                notified = true;
                continue;
            }
            Err(e) => return Err(nl(e)),
        };
        let mut offset = 0;
        while offset < size {
            let bytes = &rx[offset..size];
            let msg: NetlinkMessage<RouteNetlinkMessage> = NetlinkMessage::deserialize(bytes)
                .map_err(|e| KernelError::Netlink(format!("RTM_GETLINK reply: {e}")))?;
            let len = msg.header.length as usize;
            if msg.header.sequence_number != sequence {
                notified = true;
            } else {
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok((links, notified)),
                    NetlinkPayload::Error(e) => {
                        return Err(KernelError::Netlink(format!("RTM_GETLINK: {e:?}")))
                    }
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                        links.extend(link_of(&link));
                    }
                    _ => {}
                }
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

fn link_of(link: &LinkMessage) -> Option<Link> {
    let name = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })?;
    let peer = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(i) => Some(*i),
        _ => None,
    });
    let peer_elsewhere = link
        .attributes
        .iter()
        .any(|a| matches!(a, LinkAttribute::LinkNetNsId(_)));
    Some(Link {
        peer,
        peer_elsewhere,
        index: link.header.index,
        name,
        has_eth: matches!(
            link.header.link_layer_type,
            LinkLayerType::Ether | LinkLayerType::Loopback
        ),
    })
}
