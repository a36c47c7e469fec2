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
    collections::{HashMap, HashSet},
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
            section_header::SectionHeaderOption,
        },
        Block, PcapNgParser,
    },
    Endianness, TsResolution,
};

use crate::{
    event::{CapturedPacket, Direction, KernelDrop, ObservationPoint, SourceEvent},
    names::SharedNames,
};

/// The `if_name` of the interface block holding kernel drops in files dnspath writes
/// (evidence/pcapng.rs). Linux interface names cannot hold `/`, so no real `netns/ifname` pair
/// collides with it.
pub const DROPS_IFNAME: &str = "dnspath/drops";
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

/// The first ifindex given to a place where a dnspath-written file has a drop but no
/// interface block (pcapng interface ids count from 0).
const DROP_PLACES: u32 = 1 << 30;

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
    /// Kernel drops in a file dnspath wrote (`trace -w`: interface `dnspath/drops`) whose
    /// comment could not be read (see [`drops::parse_drop_comment`]): not decoded at all
    /// (they were no hop, and what the drop was is unknown).
    pub unreadable_drops: u64,
}

impl LinkSkips {
    pub fn total(&self) -> u64 {
        self.not_ip
            + self.link_truncated
            + self.unsupported_link
            + self.bad_block
            + self.filtered
            + self.unreadable_drops
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

pub mod drops;
mod input;
mod link;
mod pcap;
mod pcapng;
mod places;
#[cfg(test)]
mod tests;

use input::*;
use link::*;
use pcap::*;
use pcapng::*;

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
    /// Where its (first) pcapng comment is in `Input::avail()`.
    comment: Option<Range<usize>>,
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
    /// A pcapng section header; `by_dnspath`: its `shb_userappl` says `dnspath …` (a file of
    /// `trace -w`, whose interfaces are named `netns/ifname`).
    Section {
        by_dnspath: bool,
    },
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
    /// Namespaces of a dnspath-written file, by name → the id its packets get.
    netns_ids: HashMap<String, u64>,
    /// Interface → namespace id (interfaces not listed: [`FILE_NETNS`]).
    iface_netns: HashMap<u32, u64>,
    /// Interfaces holding kernel drops in a dnspath-written file.
    drops_ifaces: HashSet<u32>,
    /// A dnspath-written file's interfaces by `if_name` (`netns/ifname`): namespace id and
    /// ifindex, where its drops are placed.
    ifaces_by_name: HashMap<String, (u64, u32)>,
    /// Kernel drops read back from their comments.
    drops: u64,
    /// The first drop whose comment could not be read, and why.
    first_unreadable_drop: Option<String>,
    /// The current pcapng section was written by dnspath (`trace -w`).
    by_dnspath: bool,
}

impl FileSource<Box<dyn Read + Send>> {
    /// Opens `path` (`-`: standard input) and reads its file header. The namespace shown for
    /// its packets is the file's stem (`file` if it has none).
    pub fn open(path: &Path, names: SharedNames) -> Result<Self, FileError> {
        if path.as_os_str() == "-" {
            let stdin: Box<dyn Read + Send> = Box::new(io::stdin());
            return FileSource::from_reader(stdin, "standard input".into(), "file".into(), names);
        }
        let name = path.display().to_string();
        let file = File::open(path).map_err(|error| FileError::Open {
            name: name.clone(),
            error,
        })?;
        let file: Box<dyn Read + Send> = Box::new(file);
        FileSource::from_reader(file, name, netns_name_for(path), names)
    }
}

/// A pcapng section's `shb_userappl` says `dnspath …`: a file of `trace -w`.
fn written_by_dnspath(options: &[SectionHeaderOption]) -> bool {
    options
        .iter()
        .any(|o| matches!(o, SectionHeaderOption::UserApplication(a) if a.starts_with("dnspath ")))
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
            netns_ids: HashMap::new(),
            iface_netns: HashMap::new(),
            drops_ifaces: HashSet::new(),
            ifaces_by_name: HashMap::new(),
            drops: 0,
            first_unreadable_drop: None,
            by_dnspath: false,
        };
        if let Format::PcapNg { parser, .. } = &src.format {
            src.by_dnspath = written_by_dnspath(&parser.section().options);
        }
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

    /// Kernel drops read back from a dnspath-written file (their packets are no hops).
    pub fn drops(&self) -> u64 {
        self.drops
    }

    /// The first kernel drop whose comment could not be read (block, offset and why).
    pub fn first_unreadable_drop(&self) -> Option<&str> {
        self.first_unreadable_drop.as_deref()
    }

    /// How many blocks were read without some of their optional fields (a name that is not
    /// UTF-8, read lossily; an option of the wrong length, ignored), and the first of them.
    pub fn repaired_blocks(&self) -> (u64, Option<&str>) {
        (self.repaired, self.first_repaired.as_deref())
    }

    fn note_linktype(&mut self, linktype: u32) {
        if strip_link(linktype, &[]) == Link::Unsupported && !self.unsupported.contains(&linktype) {
            self.unsupported.push(linktype);
        }
    }

    /// The next IP packet for which `keep(bytes from the IP header on)` is true; the others
    /// are counted in [`LinkSkips::filtered`] without being copied. `Ok(None)` at the end of
    /// the file, and after an error. Kernel drops of a dnspath-written file are counted
    /// ([`FileSource::drops`]) and passed over: [`FileSource::next_event`] hands them out.
    pub fn next_packet(
        &mut self,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<Option<CapturedPacket>, FileError> {
        loop {
            match self.next_event(&mut keep)? {
                Some(SourceEvent::Packet(p)) => return Ok(Some(p)),
                Some(_) => continue,
                None => return Ok(None),
            }
        }
    }

    /// As [`FileSource::next_packet`], and the kernel drops of a file dnspath wrote (`trace
    /// -w`), each as the drop the live source produced ([`SourceEvent::Drop`], named as the
    /// live run named it).
    pub fn next_event(
        &mut self,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Result<Option<SourceEvent>, FileError> {
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
            if self.drops_ifaces.contains(&frame.iface) {
                let ip = frame.data.start.saturating_add(offset)..frame.data.end;
                match self.drop_of(&frame, ip, offset) {
                    Some(d) => return Ok(Some(SourceEvent::Drop(d))),
                    None => continue,
                }
            }
            return Ok(Some(SourceEvent::Packet(CapturedPacket {
                ts_ns: frame.ts_ns,
                cpu: None,
                at: ObservationPoint {
                    netns: self
                        .iface_netns
                        .get(&frame.iface)
                        .copied()
                        .unwrap_or(FILE_NETNS),
                    ifindex: sll2_ifindex.unwrap_or(frame.iface),
                    dir: frame.dir.or(link_dir).unwrap_or(Direction::Unknown),
                },
                vlan,
                orig_len: frame.wire_len.saturating_sub(offset as u32),
                data: bytes::Bytes::copy_from_slice(ip),
            })));
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
                Step::Section { by_dnspath } => self.by_dnspath = by_dnspath,
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
