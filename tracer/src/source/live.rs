//! The live source: records from the `EVENTS` ring buffer → [`SourceEvent`].
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;
use tracer_common::{
    DropEvent, PacketHeader, DIR_EGRESS, EVENT_DROP, EVENT_PACKET, PACKET_HEADER_LEN,
};

use crate::event::{
    CapturedPacket, CtFlow, CtSnapshot, Direction, KernelDrop, ObservationPoint, SourceEvent,
};

/// Reads a `#[repr(C)]` record without assuming the ring buffer's alignment.
fn read_record<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is plain old data shared with the kernel programs.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Interprets one ring-buffer record.
pub fn parse_record(bytes: &[u8]) -> SourceEvent {
    let kind = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes);
    match kind {
        Some(EVENT_PACKET) => match read_record::<PacketHeader>(bytes) {
            Some(ev) => {
                let data = bytes.get(PACKET_HEADER_LEN..).unwrap_or_default();
                let cap = (ev.cap_len as usize).min(data.len());
                SourceEvent::Packet(CapturedPacket {
                    ts_ns: ev.ts_ns,
                    cpu: Some(ev.cpu),
                    at: ObservationPoint {
                        netns: ev.netns_cookie,
                        ifindex: ev.ifindex,
                        dir: if ev.dir == DIR_EGRESS {
                            Direction::Egress
                        } else {
                            Direction::Ingress
                        },
                    },
                    vlan: (ev.vlan_tci != 0).then_some(ev.vlan_tci & 0x0fff),
                    orig_len: ev.orig_len,
                    data: data[..cap].to_vec(),
                })
            }
            None => SourceEvent::Garbled { len: bytes.len() },
        },
        Some(EVENT_DROP) => match read_record::<DropEvent>(bytes) {
            Some(ev) => {
                let cap = (ev.cap_len as usize).min(ev.data.len());
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
                    data: ev.data[..cap].to_vec(),
                    confirm_failed: ev.confirm_failed != 0,
                })
            }
            None => SourceEvent::Garbled { len: bytes.len() },
        },
        _ => SourceEvent::Garbled { len: bytes.len() },
    }
}

/// Async reader over the ring buffer (tokio `AsyncFd`, never blocking the runtime).
pub struct LiveSource {
    fd: AsyncFd<RingBuf<MapData>>,
}

impl LiveSource {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the AsyncFd owns the RingBuf, so its fd stays open (and is not reused)
        // for as long as it is registered.
        let fd = unsafe { AsyncFd::register(ring) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    /// Waits until records are available, then drains them all into `out`.
    pub async fn next_batch(&mut self, out: &mut Vec<SourceEvent>) -> std::io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            out.push(parse_record(&item));
        }
        guard.clear_ready();
        Ok(())
    }

    /// Drains what is there without waiting (at shutdown).
    pub fn drain(&mut self, out: &mut Vec<SourceEvent>) {
        let ring = self.fd.get_mut();
        while let Some(item) = ring.next() {
            out.push(parse_record(&item));
        }
    }
}
