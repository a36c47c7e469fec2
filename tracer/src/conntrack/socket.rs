//! A `NETLINK_NETFILTER` socket of the calling thread's current network namespace.
use std::{
    io,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::{
    message::{decode_datagram, CtMessage},
    ConntrackError,
};

/// A ctnetlink dump datagram is at most 32 KiB (netlink_dump caps its skb at
/// SKB_WITH_OVERHEAD(32768)); events are a few hundred bytes.
const RECV_BUF: usize = 64 * 1024;
/// A dump that sends nothing for this long is treated as lost.
const DUMP_STALL: Duration = Duration::from_secs(10);

pub(crate) struct CtSocket {
    sock: Socket,
    seq: u32,
    /// [`RECV_BUF`] bytes from the first receive on; a dump socket's is given back after each
    /// dump. Most pod namespaces never have a conntrack event (no NAT inside them): with a
    /// buffer each from the start, two sockets × 64 KiB × 110 pods were 14 MiB of an idle
    /// agent.
    buf: Vec<u8>,
}

/// What one non-blocking receive gave.
pub(crate) enum Received {
    /// A datagram of this many bytes, in [`CtSocket::data`].
    Datagram(usize),
    /// The datagram was longer than the buffer and is lost.
    Truncated(usize),
    /// Nothing queued.
    Empty,
    /// ENOBUFS: the kernel dropped messages for this socket since the last receive.
    Overrun,
}

fn socket_error(op: &'static str) -> impl Fn(io::Error) -> ConntrackError {
    move |source| match source.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => ConntrackError::Permission(format!("{op}: {source}")),
        Some(libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT | libc::EOPNOTSUPP) => {
            ConntrackError::Unavailable(format!("netlink {op}: {source}"))
        }
        _ => ConntrackError::Socket { op, source },
    }
}

/// An NLMSG_ERROR in answer to `request`.
fn kernel_error(request: &'static str, errno: i32) -> ConntrackError {
    match errno {
        libc::EPERM | libc::EACCES => ConntrackError::Permission(format!(
            "{request}: {}",
            io::Error::from_raw_os_error(errno)
        )),
        // nfnetlink_rcv_msg: no ctnetlink subsystem (nf_conntrack_netlink not loadable).
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT => {
            ConntrackError::Unavailable(format!(
                "ctnetlink {request}: {}",
                io::Error::from_raw_os_error(errno)
            ))
        }
        _ => ConntrackError::Kernel { request, errno },
    }
}

impl CtSocket {
    pub(crate) fn open() -> Result<Self, ConntrackError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(socket_error("socket"))?;
        sock.bind_auto().map_err(socket_error("bind"))?;
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::new(),
        })
    }

    /// The socket, to wait on it with others (`poll(2)`).
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the fd stays open while `self.sock` lives, which outlives the borrow.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.sock.as_raw_fd()) }
    }

    /// Joins a multicast group (`NFNLGRP_*`); needs CAP_NET_ADMIN.
    pub(crate) fn subscribe(&self, group: u32) -> Result<(), ConntrackError> {
        self.sock
            .add_membership(group)
            .map_err(socket_error("joining a conntrack event group"))
    }

    /// Attaches the classic BPF program `prog` ([`super::filter`]) to the socket.
    pub(crate) fn attach_filter(&self, prog: &[libc::sock_filter]) -> Result<(), ConntrackError> {
        super::filter::attach(self.as_fd(), prog).map_err(|source| ConntrackError::Socket {
            op: "SO_ATTACH_FILTER",
            source,
        })
    }

    /// Sets the receive buffer, past `net.core.rmem_max` where allowed (SO_RCVBUFFORCE
    /// needs CAP_NET_ADMIN), else as far as SO_RCVBUF goes. Returns the size in effect.
    pub(crate) fn set_rcvbuf(&self, bytes: usize) -> usize {
        use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
        // SAFETY: the fd stays open while `self.sock` lives, which outlives this borrow.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.sock.as_raw_fd()) };
        if setsockopt(&fd, RcvBufForce, &bytes).is_err() {
            let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            let _ = self.sock.set_rx_buf_sz(size);
        }
        self.sock.get_rx_buf_sz().unwrap_or(0)
    }

    /// Waits until a datagram is queued (or an error is pending), at most `timeout`.
    pub(crate) fn wait_readable(&self, timeout: Duration) -> Result<bool, ConntrackError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // SAFETY: as in `set_rcvbuf`.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.sock.as_raw_fd()) };
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let rc = match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => return Ok(false),
            Err(e) => {
                return Err(ConntrackError::Socket {
                    op: "poll",
                    source: io::Error::from(e),
                })
            }
        };
        Ok(rc > 0)
    }

    /// Receives one datagram without blocking.
    pub(crate) fn recv_nonblocking(&mut self) -> Result<Received, ConntrackError> {
        if self.buf.is_empty() {
            self.buf = vec![0u8; RECV_BUF];
        }
        loop {
            let flags = libc::MSG_DONTWAIT | libc::MSG_TRUNC;
            match self.sock.recv(&mut &mut self.buf[..], flags) {
                Ok(n) if n > self.buf.len() => return Ok(Received::Truncated(n)),
                Ok(n) => return Ok(Received::Datagram(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Received::Empty),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(Received::Overrun),
                Err(source) => return Err(ConntrackError::Socket { op: "recv", source }),
            }
        }
    }

    /// The bytes of the datagram [`CtSocket::recv_nonblocking`] returned.
    pub(crate) fn data(&self, len: usize) -> &[u8] {
        self.buf.get(..len).unwrap_or(&self.buf)
    }

    /// Sends the dump request `build(seq)` and hands every message of the answer to `each`
    /// until NLMSG_DONE. Messages of other sequence numbers (an earlier, abandoned dump) are
    /// skipped; ones that do not parse are counted in the return value.
    /// The receive buffer is given back when the dump ends.
    pub(crate) fn dump(
        &mut self,
        request: &'static str,
        build: fn(u32) -> Vec<u8>,
        each: impl FnMut(CtMessage),
    ) -> Result<u64, ConntrackError> {
        let r = self.dump_into(request, build, each);
        self.buf = Vec::new();
        r
    }

    fn dump_into(
        &mut self,
        request: &'static str,
        build: fn(u32) -> Vec<u8>,
        mut each: impl FnMut(CtMessage),
    ) -> Result<u64, ConntrackError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let req = build(seq);
        self.sock.send(&req, 0).map_err(socket_error("send"))?;
        let mut malformed = 0u64;
        let mut last = Instant::now();
        loop {
            if !self.wait_readable(Duration::from_millis(500))? {
                if last.elapsed() > DUMP_STALL {
                    return Err(ConntrackError::Socket {
                        op: request,
                        source: io::Error::new(io::ErrorKind::TimedOut, "dump stalled"),
                    });
                }
                continue;
            }
            last = Instant::now();
            let n = match self.recv_nonblocking()? {
                Received::Datagram(n) => n,
                Received::Empty => continue,
                Received::Truncated(_) | Received::Overrun => {
                    // Part of the dump is gone: the answer is incomplete.
                    return Err(ConntrackError::Malformed(format!(
                        "{request}: dump datagram truncated or dropped"
                    )));
                }
            };
            for m in decode_datagram(self.data(n)) {
                let (header, msg) = match m {
                    Ok(v) => v,
                    Err(_) => {
                        malformed += 1;
                        continue;
                    }
                };
                if header.sequence_number != seq {
                    continue;
                }
                match msg {
                    CtMessage::Done => return Ok(malformed),
                    CtMessage::Error(0) => {}
                    CtMessage::Error(errno) => return Err(kernel_error(request, errno)),
                    other => each(other),
                }
            }
        }
    }
}
