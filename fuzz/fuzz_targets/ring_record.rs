//! Ring-buffer records, as userspace reads them from the eBPF `EVENTS` ring buffer
//! (`source::live::RecordReader`, over tracer-common's `RingRecord::parse`): any bytes give
//! a packet, a drop or a garbled record, never a panic, and a record's bytes never claim
//! more than its `cap_len` and the record hold (a copy record's: its headers and the payload
//! of an earlier record). The records then go through the live
//! pipeline (`dnspath::fuzzing::Harness`: decode, correlate, detect, small tables) with its
//! checks after every record: each packet accounted for exactly once, every table within
//! its bound, no transaction reported twice.
//!
//! The input is a sequence of records, each after a two-byte little-endian length.
#![no_main]
use dnspath::{event::SourceEvent, fuzzing::Harness, source::live::RecordReader};
use libfuzzer_sys::fuzz_target;

/// `PacketHeader`'s size, and the offset of a drop's data in `DropEvent`.
const PACKET_HEADER_LEN: usize = tracer_common::PACKET_HEADER_LEN;
const DROP_DATA_AT: usize = std::mem::offset_of!(tracer_common::DropEvent, data);

fuzz_target!(|data: &[u8]| {
    let mut h = Harness::new();
    let mut reader = RecordReader::default();
    // The longest record so far: a copy's payload comes from an earlier one.
    let mut longest = 0usize;
    let mut rest = data;
    let mut latest = 0u64;
    let mut n = 0u32;
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_le_bytes(*len)).min(tail.len());
        let (record, next) = tail.split_at(len);
        rest = next;
        longest = longest.max(len);
        let ev = reader.parse(record);
        match &ev {
            SourceEvent::Packet(p) => {
                assert!(p.data.len() <= record.len().saturating_sub(PACKET_HEADER_LEN) + longest);
                latest = latest.max(p.ts_ns);
            }
            SourceEvent::Drop(d) => {
                assert!(d.data.len() <= record.len().saturating_sub(DROP_DATA_AT));
                assert!(d.data.len() <= tracer_common::MAX_DROP_DATA);
                latest = latest.max(d.ts_ns);
            }
            SourceEvent::Garbled { len, .. } => assert_eq!(*len, record.len()),
            _ => panic!("a ring record is a packet, a drop or garbled"),
        }
        if let Err(e) = h.push(ev) {
            panic!("record {n}: {e}");
        }
        n += 1;
        if n % 8 == 0 {
            if let Err(e) = h.tick(latest) {
                panic!("tick after record {n}: {e}");
            }
        }
    }
    if let Err(e) = h.finish() {
        panic!("at the end: {e}");
    }
});
