//! The bench's captures: Ethernet + IPv4 + UDP frames of the scenarios' messages, written
//! as pcap.
use anyhow::anyhow;
use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
    time::Duration,
};

use pcap_file::{
    pcap::{PcapHeader, PcapPacket, PcapWriter},
    DataLink, Endianness,
};

use super::dns::{dns_message, scenarios, Scenario, T_A};

/// RFC 1071 checksum of the IPv4 header.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet + IPv4 + UDP frame around `payload`.
pub(crate) fn frame(
    src: ([u8; 4], u16),
    dst: ([u8; 4], u16),
    ip_id: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // dst MAC
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // src MAC
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_start = f.len();
    f.push(0x45);
    f.push(0);
    f.extend_from_slice(&((20 + 8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&ip_id.to_be_bytes());
    f.extend_from_slice(&0x4000u16.to_be_bytes()); // DF
    f.push(64);
    f.push(17);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&dst.0);
    let csum = ipv4_checksum(&f[ip_start..ip_start + 20]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(&src.1.to_be_bytes());
    f.extend_from_slice(&dst.1.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // UDP checksum optional over IPv4
    f.extend_from_slice(payload);
    f
}

/// A little-endian microsecond Ethernet pcap at `path`, written by pcap-file.
pub(crate) fn pcap_writer(path: &Path) -> crate::Result<PcapWriter<BufWriter<File>>> {
    let file = File::create(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let header = PcapHeader {
        snaplen: 262_144,
        datalink: DataLink::ETHERNET,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    };
    PcapWriter::with_header(BufWriter::with_capacity(1 << 20, file), header)
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// One whole frame seen at `ts_us` (µs since the epoch).
pub(crate) fn write_frame(
    w: &mut PcapWriter<BufWriter<File>>,
    ts_us: u64,
    frame: &[u8],
) -> Result<(), pcap_file::PcapError> {
    let ts = Duration::from_micros(ts_us);
    w.write_packet(&PcapPacket::new(ts, frame.len() as u32, frame))
        .map(drop)
}

/// Writes a little-endian microsecond pcap of `packets` DNS packets (queries and their
/// responses) to `path`; returns its size.
pub(super) fn write_capture(path: &Path, packets: u64) -> crate::Result<u64> {
    let mut w = pcap_writer(path)?;
    let io = |e: pcap_file::PcapError| anyhow!("{}: {e}", path.display());

    let scenarios = scenarios();
    let server = ([10, 96, 0, 10], 53u16);
    // 2026-01-01T00:00:00Z; a transaction every 50 µs, answered after 200-1000 µs.
    let mut t_us: u64 = 1_767_225_600_000_000;
    let mut written = 0u64;
    let mut i: u64 = 0;
    // Responses wait so that queries and responses interleave as on a busy resolver; the
    // heap keeps the file in timestamp order.
    let mut pending: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>> = BinaryHeap::new();
    while written < packets {
        let due = pending
            .peek()
            .is_some_and(|Reverse((ts, _, _))| *ts <= t_us);
        if due || packets - written <= pending.len() as u64 {
            if let Some(Reverse((ts, _, f))) = pending.pop() {
                write_frame(&mut w, ts, &f).map_err(io)?;
                written += 1;
                continue;
            }
        }
        let s = &scenarios[(i % scenarios.len() as u64) as usize];
        let client = (
            [10, 244, (1 + (i / 250) % 8) as u8, (2 + i % 250) as u8],
            32768 + (i % 28000) as u16,
        );
        let id = (i.wrapping_mul(40503) & 0xffff) as u16;
        let cookie = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let q = frame(client, server, id, &dns_message(s, id, false, cookie));
        write_frame(&mut w, t_us, &q).map_err(io)?;
        written += 1;
        let r = frame(
            server,
            client,
            id ^ 0x5555,
            &dns_message(s, id, true, cookie),
        );
        pending.push(Reverse((t_us + 200 + (i * 37) % 800, i, r)));
        t_us += 50;
        i += 1;
    }
    w.into_writer()
        .flush()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Writes a pcap of `packets` unanswered `A? same.lab.test.` queries, 20 µs apart: the first
/// half from as many sockets, the second from one socket with a new DNS id each (the shape
/// that once made correlate quadratic). Returns its size.
pub(super) fn write_repeats_capture(path: &Path, packets: u64) -> crate::Result<u64> {
    let mut w = pcap_writer(path)?;
    let io = |e: pcap_file::PcapError| anyhow!("{}: {e}", path.display());
    let s = Scenario {
        qname: "same.lab.test.",
        qtype: T_A,
        rcode: 0,
        aa: false,
        answers: Vec::new(),
        authority: Vec::new(),
    };
    let server = ([10, 250, 0, 53], 53u16);
    let t0_us: u64 = 1_767_225_600_000_000;
    let half = packets / 2;
    for i in 0..packets {
        let (sport, id) = if i < half {
            (
                1024 + (i % 50_000) as u16,
                (i.wrapping_mul(40503) & 0xffff) as u16,
            )
        } else {
            (60_000, (i & 0xffff) as u16)
        };
        let f = frame(
            ([10, 244, 1, 2], sport),
            server,
            i as u16,
            &dns_message(&s, id, false, 0),
        );
        write_frame(&mut w, t0_us + 20 * i, &f).map_err(io)?;
    }
    w.into_writer()
        .flush()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}
