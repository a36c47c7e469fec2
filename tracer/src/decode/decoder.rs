//! The decode stage of the pipeline: packet and drop events → packet and
//! drop records (DNS decoded, TCP reassembled, cut and malformed messages told apart), the
//! counters that account for every packet, and typed observations for the correlate stage.
use std::{collections::HashMap, net::SocketAddr};

use tracer_common::proto::{IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    conntrack::CtStatus,
    decode::{
        addr_string, dns,
        frag::{parse_fragment, FragLimits, FragmentLoss, Pushed, Reassembler},
        observation::{DropObservation, Observation, Observed, FRAGMENT_LOSS},
        parse_ip,
        record::{
            CtEndpoints, CtRecord, DecodeReport, DecodeStats, DropRecord, DroppedFragment,
            FragmentLossRecord, KernelStats, PacketRecord,
        },
        tcp::{FlowKey, TcpLimits, TcpOutput, TcpReassembler},
        Transport,
    },
    event::{
        CapturedPacket, CtSnapshot, Direction, KernelCounters, KernelDrop, ObservationPoint,
        SourceEvent,
    },
    kallsyms::Kallsyms,
    names::SharedNames,
    time::Clock,
};

mod packet;
mod shed;

use packet::{cut_by_capture, decode_message, Decoded};
use shed::question_key;
pub use shed::{question_hash, Summarised};

pub fn ct_record(ct: &CtSnapshot) -> CtRecord {
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

/// Drops that are part of normal socket life, not a fault: why, or `None`.
///
/// The kernel frees these with a drop reason although nothing went wrong: a listener
/// consuming a SYN (`tcp_v4_rcv`/`tcp_v6_rcv`, NOT_SPECIFIED, until kernels call
/// consume_skb there), and a socket closed with data still queued (QUEUE_PURGE, or
/// NOT_SPECIFIED at `udp_destruct_common`).
/// The reason of a drop on a kernel whose drop tracepoint carries none (< 5.17).
pub const UNKNOWN_REASON: &str = "UNKNOWN";

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

/// Decode-stage state and counters.
pub struct Decoder {
    clock: Clock,
    names: SharedNames,
    kallsyms: Kallsyms,
    reasons: HashMap<u32, String>,
    confirm_hook: bool,
    tcp: TcpReassembler,
    /// IP fragments, per hop (decode/frag).
    frag: Reassembler,
    /// Latest time seen (packets, and the pipeline's ticks): the reassembler's clock, and
    /// the time of what `finish` reports.
    now_ns: u64,
    stats: DecodeStats,
    kernel: Option<KernelCounters>,
    tcp_out: Vec<TcpOutput>,
    tcp_closed: Vec<(FlowKey, TcpOutput)>,
    /// Typed observations for the correlate stage, when it runs.
    observed: Option<Vec<Observed>>,
    /// Questions of active forwarding loops, by lowercase wire form: their UDP packets are
    /// only counted (a loop runs at hundreds of thousands of packets per second).
    summarise: HashMap<Box<[u8]>, Summarised>,
}

/// The parts of a message the correlate stage reads (header, first question, rcode,
/// answers, `cut`; see correlate/join.rs and correlate/model.rs): the packet record keeps the
/// whole message for the sinks, and copying its other sections, EDNS options and further
/// questions for every packet cost more than the correlation of it.
fn for_correlation(msg: &dns::DnsMessage) -> dns::DnsMessage {
    dns::DnsMessage {
        id: msg.id,
        qr: msg.qr,
        opcode: String::new(),
        rcode: msg.rcode.clone(),
        flags: msg.flags,
        questions: msg.questions.first().cloned().into_iter().collect(),
        answers: msg.answers.clone(),
        authority: Vec::new(),
        additional: Vec::new(),
        edns: None,
        cut: msg.cut,
    }
}

impl Decoder {
    pub fn new(
        clock: Clock,
        names: SharedNames,
        kallsyms: Kallsyms,
        reasons: HashMap<u32, String>,
    ) -> Self {
        Self {
            clock,
            names,
            kallsyms,
            reasons,
            tcp: TcpReassembler::new(TcpLimits::default()),
            frag: Reassembler::new(FragLimits::default()),
            now_ns: 0,
            stats: DecodeStats::default(),
            kernel: None,
            tcp_out: Vec::new(),
            tcp_closed: Vec::new(),
            observed: None,
            summarise: HashMap::new(),
            confirm_hook: false,
        }
    }

    /// The conntrack-confirm hook is loaded: a drop's `confirm_failed` flag is then the
    /// kernel's word (without it the flag is meaningless and not passed on).
    pub fn set_confirm_hook(&mut self, loaded: bool) {
        self.confirm_hook = loaded;
    }

    /// Also hand typed observations to the correlate stage ([`Decoder::take_observed`]).
    pub fn collect_observations(&mut self) {
        self.observed.get_or_insert_with(Vec::new);
    }

    /// Moves the observations collected since the last call into `out`.
    pub fn take_observed(&mut self, out: &mut Vec<Observed>) {
        if let Some(v) = self.observed.as_mut() {
            out.append(v);
        }
    }

    fn observe(
        &mut self,
        r: &PacketRecord,
        proto: u8,
        src: SocketAddr,
        dst: SocketAddr,
        at: ObservationPoint,
    ) {
        if let (Some(obs), Some(msg)) = (self.observed.as_mut(), r.dns.as_ref()) {
            obs.push(Observed::Message(Observation {
                ts_ns: r.ts_ns,
                at,
                netns: r.netns.clone(),
                ifname: r.ifname.clone(),
                proto,
                src,
                dst,
                msg: for_correlation(msg),
            }));
        }
    }

    fn place(&self, netns: u64, ifindex: u32) -> (String, String) {
        crate::names::place(&self.names, netns, ifindex)
    }

    pub fn on_event(&mut self, ev: SourceEvent, out: &mut Vec<impl From<DecodeReport>>) {
        match ev {
            SourceEvent::Packet(p) => self.on_packet(p, out),
            SourceEvent::Drop(d) => self.on_drop(d, out),
            // Consumed by the correlate and detect stages.
            SourceEvent::Conntrack(_) | SourceEvent::CtStats(_) => {}
            SourceEvent::Garbled { len, why } => {
                log::warn!("unreadable ring-buffer record of {len} bytes: {why}");
                self.stats.lost += 1;
            }
        }
    }

    /// Datagrams whose fragments never all came, as records; a DNS message among them is
    /// also a drop of that message for the correlate stage (its transaction did not get it).
    fn fragment_losses(
        &mut self,
        losses: Vec<FragmentLoss>,
        out: &mut Vec<impl From<DecodeReport>>,
    ) {
        for l in losses {
            let (netns, ifname) = self.place(l.key.at.netns, l.key.at.ifindex);
            let time = self.clock.wall(l.last_ts_ns);
            let r = FragmentLossRecord::new(&l, netns, ifname, time);
            if let (Some(obs), Some((sport, dport)), Some(msg)) =
                (self.observed.as_mut(), l.ports, l.dns.as_ref())
            {
                obs.push(Observed::Drop(DropObservation {
                    ts_ns: l.last_ts_ns,
                    cpu: 0,
                    netns_cookie: l.key.at.netns,
                    netns: r.netns.clone(),
                    ifname: r.ifname.clone(),
                    reason: FRAGMENT_LOSS.to_string(),
                    location: r.what_missing(),
                    function: String::new(),
                    benign: false,
                    proto: l.key.proto,
                    src: SocketAddr::new(l.key.src, sport),
                    dst: SocketAddr::new(l.key.dst, dport),
                    ct: None,
                    confirm_failed: None,
                    msg: Some(msg.clone()),
                }));
            }
            out.push(DecodeReport::FragmentLoss(r).into());
        }
    }

    /// The clock moved on without packets (live): datagrams past their reassembly timeout
    /// are reported.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<impl From<DecodeReport>>) {
        self.now_ns = self.now_ns.max(now_ns);
        let mut losses = Vec::new();
        self.frag.expire(self.now_ns, &mut losses);
        self.fragment_losses(losses, out);
    }

    /// The input ended (end of file, or the trace is stopping): what is still unfinished
    /// (TCP messages short of their length) is reported, so every captured byte is accounted
    /// for. `now_ns`: the time to give those reports (0: the latest seen).
    pub fn finish(&mut self, now_ns: u64, out: &mut Vec<impl From<DecodeReport>>) {
        self.tcp.finish();
        let ts = if now_ns == 0 { self.now_ns } else { now_ns };
        self.report_closed_flows(ts, out);
        // Datagrams still missing fragments.
        let mut losses = Vec::new();
        self.frag.finish(&mut losses);
        self.fragment_losses(losses, out);
    }

    fn watched(&self, netns: u64) -> bool {
        netns == 0 || self.names.read().is_ok_and(|n| n.netns(netns).is_some())
    }

    fn on_drop(&mut self, d: KernelDrop, out: &mut Vec<impl From<DecodeReport>>) {
        // kfree_skb fires in every namespace; report those we watch.
        if !self.watched(d.netns) {
            self.stats.drops_unwatched += 1;
            return;
        }
        self.stats.drops += 1;
        let (netns, ifname) = self.place(d.netns, d.ifindex);
        let mut r = DropRecord {
            evidence: None,
            pod: Default::default(),
            ts_ns: d.ts_ns,
            time: self.clock.wall(d.ts_ns),
            cpu: d.cpu,
            netns,
            netns_cookie: d.netns,
            ifname,
            ifindex: d.ifindex,
            // No `enum skb_drop_reason` in the kernel's BTF: a kernel before 5.17, whose
            // tracepoint has no reason at all.
            reason: if self.reasons.is_empty() {
                UNKNOWN_REASON.to_string()
            } else {
                self.reasons
                    .get(&d.reason)
                    .cloned()
                    .unwrap_or_else(|| format!("REASON{}", d.reason))
            },
            reason_code: (!self.reasons.is_empty()).then_some(d.reason),
            confirm_failed: self.confirm_hook.then_some(d.confirm_failed),
            location: self.kallsyms.symbolize(d.location),
            proto: "ip",
            src: String::new(),
            dst: String::new(),
            len: d.orig_len,
            ct: d.ct.as_ref().map(ct_record),
            dns: None,
            malformed: None,
            capture_truncated: false,
            fragment: parse_fragment(&d.data).map(|f| DroppedFragment {
                ip_id: f.id,
                offset: f.offset,
                len: f.len,
            }),
            benign: None,
        };
        let function = self.kallsyms.function(d.location).unwrap_or("");
        let mut tcp_flags = None;
        // Protocol and ports of a UDP or TCP packet, for the correlate stage.
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
                    endpoints = Some((IPPROTO_UDP, src, dst));
                    r.proto = "udp";
                    r.src = addr_string(src);
                    r.dst = addr_string(dst);
                    // The first fragment of a datagram holds the start of the message.
                    let cut = cut_by_capture(d.orig_len, d.data.len(), ip.missing, payload.len())
                        .or_else(|| {
                            r.fragment
                                .as_ref()
                                .map(|_| payload.len().saturating_add(ip.missing))
                        });
                    match decode_message(payload, cut) {
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
                    endpoints = Some((IPPROTO_TCP, src, dst));
                    r.proto = "tcp";
                    r.src = addr_string(src);
                    r.dst = addr_string(dst);
                    // A segment starting a message: try to decode it, as far as it was
                    // copied.
                    if let Some((&[h0, h1], message)) = payload.split_first_chunk::<2>() {
                        let len = usize::from(u16::from_be_bytes([h0, h1]));
                        let copy_cut =
                            cut_by_capture(d.orig_len, d.data.len(), ip.missing, 0).is_some();
                        let cut = (copy_cut && len > message.len()).then_some(len);
                        match decode_message(message.get(..len).unwrap_or(message), cut) {
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
                        r.proto = match proto {
                            IPPROTO_TCP => "tcp",
                            IPPROTO_UDP => "udp",
                            _ => "ip",
                        };
                        let (src, dst) = (
                            SocketAddr::new(ip.src, first.ports.0),
                            SocketAddr::new(ip.dst, first.ports.1),
                        );
                        endpoints = Some((proto, src, dst));
                        r.src = addr_string(src);
                        r.dst = addr_string(dst);
                        r.dns = first.dns;
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
        r.benign = benign_drop(&r.reason, function, tcp_flags);
        if r.benign.is_some() {
            self.stats.drops_benign += 1;
        }
        if let Some(obs) = self.observed.as_mut() {
            if let Some((proto, src, dst)) = endpoints {
                obs.push(Observed::Drop(DropObservation {
                    ts_ns: r.ts_ns,
                    cpu: d.cpu,
                    netns_cookie: d.netns,
                    netns: r.netns.clone(),
                    ifname: r.ifname.clone(),
                    reason: r.reason.clone(),
                    location: r.location.clone(),
                    function: function.to_string(),
                    benign: r.benign.is_some(),
                    proto,
                    src,
                    dst,
                    ct: d.ct,
                    confirm_failed: self.confirm_hook.then_some(d.confirm_failed),
                    msg: r.dns.clone(),
                }));
            }
        }
        out.push(DecodeReport::Drop(r).into());
    }

    /// The latest time seen (0 before the first packet or tick).
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Latest kernel counters (live only); folds them into the stats.
    pub fn set_kernel_counters(&mut self, k: KernelCounters) {
        self.kernel = Some(k);
    }

    pub fn stats(&self) -> DecodeStats {
        let mut s = self.stats.clone();
        let t = self.tcp.stats();
        s.tcp_flows_evicted = t.flows_evicted;
        s.tcp_bytes_dropped = t.bytes_dropped;
        s.tcp_gaps = t.gaps;
        s.tcp_cut = t.cut;
        let f = self.frag.stats();
        s.fragments_merged = f.merged;
        s.fragments_incomplete = f.incomplete;
        s.fragments_pending = f.pending;
        s.datagrams_reassembled = f.datagrams_reassembled;
        s.datagrams_lost = f.datagrams_lost;
        s.datagrams_evicted = f.datagrams_evicted;
        if let Some(k) = self.kernel {
            s.lost += k.packets_lost_ringbuf + k.packets_lost_copy;
            s.drops_lost = k.drops_lost_ringbuf + k.drops_read_failed;
            s.kernel = Some(KernelStats {
                counters: k,
                setup: None,
            });
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::shed::question_key_of;
    use super::*;
    use crate::event::Direction;
    use crate::output::record::Record;
    use std::sync::{Arc, RwLock};

    /// `medium.lab.test. TXT`: 8 answers of 62 bytes of text each, id 77.
    fn txt_response() -> Vec<u8> {
        use hickory_proto::{
            op::{Message, MessageType, OpCode, Query},
            rr::{rdata::TXT, Name, RData, Record as HRecord, RecordType},
        };
        let name = Name::from_ascii("medium.lab.test.").unwrap();
        let mut m = Message::new(77, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::TXT));
        for i in 0..8 {
            let text = format!("{i:02}{}", "x".repeat(60));
            m.add_answer(HRecord::from_rdata(
                name.clone(),
                300,
                RData::TXT(TXT::new(vec![text])),
            ));
        }
        m.to_vec().unwrap()
    }

    fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let total = (20 + l4.len()) as u16;
        let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&[10, 250, 0, 53, 10, 244, 1, 2]);
        p.extend_from_slice(l4);
        p
    }

    fn udp(payload: &[u8]) -> Vec<u8> {
        let mut u = vec![0, 53, 0x9c, 0x40];
        u.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        ipv4(17, &u)
    }

    /// A data segment (PSH|ACK) at sequence `seq`.
    fn tcp(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut t = vec![0, 53, 0x9c, 0x40];
        t.extend_from_slice(&seq.to_be_bytes());
        t.extend_from_slice(&[0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        t.extend_from_slice(payload);
        ipv4(6, &t)
    }

    fn decoder() -> Decoder {
        let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
        let mut d = Decoder::new(Clock::Epoch, names, Kallsyms::default(), HashMap::new());
        d.collect_observations();
        d
    }

    /// `data` as captured at ingress of interface 1 at `ts_ns`, `orig_len` bytes on the wire.
    fn captured(ts_ns: u64, data: &[u8], orig_len: usize) -> SourceEvent {
        SourceEvent::Packet(CapturedPacket {
            ts_ns,
            cpu: None,
            at: ObservationPoint {
                netns: 0,
                ifindex: 1,
                dir: Direction::Ingress,
            },
            vlan: None,
            orig_len: orig_len as u32,
            data: data.to_vec(),
        })
    }

    /// Feeds the first `caplen` bytes of `packet`, which was `orig_len` bytes on the wire.
    fn feed(d: &mut Decoder, packet: &[u8], caplen: usize, orig_len: usize) -> PacketRecord {
        let mut out = Vec::new();
        d.on_event(captured(1, &packet[..caplen], orig_len), &mut out);
        match out.pop() {
            Some(Record::Packet(p)) => p,
            other => panic!("no packet record: {other:?}"),
        }
    }

    /// Feeds whole packets; returns every record they produced.
    fn feed_all(d: &mut Decoder, packets: &[Vec<u8>]) -> Vec<Record> {
        let mut out = Vec::new();
        for (i, p) in packets.iter().enumerate() {
            d.on_event(captured(i as u64 + 1, p, p.len()), &mut out);
        }
        out
    }

    /// docs/output.md's accounting: every packet counted once.
    fn accounted(s: &DecodeStats) -> bool {
        s.packets + s.tcp_messages
            == s.decoded
                + s.capture_truncated
                + s.malformed
                + s.tcp_control
                + s.tcp_data
                + s.other
                + s.summarised
                + s.fragments_merged
                + s.fragments_incomplete
                + s.fragments_pending
    }

    fn framed(m: &[u8]) -> Vec<u8> {
        let mut v = (m.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(m);
        v
    }

    /// The stream ends 10 bytes into a message that promised 65535: at the end, that is a
    /// malformed record saying so, and every packet is accounted for.
    #[test]
    fn tcp_message_cut_short_by_the_end_of_the_stream_is_malformed_at_finish() {
        let mut d = decoder();
        let mut partial = vec![0xff, 0xff];
        partial.extend_from_slice(&[0xab; 8]);
        let out = feed_all(&mut d, &[tcp(1000, &partial), tcp(1010, &[])]);
        assert!(out.is_empty(), "{out:?}");
        let s = d.stats();
        assert_eq!(
            (s.packets, s.tcp_data, s.tcp_control, s.malformed),
            (2, 1, 1, 0)
        );
        let mut out = Vec::new();
        d.finish(0, &mut out);
        let [Record::Packet(r)] = &out[..] else {
            panic!("{out:?}")
        };
        let why = r.malformed.as_deref().unwrap();
        assert!(
            why.contains("stream ended 65527 bytes short of a 65535-byte message"),
            "{why}"
        );
        assert_eq!((r.proto, r.len, r.caplen, r.ts_ns), ("tcp", 0, 0, 2));
        let s = d.stats();
        assert_eq!((s.malformed, s.tcp_messages), (1, 1));
        assert!(accounted(&s), "{s:?}");
        // Nothing is reported twice.
        d.finish(0, &mut out);
        assert_eq!(out.len(), 1);
    }

    /// Two messages over three segments (one split across two, two in one) and a bare ACK:
    /// segments and messages are counted apart and the accounting holds.
    #[test]
    fn tcp_segments_and_messages_are_accounted_apart() {
        let msg = txt_response();
        let mut stream = framed(&msg);
        stream.extend(framed(&msg));
        let (a, rest) = stream.split_at(100);
        let (b, c) = rest.split_at(rest.len() - 50);
        let out = {
            let mut d = decoder();
            let out = feed_all(
                &mut d,
                &[
                    tcp(1, a),
                    tcp(1 + a.len() as u32, b),
                    tcp(1 + (a.len() + b.len()) as u32, c),
                    tcp(1 + stream.len() as u32, &[]),
                ],
            );
            let s = d.stats();
            assert_eq!(
                (
                    s.packets,
                    s.tcp_data,
                    s.tcp_control,
                    s.decoded,
                    s.tcp_messages
                ),
                (4, 3, 1, 2, 2)
            );
            assert!(accounted(&s), "{s:?}");
            out
        };
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn cut_udp_answer_is_decoded_as_far_as_it_goes() {
        let msg = txt_response();
        let pkt = udp(&msg);
        let mut d = decoder();
        // 200 bytes of DNS (the --snaplen) after 28 bytes of headers.
        let r = feed(&mut d, &pkt, 28 + 200, pkt.len());
        assert!(r.capture_truncated && r.malformed.is_none(), "{r:?}");
        let m = r.dns.as_ref().unwrap();
        assert_eq!(m.questions[0].name, "medium.lab.test.");
        // Header and question: 33 bytes; each answer 2 + 10 + 1 + 62 = 75 bytes.
        assert_eq!(m.answers.len(), 2);
        let cut = m.cut.unwrap();
        assert_eq!((cut.captured_bytes, cut.message_bytes), (200, msg.len()));
        assert_eq!(cut.answers, 6);
        let s = d.stats();
        assert_eq!((s.decoded, s.malformed, s.capture_truncated), (0, 0, 1));
        // The correlate stage gets it.
        let mut obs = Vec::new();
        d.take_observed(&mut obs);
        assert!(
            matches!(&obs[..], [Observed::Message(o)] if o.msg.cut == Some(cut)),
            "{obs:?}"
        );
        let json = serde_json::to_value(Record::Packet(r)).unwrap();
        assert_eq!(json["capture_truncated"], true);
        assert!(json.get("malformed").is_none());

        // The header itself cut: no message, still not malformed.
        let r = feed(&mut d, &pkt, 28 + 7, pkt.len());
        assert!(r.capture_truncated && r.dns.is_none() && r.malformed.is_none());
        assert!(crate::output::text::packet_line(&r).contains("[|domain"));
        // Whole: decoded, no mark.
        let r = feed(&mut d, &pkt, pkt.len(), pkt.len());
        assert!(!r.capture_truncated && r.dns.unwrap().cut.is_none());
        let json =
            serde_json::to_value(Record::Packet(feed(&mut d, &pkt, pkt.len(), pkt.len()))).unwrap();
        assert!(json.get("capture_truncated").is_none(), "{json}");
        let s = d.stats();
        assert_eq!((s.decoded, s.malformed, s.capture_truncated), (2, 0, 2));
    }

    /// Short though nothing was cut on capture (the wire had only these bytes): malformed.
    #[test]
    fn short_message_not_cut_by_the_capture_is_malformed() {
        let msg = txt_response();
        let pkt = udp(&msg);
        let mut d = decoder();
        let r = feed(&mut d, &pkt, 28 + 200, 28 + 200);
        assert!(!r.capture_truncated && r.dns.is_none());
        let why = r.malformed.unwrap();
        assert!(why.contains("runs past the end"), "{why}");
        assert!(why.contains("promise"), "{why}");
        // Only Ethernet padding cut (the IP packet itself whole): a whole message.
        let r = feed(&mut d, &pkt, pkt.len(), pkt.len() + 6);
        assert!(!r.capture_truncated && r.dns.is_some());
        let s = d.stats();
        assert_eq!((s.decoded, s.malformed, s.capture_truncated), (1, 1, 0));
    }

    #[test]
    fn cut_tcp_answer_is_decoded_as_far_as_it_goes() {
        let msg = txt_response();
        let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&msg);
        let pkt = tcp(1000, &framed);
        let mut d = decoder();
        let r = feed(&mut d, &pkt, 40 + 300, pkt.len());
        assert!(r.capture_truncated && r.malformed.is_none(), "{r:?}");
        let m = r.dns.unwrap();
        let cut = m.cut.unwrap();
        assert_eq!((cut.captured_bytes, cut.message_bytes), (298, msg.len()));
        assert_eq!(m.answers.len(), 3);
        let s = d.stats();
        assert_eq!((s.decoded, s.malformed, s.capture_truncated), (0, 0, 1));
        assert_eq!(s.tcp_bytes_dropped, 0);
    }

    /// What the TCP reassembler gave up on reaches the stats: a message cut by the capture
    /// and a hole in a stream.
    #[test]
    fn tcp_cuts_and_gaps_reach_the_stats() {
        let msg = txt_response();
        let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&msg);
        let mut d = decoder();
        let pkt = tcp(1000, &framed);
        feed(&mut d, &pkt, 40 + 300, pkt.len());
        let s = d.stats();
        assert_eq!((s.tcp_cut, s.tcp_gaps), (1, 0));
        // Another flow: its first 100 bytes, then a segment 50 bytes further on, then the
        // end of input with the hole still open.
        let mut d = decoder();
        let mut out: Vec<Record> = Vec::new();
        for (i, (seq, range)) in [(5000u32, 0..100), (5150, 150..framed.len())]
            .into_iter()
            .enumerate()
        {
            let pkt = tcp(seq, &framed[range]);
            d.on_event(captured(i as u64 + 1, &pkt, pkt.len()), &mut out);
        }
        d.finish(10, &mut out);
        let s = d.stats();
        assert_eq!((s.tcp_cut, s.tcp_gaps), (0, 1));
        assert!(s.tcp_bytes_dropped > 0, "{s:?}");
        let json = serde_json::to_value(Record::Stats(crate::output::record::StatsRecord::new(
            s, None,
        )))
        .unwrap();
        assert_eq!(
            (json["tcp_gaps"].as_u64(), json["tcp_cut"].as_u64()),
            (Some(1), Some(0))
        );
    }

    #[test]
    fn normal_socket_life_is_benign_and_netfilter_is_not() {
        assert!(benign_drop("QUEUE_PURGE", "sk_stream_kill_queues", None).is_some());
        assert!(benign_drop("NOT_SPECIFIED", "udp_destruct_common", None).is_some());
        assert!(benign_drop("NOT_SPECIFIED", "tcp_v4_rcv", Some((0x02, true))).is_some());
        assert!(benign_drop("NOT_SPECIFIED", "tcp_v6_rcv", Some((0x10, true))).is_some());
        // A segment with data dropped there is not handshake bookkeeping.
        assert!(benign_drop("NOT_SPECIFIED", "tcp_v4_rcv", Some((0x18, false))).is_none());
        assert!(benign_drop("NETFILTER_DROP", "nf_hook_slow", None).is_none());
        assert!(benign_drop("NO_SOCKET", "__udp4_lib_rcv", None).is_none());
    }

    #[test]
    fn question_keys_match_from_wire_and_text() {
        // id 0x1234, RD, 1 question: WWW.Lab.test A IN (mixed case, DNS 0x20)
        let mut msg = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        msg.extend(b"\x03WWW\x03Lab\x04test\x00\x00\x01\x00\x01");
        let mut buf = [0u8; 264];
        let wire = question_key(&msg, &mut buf).unwrap().to_vec();
        assert_eq!(
            wire,
            question_key_of("www.lab.test.", "A", "IN")
                .unwrap()
                .to_vec()
        );
        assert_ne!(
            wire,
            question_key_of("www.lab.test.", "AAAA", "IN")
                .unwrap()
                .to_vec()
        );
        // Compression in a question, truncation, no question: no key, no panic.
        let mut ptr = msg[..12].to_vec();
        ptr.extend([0xc0, 0x0c, 0, 1, 0, 1]);
        assert!(question_key(&ptr, &mut buf).is_none());
        assert!(question_key(&msg[..20], &mut buf).is_none());
        let mut none = msg.clone();
        none[5] = 0;
        assert!(question_key(&none, &mut buf).is_none());
    }

    #[test]
    fn conntrack_status_names() {
        let flow = |s: &str, d: &str| crate::event::CtFlow {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
            proto: 17,
        };
        let r = ct_record(&CtSnapshot {
            status: 0x1a0,
            orig: flow("10.244.1.2:5000", "10.96.0.10:53"),
            reply: flow("10.244.1.3:53", "10.244.1.2:5000"),
        });
        assert_eq!(
            r.status_flags,
            vec!["DST_NAT", "SRC_NAT_DONE", "DST_NAT_DONE"]
        );
        assert!(!r.confirmed);
        assert_eq!(r.orig.dst, "10.96.0.10:53");
    }
}
