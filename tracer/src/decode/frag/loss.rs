//! A datagram given up: what was seen of it, what never came, and what its first fragment said.
use std::net::SocketAddr;

use super::DatagramKey;
use crate::decode::dns::DnsMessage;

/// Why a datagram was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// Still incomplete [`FragLimits::timeout_ns`](super::FragLimits::timeout_ns) after its first fragment.
    Timeout,
    /// The input ended (end of file, or the trace stopped) with the datagram incomplete.
    EndOfInput,
}

impl LossCause {
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::Timeout => "timeout",
            LossCause::EndOfInput => "end of input",
        }
    }
}

/// A datagram of which some fragments never came, at one hop.
#[derive(Clone, Debug)]
pub struct FragmentLoss {
    pub key: DatagramKey,
    /// The first fragment seen (capture time).
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub cause: LossCause,
    /// `(offset, len)` of each fragment seen, by offset (data bytes of the IP payload).
    pub seen: Vec<(usize, usize)>,
    /// `[start, end)` byte ranges never seen; `end` is `None` after the last seen byte when
    /// the last fragment (more-fragments clear) was not seen either.
    pub missing: Vec<(usize, Option<usize>)>,
    /// Payload length of the datagram, known when its last fragment was seen.
    pub total_len: Option<usize>,
    /// Ports of the first fragment's UDP/TCP header, when it was seen.
    pub ports: Option<(u16, u16)>,
    /// The DNS header and question the first fragment starts with, decoded as far as its
    /// bytes go (a UDP first fragment on any port).
    pub dns: Option<DnsMessage>,
}

impl FragmentLoss {
    /// The datagram's fragment count if its fragments follow the usual layout (each but the
    /// last as long as the first), and which of them (1-based) were never seen.
    pub fn fragment_numbers(&self) -> Option<(usize, Vec<usize>)> {
        let total = self.total_len?;
        let &(0, size) = self.seen.first()? else {
            return None;
        };
        if size == 0 || !size.is_multiple_of(8) {
            return None;
        }
        let count = total.div_ceil(size);
        // Every seen fragment must sit on that grid.
        if self
            .seen
            .iter()
            .any(|&(o, l)| o % size != 0 || (l != size && o + l != total))
        {
            return None;
        }
        let missing = (0..count)
            .filter(|i| !self.seen.iter().any(|&(o, _)| o == i * size))
            .map(|i| i + 1)
            .collect();
        Some((count, missing))
    }

    pub fn src(&self) -> String {
        match self.ports {
            Some((s, _)) => SocketAddr::new(self.key.src, s).to_string(),
            None => self.key.src.to_string(),
        }
    }

    pub fn dst(&self) -> String {
        match self.ports {
            Some((_, d)) => SocketAddr::new(self.key.dst, d).to_string(),
            None => self.key.dst.to_string(),
        }
    }
}
