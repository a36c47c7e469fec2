//! What the first fragment of a datagram says, for its later fragments, which carry no ports.
use std::collections::{HashMap, HashSet, VecDeque};

use tracer_common::proto::IPPROTO_UDP;

use super::{parse_fragment, DatagramId, Fragment};
use crate::decode::dns::{self, DnsMessage};

/// The datagrams whose first fragment was on a watched port, for a capture-file reader that
/// filters by port before decoding: later fragments carry no port, so they are kept when
/// their datagram's first fragment was (as the kernel program does with its `FRAGS` map).
/// Bounded: the oldest keys are forgotten first.
#[derive(Default)]
pub struct WatchedDatagrams {
    keys: HashSet<DatagramId>,
    order: VecDeque<DatagramId>,
}

impl WatchedDatagrams {
    const CAPACITY: usize = 4096;

    /// `ip` (from its IP header on) was kept for its ports: if it is a first fragment,
    /// remember its datagram.
    pub fn note_kept(&mut self, ip: &[u8]) {
        let Some(f) = parse_fragment(ip).filter(|f| f.offset == 0) else {
            return;
        };
        let key = f.datagram();
        if self.keys.insert(key) {
            self.order.push_back(key);
            if self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.keys.remove(&old);
                }
            }
        }
    }

    /// `ip` is a later fragment of a remembered datagram.
    pub fn is_later_fragment(&self, ip: &[u8]) -> bool {
        parse_fragment(ip).is_some_and(|f| f.offset > 0 && self.keys.contains(&f.datagram()))
    }
}

/// The ports and DNS message a first fragment's data (from its transport header on) starts
/// with; the message is decoded as far as the bytes go (header, question, whole records).
pub(super) fn first_identity(proto: u8, data: &[u8]) -> Option<((u16, u16), Option<DnsMessage>)> {
    let ports = (
        u16::from_be_bytes([*data.first()?, *data.get(1)?]),
        u16::from_be_bytes([*data.get(2)?, *data.get(3)?]),
    );
    // The message is cut where the data ends: its length on the wire is the UDP length's.
    let dns = match (proto, data.get(4..6), data.get(8..)) {
        (IPPROTO_UDP, Some(&[l0, l1]), Some(bytes)) => {
            let wire = usize::from(u16::from_be_bytes([l0, l1])).saturating_sub(8);
            dns::decode_cut(bytes, wire.max(bytes.len() + 1))
                .ok()
                .flatten()
        }
        _ => None,
    };
    Some((ports, dns))
}

/// What a later fragment's datagram said in its first fragment: how a kernel drop of a
/// fragment without ports names its query.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstFragment {
    pub ports: (u16, u16),
    /// Header and question (UDP): what ties the datagram to its transaction.
    pub dns: Option<DnsMessage>,
    /// The first fragment's data length: the datagram's fragment size, for numbering the
    /// others ([`fragment_number`]).
    pub len: usize,
    /// The datagram's IP payload length, from its UDP header's length field.
    pub total_len: Option<usize>,
}

/// Which fragment (1-based) of how many the one at `offset` of `len` bytes is, in a
/// datagram of `total_len` payload bytes whose first fragment held `first_len`: when the
/// fragments follow the usual layout (each but the last as long as the first).
pub fn fragment_number(
    first_len: usize,
    total_len: usize,
    offset: usize,
    len: usize,
) -> Option<(usize, usize)> {
    if first_len == 0 || !first_len.is_multiple_of(8) || first_len >= total_len {
        return None;
    }
    let on_grid = offset.is_multiple_of(first_len)
        && offset + len <= total_len
        && (len == first_len || offset + len == total_len);
    on_grid.then(|| (offset / first_len + 1, total_len.div_ceil(first_len)))
}

/// The IP payload length a UDP first fragment's header says its datagram has (the UDP
/// length field counts the header and all the data).
pub(crate) fn udp_total_len(proto: u8, data: &[u8]) -> Option<usize> {
    match (proto, data.get(4..6)) {
        (IPPROTO_UDP, Some(&[l0, l1])) => {
            Some(usize::from(u16::from_be_bytes([l0, l1]))).filter(|&l| l >= 8)
        }
        _ => None,
    }
}

struct FirstSeen {
    ts_ns: u64,
    /// The first fragment's data length on the wire.
    len: usize,
    /// The first fragment's data from its transport header on, up to [`FIRST_HEAD`] bytes.
    head: Box<[u8]>,
}

/// UDP header, DNS header and the longest question (a 255-byte name, type and class).
const FIRST_HEAD: usize = 8 + 12 + 255 + 4;

/// The head of each recent first fragment, by datagram, at whichever hop it was seen last,
/// so that a kernel drop of a later fragment names its query even where its datagram was
/// already reassembled (a rule dropping fragments after the hop that captured them all) or
/// at a hop that captured none of it. Bounded as the kernel's `FRAGS` map is: the same number
/// of datagrams, for as long as the kernel reports their later fragments.
pub(super) struct FirstFragments {
    by_datagram: HashMap<DatagramId, FirstSeen>,
    order: VecDeque<DatagramId>,
}

impl FirstFragments {
    pub(super) const CAPACITY: usize = tracer_common::MAX_FRAG_KEYS as usize;

    /// Datagrams remembered (and their order's entries: the larger).
    pub(super) fn len(&self) -> usize {
        self.by_datagram.len().max(self.order.len())
    }

    pub(super) fn new() -> Self {
        Self {
            by_datagram: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// `f` is a first fragment seen at `ts_ns`.
    pub(super) fn note(&mut self, f: &Fragment<'_>, ts_ns: u64) {
        let head = f.data.get(..FIRST_HEAD).unwrap_or(f.data);
        let key = f.datagram();
        match self.by_datagram.get_mut(&key) {
            // The same datagram at the next hop (or a reused IP id): the latest wins.
            Some(seen) => {
                seen.ts_ns = ts_ns;
                seen.len = f.len;
                if *seen.head != *head {
                    seen.head = head.into();
                }
            }
            None => {
                self.by_datagram.insert(
                    key,
                    FirstSeen {
                        ts_ns,
                        len: f.len,
                        head: head.into(),
                    },
                );
                self.order.push_back(key);
                if self.order.len() > Self::CAPACITY {
                    if let Some(old) = self.order.pop_front() {
                        self.by_datagram.remove(&old);
                    }
                }
            }
        }
    }

    /// What the first fragment of later fragment `f`'s datagram said, if it was seen within
    /// the kernel's key lifetime before `ts_ns`.
    pub(super) fn of(&self, f: &Fragment<'_>, ts_ns: u64) -> Option<FirstFragment> {
        if f.offset == 0 {
            return None;
        }
        let seen = self.by_datagram.get(&f.datagram())?;
        if ts_ns.saturating_sub(seen.ts_ns) >= tracer_common::FRAG_KEY_LIFETIME_NS {
            return None;
        }
        let (ports, dns) = first_identity(f.proto, &seen.head)?;
        Some(FirstFragment {
            ports,
            dns,
            len: seen.len,
            total_len: udp_total_len(f.proto, &seen.head),
        })
    }
}
