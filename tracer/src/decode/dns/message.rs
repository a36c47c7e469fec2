//! The section walk: header, questions, resource records, the OPT record; errors that name
//! the section and record they occurred in.
use hickory_proto::serialize::binary::{BinDecoder, DecodeError};

use super::reader::describe;
use super::*;

pub(super) struct Header {
    pub(super) id: u16,
    pub(super) b2: u8,
    pub(super) b3: u8,
    pub(super) qd: u16,
    pub(super) an: u16,
    pub(super) ns: u16,
    pub(super) ar: u16,
}

impl Header {
    pub(super) fn read(bytes: &[u8]) -> Option<Header> {
        let &[i0, i1, b2, b3, q0, q1, a0, a1, n0, n1, r0, r1] =
            bytes.first_chunk::<HEADER_LEN>()?;
        Some(Header {
            id: u16::from_be_bytes([i0, i1]),
            b2,
            b3,
            qd: u16::from_be_bytes([q0, q1]),
            an: u16::from_be_bytes([a0, a1]),
            ns: u16::from_be_bytes([n0, n1]),
            ar: u16::from_be_bytes([r0, r1]),
        })
    }
}

/// Why reading an entry stopped.
pub(super) enum EntryError {
    /// The bytes ran out inside the entry: the end of a cut capture, or (whole capture)
    /// a message that is short in itself.
    OutOfBytes(DnsError),
    /// The entry is wrong in itself.
    Bad(DnsError),
}

impl EntryError {
    pub(super) fn from_wire(section: Section, index: u16, what: &str, e: DecodeError) -> Self {
        let out_of_bytes = matches!(e, DecodeError::InsufficientBytes);
        let e = wire(section, index, what, e);
        if out_of_bytes {
            EntryError::OutOfBytes(e)
        } else {
            EntryError::Bad(e)
        }
    }
}

/// Room for at most `count` entries, but never more than the bytes left could hold.
pub(super) fn capacity(count: u16, bytes_left: usize, min_len: usize) -> usize {
    usize::from(count).min(bytes_left / min_len)
}

/// Everything after the header. `cut`: the message's length on the wire when the capture
/// holds only a prefix of it; running out of bytes then ends decoding instead of failing it.
pub(super) fn decode_body(
    bytes: &[u8],
    h: &Header,
    cut: Option<usize>,
) -> Result<DnsMessage, DnsError> {
    decode_body_with(bytes, h, cut, &mut NameReader::new(bytes))
}

/// [`decode_body`] with the given name reader (tests turn its shortcut off).
pub(super) fn decode_body_with(
    bytes: &[u8],
    h: &Header,
    cut: Option<usize>,
    names: &mut NameReader<'_>,
) -> Result<DnsMessage, DnsError> {
    let mut dec = BinDecoder::new(bytes);
    dec.read_slice(HEADER_LEN)
        .map_err(|e| wire(Section::Question, 0, "header", e))?;
    let cutting = cut.is_some();
    // Where the capture ended: the first entry (section, index) that was not decoded.
    let mut stopped: Option<(Section, u16)> = None;

    let mut questions = Vec::with_capacity(capacity(h.qd, dec.len(), MIN_QUESTION_LEN));
    for i in 0..h.qd {
        match read_question(&mut dec, names) {
            Ok(q) => questions.push(q),
            Err(e) => {
                let e = EntryError::from_wire(Section::Question, i, "", e);
                stopped = Some(stop_at(cutting, Section::Question, i, e)?);
                break;
            }
        }
    }
    let mut edns = None;
    let mut section = |section, count, stopped: &mut Option<(Section, u16)>| {
        if stopped.is_some() {
            return Ok(Vec::new());
        }
        let (records, stop) = read_section(&mut dec, names, section, count, &mut edns, cutting)?;
        *stopped = stop.map(|i| (section, i));
        Ok::<_, DnsError>(records)
    };
    let answers = section(Section::Answer, h.an, &mut stopped)?;
    let authority = section(Section::Authority, h.ns, &mut stopped)?;
    let additional = section(Section::Additional, h.ar, &mut stopped)?;

    let rcode_low = u16::from(h.b3 & 0x0f);
    let rcode = match &edns {
        Some(opt) => (u16::from(opt.ext_rcode) << 4) | rcode_low,
        None => rcode_low,
    };
    let cut = match (cut, stopped) {
        (Some(message_bytes), Some((section, index))) => {
            // Entries of the section it stopped in from `index` on, and all later sections.
            let left = |s: Section, count: u16| match s.cmp(&section) {
                std::cmp::Ordering::Less => 0,
                std::cmp::Ordering::Equal => count.saturating_sub(index),
                std::cmp::Ordering::Greater => count,
            };
            Some(Cut {
                captured_bytes: bytes.len(),
                message_bytes,
                questions: left(Section::Question, h.qd),
                answers: left(Section::Answer, h.an),
                authority: left(Section::Authority, h.ns),
                additional: left(Section::Additional, h.ar),
            })
        }
        _ => None,
    };
    let (b2, b3) = (h.b2, h.b3);
    Ok(DnsMessage {
        id: h.id,
        qr: b2 & 0x80 != 0,
        opcode: opcode_name((b2 >> 3) & 0x0f),
        rcode: super::Rcode::new(rcode),
        flags: Flags {
            aa: b2 & 0x04 != 0,
            tc: b2 & 0x02 != 0,
            rd: b2 & 0x01 != 0,
            ra: b3 & 0x80 != 0,
            ad: b3 & 0x20 != 0,
            cd: b3 & 0x10 != 0,
        },
        questions,
        answers,
        authority,
        additional,
        edns: edns.map(|o| o.edns),
        cut,
    })
}

/// EDNS as read from the OPT record, plus the RCODE bits the header lacks.
pub(super) struct OptRecord {
    ext_rcode: u8,
    edns: Edns,
}

pub(super) fn read_question(
    dec: &mut BinDecoder<'_>,
    names: &mut NameReader<'_>,
) -> Result<Question, DecodeError> {
    let name = String::from(names.read(dec)?);
    let qtype = dec.read_u16()?.unverified(/*any u16 is a type*/);
    let class = dec.read_u16()?.unverified(/*any u16 is a class*/);
    Ok(Question {
        name,
        qtype: RrType(qtype),
        class: RrClass(class),
    })
}

/// Reads `count` records; with `cutting`, running out of bytes ends the section early and
/// returns the index of the first record not decoded.
pub(super) fn read_section(
    dec: &mut BinDecoder<'_>,
    names: &mut NameReader<'_>,
    section: Section,
    count: u16,
    edns: &mut Option<OptRecord>,
    cutting: bool,
) -> Result<(Vec<Record>, Option<u16>), DnsError> {
    let mut records = Vec::with_capacity(capacity(count, dec.len(), MIN_RECORD_LEN));
    for index in 0..count {
        match read_record(dec, names, section, index, edns) {
            Ok(Some(rr)) => records.push(rr),
            Ok(None) => {}
            Err(e) => {
                stop_at(cutting, section, index, e)?;
                return Ok((records, Some(index)));
            }
        }
    }
    Ok((records, None))
}

/// Where a cut message's decoding ends, or the error of one that is malformed.
pub(super) fn stop_at(
    cutting: bool,
    section: Section,
    index: u16,
    e: EntryError,
) -> Result<(Section, u16), DnsError> {
    match e {
        EntryError::OutOfBytes(_) if cutting => Ok((section, index)),
        EntryError::OutOfBytes(e) | EntryError::Bad(e) => Err(e),
    }
}

/// Returns `None` for the OPT pseudo-record, which goes to `edns` instead.
pub(super) fn read_record(
    dec: &mut BinDecoder<'_>,
    names: &mut NameReader<'_>,
    section: Section,
    index: u16,
    edns: &mut Option<OptRecord>,
) -> Result<Option<Record>, EntryError> {
    let err = |reason: String| {
        EntryError::Bad(DnsError::Malformed {
            section,
            index,
            reason,
        })
    };
    let name = names
        .read(dec)
        .map_err(|e| EntryError::from_wire(section, index, "owner name", e))?;
    let mut fixed = || -> Result<(u16, u16, u32, u16), DecodeError> {
        Ok((
            dec.read_u16()?.unverified(/*any u16 is a type*/),
            dec.read_u16()?.unverified(/*class, or UDP size for OPT*/),
            dec.read_u32()?.unverified(/*any u32 is a TTL*/),
            dec.read_u16()?.unverified(/*checked against the message below*/),
        ))
    };
    let (rtype, class, ttl, rdlen) =
        fixed().map_err(|e| EntryError::from_wire(section, index, "fixed fields", e))?;
    let rdata_start = dec.index();
    let rdata = dec
        .read_slice(usize::from(rdlen))
        .map_err(|_| {
            EntryError::OutOfBytes(DnsError::Malformed {
                section,
                index,
                reason: format!(
                    "rdata length {rdlen} runs past the end of the message ({} bytes left)",
                    dec.len()
                ),
            })
        })?
        .unverified(/*bounds checked by read_slice*/);

    if rtype == TYPE_OPT {
        // RFC 6891 §6.1.1: one OPT, in the additional section, owned by the root.
        if section != Section::Additional {
            return Err(err(
                "OPT pseudo-record outside the additional section".into()
            ));
        }
        if edns.is_some() {
            return Err(err("second OPT pseudo-record".into()));
        }
        // Only the root's text is ".": every other name has a label before its dot.
        if name != "." {
            return Err(err(format!("OPT owner name {name} is not the root")));
        }
        *edns = Some(read_opt(class, ttl, rdata).map_err(err)?);
        return Ok(None);
    }

    let name = String::from(name);
    let data = rdata_summary(names, rdata_start, rtype, rdata).map_err(err)?;
    Ok(Some(Record {
        name,
        rtype: super::RrType(rtype),
        class: super::RrClass(class),
        ttl,
        data,
    }))
}

pub(super) fn read_opt(udp_size: u16, ttl: u32, mut rdata: &[u8]) -> Result<OptRecord, String> {
    let [ext_rcode, version, flags_hi, _] = ttl.to_be_bytes();
    let mut options = Vec::new();
    while !rdata.is_empty() {
        let (Some(&[c0, c1, l0, l1]), rest) = (rdata.first_chunk::<4>(), rdata.get(4..)) else {
            return Err(format!(
                "EDNS option header needs 4 bytes, {} left in OPT rdata",
                rdata.len()
            ));
        };
        let code = u16::from_be_bytes([c0, c1]);
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let rest = rest.unwrap_or_default();
        let (Some(data), Some(tail)) = (rest.get(..len), rest.get(len..)) else {
            return Err(format!(
                "EDNS option {code} declares {len} bytes, {} left in OPT rdata",
                rest.len()
            ));
        };
        rdata = tail;
        let data = match code {
            8 => ecs_summary(data).unwrap_or_else(|| hex(data)),
            _ => hex(data),
        };
        options.push(EdnsOption {
            code,
            name: edns_option_name(code),
            data,
        });
    }
    Ok(OptRecord {
        ext_rcode,
        edns: Edns {
            udp_size,
            version,
            dnssec_ok: flags_hi & 0x80 != 0,
            options,
        },
    })
}

pub(super) fn wire(section: Section, index: u16, what: &str, e: DecodeError) -> DnsError {
    let reason = describe(e);
    DnsError::Malformed {
        section,
        index,
        reason: if what.is_empty() {
            reason
        } else {
            format!("{what}: {reason}")
        },
    }
}
