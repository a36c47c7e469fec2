//! ctnetlink messages: requests we send, and what we make of the kernel's datagrams.
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    DefaultNla, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLA_TYPE_MASK,
    NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple},
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use tracer_common::proto::{IPPROTO_TCP, IPPROTO_UDP};

use super::ConntrackError;
use crate::event::{CtChange, CtCpuStats, CtFlow};

/// `enum cntl_msg_types` (nfnetlink_conntrack.h): the one message type the crate leaves to
/// `ConntrackMessage::Other`.
pub(crate) const IPCTNL_MSG_CT_GET_STATS_CPU: u8 = 4;
/// `enum ctattr_type`: `CTA_ZONE`, a big-endian u16.
const CTA_ZONE: u16 = 18;
/// `NLMSG_ALIGNTO`: messages in one datagram start on 4-byte boundaries.
const NLMSG_ALIGN: usize = 4;

/// `enum ctattr_stats_cpu` (nfnetlink_conntrack.h); all values big-endian u32.
mod cta_stats {
    pub(super) const FOUND: u16 = 2;
    pub(super) const INVALID: u16 = 4;
    pub(super) const INSERT: u16 = 8;
    pub(super) const INSERT_FAILED: u16 = 9;
    pub(super) const DROP: u16 = 10;
    pub(super) const EARLY_DROP: u16 = 11;
    pub(super) const ERROR: u16 = 12;
    pub(super) const SEARCH_RESTART: u16 = 13;
    pub(super) const CLASH_RESOLVE: u16 = 14;
    pub(super) const CHAIN_TOOLONG: u16 = 15;
}

/// A conntrack entry of a TCP or UDP flow, as ctnetlink reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtEntry {
    /// `enum ip_conntrack_status` bits (CTA_STATUS), 0 if absent.
    pub status: u64,
    /// CTA_ZONE, 0 (the default zone) if absent.
    pub zone: u16,
    pub orig: CtFlow,
    pub reply: CtFlow,
}

/// What one netlink message of a ctnetlink socket says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CtMessage {
    /// A TCP or UDP entry: an event (New/Update/Destroy) or a dump reply (Existing).
    Entry { change: CtChange, entry: CtEntry },
    /// An entry of another protocol (ICMP, GRE, ...).
    OtherProtocol,
    /// One CPU's IPCTNL_MSG_CT_GET_STATS_CPU reply.
    Stats(CtCpuStats),
    /// NLMSG_DONE: end of a dump.
    Done,
    /// NLMSG_ERROR: positive errno, 0 for an acknowledgement.
    Error(i32),
    /// Anything else (NLMSG_NOOP, expectations, other subsystems).
    Ignored,
}

/// Splits one datagram into its netlink messages and decodes each, with its header (for the
/// sequence number). A message that does not parse is an `Err` and the next one is still
/// read; a broken netlink header ends the datagram.
pub fn decode_datagram(buf: &[u8]) -> Vec<Result<(NetlinkHeader, CtMessage), ConntrackError>> {
    let mut out = Vec::new();
    let mut offset = 0usize;
    while let Some(rest) = buf.get(offset..) {
        if rest.is_empty() {
            break;
        }
        // new_checked: 16 <= length <= rest.len(), so `this` exists and offset advances.
        let this = match NetlinkBuffer::new_checked(rest) {
            Ok(b) => rest.get(..b.length() as usize).unwrap_or(rest),
            Err(e) => {
                out.push(Err(ConntrackError::Malformed(e.to_string())));
                break;
            }
        };
        offset = offset.saturating_add(this.len().div_ceil(NLMSG_ALIGN) * NLMSG_ALIGN);
        out.push(
            NetlinkMessage::<NetfilterMessage>::deserialize(this)
                .map_err(|e| ConntrackError::Malformed(e.to_string()))
                .and_then(|msg| {
                    let header = msg.header;
                    decode_message(&header, msg.payload).map(|m| (header, m))
                }),
        );
    }
    out
}

fn decode_message(
    header: &NetlinkHeader,
    payload: NetlinkPayload<NetfilterMessage>,
) -> Result<CtMessage, ConntrackError> {
    let nf = match payload {
        NetlinkPayload::Done(_) => return Ok(CtMessage::Done),
        NetlinkPayload::Error(e) => {
            return Ok(CtMessage::Error(
                e.code.map_or(0, |c| c.get().saturating_neg()),
            ))
        }
        NetlinkPayload::InnerMessage(nf) => nf,
        _ => return Ok(CtMessage::Ignored),
    };
    let NetfilterMessageInner::Conntrack(ct) = nf.inner else {
        return Ok(CtMessage::Ignored);
    };
    let (attrs, destroy) = match ct {
        ConntrackMessage::New(a) => (a, false),
        ConntrackMessage::Delete(a) => (a, true),
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET_STATS_CPU,
            attributes,
        } => return stats(u32::from(nf.header.res_id), &attributes).map(CtMessage::Stats),
        _ => return Ok(CtMessage::Ignored),
    };
    // ctnetlink_conntrack_event: NEW with NLM_F_CREATE|NLM_F_EXCL for a new entry, NEW
    // without them for an update, DELETE for a destroyed one; dump replies are NEW with
    // NLM_F_MULTI.
    let change = if destroy {
        CtChange::Destroy
    } else if header.flags & NLM_F_MULTIPART != 0 {
        CtChange::Existing
    } else if header.flags & (NLM_F_CREATE | NLM_F_EXCL) != 0 {
        CtChange::New
    } else {
        CtChange::Update
    };
    Ok(match entry(&attrs)? {
        Some(entry) => CtMessage::Entry { change, entry },
        None => CtMessage::OtherProtocol,
    })
}

/// The entry, or `None` if it is not a TCP/UDP flow.
fn entry(attrs: &[ConntrackAttribute]) -> Result<Option<CtEntry>, ConntrackError> {
    let mut orig = None;
    let mut reply = None;
    let mut status = 0u64;
    let mut zone = 0u16;
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t.as_slice()),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(t.as_slice()),
            ConntrackAttribute::CtaStatus(s) => status = u64::from(s.bits()),
            ConntrackAttribute::Other(nla) if nla.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                let v = nla_value(nla);
                let b: [u8; 2] = v.as_slice().try_into().map_err(|_| {
                    ConntrackError::Malformed(format!("CTA_ZONE of {} bytes", v.len()))
                })?;
                zone = u16::from_be_bytes(b);
            }
            _ => {}
        }
    }
    let orig =
        orig.ok_or_else(|| ConntrackError::Malformed("entry without CTA_TUPLE_ORIG".into()))?;
    let Some(orig) = flow(orig, "CTA_TUPLE_ORIG")? else {
        return Ok(None);
    };
    let reply = reply
        .ok_or_else(|| ConntrackError::Malformed("TCP/UDP entry without CTA_TUPLE_REPLY".into()))?;
    let reply = flow(reply, "CTA_TUPLE_REPLY")?.ok_or_else(|| {
        ConntrackError::Malformed("reply tuple's protocol differs from the original's".into())
    })?;
    if reply.proto != orig.proto {
        return Err(ConntrackError::Malformed(
            "reply tuple's protocol differs from the original's".into(),
        ));
    }
    Ok(Some(CtEntry {
        status,
        zone,
        orig,
        reply,
    }))
}

/// One direction's tuple, or `None` if it is not TCP/UDP.
fn flow(tuple: &[Tuple], which: &str) -> Result<Option<CtFlow>, ConntrackError> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, None, None);
    for t in tuple {
        match t {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => proto = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(n) => sport = Some(*n),
                        ProtoTuple::DestinationPort(n) => dport = Some(*n),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let missing = |what: &str| ConntrackError::Malformed(format!("{which} without {what}"));
    let proto = proto.ok_or_else(|| missing("CTA_PROTO_NUM"))?;
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return Ok(None);
    }
    let src: IpAddr = src.ok_or_else(|| missing("source address"))?;
    let dst: IpAddr = dst.ok_or_else(|| missing("destination address"))?;
    if src.is_ipv4() != dst.is_ipv4() {
        return Err(ConntrackError::Malformed(format!(
            "{which} mixes IPv4 and IPv6 addresses"
        )));
    }
    Ok(Some(CtFlow {
        src: SocketAddr::new(src, sport.ok_or_else(|| missing("CTA_PROTO_SRC_PORT"))?),
        dst: SocketAddr::new(dst, dport.ok_or_else(|| missing("CTA_PROTO_DST_PORT"))?),
        proto,
    }))
}

fn stats(cpu: u32, attrs: &[DefaultNla]) -> Result<CtCpuStats, ConntrackError> {
    let mut s = CtCpuStats {
        cpu,
        ..CtCpuStats::default()
    };
    for nla in attrs {
        let kind = nla.kind() & NLA_TYPE_MASK;
        let v = nla_value(nla);
        let value = match <[u8; 4]>::try_from(v.as_slice()) {
            Ok(b) => u64::from(u32::from_be_bytes(b)),
            Err(_) => {
                return Err(ConntrackError::Malformed(format!(
                    "CTA_STATS attribute {kind} of {} bytes",
                    v.len()
                )))
            }
        };
        let slot = match kind {
            cta_stats::FOUND => &mut s.found,
            cta_stats::INVALID => &mut s.invalid,
            cta_stats::INSERT => &mut s.insert,
            cta_stats::INSERT_FAILED => &mut s.insert_failed,
            cta_stats::DROP => &mut s.drop,
            cta_stats::EARLY_DROP => &mut s.early_drop,
            cta_stats::ERROR => &mut s.error,
            cta_stats::SEARCH_RESTART => &mut s.search_restart,
            cta_stats::CLASH_RESOLVE => &mut s.clash_resolve,
            cta_stats::CHAIN_TOOLONG => &mut s.chain_toolong,
            // Unused ("no longer used" in the header) or newer counters.
            _ => continue,
        };
        *slot = value;
    }
    Ok(s)
}

/// `DefaultNla` keeps its value private; emitting it is the way to read it.
fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0u8; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

/// A dump request (`NLM_F_REQUEST | NLM_F_DUMP`) for all address families.
pub(crate) fn dump_request(msg: ConntrackMessage, seq: u32) -> Vec<u8> {
    let mut req = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            msg,
        )),
    );
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.header.sequence_number = seq;
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);
    buf
}

/// IPCTNL_MSG_CT_GET dump: every entry of the namespace's table.
pub(crate) fn table_dump_request(seq: u32) -> Vec<u8> {
    dump_request(ConntrackMessage::Get(Vec::new()), seq)
}

/// IPCTNL_MSG_CT_GET_STATS_CPU dump: one reply per possible CPU.
pub(crate) fn stats_dump_request(seq: u32) -> Vec<u8> {
    dump_request(
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET_STATS_CPU,
            attributes: Vec::new(),
        },
        seq,
    )
}

#[cfg(test)]
mod tests;
