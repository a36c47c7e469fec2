//! What the decode stage hands the correlate stage: each decoded DNS message and each kernel
//! drop, typed, with where and when it was seen.
use std::{net::SocketAddr, sync::Arc};

use crate::{
    decode::{dns::DnsMessage, record::DroppedPart, tunnel::Tunnel},
    event::{CtSnapshot, ObservationPoint, Proto},
};

/// `reason` of a drop observation that is a datagram whose IP fragments never all reached a
/// hop (decode/frag.rs), not a kernel drop.
pub const FRAGMENT_LOSS: &str = "FRAGMENT_LOSS";

/// One decoded DNS message at one observation point (decode → correlate).
#[derive(Clone, Debug)]
pub struct Observation {
    pub ts_ns: u64,
    pub at: ObservationPoint,
    /// Display names of the namespace and interface (shared with the packet's record and
    /// every hop that is this observation).
    pub netns: Arc<str>,
    pub ifname: Arc<str>,
    /// UDP or TCP.
    pub proto: Proto,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The message as decoded, shared with the packet's record (and with every other hop
    /// that carried the same bytes).
    pub msg: Arc<DnsMessage>,
    /// The tunnel it was seen in, shared with the packet's record.
    pub tunnel: Option<Arc<Tunnel>>,
}

/// A kernel drop of a DNS packet (decode → correlate).
#[derive(Clone, Debug)]
pub struct DropObservation {
    pub ts_ns: u64,
    pub cpu: u32,
    /// Cookie of the namespace (whose conntrack statistics tell a race).
    pub netns_cookie: u64,
    pub netns: Arc<str>,
    pub ifname: Arc<str>,
    pub reason: String,
    pub location: String,
    /// The function part of `location`.
    pub function: String,
    pub benign: bool,
    pub proto: Proto,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub ct: Option<CtSnapshot>,
    /// With the conntrack-confirm hook loaded: whether the kernel's confirm of this packet
    /// failed (`NF_DROP`); `None` without the hook.
    pub confirm_failed: Option<bool>,
    pub msg: Option<Arc<DnsMessage>>,
    /// The drop took (or the loss lacked) part of an IP-fragmented datagram: which.
    pub fragment: Option<DroppedPart>,
}

/// A drop is boxed: drops are rare, and every message moves through the reorder buffer at
/// a message's size rather than a drop's.
#[derive(Clone, Debug)]
pub enum Observed {
    Message(Observation),
    Drop(Box<DropObservation>),
}

impl Observed {
    pub fn ts(&self) -> u64 {
        match self {
            Observed::Message(o) => o.ts_ns,
            Observed::Drop(d) => d.ts_ns,
        }
    }
}
