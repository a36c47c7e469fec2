//! The file source: pcap and pcapng captures → [`SourceEvent`]s, one per IP packet.
//!
//! Framing is checked here (a record or block must lie whole inside the file, at most
//! [`MAX_RECORD`] bytes); the fields are parsed by `pcap-file`. A file that ends inside a
//! record, or whose framing is broken, ends the stream with a [`FileError`] naming the byte
//! offset and record number; everything before it has already been handed out.
//!
//! Link layers (<https://www.tcpdump.org/linktypes.html>): Ethernet (1) with 802.1Q/802.1ad
//! tags, raw IP (101, 228, 229, and 12/14 as some systems wrote DLT_RAW), Linux cooked
//! SLL (113) and SLL2 (276, what `tcpdump -i any` writes), BSD NULL (0) and LOOP (108).
use std::{
    fmt,
    fs::File,
    io::{self, Read},
    ops::Range,
    path::Path,
};

use pcap_file::{
    pcap::{PcapHeader, PcapParser},
    pcapng::{
        blocks::{
            enhanced_packet::EnhancedPacketOption,
            interface_description::InterfaceDescriptionOption, packet::PacketOption,
        },
        Block, PcapNgParser,
    },
    Endianness, TsResolution,
};

use crate::{
    event::{CapturedPacket, Direction, ObservationPoint, SourceEvent},
    kernel::attach::SharedNames,
};

/// Largest pcap record or pcapng block accepted. Real captures stay far below (libpcap's
/// largest snaplen is 256 KiB); a bigger length field means the file is corrupt.
pub const MAX_RECORD: usize = 16 << 20;
/// Buffer size once a file turns out to be longer than [`FIRST_CHUNK`].
const READ_CHUNK: usize = 1 << 20;
const FIRST_CHUNK: usize = 8 << 10;

const PCAP_HEADER_LEN: usize = 24;
const PCAP_RECORD_HEADER_LEN: usize = 16;
const PCAPNG_SHB: u32 = 0x0A0D_0D0A;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_PB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;
const PCAPNG_BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;

/// Network-namespace cookie every packet from a file gets; interfaces are told apart by
/// their ifindex (pcapng interface id, or the SLL2 header's interface index).
pub const FILE_NETNS: u64 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureFormat {
    Pcap,
    PcapNg,
}

impl fmt::Display for CaptureFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaptureFormat::Pcap => "pcap",
            CaptureFormat::PcapNg => "pcapng",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    // The io::Error is in the message and not a source (a field named `source` would be),
    // so that a chain printed with `{:#}` does not repeat it.
    #[error("{name}: {error}")]
    Open { name: String, error: io::Error },
    #[error("{name}: not a pcap or pcapng file ({detail})")]
    NotACapture { name: String, detail: String },
    #[error("{name}: {format} file header unreadable: {reason}")]
    BadHeader {
        name: String,
        format: CaptureFormat,
        reason: String,
    },
    #[error("{name}: read error at byte offset {offset}: {error}")]
    Read {
        name: String,
        offset: u64,
        error: io::Error,
    },
    #[error("{name}: truncated at byte offset {offset}, inside {unit} {number}: it needs {need} bytes, the file has {have} more")]
    Truncated {
        name: String,
        offset: u64,
        unit: &'static str,
        number: u64,
        need: u64,
        have: usize,
    },
    #[error("{name}: corrupt {unit} {number} at byte offset {offset}: {reason}")]
    Corrupt {
        name: String,
        offset: u64,
        unit: &'static str,
        number: u64,
        reason: String,
    },
}

impl FileError {
    /// True for errors that leave nothing readable (the file is not a capture at all);
    /// false for ones that end a stream part-way.
    pub fn before_first_record(&self) -> bool {
        matches!(
            self,
            FileError::Open { .. } | FileError::NotACapture { .. } | FileError::BadHeader { .. }
        )
    }
}

/// Packets the file source read but did not hand out, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkSkips {
    /// Not IPv4/IPv6 (ARP, LLDP, STP, ... by EtherType or address family).
    pub not_ip: u64,
    /// Captured bytes end inside the link-layer header.
    pub link_truncated: u64,
    /// On an interface whose link type dnspath does not read.
    pub unsupported_link: u64,
    /// pcapng packet blocks with intact framing but unreadable contents (bad options, an
    /// interface id with no interface description).
    pub bad_block: u64,
    /// Left out by the caller's filter (see [`FileSource::next_packet`]).
    pub filtered: u64,
}

impl LinkSkips {
    pub fn total(&self) -> u64 {
        self.not_ip + self.link_truncated + self.unsupported_link + self.bad_block + self.filtered
    }
}

/// How far the source got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileProgress {
    /// Packet records (pcap) / packet blocks (pcapng) read.
    pub packets: u64,
    /// Records (pcap) or blocks (pcapng, all kinds) read, including the file header.
    pub records: u64,
    /// Bytes consumed.
    pub bytes: u64,
}

/// Converts a pcapng interface's timestamp units into nanoseconds (if_tsresol, if_tsoffset;
/// pcapng §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TsUnit {
    /// 10^-n seconds.
    Decimal(u8),
    /// 2^-n seconds.
    Binary(u8),
}

impl TsUnit {
    fn from_tsresol(v: u8) -> Self {
        if v & 0x80 == 0 {
            TsUnit::Decimal(v)
        } else {
            TsUnit::Binary(v & 0x7f)
        }
    }

    fn to_ns(self, raw: u64) -> u64 {
        let ns: u128 = match self {
            TsUnit::Decimal(n) if n <= 9 => u128::from(raw) * 10u128.pow(u32::from(9 - n)),
            TsUnit::Decimal(n) => match 10u128.checked_pow(u32::from(n - 9)) {
                Some(div) => u128::from(raw) / div,
                None => 0,
            },
            // raw < 2^64 and 1e9 < 2^30: the product fits; n ≤ 127.
            TsUnit::Binary(n) => (u128::from(raw) * 1_000_000_000) >> n,
        };
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

#[derive(Clone, Debug)]
struct Interface {
    linktype: u32,
    ts: TsUnit,
    /// if_tsoffset, seconds (a signed value in the spec).
    ts_offset_s: i64,
}

/// What [`strip_link`] found in a frame.
#[derive(Debug, PartialEq, Eq)]
enum Link {
    Ip {
        offset: usize,
        vlan: Option<u16>,
        dir: Option<Direction>,
        /// Kernel interface index from an SLL2 header.
        ifindex: Option<u32>,
    },
    NotIp,
    Truncated,
    Unsupported,
}

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
/// Pre-standard QinQ outer tag some switches still use.
const ETH_P_QINQ1: u16 = 0x9100;
/// Tags followed at most; more means garbage.
const MAX_VLAN_TAGS: usize = 4;
/// `PACKET_OUTGOING` in SLL/SLL2's packet type (include/uapi/linux/if_packet.h).
const PACKET_OUTGOING: u8 = 4;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// Follows 802.1Q/802.1ad tags from `ethertype` at `offset`; the innermost tag's VLAN id
/// wins, as in the kernel programs.
fn after_tags(
    frame: &[u8],
    mut ethertype: u16,
    mut offset: usize,
    dir: Option<Direction>,
    ifindex: Option<u32>,
) -> Link {
    let mut vlan = None;
    let mut tags = 0;
    while matches!(ethertype, ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1) {
        tags += 1;
        if tags > MAX_VLAN_TAGS {
            return Link::NotIp;
        }
        let (Some(tci), Some(next)) = (be16(frame, offset), be16(frame, offset + 2)) else {
            return Link::Truncated;
        };
        vlan = (tci != 0).then_some(tci & 0x0fff);
        ethertype = next;
        offset += 4;
    }
    match ethertype {
        ETH_P_IP | ETH_P_IPV6 => Link::Ip {
            offset,
            vlan,
            dir,
            ifindex,
        },
        _ => Link::NotIp,
    }
}

fn sll_dir(pkttype: u8) -> Option<Direction> {
    Some(if pkttype == PACKET_OUTGOING {
        Direction::Egress
    } else {
        Direction::Ingress
    })
}

/// BSD address families for IPv4 and IPv6 (AF_INET6 differs between systems).
fn null_family(family: u32) -> Link {
    match family {
        2 | 10 | 24 | 28 | 30 => Link::Ip {
            offset: 4,
            vlan: None,
            dir: None,
            ifindex: None,
        },
        _ => Link::NotIp,
    }
}

/// Finds the IP header in a captured frame of link type `linktype`.
fn strip_link(linktype: u32, frame: &[u8]) -> Link {
    match linktype {
        // LINKTYPE_NULL: the address family in the capturing host's byte order.
        0 => match frame.first_chunk::<4>() {
            None => Link::Truncated,
            Some(b) => {
                let le = u32::from_le_bytes(*b);
                null_family(if le <= 0xffff {
                    le
                } else {
                    u32::from_be_bytes(*b)
                })
            }
        },
        // LINKTYPE_LOOP: the same, always big-endian.
        108 => match frame.first_chunk::<4>() {
            None => Link::Truncated,
            Some(b) => null_family(u32::from_be_bytes(*b)),
        },
        // LINKTYPE_ETHERNET.
        1 => match be16(frame, 12) {
            None => Link::Truncated,
            Some(ethertype) => after_tags(frame, ethertype, 14, None, None),
        },
        // LINKTYPE_RAW, IPV4, IPV6; 12 and 14 are DLT_RAW's values on some BSDs.
        101 | 228 | 229 | 12 | 14 => {
            if frame.is_empty() {
                Link::Truncated
            } else {
                Link::Ip {
                    offset: 0,
                    vlan: None,
                    dir: None,
                    ifindex: None,
                }
            }
        }
        // LINKTYPE_LINUX_SLL: pkttype(2) hatype(2) halen(2) addr(8) protocol(2).
        113 => match (be16(frame, 0), be16(frame, 14)) {
            (Some(pkttype), Some(proto)) => {
                after_tags(frame, proto, 16, sll_dir(pkttype as u8), None)
            }
            _ => Link::Truncated,
        },
        // LINKTYPE_LINUX_SLL2: protocol(2) reserved(2) ifindex(4) hatype(2) pkttype(1)
        // halen(1) addr(8).
        276 => match (be16(frame, 0), be32(frame, 4), frame.get(10)) {
            (Some(proto), Some(ifindex), Some(&pkttype)) if frame.len() >= 20 => {
                after_tags(frame, proto, 20, sll_dir(pkttype), Some(ifindex))
            }
            _ => Link::Truncated,
        },
        _ => Link::Unsupported,
    }
}

/// Buffered reader that knows the file offset of every byte it holds.
struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[0]`.
    base: u64,
    eof: bool,
}

impl<R: Read> Input<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            buf: vec![0; FIRST_CHUNK],
            start: 0,
            end: 0,
            base: 0,
            eof: false,
        }
    }

    fn avail(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    fn offset(&self) -> u64 {
        self.base + self.start as u64
    }

    fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n).min(self.end);
    }

    /// Makes at least `n` (≤ [`MAX_RECORD`]) bytes available unless the file ends first;
    /// true when they are.
    fn want(&mut self, n: usize) -> io::Result<bool> {
        if self.end - self.start >= n {
            return Ok(true);
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        // Small files stay cheap; long ones get fewer, larger reads.
        if self.base >= FIRST_CHUNK as u64 && self.buf.len() < READ_CHUNK {
            self.buf.resize(READ_CHUNK, 0);
        }
        while self.end < n && !self.eof {
            if self.end == self.buf.len() {
                // Grows with the data that arrives, not with what a length field claims.
                let len = self.buf.len();
                self.buf
                    .resize((len * 2).min(n.next_power_of_two()).max(len + 1), 0);
            }
            let Some(free) = self.buf.get_mut(self.end..) else {
                break;
            };
            match self.reader.read(free) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.start >= n)
    }
}

/// A packet as it came out of the file, before the link layer is stripped.
struct Frame {
    ts_ns: u64,
    iface: u32,
    linktype: u32,
    wire_len: u32,
    /// Direction from pcapng `epb_flags`, when they say.
    dir: Option<Direction>,
    /// Where the frame's captured bytes are in `Input::avail()`.
    data: Range<usize>,
}

/// What one record or block was.
enum Step {
    Packet(Frame),
    /// A pcapng interface description: learn its name.
    Interface {
        id: u32,
        name: Option<String>,
        linktype: u32,
    },
    /// A packet block with intact framing whose contents could not be read.
    BadBlock(String),
    /// Anything else (statistics, name resolution, section headers, ...).
    Other,
}

/// Why a record could not be read, before the file position is attached.
enum RecordError {
    Io(io::Error),
    Truncated { need: u64 },
    Corrupt(String),
}

impl From<io::Error> for RecordError {
    fn from(e: io::Error) -> Self {
        RecordError::Io(e)
    }
}

fn u32_at(b: &[u8], at: usize, endian: Endianness) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u32::from_be_bytes(s),
        Endianness::Little => u32::from_le_bytes(s),
    })
}

/// Where `inner` (a sub-slice of `outer`) starts within it.
fn range_in(outer: &[u8], inner: &[u8]) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// Length of the pcapng section header block at the start of `b`.
fn shb_len(b: &[u8]) -> Result<usize, String> {
    let (Some(len), Some(bom)) = (b.get(4..8), b.get(8..12)) else {
        return Err(format!(
            "section header block cut short: {} of 12 bytes",
            b.len()
        ));
    };
    let bom = u32::from_be_bytes([bom[0], bom[1], bom[2], bom[3]]);
    let len = [len[0], len[1], len[2], len[3]];
    let len = match bom {
        PCAPNG_BYTE_ORDER_MAGIC => u32::from_be_bytes(len),
        0x4D3C_2B1A => u32::from_le_bytes(len),
        _ => return Err(format!("bad byte-order magic {bom:#010x}")),
    };
    check_block_len(len)
}

fn check_block_len(len: u32) -> Result<usize, String> {
    let len = len as usize;
    if len < 12 || !len.is_multiple_of(4) {
        return Err(format!(
            "block length {len} is not a multiple of 4 of at least 12"
        ));
    }
    if len > MAX_RECORD {
        return Err(format!(
            "block length {len} exceeds the {MAX_RECORD}-byte limit"
        ));
    }
    Ok(len)
}

/// Reads one pcap packet record.
fn pcap_record<R: Read>(
    input: &mut Input<R>,
    parser: &PcapParser,
    linktype: u32,
) -> Result<(usize, Step), RecordError> {
    let header = parser.header();
    if !input.want(PCAP_RECORD_HEADER_LEN)? {
        return Err(RecordError::Truncated {
            need: PCAP_RECORD_HEADER_LEN as u64,
        });
    }
    let incl = u32_at(input.avail(), 8, header.endianness).unwrap_or(0) as usize;
    if incl > MAX_RECORD - PCAP_RECORD_HEADER_LEN {
        return Err(RecordError::Corrupt(format!(
            "captured length {incl} exceeds the {MAX_RECORD}-byte limit"
        )));
    }
    let len = PCAP_RECORD_HEADER_LEN + incl;
    if !input.want(len)? {
        return Err(RecordError::Truncated { need: len as u64 });
    }
    let avail = input.avail();
    let (_, raw) = parser
        .next_raw_packet(avail)
        .map_err(|e| RecordError::Corrupt(e.to_string()))?;
    let frac_ns = match header.ts_resolution {
        TsResolution::MicroSecond => u64::from(raw.ts_frac) * 1_000,
        TsResolution::NanoSecond => u64::from(raw.ts_frac),
    };
    let frame = Frame {
        ts_ns: u64::from(raw.ts_sec) * 1_000_000_000 + frac_ns,
        iface: 0,
        linktype,
        // Some writers leave orig_len below incl_len; the wire had at least what was kept.
        wire_len: raw.orig_len.max(raw.incl_len),
        dir: None,
        data: PCAP_RECORD_HEADER_LEN..len,
    };
    Ok((len, Step::Packet(frame)))
}

/// `epb_flags`/`pack_flags` bits 0-1: 01 inbound, 10 outbound (pcapng §4.3.1).
fn flags_dir(flags: u32) -> Option<Direction> {
    match flags & 0b11 {
        0b01 => Some(Direction::Ingress),
        0b10 => Some(Direction::Egress),
        _ => None,
    }
}

fn u16_at(b: &[u8], at: usize, endian: Endianness) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u16::from_be_bytes(s),
        Endianness::Little => u16::from_le_bytes(s),
    })
}

fn u64_at(b: &[u8], at: usize, endian: Endianness) -> Option<u64> {
    let s: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u64::from_be_bytes(s),
        Endianness::Little => u64::from_le_bytes(s),
    })
}

/// The options of a pcapng block, `(code, value)`, from `b` (the bytes after the block's
/// fixed fields, before its trailing length), up to `opt_endofopt` or the end. An option
/// running past the block is structural damage.
fn pcapng_options(mut b: &[u8], endian: Endianness) -> Result<Vec<(u16, &[u8])>, String> {
    let mut out = Vec::new();
    while let (Some(code), Some(len)) = (u16_at(b, 0, endian), u16_at(b, 2, endian)) {
        if code == 0 {
            break;
        }
        let len = usize::from(len);
        let Some(value) = b.get(4..4 + len) else {
            return Err(format!(
                "option {code} of {len} bytes runs past the end of its block"
            ));
        };
        out.push((code, value));
        b = b.get(4 + len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// A string option that is not UTF-8, read lossily (U+FFFD for each bad sequence); `None`
/// when it was UTF-8.
fn lossy_note(what: &str, v: &[u8]) -> Option<String> {
    std::str::from_utf8(v).is_err().then(|| {
        format!(
            "{what} is not UTF-8, read as {:?}",
            String::from_utf8_lossy(v)
        )
    })
}

/// An interface description block pcap-file refused (`error`) read field by field: the
/// fields dnspath uses from the fixed part and the options (if_name lossily as UTF-8,
/// if_tsresol, if_tsoffset), the others ignored. Only a block whose options do not fit it
/// is an error. Returns the interface, its name and what was repaired.
fn idb_lossy(
    block: &[u8],
    endian: Endianness,
    error: &str,
) -> Result<(Interface, Option<String>, String), String> {
    let body = block.get(8..block.len().saturating_sub(4)).unwrap_or(&[]);
    let (Some(linktype), Some(opts)) = (u16_at(body, 0, endian), body.get(8..)) else {
        return Err(format!(
            "interface description block of {} bytes: {error}",
            block.len()
        ));
    };
    let mut iface = Interface {
        linktype: u32::from(linktype),
        ts: TsUnit::Decimal(6),
        ts_offset_s: 0,
    };
    let mut name = None;
    let mut notes = Vec::new();
    for (code, v) in pcapng_options(opts, endian).map_err(|e| format!("{error} ({e})"))? {
        match (code, v.len()) {
            (2, _) => {
                notes.extend(lossy_note("if_name", v));
                let n = String::from_utf8_lossy(v);
                name = Some(n.trim_end_matches('\0').to_string());
            }
            (9, 1) => iface.ts = TsUnit::from_tsresol(v[0]),
            (14, 8) => iface.ts_offset_s = u64_at(v, 0, endian).unwrap_or(0) as i64,
            (9 | 14, n) => notes.push(format!("option {code} has a bad length {n}, ignored")),
            (1, _) => notes.extend(lossy_note("comment", v)),
            (3, _) => notes.extend(lossy_note("if_description", v)),
            (12, _) => notes.extend(lossy_note("if_os", v)),
            (15, _) => notes.extend(lossy_note("if_hardware", v)),
            _ => {}
        }
    }
    if notes.is_empty() {
        notes.push(error.to_string());
    }
    Ok((iface, name, notes.join("; ")))
}

/// An enhanced packet block pcap-file refused (`error`) with intact framing, read field by
/// field: its packet, with `epb_flags` if readable; its other options (comment, hash, drop
/// count) ignored. Returns the step and what was repaired.
fn epb_lossy(
    interfaces: &[Interface],
    avail: &[u8],
    len: usize,
    endian: Endianness,
    error: &str,
) -> (Step, Option<String>) {
    let body = avail.get(8..len.saturating_sub(4)).unwrap_or(&[]);
    let field = |at| u32_at(body, at, endian);
    let (Some(id), Some(hi), Some(lo), Some(caplen), Some(orig)) =
        (field(0), field(4), field(8), field(12), field(16))
    else {
        return (Step::BadBlock(error.to_string()), None);
    };
    let caplen = caplen as usize;
    let (Some(data), Some(opts)) = (
        body.get(20..20 + caplen),
        body.get(20 + caplen.next_multiple_of(4)..),
    ) else {
        return (Step::BadBlock(error.to_string()), None);
    };
    let Ok(opts) = pcapng_options(opts, endian) else {
        return (Step::BadBlock(error.to_string()), None);
    };
    let mut flags = None;
    let mut notes = Vec::new();
    for (code, v) in opts {
        match (code, v.len()) {
            (2, 4) => flags = u32_at(v, 0, endian),
            (2, n) => notes.push(format!("epb_flags has a bad length {n}, ignored")),
            (1, _) => notes.extend(lossy_note("comment", v)),
            _ => {}
        }
    }
    if notes.is_empty() {
        notes.push(format!("{error}; its options ignored"));
    }
    let raw = (u64::from(hi) << 32) | u64::from(lo);
    let step = packet_step(interfaces, avail, id, raw, orig, data, flags);
    (step, Some(notes.join("; ")))
}

/// Reads one pcapng block. A block whose optional fields could not be read (a name that
/// is not UTF-8, an option of the wrong length) is read without them: `repaired` then says
/// what was replaced or ignored.
fn pcapng_block<R: Read>(
    input: &mut Input<R>,
    parser: &mut PcapNgParser,
    interfaces: &mut Vec<Interface>,
    last_ts: u64,
    repaired: &mut Option<String>,
) -> Result<(usize, Step), RecordError> {
    if !input.want(12)? {
        return Err(RecordError::Truncated { need: 12 });
    }
    let endian = parser.section().endianness;
    let avail = input.avail();
    let block_type = u32_at(avail, 0, endian).unwrap_or(0);
    let len = if block_type == PCAPNG_SHB {
        shb_len(avail)
    } else {
        check_block_len(u32_at(avail, 4, endian).unwrap_or(0))
    }
    .map_err(RecordError::Corrupt)?;
    if !input.want(len)? {
        return Err(RecordError::Truncated { need: len as u64 });
    }
    let avail = input.avail();
    let block = match parser.next_block(avail) {
        Ok((_, block)) => block,
        // The file's structure depends on these: nothing after them can be trusted.
        Err(e) if block_type == PCAPNG_SHB => return Err(RecordError::Corrupt(e.to_string())),
        // Unless only its options are bad: the interface is what the fixed part says.
        Err(e) if block_type == PCAPNG_IDB => {
            let block = avail.get(..len).unwrap_or(avail);
            let (iface, name, note) =
                idb_lossy(block, endian, &e.to_string()).map_err(RecordError::Corrupt)?;
            let id = interfaces.len() as u32;
            let linktype = iface.linktype;
            interfaces.push(iface);
            *repaired = Some(note);
            return Ok((len, Step::Interface { id, name, linktype }));
        }
        Err(e) => {
            let framing = parser.next_raw_block(avail);
            return match framing {
                Ok(_) if block_type == PCAPNG_EPB => {
                    let (step, note) = epb_lossy(interfaces, avail, len, endian, &e.to_string());
                    *repaired = note;
                    Ok((len, step))
                }
                Ok(_) if matches!(block_type, PCAPNG_PB | PCAPNG_SPB) => {
                    Ok((len, Step::BadBlock(e.to_string())))
                }
                // Statistics, name resolution, ...: not needed here.
                Ok(_) => Ok((len, Step::Other)),
                Err(e) => Err(RecordError::Corrupt(e.to_string())),
            };
        }
    };
    let step = match block {
        Block::SectionHeader(_) => {
            interfaces.clear();
            Step::Other
        }
        Block::InterfaceDescription(idb) => {
            let mut iface = Interface {
                linktype: u32::from(idb.linktype),
                ts: TsUnit::Decimal(6),
                ts_offset_s: 0,
            };
            let mut name = None;
            for opt in &idb.options {
                match opt {
                    InterfaceDescriptionOption::IfName(n) => name = Some(n.to_string()),
                    InterfaceDescriptionOption::IfTsResol(r) => iface.ts = TsUnit::from_tsresol(*r),
                    InterfaceDescriptionOption::IfTsOffset(o) => iface.ts_offset_s = *o as i64,
                    _ => {}
                }
            }
            let id = interfaces.len() as u32;
            let linktype = iface.linktype;
            interfaces.push(iface);
            Step::Interface { id, name, linktype }
        }
        Block::EnhancedPacket(epb) => {
            let flags = epb.options.iter().find_map(|o| match o {
                EnhancedPacketOption::Flags(f) => Some(*f),
                _ => None,
            });
            // `timestamp` holds the raw 64-bit count of if_tsresol units.
            let raw = u64::try_from(epb.timestamp.as_nanos()).unwrap_or(u64::MAX);
            packet_step(
                interfaces,
                avail,
                epb.interface_id,
                raw,
                epb.original_len,
                &epb.data,
                flags,
            )
        }
        Block::Packet(pb) => {
            let flags = pb.options.iter().find_map(|o| match o {
                PacketOption::Flags(f) => Some(*f),
                _ => None,
            });
            // The obsolete packet block stores the timestamp as high and low 32-bit words,
            // which pcap-file reads as one u64 in the section's byte order.
            let raw = match endian {
                Endianness::Big => pb.timestamp,
                Endianness::Little => pb.timestamp.rotate_left(32),
            };
            packet_step(
                interfaces,
                avail,
                u32::from(pb.interface_id),
                raw,
                pb.original_len,
                &pb.data,
                flags,
            )
        }
        Block::SimplePacket(spb) => {
            // Padding is part of `data`; the original length bounds what was captured.
            let kept = spb.data.len().min(spb.original_len as usize);
            match (
                interfaces.first(),
                spb.data.get(..kept).and_then(|d| range_in(avail, d)),
            ) {
                (Some(iface), Some(data)) => Step::Packet(Frame {
                    ts_ns: last_ts,
                    iface: 0,
                    linktype: iface.linktype,
                    wire_len: spb.original_len,
                    dir: None,
                    data,
                }),
                (None, _) => {
                    Step::BadBlock("simple packet block before any interface description".into())
                }
                (_, None) => Step::BadBlock("packet data outside its block".into()),
            }
        }
        _ => Step::Other,
    };
    Ok((len, step))
}

fn packet_step(
    interfaces: &[Interface],
    avail: &[u8],
    id: u32,
    raw_ts: u64,
    original_len: u32,
    data: &[u8],
    flags: Option<u32>,
) -> Step {
    let Some(iface) = interfaces.get(id as usize) else {
        return Step::BadBlock(format!(
            "interface id {id}, but only {} interface(s) described",
            interfaces.len()
        ));
    };
    let Some(range) = range_in(avail, data) else {
        return Step::BadBlock("packet data outside its block".into());
    };
    let ns = iface.ts.to_ns(raw_ts);
    let ts_ns = if iface.ts_offset_s >= 0 {
        ns.saturating_add((iface.ts_offset_s as u64).saturating_mul(1_000_000_000))
    } else {
        ns.saturating_sub(
            iface
                .ts_offset_s
                .unsigned_abs()
                .saturating_mul(1_000_000_000),
        )
    };
    Step::Packet(Frame {
        ts_ns,
        iface: id,
        linktype: iface.linktype,
        wire_len: original_len.max(data.len() as u32),
        dir: flags.and_then(flags_dir),
        data: range,
    })
}

enum Format {
    Pcap {
        parser: PcapParser,
        linktype: u32,
    },
    PcapNg {
        parser: PcapNgParser,
        interfaces: Vec<Interface>,
    },
}

/// Reads a pcap or pcapng capture (detected by its magic number).
pub struct FileSource<R> {
    name: String,
    input: Input<R>,
    format: Format,
    names: SharedNames,
    netns_name: String,
    skips: LinkSkips,
    progress: FileProgress,
    /// Link types present that are not read, for the summary.
    unsupported: Vec<u32>,
    /// Last packet timestamp, for pcapng simple packet blocks (which have none).
    last_ts: u64,
    /// Bytes of the record last handed out, consumed on the next call.
    pending: usize,
    /// First unreadable packet block, for the summary.
    first_bad_block: Option<String>,
    /// Blocks read without some of their optional fields, and the first of them.
    repaired: u64,
    first_repaired: Option<String>,
    done: bool,
}

impl FileSource<File> {
    /// Opens `path` and reads its file header. The namespace shown for its packets is the
    /// file's stem (`file` if it has none).
    pub fn open(path: &Path, names: SharedNames) -> Result<Self, FileError> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|error| FileError::Open {
            name: name.clone(),
            error,
        })?;
        FileSource::from_reader(file, name, netns_name_for(path), names)
    }
}

/// The namespace name packets from `path` are shown with: the file's stem, else `file`.
pub fn netns_name_for(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy())
        .filter(|s| !s.is_empty())
        .map_or_else(|| "file".to_string(), |s| s.into_owned())
}

fn hex_prefix(b: &[u8]) -> String {
    b.iter()
        .take(8)
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl<R: Read> FileSource<R> {
    /// Reads a capture from `reader`: `name` appears in errors, `netns_name` as the
    /// namespace of its packets.
    pub fn from_reader(
        reader: R,
        name: String,
        netns_name: String,
        names: SharedNames,
    ) -> Result<Self, FileError> {
        let mut input = Input::new(reader);
        if let Err(error) = input.want(PCAP_HEADER_LEN) {
            return Err(FileError::Read {
                name,
                offset: 0,
                error,
            });
        }
        let head = input.avail();
        let format = match head.first_chunk::<4>().map(|b| u32::from_be_bytes(*b)) {
            Some(0xA1B2_C3D4 | 0xD4C3_B2A1 | 0xA1B2_3C4D | 0x4D3C_B2A1) => CaptureFormat::Pcap,
            Some(PCAPNG_SHB) => CaptureFormat::PcapNg,
            _ => {
                let detail = if head.is_empty() {
                    "the file is empty".to_string()
                } else if head.starts_with(&[0x1f, 0x8b]) {
                    "gzip-compressed; decompress it first".to_string()
                } else {
                    format!("it starts with {}", hex_prefix(head))
                };
                return Err(FileError::NotACapture { name, detail });
            }
        };
        let bad_header = |reason: String| FileError::BadHeader {
            name: name.clone(),
            format,
            reason,
        };
        let format = match format {
            CaptureFormat::Pcap => {
                if head.len() < PCAP_HEADER_LEN {
                    return Err(bad_header(format!(
                        "{} of {PCAP_HEADER_LEN} bytes present",
                        head.len()
                    )));
                }
                let (_, parser) = PcapParser::new(head).map_err(|e| bad_header(e.to_string()))?;
                let header: PcapHeader = parser.header();
                // The top bits may carry FCS information (pcap spec, LinkType field).
                let linktype = u32::from(header.datalink) & 0x03ff_ffff;
                input.consume(PCAP_HEADER_LEN);
                Format::Pcap { parser, linktype }
            }
            CaptureFormat::PcapNg => {
                let len = shb_len(head).map_err(&bad_header)?;
                match input.want(len) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(bad_header(format!(
                            "section header block of {len} bytes, only {} present",
                            input.avail().len()
                        )))
                    }
                    Err(e) => return Err(bad_header(e.to_string())),
                }
                let parser = match PcapNgParser::new(input.avail()) {
                    Ok((_, parser)) => parser,
                    Err(e) => return Err(bad_header(e.to_string())),
                };
                input.consume(len);
                Format::PcapNg {
                    parser,
                    interfaces: Vec::new(),
                }
            }
        };
        let mut src = FileSource {
            name,
            input,
            format,
            names,
            netns_name,
            skips: LinkSkips::default(),
            progress: FileProgress::default(),
            unsupported: Vec::new(),
            last_ts: 0,
            pending: 0,
            first_bad_block: None,
            repaired: 0,
            first_repaired: None,
            done: false,
        };
        src.progress.records = 1;
        src.progress.bytes = src.input.offset();
        if let Format::Pcap { linktype, .. } = src.format {
            src.learn(0, "if0");
            src.note_linktype(linktype);
        }
        Ok(src)
    }

    pub fn format(&self) -> CaptureFormat {
        match self.format {
            Format::Pcap { .. } => CaptureFormat::Pcap,
            Format::PcapNg { .. } => CaptureFormat::PcapNg,
        }
    }

    /// Packets read but not handed out, by reason.
    pub fn skips(&self) -> LinkSkips {
        self.skips
    }

    pub fn progress(&self) -> FileProgress {
        self.progress
    }

    /// Link types present in the file that dnspath does not read.
    pub fn unsupported_linktypes(&self) -> &[u32] {
        &self.unsupported
    }

    /// Why the first unreadable packet block was skipped (pcapng).
    pub fn first_bad_block(&self) -> Option<&str> {
        self.first_bad_block.as_deref()
    }

    /// How many blocks were read without some of their optional fields (a name that is not
    /// UTF-8, read lossily; an option of the wrong length, ignored), and the first of them.
    pub fn repaired_blocks(&self) -> (u64, Option<&str>) {
        (self.repaired, self.first_repaired.as_deref())
    }

    /// The name the packets' namespace is shown with.
    pub fn netns_name(&self) -> &str {
        &self.netns_name
    }

    fn learn(&self, ifindex: u32, ifname: &str) {
        if let Ok(mut names) = self.names.write() {
            names.learn(FILE_NETNS, &self.netns_name, ifindex, ifname);
        }
    }

    fn note_linktype(&mut self, linktype: u32) {
        if strip_link(linktype, &[]) == Link::Unsupported && !self.unsupported.contains(&linktype) {
            self.unsupported.push(linktype);
        }
    }

    /// The next packet as a [`SourceEvent`]; `Ok(None)` at the end of the file.
    pub fn next_event(&mut self) -> Result<Option<SourceEvent>, FileError> {
        Ok(self.next_packet(|_| true)?.map(SourceEvent::Packet))
    }

    /// The next IP packet for which `keep(bytes from the IP header on)` is true; the others
    /// are counted in [`LinkSkips::filtered`] without being copied. `Ok(None)` at the end of
    /// the file, and after an error.
    pub fn next_packet(
        &mut self,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<Option<CapturedPacket>, FileError> {
        loop {
            let frame = match self.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            let Some(bytes) = self.input.avail().get(frame.data.clone()) else {
                self.skips.link_truncated += 1;
                continue;
            };
            let (offset, vlan, link_dir, sll2_ifindex) = match strip_link(frame.linktype, bytes) {
                Link::Ip {
                    offset,
                    vlan,
                    dir,
                    ifindex,
                } => (offset, vlan, dir, ifindex),
                Link::NotIp => {
                    self.skips.not_ip += 1;
                    continue;
                }
                Link::Truncated => {
                    self.skips.link_truncated += 1;
                    continue;
                }
                Link::Unsupported => {
                    self.skips.unsupported_link += 1;
                    continue;
                }
            };
            let Some(ip) = bytes.get(offset..) else {
                self.skips.link_truncated += 1;
                continue;
            };
            if !keep(ip) {
                self.skips.filtered += 1;
                continue;
            }
            return Ok(Some(CapturedPacket {
                ts_ns: frame.ts_ns,
                cpu: None,
                at: ObservationPoint {
                    netns: FILE_NETNS,
                    ifindex: sll2_ifindex.unwrap_or(frame.iface),
                    dir: frame.dir.or(link_dir).unwrap_or(Direction::Unknown),
                },
                vlan,
                orig_len: frame.wire_len.saturating_sub(offset as u32),
                data: ip.to_vec(),
            }));
        }
    }

    /// Reads records up to the next packet, whose bytes stay in the buffer (at
    /// `Frame::data` within `input.avail()`) until the next call.
    fn next_frame(&mut self) -> Result<Option<Frame>, FileError> {
        self.input.consume(std::mem::take(&mut self.pending));
        self.progress.bytes = self.input.offset();
        while !self.done {
            let more = self.input.want(1).map_err(|error| FileError::Read {
                name: self.name.clone(),
                offset: self.input.offset(),
                error,
            })?;
            if !more {
                self.done = true;
                break;
            }
            let mut repaired = None;
            let read = match &mut self.format {
                Format::Pcap { parser, linktype } => {
                    pcap_record(&mut self.input, parser, *linktype)
                }
                Format::PcapNg { parser, interfaces } => pcapng_block(
                    &mut self.input,
                    parser,
                    interfaces,
                    self.last_ts,
                    &mut repaired,
                ),
            };
            let (len, step) = match read {
                Ok(v) => v,
                Err(e) => return Err(self.record_error(e)),
            };
            self.progress.records += 1;
            if let Some(note) = repaired {
                self.repaired += 1;
                if self.first_repaired.is_none() {
                    self.first_repaired = Some(format!(
                        "block {} at byte offset {}: {note}",
                        self.progress.records,
                        self.input.offset()
                    ));
                }
            }
            match step {
                Step::Packet(frame) => {
                    self.progress.packets += 1;
                    self.last_ts = frame.ts_ns;
                    self.pending = len;
                    return Ok(Some(frame));
                }
                Step::Interface { id, name, linktype } => {
                    let name = name.unwrap_or_else(|| format!("if{id}"));
                    self.learn(id, &name);
                    self.note_linktype(linktype);
                }
                Step::BadBlock(reason) => {
                    self.progress.packets += 1;
                    self.skips.bad_block += 1;
                    if self.first_bad_block.is_none() {
                        self.first_bad_block = Some(format!(
                            "block {} at byte offset {}: {reason}",
                            self.progress.records,
                            self.input.offset()
                        ));
                    }
                }
                Step::Other => {}
            }
            self.input.consume(len);
            self.progress.bytes = self.input.offset();
        }
        Ok(None)
    }

    fn record_error(&self, e: RecordError) -> FileError {
        let (unit, number) = match self.format {
            Format::Pcap { .. } => ("packet record", self.progress.packets + 1),
            Format::PcapNg { .. } => ("block", self.progress.records + 1),
        };
        let name = self.name.clone();
        let offset = self.input.offset();
        match e {
            RecordError::Io(error) => FileError::Read {
                name,
                offset,
                error,
            },
            RecordError::Truncated { need } => FileError::Truncated {
                name,
                offset,
                unit,
                number,
                need,
                have: self.input.avail().len(),
            },
            RecordError::Corrupt(reason) => FileError::Corrupt {
                name,
                offset,
                unit,
                number,
                reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

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

    struct Pcap {
        bytes: Vec<u8>,
        big: bool,
    }

    impl Pcap {
        fn new(linktype: u32, big: bool, nanos: bool) -> Self {
            let magic: u32 = if nanos { 0xA1B2_3C4D } else { 0xA1B2_C3D4 };
            let mut p = Pcap {
                bytes: Vec::new(),
                big,
            };
            p.u32(magic);
            p.u16(2);
            p.u16(4);
            p.u32(0);
            p.u32(0);
            p.u32(262_144);
            p.u32(linktype);
            p
        }
        fn u16(&mut self, v: u16) {
            let b = if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            self.bytes.extend_from_slice(&b);
        }
        fn u32(&mut self, v: u32) {
            let b = if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            self.bytes.extend_from_slice(&b);
        }
        fn packet(mut self, sec: u32, frac: u32, frame: &[u8], wire: u32) -> Self {
            self.u32(sec);
            self.u32(frac);
            self.u32(frame.len() as u32);
            self.u32(wire);
            self.bytes.extend_from_slice(frame);
            self
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
            .bytes;
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
            .bytes;
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
            .bytes;
        let (pkts, _, _) = read_all(&bytes);
        assert_eq!(pkts[0].at.dir, Direction::Egress);
        assert_eq!(pkts[0].data, ip);
        assert_eq!(pkts[0].ts_ns, 5_000_000_007, "nanosecond pcap");

        let mut sll2 = vec![
            0x86, 0xdd, 0, 0, 0, 0, 0, 42, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
        ];
        sll2.extend_from_slice(&[0x60, 0, 0, 0]);
        let bytes = Pcap::new(276, false, false).packet(5, 7, &sll2, 24).bytes;
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
                .bytes;
            let (pkts, err, _) = read_all(&bytes);
            assert!(err.is_none(), "{linktype}");
            assert_eq!(pkts.len(), 1, "linktype {linktype} header {header:?}");
            assert_eq!(pkts[0].data, ip);
        }
        let bytes = Pcap::new(0, false, false)
            .packet(1, 0, &[7, 0, 0, 0, 1], 5)
            .bytes;
        assert_eq!(read_all(&bytes).2.not_ip, 1, "unknown address family");
    }

    #[test]
    fn unsupported_link_type_is_counted() {
        let bytes = Pcap::new(105, false, false)
            .packet(1, 0, &[0; 30], 30)
            .bytes;
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
            .bytes;
        let cut = &full[..full.len() - 10];
        let (pkts, err, _) = read_all(cut);
        assert_eq!(pkts.len(), 2);
        let err = err.unwrap();
        let msg = err.to_string();
        let third = 24 + 2 * (16 + frame.len());
        assert!(msg.contains(&format!("byte offset {third}")), "{msg}");
        assert!(msg.contains("packet record 3"), "{msg}");
        assert!(!err.before_first_record());
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
                Err(e) => assert!(e.before_first_record(), "{len}: {e}"),
            }
        }
    }

    #[test]
    fn not_a_capture() {
        let err = |b: &[u8]| open(b).err().unwrap().to_string();
        assert!(err(b"").contains("empty"));
        assert!(err(b"hello, this is not a capture file").contains("68 65 6c 6c 6f"));
        assert!(err(&[0x1f, 0x8b, 8, 0]).contains("gzip"));
        let short = &Pcap::new(1, false, false).bytes[..10];
        let e = open(short).err().unwrap();
        assert!(e.before_first_record());
        assert!(e.to_string().contains("10 of 24 bytes"), "{e}");
    }

    #[test]
    fn absurd_lengths_are_corruption_not_allocations() {
        let mut bytes = Pcap::new(1, false, false).bytes;
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
                .bytes,
            Pcap::new(276, true, true).packet(1, 2, &sll2, 60).bytes,
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
}
