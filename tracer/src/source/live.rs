//! The live source: records from the `EVENTS` ring buffer → [`SourceEvent`].
use aya::maps::{MapData, RingBuf};
use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tracer_common::{Dir, RingRecord};

use crate::event::{
    CapturedPacket, CtFlow, CtSnapshot, Direction, KernelDrop, ObservationPoint, SourceEvent,
};

/// Records read from the ring buffer per batch. A batch is decoded and correlated whole
/// before the next is read, and the buffers it passes through keep their largest size: a
/// drain that lasts while the kernel keeps writing (a reader as slow as the traffic is fast)
/// grew them by hundreds of megabytes, never given back.
pub const MAX_BATCH: usize = 4096;

/// Interprets one ring-buffer record (decoded by tracer-common, next to its layout).
pub fn parse_record(bytes: &[u8]) -> SourceEvent {
    match RingRecord::parse(bytes) {
        Ok(RingRecord::Packet { hdr, dir, data }) => SourceEvent::Packet(CapturedPacket {
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
            data: Bytes::copy_from_slice(data),
        }),
        Ok(RingRecord::Drop { ev, data }) => {
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
        Err(why) => SourceEvent::Garbled {
            len: bytes.len(),
            why,
        },
    }
}

/// Async reader over the ring buffer (tokio `AsyncFd`, never blocking the runtime).
pub struct LiveSource {
    fd: AsyncFd<RingBuf<MapData>>,
    /// The last read stopped at [`MAX_BATCH`] with records left in the ring buffer.
    behind: bool,
}

impl LiveSource {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the AsyncFd owns the RingBuf, so its fd stays open (and is not reused)
        // for as long as it is registered.
        let fd = unsafe { AsyncFd::register(ring) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { fd, behind: false })
    }

    /// Waits until records are available, then drains them all into `out`.
    pub async fn next_batch(&mut self, out: &mut Vec<SourceEvent>) -> std::io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let mut taken = 0;
        let drained = loop {
            if taken == MAX_BATCH {
                break false;
            }
            match ring.next() {
                Some(item) => out.push(parse_record(&item)),
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
        self.behind = poll(self.fd.get_mut(), out);
    }
}

/// Takes at most a batch; `true` if records are left.
fn poll(ring: &mut RingBuf<MapData>, out: &mut Vec<SourceEvent>) -> bool {
    for _ in 0..MAX_BATCH {
        match ring.next() {
            Some(item) => out.push(parse_record(&item)),
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
    /// Drops read from it (they would have been lost without it).
    pub read: u64,
}

impl DropReserve {
    pub fn new(ring: RingBuf<MapData>) -> Self {
        Self { ring, read: 0 }
    }

    /// Takes what is there (at most a batch) when `source` is drained.
    pub fn poll_after(&mut self, source: &LiveSource, out: &mut Vec<SourceEvent>) {
        if source.behind() {
            return;
        }
        let before = out.len();
        poll(&mut self.ring, out);
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
        let hdr = PacketHeader {
            kind: EventKind::Packet as u32,
            cpu: 1,
            ts_ns: 5,
            netns_cookie: 9,
            ifindex: 3,
            orig_len: 100,
            cap_len,
            vlan_tci: 0x2007,
            dir,
            _reserved: 0,
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
        for k in [EventKind::Packet, EventKind::Drop] {
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
            RecordError::TooShort { need: 40, .. }
        ));
        assert_eq!(why(&packet_record(9, 0, &[])), RecordError::UnknownDir(9));
    }
}
