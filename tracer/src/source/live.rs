//! The live source: records from the `EVENTS` ring buffer → [`SourceEvent`].
use aya::maps::{MapData, RingBuf};
use bytes::{Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tracer_common::{
    proto::{IPV6_HEADER_LEN, UDP_HEADER_LEN},
    Dir, DropEvent, PacketHeader, RecordError, RingRecord,
};

use crate::event::{
    CapturedPacket, CtFlow, CtSnapshot, Direction, KernelDrop, ObservationPoint, SourceEvent,
};

/// Records read from the ring buffer per batch. A batch is decoded and correlated whole
/// before the next is read, and the buffers it passes through keep their largest size: a
/// drain that lasts while the kernel keeps writing (a reader as slow as the traffic is fast)
/// grew them by hundreds of megabytes, never given back.
pub const MAX_BATCH: usize = 4096;

/// Interprets one ring-buffer record (decoded by tracer-common, next to its layout) on its
/// own: a copy record (`tracer_common::copies`) comes out as lost, since only a
/// [`RecordReader`] that read its message's packet record can rebuild it.
pub fn parse_record(bytes: &[u8]) -> SourceEvent {
    RecordReader::default().parse(bytes)
}

/// Reads the ring buffer's records in order, holding the packet records of messages later
/// copies name (`tracer_common::copies`), so that a copy record comes out as the packet its
/// hook saw: its own IP and UDP headers in front of the message's payload.
pub struct RecordReader {
    /// Per CPU (the message id's top 16 bits), the last [`RecordReader::per_cpu`] messages
    /// sent whole there, by their per-CPU count (ids are handed out in order on a CPU, so
    /// a slot is taken again only by the message `per_cpu` later).
    messages: Vec<Vec<Held>>,
    per_cpu: usize,
    /// The kernel's possible CPUs: an id naming another is not the kernel's (a garbled
    /// record) and is never held, so the tables stay within `cpus × per_cpu`.
    cpus: usize,
}

/// A message sent whole: its id, its record's bytes, and where its UDP payload starts.
#[derive(Clone, Default)]
struct Held {
    msg: u64,
    data: Bytes,
    payload: usize,
}

/// Messages held in all: a copy follows its message within microseconds (the same
/// `sk_buff` on its way), so the last thousands are plenty; at most this many records' bytes
/// are held (each ≤ `MAX_PACKET_DATA`), shared with the pipeline meanwhile.
const HELD_MESSAGES: usize = 4096;
/// Held per CPU at the least, however many CPUs the node has.
const MIN_HELD_PER_CPU: usize = 128;

impl Default for RecordReader {
    fn default() -> Self {
        let cpus = aya::util::nr_cpus().unwrap_or(1).max(1);
        Self {
            messages: Vec::new(),
            per_cpu: (HELD_MESSAGES / cpus)
                .next_power_of_two()
                .max(MIN_HELD_PER_CPU),
            cpus,
        }
    }
}

impl RecordReader {
    fn slot(&mut self, msg: u64) -> Option<&mut Held> {
        let cpu = ((msg >> 48) as usize)
            .checked_sub(1)
            .filter(|&c| c < self.cpus)?;
        let n = (msg & ((1 << 48) - 1)) as usize % self.per_cpu;
        if self.messages.len() <= cpu {
            // One table a CPU, made when its CPU is first seen.
            self.messages.resize_with(cpu + 1, Vec::new);
        }
        let table = self.messages.get_mut(cpu)?;
        if table.is_empty() {
            table.resize_with(self.per_cpu, Held::default);
        }
        table.get_mut(n)
    }

    /// Interprets the next record.
    pub fn parse(&mut self, bytes: &[u8]) -> SourceEvent {
        match RingRecord::parse(bytes) {
            Ok(RingRecord::Packet { hdr, dir, data }) => {
                let data = Bytes::copy_from_slice(data);
                if hdr.msg != 0 {
                    let payload = udp_payload_offset(&data);
                    if let Some(slot) = self.slot(hdr.msg) {
                        *slot = Held {
                            msg: hdr.msg,
                            data: data.clone(),
                            payload,
                        };
                    }
                }
                SourceEvent::Packet(packet(&hdr, dir, data))
            }
            Ok(RingRecord::Copy { hdr, dir, headers }) => {
                let held = self.slot(hdr.msg).filter(|h| h.msg == hdr.msg);
                let Some(payload) = held.and_then(|h| h.data.get(h.payload..)) else {
                    return SourceEvent::Garbled {
                        len: bytes.len(),
                        why: RecordError::UnknownMessage(hdr.msg),
                    };
                };
                let mut data = BytesMut::with_capacity(headers.len() + payload.len());
                data.extend_from_slice(headers);
                data.extend_from_slice(payload);
                SourceEvent::Packet(packet(&hdr, dir, data.freeze()))
            }
            Ok(RingRecord::Drop { ev, data }) => drop_event(&ev, data),
            Err(why) => SourceEvent::Garbled {
                len: bytes.len(),
                why,
            },
        }
    }
}

/// Where the UDP payload of a datagram the kernel sent whole with a message id starts:
/// after its IPv4 header (with options) or its IPv6 header (no extension headers), and the
/// UDP header (`tracer_common::copies`).
fn udp_payload_offset(data: &[u8]) -> usize {
    match data.first().map(|v| (v >> 4, v & 0x0f)) {
        Some((4, ihl)) => ihl as usize * 4 + UDP_HEADER_LEN,
        _ => IPV6_HEADER_LEN + UDP_HEADER_LEN,
    }
}

fn packet(hdr: &PacketHeader, dir: Dir, data: Bytes) -> CapturedPacket {
    CapturedPacket {
        ts_ns: hdr.ts_ns,
        cpu: Some(hdr.cpu),
        at: ObservationPoint {
            netns: hdr.netns_cookie,
            ifindex: hdr.ifindex,
            dir: match dir {
                Dir::Ingress => Direction::Ingress,
                Dir::Egress => Direction::Egress,
            },
        },
        vlan: (hdr.vlan_tci != 0).then_some(hdr.vlan_tci & 0x0fff),
        orig_len: hdr.orig_len,
        data,
    }
}

fn drop_event(ev: &DropEvent, data: &[u8]) -> SourceEvent {
    let ct = if ev.has_ct != 0 {
        match (
            CtFlow::from_tuple(&ev.ct_orig),
            CtFlow::from_tuple(&ev.ct_reply),
        ) {
            (Some(orig), Some(reply)) => Some(CtSnapshot {
                status: ev.ct_status,
                orig,
                reply,
            }),
            _ => None,
        }
    } else {
        None
    };
    SourceEvent::Drop(KernelDrop {
        ts_ns: ev.ts_ns,
        cpu: ev.cpu,
        netns: ev.netns_cookie,
        ifindex: ev.ifindex,
        reason: ev.reason,
        location: ev.location,
        ct,
        orig_len: ev.orig_len,
        data: Bytes::copy_from_slice(data),
        confirm_failed: ev.confirm_failed != 0,
        named: None,
    })
}

/// Async reader over the ring buffer (tokio `AsyncFd`, never blocking the runtime).
pub struct LiveSource {
    fd: AsyncFd<RingBuf<MapData>>,
    records: RecordReader,
    /// The last read stopped at [`MAX_BATCH`] with records left in the ring buffer.
    behind: bool,
}

impl LiveSource {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the AsyncFd owns the RingBuf, so its fd stays open (and is not reused)
        // for as long as it is registered.
        let fd = unsafe { AsyncFd::register(ring) }.map_err(|e| e.into_parts().1)?;
        Ok(Self {
            fd,
            records: RecordReader::default(),
            behind: false,
        })
    }

    /// Waits until records are available, then drains them all into `out`.
    pub async fn next_batch(&mut self, out: &mut Vec<SourceEvent>) -> std::io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let records = &mut self.records;
        let mut taken = 0;
        let drained = loop {
            if taken == MAX_BATCH {
                break false;
            }
            match ring.next() {
                Some(item) => out.push(records.parse(&item)),
                None => break true,
            }
            taken += 1;
        };
        // Not drained: left ready, the rest is read on the next turn of the run loop.
        if drained {
            guard.clear_ready();
        }
        self.behind = !drained;
        Ok(())
    }

    /// The last read left records in the ring buffer.
    pub fn behind(&self) -> bool {
        self.behind
    }

    /// Takes what is there, at most a batch, without waiting: the run loop's poll. The
    /// kernel programs wake the reader only once a backlog has built up, so a trickle of
    /// records is read here.
    pub fn poll_now(&mut self, out: &mut Vec<SourceEvent>) {
        self.behind = poll(self.fd.get_mut(), &mut self.records, out);
    }
}

/// Takes at most a batch; `true` if records are left.
fn poll(
    ring: &mut RingBuf<MapData>,
    records: &mut RecordReader,
    out: &mut Vec<SourceEvent>,
) -> bool {
    for _ in 0..MAX_BATCH {
        match ring.next() {
            Some(item) => out.push(records.parse(&item)),
            None => return false,
        }
    }
    true
}

/// The drops' reserve ring (`DROP_RESERVE`): drops the kernel could not put in `EVENTS`
/// because it was full. Read only when [`LiveSource`] is not behind, so a drop comes after
/// the packets read before it, as it would have from `EVENTS`.
pub struct DropReserve {
    ring: RingBuf<MapData>,
    /// Drop records only; never a copy.
    records: RecordReader,
    /// Drops read from it (they would have been lost without it).
    pub read: u64,
}

impl DropReserve {
    pub fn new(ring: RingBuf<MapData>) -> Self {
        Self {
            ring,
            records: RecordReader::default(),
            read: 0,
        }
    }

    /// Takes what is there (at most a batch) when `source` is drained.
    pub fn poll_after(&mut self, source: &LiveSource, out: &mut Vec<SourceEvent>) {
        if source.behind() {
            return;
        }
        let before = out.len();
        poll(&mut self.ring, &mut self.records, out);
        self.read += (out.len() - before) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{
        Dir, DropEvent, EventKind, PacketHeader, RecordError, MAX_DROP_DATA, PACKET_HEADER_LEN,
    };

    fn packet_record(dir: u8, cap_len: u32, data: &[u8]) -> Vec<u8> {
        record(EventKind::Packet, 0, dir, cap_len, data)
    }

    fn record(kind: EventKind, msg: u64, dir: u8, cap_len: u32, data: &[u8]) -> Vec<u8> {
        let hdr = PacketHeader {
            kind: kind as u32,
            cpu: 1,
            ts_ns: 5,
            netns_cookie: 9,
            ifindex: 3,
            orig_len: 100,
            cap_len,
            vlan_tci: 0x2007,
            dir,
            _reserved: 0,
            msg,
        };
        // SAFETY: PacketHeader is plain old data without padding.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&hdr as *const PacketHeader).cast::<u8>(),
                PACKET_HEADER_LEN,
            )
        };
        let mut v = bytes.to_vec();
        v.extend_from_slice(data);
        v
    }

    /// An IPv4 (IHL `ihl`) + UDP datagram whose headers are all `h` and payload `payload`.
    fn datagram(ihl: u8, h: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![h; ihl as usize * 4 + 8];
        v[0] = 0x40 | ihl;
        v.extend_from_slice(payload);
        v
    }

    /// A copy record comes out as the packet its hook saw: its own headers in front of its
    /// message's payload; a copy of a message not held is lost, said why.
    #[test]
    fn copy_records_are_rebuilt_from_their_message() {
        // As on a node of four CPUs, whatever this machine has.
        let mut r = RecordReader {
            cpus: 4,
            ..Default::default()
        };
        let cpu2 = 3u64 << 48;
        let first = datagram(5, 0xaa, b"the dns payload");
        let whole = record(EventKind::Packet, cpu2 | 7, 0, first.len() as u32, &first);
        let SourceEvent::Packet(p) = r.parse(&whole) else {
            panic!("not a packet")
        };
        assert_eq!(p.data, first);
        // After DNAT, with IPv4 options: other headers, the same payload.
        let later = datagram(6, 0xbb, b"the dns payload");
        let headers = &later[..32];
        let copy = record(EventKind::Copy, cpu2 | 7, 1, 32, headers);
        let SourceEvent::Packet(p) = r.parse(&copy) else {
            panic!("not a packet")
        };
        assert_eq!(p.data, later, "its headers, the message's payload");
        assert_eq!(p.at.dir, Direction::Egress);
        // Another CPU's message 7, and ours once its slot was taken by a later message.
        let other = record(EventKind::Copy, (1 << 48) | 7, 1, 32, headers);
        assert!(matches!(
            r.parse(&other),
            SourceEvent::Garbled {
                why: RecordError::UnknownMessage(m),
                ..
            } if m == (1 << 48) | 7
        ));
        let n = r.per_cpu as u64;
        r.parse(&record(
            EventKind::Packet,
            cpu2 | (7 + n),
            0,
            first.len() as u32,
            &first,
        ));
        assert!(matches!(
            r.parse(&copy),
            SourceEvent::Garbled {
                why: RecordError::UnknownMessage(_),
                ..
            }
        ));
        // A copy read on its own (no reader before it) is lost too, never made up.
        assert!(matches!(parse_record(&copy), SourceEvent::Garbled { .. }));
        // An id naming a CPU beyond the kernel's (a garbled record): never held.
        let beyond = ((r.cpus as u64 + 1) << 48) | 7;
        r.parse(&record(
            EventKind::Packet,
            beyond,
            0,
            first.len() as u32,
            &first,
        ));
        assert!(r.messages.len() <= r.cpus);
        assert!(matches!(
            r.parse(&record(EventKind::Copy, beyond, 1, 32, headers)),
            SourceEvent::Garbled { .. }
        ));
        // Message id 0 (no CPU): not held, never found.
        assert!(matches!(
            r.parse(&record(EventKind::Copy, 0, 1, 32, headers)),
            SourceEvent::Garbled { .. }
        ));
    }

    #[test]
    fn packet_records_decode_with_their_direction_and_captured_bytes() {
        let SourceEvent::Packet(p) =
            parse_record(&packet_record(Dir::Egress as u8, 3, &[1, 2, 3, 4]))
        else {
            panic!("not a packet")
        };
        assert_eq!(
            (p.at.netns, p.at.ifindex, p.at.dir),
            (9, 3, Direction::Egress)
        );
        assert_eq!(p.vlan, Some(7));
        assert_eq!(p.data[..], [1, 2, 3], "cap_len bounds the bytes");
    }

    #[test]
    fn drop_records_carry_only_their_captured_bytes() {
        let drop_record = |cap_len: u32| {
            let mut v = vec![0u8; size_of::<DropEvent>()];
            v[..4].copy_from_slice(&(EventKind::Drop as u32).to_ne_bytes());
            let at = std::mem::offset_of!(DropEvent, cap_len);
            v[at..at + 4].copy_from_slice(&cap_len.to_ne_bytes());
            let at = std::mem::offset_of!(DropEvent, data);
            v[at..at + 4].copy_from_slice(&[1, 2, 3, 4]);
            v
        };
        let data = |record: Vec<u8>| match parse_record(&record) {
            SourceEvent::Drop(d) => d.data,
            _ => panic!("not a drop"),
        };
        assert_eq!(
            data(drop_record(3))[..],
            [1, 2, 3],
            "cap_len bounds the bytes"
        );
        assert_eq!(data(drop_record(u32::MAX)).len(), MAX_DROP_DATA);
    }

    #[test]
    fn kinds_and_directions_round_trip_through_their_wire_values() {
        for k in [EventKind::Packet, EventKind::Drop, EventKind::Copy] {
            assert_eq!(EventKind::try_from(k as u32), Ok(k));
        }
        for d in [Dir::Ingress, Dir::Egress] {
            assert_eq!(Dir::try_from(d as u8), Ok(d));
        }
        assert_eq!(EventKind::try_from(0), Err(RecordError::UnknownKind(0)));
        assert_eq!(Dir::try_from(2), Err(RecordError::UnknownDir(2)));
    }

    /// Records that are not what the kernel writes are counted as garbled, with why.
    #[test]
    fn bad_records_say_what_is_wrong() {
        let why = |b: &[u8]| match parse_record(b) {
            SourceEvent::Garbled { why, .. } => why,
            _ => panic!("accepted"),
        };
        assert_eq!(why(&[1, 0]), RecordError::NoKind { len: 2 });
        assert_eq!(why(&7u32.to_ne_bytes()), RecordError::UnknownKind(7));
        assert!(matches!(
            why(&(EventKind::Packet as u32).to_ne_bytes()),
            RecordError::TooShort { need: 48, .. }
        ));
        assert_eq!(why(&packet_record(9, 0, &[])), RecordError::UnknownDir(9));
    }
}
