//! What sources hand to the decode stage: raw observations, live or from a file.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use serde::Serialize;
use tracer_common::{
    proto::{IPPROTO_TCP, IPPROTO_UDP},
    CtTuple,
};

/// Direction of a packet at its observation point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Ingress,
    Egress,
    /// Capture files do not say.
    Unknown,
}

words!(Direction {
    Ingress => "ingress",
    Egress => "egress",
    Unknown => "unknown",
});

impl Direction {
    pub fn as_code(self) -> u8 {
        match self {
            Direction::Ingress => 0,
            Direction::Egress => 1,
            Direction::Unknown => 2,
        }
    }
    /// The inverse of [`Direction::as_code`].
    pub fn from_code(code: u8) -> Self {
        match code {
            0 => Direction::Ingress,
            1 => Direction::Egress,
            _ => Direction::Unknown,
        }
    }
}

/// The transport of a packet, drop or leg: UDP, TCP, or `Ip` for a drop whose transport is
/// not known (a later fragment no first fragment named) or is neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Ip,
    Udp,
    Tcp,
}

words!(Proto {
    Ip => "ip",
    Udp => "udp",
    Tcp => "tcp",
});

impl Proto {
    /// The transport of IP protocol number `n` (`Ip` for one that is neither UDP nor TCP).
    pub fn from_number(n: u8) -> Self {
        match n {
            IPPROTO_UDP => Proto::Udp,
            IPPROTO_TCP => Proto::Tcp,
            _ => Proto::Ip,
        }
    }

    /// UDP or TCP by its word (`udp`, `tcp`); `None` for any other.
    pub fn transport_named(word: &str) -> Option<Self> {
        [Proto::Udp, Proto::Tcp]
            .into_iter()
            .find(|p| p.as_str() == word)
    }

    /// Its IP protocol number (0 for `Ip`, which names none).
    pub fn number(self) -> u8 {
        match self {
            Proto::Udp => IPPROTO_UDP,
            Proto::Tcp => IPPROTO_TCP,
            Proto::Ip => 0,
        }
    }
}

/// Tests compare with the IP protocol number they expect.
#[cfg(test)]
impl PartialEq<u8> for Proto {
    fn eq(&self, n: &u8) -> bool {
        self.number() == *n
    }
}

/// Where a packet was seen: network namespace (cookie), interface, direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObservationPoint {
    pub netns: u64,
    pub ifindex: u32,
    pub dir: Direction,
}

/// One captured packet, bytes from the IP header on.
#[derive(Clone, Debug)]
pub struct CapturedPacket {
    /// CLOCK_BOOTTIME nanoseconds (live) or Unix-epoch nanoseconds (files).
    pub ts_ns: u64,
    pub cpu: Option<u32>,
    pub at: ObservationPoint,
    pub vlan: Option<u16>,
    /// Length on the wire from the IP header on.
    pub orig_len: u32,
    /// The copied bytes, from the IP header on: shared, not copied, by the stages and sinks
    /// that keep them (decode, the pcapng writer, the flight recorder).
    pub data: Bytes,
}

/// One conntrack direction's tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CtFlow {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The tuple's IP protocol number, as conntrack has it: a dropped packet's entry can be
    /// of another protocol than UDP or TCP (a GRE tunnel's), whose number a file keeps.
    pub proto: u8,
}

impl CtFlow {
    pub fn from_tuple(t: &CtTuple) -> Option<Self> {
        let ip = |b: &[u8; 16]| -> Option<IpAddr> {
            match t.l3num {
                2 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
                10 => Some(IpAddr::V6(Ipv6Addr::from(*b))),
                _ => None,
            }
        };
        Some(Self {
            src: SocketAddr::new(ip(&t.src)?, u16::from_be_bytes(t.sport)),
            dst: SocketAddr::new(ip(&t.dst)?, u16::from_be_bytes(t.dport)),
            proto: t.proto,
        })
    }
}

/// Conntrack entry attached to a dropped skb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtSnapshot {
    /// `enum ip_conntrack_status` bits.
    pub status: u64,
    pub orig: CtFlow,
    pub reply: CtFlow,
}

/// A packet on a watched port freed with a drop reason.
#[derive(Clone, Debug)]
pub struct KernelDrop {
    pub ts_ns: u64,
    pub cpu: u32,
    pub netns: u64,
    pub ifindex: u32,
    pub reason: u32,
    pub location: u64,
    pub ct: Option<CtSnapshot>,
    pub orig_len: u32,
    pub data: Bytes,
    /// The optional kprobe pair saw `__nf_conntrack_confirm` return `NF_DROP` for this skb.
    pub confirm_failed: bool,
    /// A drop read back from a file dnspath wrote (`trace -w`): the live run's names of its
    /// reason and location, which the decoder takes instead of naming `reason` and
    /// `location` itself (those are 0 then). `None` live.
    pub named: Option<Box<NamedDrop>>,
}

/// A kernel drop as the live run named it, from its packet comment in a pcapng file
/// (`source::file::drops`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedDrop {
    /// The drop reason's name (`NETFILTER_DROP`, `UNKNOWN` before Linux 5.17).
    pub reason: String,
    /// `enum skb_drop_reason` value, when the live kernel had one.
    pub reason_code: Option<u32>,
    /// `symbol+0xoff`, or the bare address.
    pub location: String,
    /// The symbol of `location` (empty for a bare address).
    pub function: String,
    /// The conntrack-confirm hook's word, when it was loaded.
    pub confirm_failed: Option<bool>,
    /// The live run's namespace cookie and ifindex of the place (the file's own ids place
    /// the drop: [`KernelDrop::netns`], [`KernelDrop::ifindex`]).
    pub netns_cookie: Option<u64>,
    pub ifindex: Option<u32>,
}

/// A looping question whose UDP packets the kernel should only count (live storm shedding,
/// see `tracer_common::shed`); the live source applies these to its maps
/// (`kernel::shed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShedChange {
    Start(ShedQuestion),
    /// By [`ShedQuestion::hash`].
    Stop(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShedQuestion {
    /// `tracer_common::shed` hash of the question's wire form.
    pub hash: u64,
    pub name: String,
    /// The question's type and class codes (mnemonics are made where they are written).
    pub qtype: u16,
    pub class: u16,
}

/// Kernel-side loss and match counters (live only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounters {
    pub packets_matched: u64,
    pub packets_lost_ringbuf: u64,
    pub packets_lost_copy: u64,
    pub parse_failed: u64,
    pub drops_matched: u64,
    pub drops_lost_ringbuf: u64,
    pub drops_read_failed: u64,
    /// Matched packets of a looping question only counted (in `packets_matched`).
    pub packets_shed: u64,
    /// Of `packets_matched`, those the kernel sent as copy records (a message already sent
    /// whole, seen again on its way: its headers only; `tracer_common::copies`).
    pub packets_copied: u64,
}

impl KernelCounters {
    pub fn from_array(c: &[u64]) -> Self {
        use tracer_common::counter as k;
        let at = |i: u32| c.get(i as usize).copied().unwrap_or(0);
        Self {
            packets_matched: at(k::PACKETS_MATCHED),
            packets_lost_ringbuf: at(k::PACKETS_LOST_RINGBUF),
            packets_lost_copy: at(k::PACKETS_LOST_COPY),
            parse_failed: at(k::PARSE_FAILED),
            drops_matched: at(k::DROPS_MATCHED),
            drops_lost_ringbuf: at(k::DROPS_LOST_RINGBUF),
            drops_read_failed: at(k::DROPS_READ_FAILED),
            packets_shed: at(k::PACKETS_SHED),
            packets_copied: at(k::PACKETS_COPIED),
        }
    }
}

/// What the live source could set up on this kernel: said once at start and repeated in the
/// final `stats` (under `kernel`), so a degraded run is never mistaken for a full one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelSetup {
    /// `uname -r`
    pub release: String,
    /// `clsact` (netlink filters) on every kernel: TCX links wait an RCU grace period each.
    pub tc_attach: &'static str,
    /// Hooks in use: `tc`, `tp_btf/kfree_skb`, …
    pub hooks: Vec<&'static str>,
    /// Drops carry the kernel's drop reason (`tp_btf/kfree_skb` with `reason`, Linux ≥ 5.17).
    pub drop_reason: bool,
    /// How namespaces are identified: `cookie` (≥ 5.14) or `inode`.
    pub netns_id: &'static str,
    /// Features this kernel cannot have, each with why.
    pub degraded: Vec<String>,
    /// Interfaces that could not be attached to, over the run.
    pub attach_failures: u64,
}

/// What happened to a conntrack entry (ctnetlink NEW/UPDATE/DESTROY, or a dump entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CtChange {
    New,
    Update,
    Destroy,
    /// Present in a dump taken at start.
    Existing,
}

/// One conntrack entry of a UDP/TCP flow on a watched port, in one network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConntrackEvent {
    /// Userspace receive time, CLOCK_BOOTTIME ns (same clock as packet events).
    pub ts_ns: u64,
    /// Cookie of the namespace whose conntrack table it is in.
    pub netns: u64,
    pub change: CtChange,
    /// `enum ip_conntrack_status` bits (CTA_STATUS), 0 if absent.
    pub status: u64,
    pub zone: u16,
    pub orig: CtFlow,
    pub reply: CtFlow,
}

/// Per-CPU conntrack statistics of one namespace (ctnetlink IPCTNL_MSG_CT_GET_STATS_CPU, or
/// /proc/net/stat/nf_conntrack), summed or for one CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CtCpuStats {
    pub cpu: u32,
    pub found: u64,
    pub invalid: u64,
    pub insert: u64,
    pub insert_failed: u64,
    pub drop: u64,
    pub early_drop: u64,
    pub error: u64,
    pub search_restart: u64,
    pub clash_resolve: u64,
    pub chain_toolong: u64,
}

/// A sample of conntrack statistics of one namespace, one entry per CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtStatsSample {
    pub ts_ns: u64,
    pub netns: u64,
    pub per_cpu: Vec<CtCpuStats>,
}

/// Everything a source produces.
#[derive(Clone, Debug)]
pub enum SourceEvent {
    Packet(CapturedPacket),
    Drop(KernelDrop),
    Conntrack(ConntrackEvent),
    CtStats(CtStatsSample),
    /// A ring-buffer record we could not interpret (size/kind mismatch): counted as lost.
    Garbled {
        len: usize,
        why: tracer_common::RecordError,
    },
}
