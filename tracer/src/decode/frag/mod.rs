//! IP fragment reassembly (RFC 791 §3.2, RFC 8200 §4.5), per hop.
//!
//! Large UDP DNS answers (EDNS 4096, DNSSEC) leave their server as several IP fragments; only
//! the first carries the UDP header. Each hop (namespace, interface, direction) reassembles on
//! its own, so a fragment missing at one hop is reported at that hop: when a datagram is not
//! complete after [`FragLimits::timeout_ns`] (or at the end of input) it becomes a
//! [`FragmentLoss`] naming the fragments seen, the byte ranges never seen, and — when the
//! first fragment was seen — its ports and the DNS header and question it starts with.
//!
//! A complete datagram is rebuilt as one unfragmented IP packet and handed back, to be
//! decoded like any other. Fragments are kept sorted by offset with at most
//! [`FragLimits::max_fragments`] per datagram, which bounds the per-fragment work; the number
//! of datagrams in flight and their bytes are capped (the oldest is evicted and counted).
//! Overlapping fragments must agree where they overlap: fragments that rewrite bytes already
//! seen (the overlap attack of RFC 1858 / RFC 5722) make the datagram unusable.
mod first;
mod loss;
mod parse;
mod reassemble;
#[cfg(test)]
mod tests;

use std::net::IpAddr;

use crate::event::ObservationPoint;

pub(crate) use first::udp_total_len;
pub use first::{fragment_number, FirstFragment, WatchedDatagrams};
pub use loss::{FragmentLoss, LossCause};
pub use parse::{parse_fragment, Fragment};
pub use reassemble::{FragStats, Pushed, Reassembler};

/// IPv4 total length and IPv6 payload length are 16 bits.
const MAX_IP_LENGTH: usize = 65535;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragLimits {
    /// Datagrams being reassembled at once, over all hops.
    pub max_datagrams: usize,
    /// Captured fragment bytes held at once, over all hops.
    pub max_bytes: usize,
    /// Fragments of one datagram (a 65 535-byte datagram over a 1280-byte MTU is 53).
    pub max_fragments: usize,
    /// A datagram incomplete this long after its first fragment (in capture time) is lost.
    pub timeout_ns: u64,
}

impl Default for FragLimits {
    fn default() -> Self {
        Self {
            max_datagrams: 1024,
            max_bytes: 16 << 20,
            max_fragments: 128,
            timeout_ns: 2_000_000_000,
        }
    }
}

/// Why a fragment made its datagram unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    #[error("IP fragment at offset {offset} overlaps an earlier one with different bytes")]
    Overlap { offset: usize },
    #[error("IP fragment at offset {offset} of {len} bytes ends past the {MAX_IP_LENGTH}-byte limit of a datagram")]
    TooBig { offset: usize, len: usize },
    #[error("more than {0} IP fragments for one datagram")]
    TooManyFragments(usize),
    #[error("IP fragment with more-fragments set has {0} bytes of data, not a multiple of 8")]
    Misaligned(usize),
    #[error(
        "IP fragment ends at {end}, past the datagram's end at {total} set by its last fragment"
    )]
    PastEnd { end: usize, total: usize },
}

/// One datagram, wherever it is seen: what its fragments share (RFC 791 §2.3, RFC 8200 §4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatagramId {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub id: u32,
    pub proto: u8,
}

/// Where a datagram is reassembled: one hop, one (src, dst, IP id, protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatagramKey {
    pub at: ObservationPoint,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPv4 16-bit Identification, or the IPv6 Fragment header's 32-bit one.
    pub id: u32,
    pub proto: u8,
}
