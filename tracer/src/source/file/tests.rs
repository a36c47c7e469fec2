use std::io::Cursor;

use pcap_file::{
    pcap::{PcapHeader, PcapPacket, PcapWriter},
    DataLink,
};

use super::*;
use crate::kernel::attach::Names;

/// IPv4 + UDP 40000 → 53 with a 4-byte payload: 32 bytes.
fn ipv4_udp() -> Vec<u8> {
    let mut p = vec![
        0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    p.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 12, 0, 0, 1, 2, 3, 4]);
    p
}

fn eth(ethertype: u16, tags: &[(u16, u16)], ip: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    match tags.first() {
        None => f.extend_from_slice(&ethertype.to_be_bytes()),
        Some((tpid, _)) => f.extend_from_slice(&tpid.to_be_bytes()),
    }
    for (i, (_, tci)) in tags.iter().enumerate() {
        f.extend_from_slice(&tci.to_be_bytes());
        let next = tags.get(i + 1).map(|t| t.0).unwrap_or(ethertype);
        f.extend_from_slice(&next.to_be_bytes());
    }
    f.extend_from_slice(ip);
    f
}

/// A pcap file written by pcap-file's writer: `big`-endian or not, with nanosecond or
/// microsecond timestamps.
struct Pcap {
    writer: PcapWriter<Vec<u8>>,
    nanos: bool,
}

impl Pcap {
    fn new(linktype: u32, big: bool, nanos: bool) -> Self {
        let header = PcapHeader {
            snaplen: 262_144,
            datalink: DataLink::from(linktype),
            ts_resolution: if nanos {
                TsResolution::NanoSecond
            } else {
                TsResolution::MicroSecond
            },
            endianness: if big {
                Endianness::Big
            } else {
                Endianness::Little
            },
            ..PcapHeader::default()
        };
        Pcap {
            writer: PcapWriter::with_header(Vec::new(), header).unwrap(),
            nanos,
        }
    }
    /// A record at `sec` + `frac` (nano- or microseconds) of `frame`, `wire` bytes long.
    fn packet(mut self, sec: u32, frac: u32, frame: &[u8], wire: u32) -> Self {
        let nanos = if self.nanos { frac } else { frac * 1000 };
        let ts = std::time::Duration::new(sec.into(), nanos);
        self.writer
            .write_packet(&PcapPacket::new(ts, wire, frame))
            .unwrap();
        self
    }
    fn bytes(self) -> Vec<u8> {
        self.writer.into_writer()
    }
}

struct PcapNg {
    bytes: Vec<u8>,
    big: bool,
}

impl PcapNg {
    fn new(big: bool) -> Self {
        let mut p = PcapNg {
            bytes: Vec::new(),
            big,
        };
        let mut body = Vec::new();
        p.put32(&mut body, PCAPNG_BYTE_ORDER_MAGIC);
        p.put16(&mut body, 1);
        p.put16(&mut body, 0);
        body.extend_from_slice(&[0xff; 8]);
        p.block(PCAPNG_SHB, &body);
        p
    }
    fn put16(&self, b: &mut Vec<u8>, v: u16) {
        b.extend_from_slice(&if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }
    fn put32(&self, b: &mut Vec<u8>, v: u32) {
        b.extend_from_slice(&if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }
    fn opt(&self, b: &mut Vec<u8>, code: u16, value: &[u8]) {
        self.put16(b, code);
        self.put16(b, value.len() as u16);
        b.extend_from_slice(value);
        b.resize(b.len().next_multiple_of(4), 0);
    }
    fn block(&mut self, kind: u32, body: &[u8]) {
        let len = 12 + body.len().next_multiple_of(4) as u32;
        let mut b = Vec::new();
        self.put32(&mut b, kind);
        self.put32(&mut b, len);
        b.extend_from_slice(body);
        b.resize(b.len().next_multiple_of(4), 0);
        self.put32(&mut b, len);
        self.bytes.extend_from_slice(&b);
    }
    fn idb(mut self, linktype: u16, name: Option<&str>, tsresol: Option<u8>) -> Self {
        let mut body = Vec::new();
        self.put16(&mut body, linktype);
        self.put16(&mut body, 0);
        self.put32(&mut body, 0);
        if let Some(n) = name {
            self.opt(&mut body, 2, n.as_bytes());
        }
        if let Some(r) = tsresol {
            self.opt(&mut body, 9, &[r]);
        }
        if name.is_some() || tsresol.is_some() {
            self.opt(&mut body, 0, &[]);
        }
        self.block(PCAPNG_IDB, &body);
        self
    }
    fn epb(mut self, iface: u32, ts: u64, frame: &[u8], flags: Option<u32>) -> Self {
        let mut body = Vec::new();
        self.put32(&mut body, iface);
        self.put32(&mut body, (ts >> 32) as u32);
        self.put32(&mut body, ts as u32);
        self.put32(&mut body, frame.len() as u32);
        self.put32(&mut body, frame.len() as u32);
        body.extend_from_slice(frame);
        body.resize(body.len().next_multiple_of(4), 0);
        if let Some(f) = flags {
            let mut v = Vec::new();
            self.put32(&mut v, f);
            self.opt(&mut body, 2, &v);
            self.opt(&mut body, 0, &[]);
        }
        self.block(6, &body);
        self
    }
    fn spb(mut self, frame: &[u8]) -> Self {
        let mut body = Vec::new();
        self.put32(&mut body, frame.len() as u32);
        body.extend_from_slice(frame);
        self.block(3, &body);
        self
    }
}

fn names() -> SharedNames {
    std::sync::Arc::new(std::sync::RwLock::new(Names::default()))
}

fn open(bytes: &[u8]) -> Result<FileSource<Cursor<Vec<u8>>>, FileError> {
    FileSource::from_reader(
        Cursor::new(bytes.to_vec()),
        "t.pcap".into(),
        "t".into(),
        names(),
    )
}

/// Every packet, then the error that ended the file (if any).
fn read_all(bytes: &[u8]) -> (Vec<CapturedPacket>, Option<FileError>, LinkSkips) {
    let mut src = open(bytes).unwrap();
    let mut out = Vec::new();
    loop {
        match src.next_packet(|_| true) {
            Ok(Some(p)) => out.push(p),
            Ok(None) => return (out, None, src.skips()),
            Err(e) => {
                assert!(
                    src.next_packet(|_| true).unwrap().is_none(),
                    "stream ends after an error"
                );
                return (out, Some(e), src.skips());
            }
        }
    }
}

#[test]
fn ethernet_with_two_vlan_tags() {
    let ip = ipv4_udp();
    let frame = eth(
        ETH_P_IP,
        &[(ETH_P_8021AD, 0x0064), (ETH_P_8021Q, 0x2005)],
        &ip,
    );
    let bytes = Pcap::new(1, false, false)
        .packet(1_700_000_000, 123_456, &frame, 80)
        .bytes();
    let (pkts, err, _) = read_all(&bytes);
    assert!(err.is_none());
    let p = &pkts[0];
    assert_eq!(p.data, ip);
    assert_eq!(
        p.vlan,
        Some(5),
        "innermost tag, as the kernel programs report"
    );
    assert_eq!(p.orig_len, 80 - 22);
    assert_eq!(p.ts_ns, 1_700_000_000_123_456_000);
    assert_eq!(p.at.dir, Direction::Unknown);
    assert_eq!((p.at.netns, p.at.ifindex), (FILE_NETNS, 0));
    assert_eq!(p.cpu, None);
}

#[test]
fn non_ip_and_short_frames_are_skipped_not_errors() {
    let arp = eth(0x0806, &[], &[0u8; 28]);
    let ip = eth(ETH_P_IPV6, &[], &[0x60, 0, 0, 0]);
    let bytes = Pcap::new(1, false, false)
        .packet(1, 0, &arp, 42)
        .packet(2, 0, &[1, 2, 3], 3)
        .packet(3, 0, &ip, 18)
        .bytes();
    let (pkts, err, skips) = read_all(&bytes);
    assert!(err.is_none());
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].data, vec![0x60, 0, 0, 0]);
    assert_eq!((skips.not_ip, skips.link_truncated), (1, 1));
}

#[test]
fn linux_cooked_headers_give_direction_and_sll2_ifindex() {
    let ip = ipv4_udp();
    let mut sll = vec![0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 8, 0];
    sll.extend_from_slice(&ip);
    let bytes = Pcap::new(113, true, true)
        .packet(5, 7, &sll, sll.len() as u32)
        .bytes();
    let (pkts, _, _) = read_all(&bytes);
    assert_eq!(pkts[0].at.dir, Direction::Egress);
    assert_eq!(pkts[0].data, ip);
    assert_eq!(pkts[0].ts_ns, 5_000_000_007, "nanosecond pcap");

    let mut sll2 = vec![
        0x86, 0xdd, 0, 0, 0, 0, 0, 42, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
    ];
    sll2.extend_from_slice(&[0x60, 0, 0, 0]);
    let bytes = Pcap::new(276, false, false).packet(5, 7, &sll2, 24).bytes();
    let (pkts, _, _) = read_all(&bytes);
    assert_eq!(pkts[0].at.dir, Direction::Ingress);
    assert_eq!(pkts[0].at.ifindex, 42);
    assert_eq!(pkts[0].orig_len, 4);
}

#[test]
fn loopback_and_raw_link_types() {
    let ip = ipv4_udp();
    for (linktype, header) in [
        (0u32, 2u32.to_le_bytes().to_vec()),
        (0, 2u32.to_be_bytes().to_vec()),
        (0, 30u32.to_le_bytes().to_vec()),
        (108, 2u32.to_be_bytes().to_vec()),
        (101, vec![]),
        (228, vec![]),
        (12, vec![]),
    ] {
        let mut f = header.clone();
        f.extend_from_slice(&ip);
        let bytes = Pcap::new(linktype, false, false)
            .packet(1, 0, &f, f.len() as u32)
            .bytes();
        let (pkts, err, _) = read_all(&bytes);
        assert!(err.is_none(), "{linktype}");
        assert_eq!(pkts.len(), 1, "linktype {linktype} header {header:?}");
        assert_eq!(pkts[0].data, ip);
    }
    let bytes = Pcap::new(0, false, false)
        .packet(1, 0, &[7, 0, 0, 0, 1], 5)
        .bytes();
    assert_eq!(read_all(&bytes).2.not_ip, 1, "unknown address family");
}

#[test]
fn unsupported_link_type_is_counted() {
    let bytes = Pcap::new(105, false, false)
        .packet(1, 0, &[0; 30], 30)
        .bytes();
    let mut src = open(&bytes).unwrap();
    assert!(src.next_packet(|_| true).unwrap().is_none());
    assert_eq!(src.skips().unsupported_link, 1);
    assert_eq!(src.unsupported_linktypes(), &[105]);
}

#[test]
fn pcapng_interfaces_names_timestamps_and_flags() {
    for big in [false, true] {
        let ip = ipv4_udp();
        let frame = eth(ETH_P_IP, &[], &ip);
        let bytes = PcapNg::new(big)
            .idb(1, Some("eth0"), None)
            .idb(101, None, Some(9))
            .epb(0, 1_700_000_000_000_001, &frame, Some(2))
            .epb(1, 1_700_000_000_000_000_002, &ip, Some(1))
            .epb(1, 3, &ip, None)
            .spb(&frame)
            .bytes;
        let names = names();
        let mut src = FileSource::from_reader(
            Cursor::new(bytes),
            "t.pcapng".into(),
            "capture".into(),
            names.clone(),
        )
        .unwrap();
        assert_eq!(src.format(), CaptureFormat::PcapNg);
        let a = src.next_packet(|_| true).unwrap().unwrap();
        assert_eq!(
            a.ts_ns, 1_700_000_000_000_001_000,
            "default resolution is µs"
        );
        assert_eq!(a.at.dir, Direction::Egress);
        assert_eq!(a.at.ifindex, 0);
        assert_eq!(a.data, ip);
        let b = src.next_packet(|_| true).unwrap().unwrap();
        assert_eq!(b.ts_ns, 1_700_000_000_000_000_002);
        assert_eq!(b.at.dir, Direction::Ingress);
        assert_eq!(b.at.ifindex, 1);
        let c = src.next_packet(|_| true).unwrap().unwrap();
        assert_eq!(c.at.dir, Direction::Unknown);
        let d = src.next_packet(|_| true).unwrap().unwrap();
        assert_eq!(
            d.ts_ns, 3,
            "a simple packet block takes the previous timestamp"
        );
        assert_eq!(d.data, ip);
        assert!(src.next_packet(|_| true).unwrap().is_none());
        let n = names.read().unwrap();
        assert_eq!(n.iface(FILE_NETNS, 0), Some("eth0"));
        assert_eq!(n.iface(FILE_NETNS, 1), Some("if1"));
        assert_eq!(n.netns(FILE_NETNS), Some("capture"));
        assert_eq!(src.progress().packets, 4);
    }
}

#[test]
fn pcapng_packet_for_undescribed_interface_is_skipped() {
    let ip = ipv4_udp();
    let bytes = PcapNg::new(false)
        .idb(101, None, None)
        .epb(3, 0, &ip, None)
        .epb(0, 0, &ip, None)
        .bytes;
    let mut src = open(&bytes).unwrap();
    assert!(src.next_packet(|_| true).unwrap().is_some());
    assert_eq!(src.skips().bad_block, 1);
    assert!(src.first_bad_block().unwrap().contains("interface id 3"));
}

/// An IDB with the given raw options (code, value), then `opt_endofopt`.
fn idb_raw(mut ng: PcapNg, linktype: u16, opts: &[(u16, &[u8])]) -> PcapNg {
    let mut body = Vec::new();
    ng.put16(&mut body, linktype);
    ng.put16(&mut body, 0);
    ng.put32(&mut body, 0);
    for (code, v) in opts {
        ng.opt(&mut body, *code, v);
    }
    ng.opt(&mut body, 0, &[]);
    ng.block(PCAPNG_IDB, &body);
    ng
}

/// One byte that is not UTF-8 in the optional `if_name` (and `if_description`): the
/// interface is read all the same, its name lossily, its `if_tsresol` kept, a warning
/// counts the block; every packet is read.
#[test]
fn pcapng_if_name_not_utf8_is_read_lossily() {
    let ip = ipv4_udp();
    for big in [false, true] {
        let ng = idb_raw(
            PcapNg::new(big),
            101,
            &[(2, b"eth\xff0"), (3, b"\xc3("), (9, &[9])],
        );
        let bytes = ng
            .epb(0, 5_000_000_000, &ip, Some(1))
            .epb(0, 6_000_000_000, &ip, None)
            .bytes;
        let names = names();
        let mut src = FileSource::from_reader(
            Cursor::new(bytes),
            "t.pcapng".into(),
            "t".into(),
            std::sync::Arc::clone(&names),
        )
        .unwrap();
        let mut pkts = Vec::new();
        while let Some(p) = src.next_packet(|_| true).unwrap() {
            pkts.push(p);
        }
        assert_eq!(pkts.len(), 2);
        // if_tsresol 9 (ns) was read from the repaired block.
        assert_eq!(pkts[0].ts_ns, 5_000_000_000);
        assert_eq!(pkts[0].at.dir, Direction::Ingress);
        assert_eq!(
            names.read().unwrap().iface(FILE_NETNS, 0),
            Some("eth\u{fffd}0")
        );
        let (n, first) = src.repaired_blocks();
        assert_eq!(n, 1);
        let first = first.unwrap();
        assert!(
            first.starts_with("block 2 at byte offset 28: if_name is not UTF-8"),
            "{first}"
        );
        assert!(first.contains("if_description is not UTF-8"), "{first}");
        assert_eq!(src.skips().bad_block, 0);
    }
}

/// An EPB whose comment is not UTF-8 still gives its packet (and its `epb_flags`).
#[test]
fn pcapng_epb_comment_not_utf8_keeps_the_packet() {
    let ip = ipv4_udp();
    let mut ng = PcapNg::new(false).idb(101, Some("eth0"), None);
    let mut body = Vec::new();
    for v in [0, 0, 7, ip.len() as u32, ip.len() as u32] {
        ng.put32(&mut body, v);
    }
    body.extend_from_slice(&ip);
    body.resize(body.len().next_multiple_of(4), 0);
    ng.opt(&mut body, 1, b"bad \xff comment");
    ng.opt(&mut body, 2, &2u32.to_le_bytes());
    ng.opt(&mut body, 0, &[]);
    ng.block(PCAPNG_EPB, &body);
    let (pkts, err, skips) = read_all(&ng.bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].at.dir, Direction::Egress);
    assert_eq!(pkts[0].ts_ns, 7_000);
    assert_eq!(skips.bad_block, 0);
    let src = {
        let mut s = open(&ng.bytes).unwrap();
        while s.next_packet(|_| true).unwrap().is_some() {}
        s
    };
    let (n, first) = src.repaired_blocks();
    assert_eq!(n, 1);
    assert!(first.unwrap().contains("comment is not UTF-8"));
}

/// An IDB whose option runs past its block is structural damage: reading stops there.
#[test]
fn pcapng_idb_option_past_its_block_stops_reading() {
    let ip = ipv4_udp();
    let mut ng = PcapNg::new(false);
    let mut body = Vec::new();
    ng.put16(&mut body, 101);
    ng.put16(&mut body, 0);
    ng.put32(&mut body, 0);
    ng.put16(&mut body, 2);
    ng.put16(&mut body, 200);
    body.extend_from_slice(b"eth\xff");
    ng.block(PCAPNG_IDB, &body);
    let bytes = ng.epb(0, 0, &ip, None).bytes;
    let (pkts, err, _) = read_all(&bytes);
    assert!(pkts.is_empty());
    let err = err.unwrap();
    assert!(matches!(err, FileError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("runs past the end of its block"),
        "{err}"
    );
}

#[test]
fn netns_name_of_a_non_utf8_file_is_lossy() {
    use std::os::unix::ffi::OsStrExt;
    let p = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/node\xff1.pcap"));
    assert_eq!(netns_name_for(p), "node\u{fffd}1");
    assert_eq!(netns_name_for(Path::new("/tmp/.pcap")), ".pcap");
    assert_eq!(netns_name_for(Path::new("/")), "file");
}

#[test]
fn truncated_pcap_keeps_what_came_before() {
    let ip = ipv4_udp();
    let frame = eth(ETH_P_IP, &[], &ip);
    let full = Pcap::new(1, false, false)
        .packet(1, 0, &frame, 46)
        .packet(2, 0, &frame, 46)
        .packet(3, 0, &frame, 46)
        .bytes();
    let cut = &full[..full.len() - 10];
    let (pkts, err, _) = read_all(cut);
    assert_eq!(pkts.len(), 2);
    let err = err.unwrap();
    let msg = err.to_string();
    let third = 24 + 2 * (16 + frame.len());
    assert!(msg.contains(&format!("byte offset {third}")), "{msg}");
    assert!(msg.contains("packet record 3"), "{msg}");
    assert!(!before_first_record(&err));
}

/// Errors that leave nothing readable (the file is not a capture at all), not ones that end
/// a stream part-way.
fn before_first_record(e: &FileError) -> bool {
    matches!(
        e,
        FileError::Open { .. } | FileError::NotACapture { .. } | FileError::BadHeader { .. }
    )
}

#[test]
fn every_truncation_of_a_pcapng_ends_cleanly() {
    let ip = ipv4_udp();
    let full = PcapNg::new(false)
        .idb(101, Some("lo"), None)
        .epb(0, 1, &ip, Some(1))
        .epb(0, 2, &ip, None)
        .bytes;
    for len in 0..full.len() {
        match open(&full[..len]) {
            Ok(mut src) => {
                let mut n = 0;
                let end = loop {
                    match src.next_packet(|_| true) {
                        Ok(Some(_)) => n += 1,
                        Ok(None) => break None,
                        Err(e) => break Some(e),
                    }
                };
                assert!(n <= 2);
                if let Some(e) = end {
                    assert!(matches!(e, FileError::Truncated { .. }), "{len}: {e}");
                }
            }
            Err(e) => assert!(before_first_record(&e), "{len}: {e}"),
        }
    }
}

#[test]
fn not_a_capture() {
    let err = |b: &[u8]| open(b).err().unwrap().to_string();
    assert!(err(b"").contains("empty"));
    assert!(err(b"hello, this is not a capture file").contains("68 65 6c 6c 6f"));
    assert!(err(&[0x1f, 0x8b, 8, 0]).contains("gzip"));
    let short = &Pcap::new(1, false, false).bytes()[..10];
    let e = open(short).err().unwrap();
    assert!(before_first_record(&e));
    assert!(e.to_string().contains("10 of 24 bytes"), "{e}");
}

#[test]
fn absurd_lengths_are_corruption_not_allocations() {
    let mut bytes = Pcap::new(1, false, false).bytes();
    bytes.extend_from_slice(&[0; 8]);
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    let (_, err, _) = read_all(&bytes);
    assert!(matches!(err, Some(FileError::Corrupt { .. })), "{err:?}");

    let mut ng = PcapNg::new(false).bytes;
    ng.extend_from_slice(&6u32.to_le_bytes());
    ng.extend_from_slice(&13u32.to_le_bytes());
    ng.extend_from_slice(&[0; 16]);
    let (_, err, _) = read_all(&ng);
    let err = err.unwrap().to_string();
    assert!(
        err.contains("block 2") && err.contains("byte offset 28"),
        "{err}"
    );
}

#[test]
fn timestamp_units() {
    assert_eq!(TsUnit::from_tsresol(6).to_ns(5), 5_000);
    assert_eq!(TsUnit::from_tsresol(9).to_ns(5), 5);
    assert_eq!(TsUnit::from_tsresol(12).to_ns(5_000), 5);
    assert_eq!(TsUnit::from_tsresol(0x80 | 10).to_ns(1024), 1_000_000_000);
    assert_eq!(TsUnit::from_tsresol(0).to_ns(u64::MAX), u64::MAX);
    assert_eq!(TsUnit::from_tsresol(127).to_ns(u64::MAX), 0);
    assert_eq!(TsUnit::from_tsresol(0xff).to_ns(u64::MAX), 0);
}

/// xorshift64*: deterministic bytes for the mutation test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn mutated_files_never_panic() {
    let ip = ipv4_udp();
    let frame = eth(ETH_P_IP, &[(ETH_P_8021Q, 7)], &ip);
    let mut sll2 = vec![8, 0, 0, 0, 0, 0, 0, 3, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0];
    sll2.extend_from_slice(&ip);
    let seeds = [
        Pcap::new(1, false, false)
            .packet(1, 2, &frame, 60)
            .packet(3, 4, &frame, 60)
            .bytes(),
        Pcap::new(276, true, true).packet(1, 2, &sll2, 60).bytes(),
        PcapNg::new(false)
            .idb(1, Some("eth0"), Some(9))
            .idb(276, None, None)
            .epb(0, 1, &frame, Some(1))
            .epb(1, 2, &sll2, None)
            .spb(&frame)
            .bytes,
        PcapNg::new(true)
            .idb(0, None, None)
            .epb(0, 1, &[2, 0, 0, 0, 0x45], None)
            .bytes,
    ];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for seed in &seeds {
        for _ in 0..2000 {
            let mut b = seed.clone();
            for _ in 0..(rng.next() % 6 + 1) {
                let at = (rng.next() as usize) % b.len();
                match rng.next() % 4 {
                    0 => b[at] = rng.next() as u8,
                    1 => b[at] ^= 0x80,
                    2 => b.truncate(at),
                    _ => b.insert(at, rng.next() as u8),
                }
                if b.is_empty() {
                    break;
                }
            }
            if let Ok(mut src) = open(&b) {
                for _ in 0..100 {
                    match src.next_packet(|_| true) {
                        Ok(Some(p)) => {
                            let _ = crate::decode::parse_ip(&p.data);
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
    }
}
