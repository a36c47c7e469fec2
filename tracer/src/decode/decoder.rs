//! The decode stage of the pipeline: packet and drop events → packet and
//! drop records (DNS decoded, TCP reassembled, cut and malformed messages told apart), the
//! counters that account for every packet, and typed observations for the correlate stage.
use std::{collections::HashMap, net::SocketAddr, sync::Arc};

use crate::{
    decode::{
        dns,
        frag::{FragLimits, FragmentLoss, Pushed, Reassembler},
        ip::Endpoint,
        observation::{DropObservation, Observation, Observed, FRAGMENT_LOSS},
        parse_ip,
        record::{DecodeReport, DecodeStats, FragmentLossRecord, KernelStats, PacketRecord, Proto},
        tcp::{FlowKey, TcpLimits, TcpOutput, TcpReassembler},
        Transport,
    },
    event::{CapturedPacket, Direction, KernelCounters, ObservationPoint},
    kallsyms::Kallsyms,
    names::SharedNames,
    time::Clock,
};

mod cache;
mod drop;
mod packet;
mod shed;

pub use drop::{benign_drop, UNKNOWN_REASON};
use shed::question_key;
pub use shed::{question_hash, Summarised, WireQuestion};

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
    /// The places named lately, for the next packets seen there.
    places: PlaceCache,
    /// Messages decoded lately, by their bytes: the same message at the next hop.
    messages: cache::MessageCache,
    /// A record for every packet (else only for malformed and cut ones).
    every_packet: bool,
    /// For now, no record of a whole message even though every packet is wanted: the one
    /// sink that writes them cannot take them ([`Decoder::hold_packet_records`]).
    holding: bool,
    /// Records of whole messages not made while holding.
    held: u64,
    /// Of `stats.lost`, copy records whose message was not held (`tracer_common::copies`).
    lost_copies: u64,
}

/// The names of the last few places (namespace cookie, ifindex) packets were seen at, as
/// [`Names::place`](crate::names::Names::place) gave them at one generation of the names:
/// a packet's place is then a short scan instead of two map lookups.
#[derive(Default)]
struct PlaceCache {
    generation: u64,
    entries: Vec<((u64, u32), Place)>,
    /// The entry to replace next when full.
    next: usize,
}

/// A place's names: namespace, interface.
type Place = (Arc<str>, Arc<str>);

/// Places remembered: a node's hops of one query path are a handful of interfaces.
const PLACES: usize = 8;

impl PlaceCache {
    fn get(&mut self, names: &crate::names::Names, netns: u64, ifindex: u32) -> Place {
        if names.generation() != self.generation {
            self.entries.clear();
            self.next = 0;
            self.generation = names.generation();
        }
        let key = (netns, ifindex);
        if let Some((_, (ns, ifname))) = self.entries.iter().find(|(k, _)| *k == key) {
            return (Arc::clone(ns), Arc::clone(ifname));
        }
        let place = names.place(netns, ifindex);
        let entry = (key, (Arc::clone(&place.0), Arc::clone(&place.1)));
        if self.entries.len() < PLACES {
            self.entries.push(entry);
        } else if let Some(slot) = self.entries.get_mut(self.next) {
            *slot = entry;
            self.next = (self.next + 1) % PLACES;
        }
        place
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
            places: PlaceCache::default(),
            messages: cache::MessageCache::default(),
            every_packet: true,
            holding: false,
            held: 0,
            lost_copies: 0,
            confirm_hook: false,
        }
    }

    /// Smaller reassembly tables (the fuzz harness's, to reach their bounds); before the
    /// first packet.
    pub(crate) fn set_limits(&mut self, tcp: TcpLimits, frag: FragLimits) {
        self.tcp = TcpReassembler::new(tcp);
        self.frag = Reassembler::new(frag);
    }

    /// Every table within its bound (the fuzz harness's check after each event,
    /// `crate::fuzzing`): the reassemblers', the questions only counted (one per active
    /// loop at most: `loops`, the loop detector's cap), the places named.
    pub(crate) fn check_bounds(&self, loops: usize) -> Result<(), String> {
        self.frag.check_bounds()?;
        self.tcp.check_bounds()?;
        if self.summarise.len() > loops {
            return Err(format!(
                "questions summarised: {} > {loops}",
                self.summarise.len()
            ));
        }
        if self.places.entries.len() > PLACES {
            return Err(format!("places: {} > {PLACES}", self.places.entries.len()));
        }
        Ok(())
    }

    /// The conntrack-confirm hook is loaded: a drop's `confirm_failed` flag is then the
    /// kernel's word (without it the flag is meaningless and not passed on).
    pub fn set_confirm_hook(&mut self, loaded: bool) {
        self.confirm_hook = loaded;
    }

    /// Report only the packets whose message was malformed or cut, not every packet
    /// (the agent: its metrics count packets from the stats, and nothing writes packets).
    /// Every packet is still decoded, counted and handed to the correlate stage.
    pub fn unusual_packets_only(&mut self) {
        self.every_packet = false;
    }

    /// While `hold` is set, whole messages get no packet record (as with
    /// [`Decoder::unusual_packets_only`]) and are counted instead: `trace` holds them while
    /// its output's queue is full, where they would be dropped anyway, so the reading thread
    /// does not make them. Every packet is still decoded, counted and handed to the correlate
    /// stage.
    pub fn hold_packet_records(&mut self, hold: bool) {
        self.holding = hold;
    }

    /// The packet records not made while holding, since the last call.
    pub fn take_held(&mut self) -> u64 {
        std::mem::take(&mut self.held)
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
                proto: r.proto,
                src,
                dst,
                msg: Arc::clone(msg),
                tunnel: r.tunnel.clone(),
            }));
        }
    }

    /// The names of a place, as records give them.
    fn place(&mut self, netns: u64, ifindex: u32) -> Place {
        match self.names.read() {
            Ok(names) => self.places.get(&names, netns, ifindex),
            Err(_) => crate::names::place(&self.names, netns, ifindex),
        }
    }

    /// A ring-buffer record that could not be read: counted as lost. (Packets and drops go
    /// to [`Decoder::on_packet`] and [`Decoder::on_drop`]; conntrack events and samples
    /// bypass this stage.)
    pub fn on_garbled(&mut self, len: usize, why: tracer_common::RecordError) {
        if let tracer_common::RecordError::UnknownMessage(_) = why {
            // A copy of a message whose record was lost (counted there too) or is too old:
            // counted as lost, said once at warn level.
            if self.lost_copies == 0 {
                log::warn!("{why}: counted in stats.lost (said once)");
            } else {
                log::debug!("{why}");
            }
            self.lost_copies += 1;
        } else {
            log::warn!("unreadable ring-buffer record of {len} bytes: {why}");
        }
        self.stats.lost += 1;
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
                obs.push(Observed::Drop(Box::new(DropObservation {
                    ts_ns: l.last_ts_ns,
                    cpu: 0,
                    netns_cookie: l.key.at.netns,
                    netns: r.netns.clone(),
                    ifname: r.ifname.clone(),
                    reason: FRAGMENT_LOSS.to_string(),
                    location: r.what_missing(),
                    function: String::new(),
                    benign: false,
                    proto: Proto::from_number(l.key.proto),
                    src: SocketAddr::new(l.key.src, sport),
                    dst: SocketAddr::new(l.key.dst, dport),
                    ct: None,
                    confirm_failed: None,
                    msg: Some(Arc::new(msg.clone())),
                    fragment: Some(r.part()),
                })));
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
mod tests;
