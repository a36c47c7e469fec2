//! Captured packets: reassembled, framed (TCP), decoded, counted, and reported, with each
//! DNS message handed to the correlate stage.
use super::{cache::MessageCache, *};
use crate::decode::tunnel::{self, Decap};

/// What became of one DNS message's bytes.
pub(super) enum Decoded {
    Whole(Arc<dns::DnsMessage>),
    /// The capture cut it: what was decoded (`None`: not even the header was captured).
    Cut(Option<Arc<dns::DnsMessage>>),
    /// Wrong in itself (or in the part the capture holds): why.
    Malformed(String),
}

/// The length on the wire of a message whose end the capture cut off, or `None` when the
/// capture holds it whole. Cut means both: the packet's headers say `missing` bytes of the
/// transport payload are not in the capture, and the capture's own record of the packet's
/// length (`orig_len`, from the IP header on) says it held fewer bytes than were on the wire.
/// A packet whose headers promise more than the wire had is short in itself, not cut.
pub(super) fn cut_by_capture(
    orig_len: u32,
    caplen: usize,
    missing: usize,
    captured: usize,
) -> Option<usize> {
    let cut = missing > 0 && usize::try_from(orig_len).is_ok_and(|wire| wire > caplen);
    cut.then(|| captured.saturating_add(missing))
}

/// Decodes one message; `cut`: its length on the wire when the capture cut it. Whole
/// messages go through the cache of messages decoded lately (the same bytes at the previous
/// hop).
pub(super) fn decode_message(
    messages: &mut MessageCache,
    bytes: &[u8],
    cut: Option<usize>,
) -> Decoded {
    match cut {
        None => match messages.decode(bytes) {
            Ok(m) => Decoded::Whole(m),
            Err(e) => Decoded::Malformed(e.to_string()),
        },
        Some(len) => match dns::decode_cut(bytes, len) {
            // Only bytes after the message were missing.
            Ok(Some(m)) if m.cut.is_none() => Decoded::Whole(Arc::new(m)),
            Ok(m) => Decoded::Cut(m.map(Arc::new)),
            Err(e) => Decoded::Malformed(format!(
                "{e} (in the {} bytes captured of a {len}-byte message)",
                bytes.len()
            )),
        },
    }
}

/// A packet record of a message seen at `at` (`place`: its namespace and interface names),
/// with nothing decoded yet and no packet of its own (`cpu`, `len`, `caplen`, `vlan`
/// unset).
fn packet_record(
    clock: &Clock,
    ts_ns: u64,
    at: ObservationPoint,
    (netns, ifname): (Arc<str>, Arc<str>),
    proto: Proto,
    src: Endpoint,
    dst: Endpoint,
) -> PacketRecord {
    PacketRecord {
        pod: None,
        ts_ns,
        time: clock.wall(ts_ns),
        cpu: None,
        netns,
        netns_cookie: at.netns,
        ifname,
        ifindex: at.ifindex,
        dir: at.dir,
        proto,
        src,
        dst,
        len: 0,
        caplen: 0,
        vlan: None,
        tunnel: None,
        dns: None,
        malformed: None,
        capture_truncated: false,
    }
}

impl Decoder {
    /// Puts a decode result into a packet record, counts it, hands a message (whole or
    /// cut) to the correlate stage, and reports the record — unless only the unusual ones
    /// are wanted and it is a whole message (counted in the stats all the same): then the
    /// observation takes the record's names and message instead of copies of them.
    pub(super) fn record_decoded(
        &mut self,
        mut r: PacketRecord,
        decoded: Decoded,
        (src, dst, at): (SocketAddr, SocketAddr, ObservationPoint),
        out: &mut Vec<impl From<DecodeReport>>,
    ) {
        match decoded {
            Decoded::Whole(m) => {
                self.stats.decoded += 1;
                if !self.every_packet || self.holding {
                    if self.every_packet {
                        self.held += 1;
                    }
                    if let Some(obs) = self.observed.as_mut() {
                        obs.push(Observed::Message(Observation {
                            ts_ns: r.ts_ns,
                            at,
                            netns: r.netns,
                            ifname: r.ifname,
                            proto: r.proto,
                            src,
                            dst,
                            msg: m,
                            tunnel: r.tunnel,
                        }));
                    }
                    return;
                }
                r.dns = Some(m);
            }
            Decoded::Cut(m) => {
                self.stats.capture_truncated += 1;
                r.capture_truncated = true;
                r.dns = m;
            }
            Decoded::Malformed(why) => {
                self.stats.malformed += 1;
                r.malformed = Some(why);
            }
        }
        self.observe(&r, src, dst, at);
        out.push(DecodeReport::Packet(r).into());
    }

    /// One captured packet: reassembled, decoded, counted and reported.
    pub fn on_packet(&mut self, p: CapturedPacket, out: &mut Vec<impl From<DecodeReport>>) {
        self.stats.packets += 1;
        self.tick(p.ts_ns, out);
        // A packet inside a tunnel is the inner packet from here on (its fragments
        // reassembled per hop like any other's); its record keeps the outer lengths and the
        // tunnel.
        let (p, tunnel, outer_len) = match tunnel::decapsulate(&p.data) {
            Ok(Decap::Plain) => (p, None, None),
            Ok(Decap::Inner { tunnel, offset }) => {
                let outer_len = (p.orig_len, p.data.len() as u32);
                let inner = CapturedPacket {
                    orig_len: p.orig_len.saturating_sub(offset as u32),
                    data: p.data.slice(offset..),
                    ..p
                };
                (inner, Some(Arc::new(tunnel)), Some(outer_len))
            }
            Ok(Decap::NotIp(_)) => {
                self.stats.other += 1;
                return;
            }
            Err(e) => {
                self.stats.malformed += 1;
                let (src, dst) = parse_ip(&p.data)
                    .map(|ip| (Endpoint::Ip(ip.src), Endpoint::Ip(ip.dst)))
                    .unwrap_or_default();
                let place = self.place(p.at.netns, p.at.ifindex);
                let r = PacketRecord {
                    cpu: p.cpu,
                    len: p.orig_len,
                    caplen: p.data.len() as u32,
                    vlan: p.vlan,
                    malformed: Some(format!("tunnel: {e}")),
                    ..packet_record(&self.clock, p.ts_ns, p.at, place, Proto::Ip, src, dst)
                };
                out.push(DecodeReport::Packet(r).into());
                return;
            }
        };
        let (p, rejected) = match self.frag.push(p) {
            Pushed::Unfragmented(p) | Pushed::Complete(p) => (p, None),
            Pushed::Held => return,
            Pushed::Rejected(p, e) => (p, Some(e)),
        };
        let (netns, ifname) = self.place(p.at.netns, p.at.ifindex);
        let clock = self.clock;
        // The place's names go into the record (a UDP packet's one record takes them).
        let (len, caplen) = outer_len.unwrap_or((p.orig_len, p.data.len() as u32));
        let base = |proto: Proto, src: Endpoint, dst: Endpoint, place: Place| PacketRecord {
            cpu: p.cpu,
            len,
            caplen,
            vlan: p.vlan,
            tunnel: tunnel.clone(),
            ..packet_record(&clock, p.ts_ns, p.at, place, proto, src, dst)
        };
        let ip = match (parse_ip(&p.data), rejected) {
            (Ok(ip), None) => ip,
            (ip, rejected) => {
                self.stats.malformed += 1;
                // A rejected fragment's IP addresses alone; nothing without an IP header.
                let (src, dst) = ip
                    .as_ref()
                    .map(|ip| (Endpoint::Ip(ip.src), Endpoint::Ip(ip.dst)))
                    .unwrap_or_default();
                let mut r = base(Proto::Ip, src, dst, (netns, ifname));
                r.malformed = Some(match (ip, rejected) {
                    (_, Some(e)) => e.to_string(),
                    (Err(e), None) => format!("IP: {e}"),
                    (Ok(_), None) => String::new(),
                });
                out.push(DecodeReport::Packet(r).into());
                return;
            }
        };
        match ip.transport {
            Transport::Udp {
                sport,
                dport,
                payload,
            } => {
                if !self.summarise.is_empty() {
                    let mut buf = [0u8; 264];
                    if let Some(key) = question_key(payload, &mut buf) {
                        if let Some(s) = self.summarise.get_mut(key) {
                            s.count += 1;
                            s.last_ts = s.last_ts.max(p.ts_ns);
                            self.stats.summarised += 1;
                            return;
                        }
                    }
                }
                let (src, dst) = (
                    SocketAddr::new(ip.src, sport),
                    SocketAddr::new(ip.dst, dport),
                );
                let r = base(Proto::Udp, src.into(), dst.into(), (netns, ifname));
                let cut = cut_by_capture(p.orig_len, p.data.len(), ip.missing, payload.len());
                let decoded = match decode_message(&mut self.messages, payload, cut) {
                    // Short of what its headers say, though nothing was cut on capture.
                    Decoded::Malformed(e) if ip.missing > 0 && cut.is_none() => {
                        Decoded::Malformed(format!(
                            "{e} (the IP/UDP lengths promise {} more bytes than the packet had)",
                            ip.missing
                        ))
                    }
                    d => d,
                };
                self.record_decoded(r, decoded, (src, dst, p.at), out);
            }
            Transport::Tcp {
                sport,
                dport,
                seq,
                flags,
                payload,
            } => {
                let src = SocketAddr::new(ip.src, sport);
                let dst = SocketAddr::new(ip.dst, dport);
                let key = FlowKey {
                    netns: p.at.netns,
                    ifindex: p.at.ifindex,
                    dir: p.at.dir.as_code(),
                    src,
                    dst,
                };
                let mut produced = std::mem::take(&mut self.tcp_out);
                produced.clear();
                let cut = cut_by_capture(p.orig_len, p.data.len(), ip.missing, payload.len());
                self.tcp.push(
                    p.ts_ns,
                    key,
                    seq,
                    flags,
                    payload,
                    cut.is_some(),
                    &mut produced,
                );
                // Each segment counts once here; the messages framed from the stream count
                // in `decoded`/`capture_truncated`/`malformed` and in `tcp_messages`.
                if payload.is_empty() {
                    self.stats.tcp_control += 1;
                } else {
                    self.stats.tcp_data += 1;
                }
                for item in produced.drain(..) {
                    let r = base(
                        Proto::Tcp,
                        src.into(),
                        dst.into(),
                        (Arc::clone(&netns), Arc::clone(&ifname)),
                    );
                    self.tcp_message(item, r, src, dst, p.at, out);
                }
                self.tcp_out = produced;
                self.tcp.expire(p.ts_ns);
                self.report_closed_flows(p.ts_ns, out);
            }
            Transport::Other { .. } => {
                self.stats.other += 1;
            }
        }
    }

    /// Decodes one output of the TCP reassembler into `r`, counts it, and emits it.
    fn tcp_message(
        &mut self,
        item: TcpOutput,
        r: PacketRecord,
        src: SocketAddr,
        dst: SocketAddr,
        at: ObservationPoint,
        out: &mut Vec<impl From<DecodeReport>>,
    ) {
        let decoded = match item {
            TcpOutput::Message(bytes) => decode_message(&mut self.messages, &bytes, None),
            TcpOutput::Cut {
                captured,
                message_len: Some(len),
            } => decode_message(&mut self.messages, &captured, Some(len)),
            // Not even the length prefix of the message was captured.
            TcpOutput::Cut {
                message_len: None, ..
            } => Decoded::Cut(None),
            TcpOutput::Malformed { reason, bytes } => {
                Decoded::Malformed(format!("TCP stream: {reason} ({bytes} bytes)"))
            }
        };
        self.stats.tcp_messages += 1;
        self.record_decoded(r, decoded, (src, dst, at), out);
    }

    /// Reports what TCP flows that were forgotten (evicted, idle, or at the end) still held:
    /// a `malformed` record per unfinished message, at `ts_ns`, on the flow's hop. Such a
    /// record stands for no packet of its own (`len` and `caplen` 0).
    pub(super) fn report_closed_flows(
        &mut self,
        ts_ns: u64,
        out: &mut Vec<impl From<DecodeReport>>,
    ) {
        let mut closed = std::mem::take(&mut self.tcp_closed);
        self.tcp.take_closed(&mut closed);
        for (key, item) in closed.drain(..) {
            let at = ObservationPoint {
                netns: key.netns,
                ifindex: key.ifindex,
                dir: Direction::from_code(key.dir),
            };
            let (netns, ifname) = self.place(key.netns, key.ifindex);
            let r = packet_record(
                &self.clock,
                ts_ns,
                at,
                (netns, ifname),
                Proto::Tcp,
                key.src.into(),
                key.dst.into(),
            );
            self.tcp_message(item, r, key.src, key.dst, at, out);
        }
        self.tcp_closed = closed;
    }
}
