//! pcapng blocks (draft-ietf-opsawg-pcapng): section headers, interfaces, packets; blocks
//! whose optional fields are damaged are read without them.
use super::*;

/// Converts a pcapng interface's timestamp units into nanoseconds (if_tsresol, if_tsoffset;
/// pcapng §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TsUnit {
    /// 10^-n seconds.
    Decimal(u8),
    /// 2^-n seconds.
    Binary(u8),
}

impl TsUnit {
    pub(super) fn from_tsresol(v: u8) -> Self {
        if v & 0x80 == 0 {
            TsUnit::Decimal(v)
        } else {
            TsUnit::Binary(v & 0x7f)
        }
    }

    pub(super) fn to_ns(self, raw: u64) -> u64 {
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
pub(super) struct Interface {
    pub(super) linktype: u32,
    pub(super) ts: TsUnit,
    /// if_tsoffset, seconds (a signed value in the spec).
    pub(super) ts_offset_s: i64,
}

pub(super) fn u32_at(b: &[u8], at: usize, endian: Endianness) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u32::from_be_bytes(s),
        Endianness::Little => u32::from_le_bytes(s),
    })
}

/// Where `inner` (a sub-slice of `outer`) starts within it.
pub(super) fn range_in(outer: &[u8], inner: &[u8]) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// Length of the pcapng section header block at the start of `b`.
pub(super) fn shb_len(b: &[u8]) -> Result<usize, String> {
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

pub(super) fn check_block_len(len: u32) -> Result<usize, String> {
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

/// `epb_flags`/`pack_flags` bits 0-1: 01 inbound, 10 outbound (pcapng §4.3.1).
pub(super) fn flags_dir(flags: u32) -> Option<Direction> {
    match flags & 0b11 {
        0b01 => Some(Direction::Ingress),
        0b10 => Some(Direction::Egress),
        _ => None,
    }
}

pub(super) fn u16_at(b: &[u8], at: usize, endian: Endianness) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u16::from_be_bytes(s),
        Endianness::Little => u16::from_le_bytes(s),
    })
}

pub(super) fn u64_at(b: &[u8], at: usize, endian: Endianness) -> Option<u64> {
    let s: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
    Some(match endian {
        Endianness::Big => u64::from_be_bytes(s),
        Endianness::Little => u64::from_le_bytes(s),
    })
}

/// The options of a pcapng block, `(code, value)`, from `b` (the bytes after the block's
/// fixed fields, before its trailing length), up to `opt_endofopt` or the end. An option
/// running past the block is structural damage.
pub(super) fn pcapng_options(
    mut b: &[u8],
    endian: Endianness,
) -> Result<Vec<(u16, &[u8])>, String> {
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
pub(super) fn lossy_note(what: &str, v: &[u8]) -> Option<String> {
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
pub(super) fn idb_lossy(
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
pub(super) fn epb_lossy(
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
    let mut comment = None;
    let mut notes = Vec::new();
    for (code, v) in opts {
        match (code, v.len()) {
            (2, 4) => flags = u32_at(v, 0, endian),
            (2, n) => notes.push(format!("epb_flags has a bad length {n}, ignored")),
            (1, _) => {
                notes.extend(lossy_note("comment", v));
                comment = comment.or_else(|| range_in(avail, v));
            }
            _ => {}
        }
    }
    if notes.is_empty() {
        notes.push(format!("{error}; its options ignored"));
    }
    let raw = (u64::from(hi) << 32) | u64::from(lo);
    let step = packet_step(interfaces, avail, id, raw, orig, data, flags, comment);
    (step, Some(notes.join("; ")))
}

/// Reads one pcapng block. A block whose optional fields could not be read (a name that
/// is not UTF-8, an option of the wrong length) is read without them: `repaired` then says
/// what was replaced or ignored.
pub(super) fn pcapng_block<R: Read>(
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
        Block::SectionHeader(shb) => {
            interfaces.clear();
            Step::Section {
                by_dnspath: written_by_dnspath(&shb.options),
            }
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
            // The first comment, where it lies in the block (read only for dnspath's drops).
            let comment = epb.options.iter().find_map(|o| match o {
                EnhancedPacketOption::Comment(c) => range_in(avail, c.as_bytes()),
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
                comment,
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
                None,
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
                    comment: None,
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

#[allow(clippy::too_many_arguments, reason = "the fields of a packet block")]
pub(super) fn packet_step(
    interfaces: &[Interface],
    avail: &[u8],
    id: u32,
    raw_ts: u64,
    original_len: u32,
    data: &[u8],
    flags: Option<u32>,
    comment: Option<Range<usize>>,
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
        comment,
    })
}
