//! Kernel drops: the drop record (reason named, location symbolised, the packet decoded as
//! far as its bytes go), whether it is part of normal socket life, and the drop handed to
//! the correlate stage.
use std::net::SocketAddr;

use super::{
    packet::{cut_by_capture, decode_message, Decoded},
    Decoder,
};
use crate::{
    conntrack::CtStatus,
    decode::{
        addr_string,
        frag::{fragment_number, parse_fragment, udp_total_len},
        observation::{DropObservation, Observed},
        parse_ip,
        record::{CtEndpoints, CtRecord, DecodeReport, DropRecord, DroppedFragment, Proto},
        Transport,
    },
    event::{CtSnapshot, KernelDrop},
};

pub(super) fn ct_record(ct: &CtSnapshot) -> CtRecord {
    CtRecord {
        status: ct.status,
        status_flags: CtStatus::from_bits_retain(ct.status).names(),
        confirmed: CtStatus::from_bits_retain(ct.status).contains(CtStatus::CONFIRMED),
        orig: CtEndpoints {
            src: ct.orig.src.to_string(),
            dst: ct.orig.dst.to_string(),
        },
        reply: CtEndpoints {
            src: ct.reply.src.to_string(),
            dst: ct.reply.dst.to_string(),
        },
    }
}

/// The reason of a drop on a kernel whose drop tracepoint carries none (< 5.17).
pub const UNKNOWN_REASON: &str = "UNKNOWN";

/// Drops that are part of normal socket life, not a fault: why, or `None`.
///
/// The kernel frees these with a drop reason although nothing went wrong: a listener
/// consuming a SYN (`tcp_v4_rcv`/`tcp_v6_rcv`, NOT_SPECIFIED, until kernels call
/// consume_skb there), and a socket closed with data still queued (QUEUE_PURGE, or
/// NOT_SPECIFIED at `udp_destruct_common`).
pub fn benign_drop(reason: &str, function: &str, tcp: Option<(u8, bool)>) -> Option<&'static str> {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    match (reason, function, tcp) {
        ("QUEUE_PURGE", _, _) => Some("socket closed with data still queued"),
        ("NOT_SPECIFIED", "udp_destruct_common", _) => Some("socket closed with unread datagrams"),
        ("NOT_SPECIFIED", "tcp_v4_rcv" | "tcp_v6_rcv", Some((flags, true)))
            if flags & SYN != 0 && flags & ACK == 0 =>
        {
            Some("SYN consumed by a listening socket")
        }
        // The handshake's final ACK, consumed while the request socket becomes a full one.
        ("NOT_SPECIFIED", "tcp_v4_rcv" | "tcp_v6_rcv", Some((flags, true)))
            if flags & ACK != 0 && flags & SYN == 0 =>
        {
            Some("handshake ACK consumed by a listening socket")
        }
        _ => None,
    }
}

impl Decoder {
    fn watched(&self, netns: u64) -> bool {
        netns == 0 || self.names.read().is_ok_and(|n| n.netns(netns).is_some())
    }

    /// One kernel drop: reported if its namespace is watched, counted either way.
    pub fn on_drop(&mut self, d: KernelDrop, out: &mut Vec<impl From<DecodeReport>>) {
        // kfree_skb fires in every namespace; report those we watch.
        if !self.watched(d.netns) {
            self.stats.drops_unwatched += 1;
            return;
        }
        self.stats.drops += 1;
        let (netns, ifname) = self.place(d.netns, d.ifindex);
        // Named by this run (live), or as the live run named it (a file of `trace -w`).
        let (reason, reason_code, location, function, confirm_failed) = match d.named.as_deref() {
            Some(n) => (
                n.reason.clone(),
                n.reason_code,
                n.location.clone(),
                n.function.clone(),
                n.confirm_failed,
            ),
            // No `enum skb_drop_reason` in the kernel's BTF: a kernel before 5.17, whose
            // tracepoint has no reason at all.
            None => (
                if self.reasons.is_empty() {
                    UNKNOWN_REASON.to_string()
                } else {
                    self.reasons
                        .get(&d.reason)
                        .cloned()
                        .unwrap_or_else(|| format!("REASON{}", d.reason))
                },
                (!self.reasons.is_empty()).then_some(d.reason),
                self.kallsyms.symbolize(d.location),
                self.kallsyms.function(d.location).unwrap_or("").to_string(),
                self.confirm_hook.then_some(d.confirm_failed),
            ),
        };
        let mut r = DropRecord {
            evidence: None,
            pod: None,
            ts_ns: d.ts_ns,
            time: self.clock.wall(d.ts_ns),
            cpu: d.cpu,
            netns,
            // A file's drop: the live run's ids, as its record said (the file's own place it).
            netns_cookie: d
                .named
                .as_ref()
                .and_then(|n| n.netns_cookie)
                .unwrap_or(d.netns),
            ifname,
            ifindex: d
                .named
                .as_ref()
                .and_then(|n| n.ifindex)
                .unwrap_or(d.ifindex),
            reason,
            reason_code,
            confirm_failed,
            location,
            proto: Proto::Ip,
            src: String::new(),
            dst: String::new(),
            len: d.orig_len,
            ct: d.ct.as_ref().map(ct_record),
            dns: None,
            malformed: None,
            capture_truncated: false,
            fragment: parse_fragment(&d.data).map(|f| {
                // The first fragment numbers itself; a later one by its datagram's first,
                // below.
                let total_len = (f.offset == 0)
                    .then(|| udp_total_len(f.proto, f.data))
                    .flatten();
                let place = total_len.and_then(|t| fragment_number(f.len, t, 0, f.len));
                DroppedFragment {
                    ip_id: f.id,
                    offset: f.offset,
                    len: f.len,
                    number: place.map(|p| p.0),
                    fragments: place.map(|p| p.1),
                    total_len,
                }
            }),
            benign: None,
        };
        let mut tcp_flags = None;
        // Addresses and ports of a UDP or TCP packet, for the correlate stage.
        let mut endpoints = None;
        match parse_ip(&d.data) {
            Ok(ip) => match ip.transport {
                Transport::Udp {
                    sport,
                    dport,
                    payload,
                } => {
                    let (src, dst) = (
                        SocketAddr::new(ip.src, sport),
                        SocketAddr::new(ip.dst, dport),
                    );
                    endpoints = Some((src, dst));
                    r.proto = Proto::Udp;
                    r.src = addr_string(src);
                    r.dst = addr_string(dst);
                    // The first fragment of a datagram holds the start of the message.
                    let cut = cut_by_capture(d.orig_len, d.data.len(), ip.missing, payload.len())
                        .or_else(|| {
                            r.fragment
                                .as_ref()
                                .map(|_| payload.len().saturating_add(ip.missing))
                        });
                    match decode_message(&mut self.messages, payload, cut) {
                        Decoded::Whole(m) => r.dns = Some(m),
                        Decoded::Cut(m) => {
                            r.dns = m;
                            r.capture_truncated = true;
                        }
                        Decoded::Malformed(e) => r.malformed = Some(e),
                    }
                }
                Transport::Tcp {
                    sport,
                    dport,
                    payload,
                    flags,
                    ..
                } => {
                    tcp_flags = Some((flags, payload.is_empty()));
                    let (src, dst) = (
                        SocketAddr::new(ip.src, sport),
                        SocketAddr::new(ip.dst, dport),
                    );
                    endpoints = Some((src, dst));
                    r.proto = Proto::Tcp;
                    r.src = addr_string(src);
                    r.dst = addr_string(dst);
                    // A segment starting a message: try to decode it, as far as it was
                    // copied.
                    if let Some((&[h0, h1], message)) = payload.split_first_chunk::<2>() {
                        let len = usize::from(u16::from_be_bytes([h0, h1]));
                        let copy_cut =
                            cut_by_capture(d.orig_len, d.data.len(), ip.missing, 0).is_some();
                        let cut = (copy_cut && len > message.len()).then_some(len);
                        match decode_message(
                            &mut self.messages,
                            message.get(..len).unwrap_or(message),
                            cut,
                        ) {
                            Decoded::Whole(m) => r.dns = Some(m),
                            Decoded::Cut(m) => {
                                r.dns = m;
                                r.capture_truncated = true;
                            }
                            // Maybe not the start of a message at all.
                            Decoded::Malformed(_) => {}
                        }
                    }
                }
                // A later IP fragment has no ports: its datagram's first fragment, seen on
                // the way, names the message (so the drop joins its transaction).
                Transport::Other { proto } => match self.frag.first_fragment_of(&d.data, d.ts_ns) {
                    Some(first) => {
                        if let (Some(f), Some(total)) = (r.fragment.as_mut(), first.total_len) {
                            let place = fragment_number(first.len, total, f.offset, f.len);
                            f.number = place.map(|p| p.0);
                            f.fragments = place.map(|p| p.1);
                            f.total_len = Some(total);
                        }
                        r.proto = Proto::from_number(proto);
                        let (src, dst) = (
                            SocketAddr::new(ip.src, first.ports.0),
                            SocketAddr::new(ip.dst, first.ports.1),
                        );
                        endpoints = Some((src, dst));
                        r.src = addr_string(src);
                        r.dst = addr_string(dst);
                        r.dns = first.dns.map(std::sync::Arc::new);
                    }
                    // Other protocols, fragments of datagrams not seen: the addresses.
                    None => {
                        r.src = ip.src.to_string();
                        r.dst = ip.dst.to_string();
                    }
                },
            },
            Err(e) => r.malformed = Some(format!("IP: {e}")),
        }
        r.benign = benign_drop(&r.reason, &function, tcp_flags);
        if r.benign.is_some() {
            self.stats.drops_benign += 1;
        }
        if let Some(obs) = self.observed.as_mut() {
            if let Some((src, dst)) = endpoints {
                obs.push(Observed::Drop(Box::new(DropObservation {
                    ts_ns: r.ts_ns,
                    cpu: d.cpu,
                    netns_cookie: d.netns,
                    netns: r.netns.clone(),
                    ifname: r.ifname.clone(),
                    reason: r.reason.clone(),
                    location: r.location.clone(),
                    function,
                    benign: r.benign.is_some(),
                    proto: r.proto,
                    src,
                    dst,
                    ct: d.ct,
                    confirm_failed,
                    msg: r.dns.clone(),
                    fragment: r.fragment.as_ref().map(DroppedFragment::part),
                })));
            }
        }
        out.push(DecodeReport::Drop(r).into());
    }
}
