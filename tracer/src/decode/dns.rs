//! One DNS message (RFC 1035 §4) → [`DnsMessage`], a serialisable presentation-format view.
//!
//! hickory-proto does the risky part, domain-name decompression (`Name::read` accepts only
//! pointers to strictly earlier offsets, so loops and forward pointers cannot recurse), and
//! parses the rarer structured rdata. The section walk is ours rather than
//! `Message::from_vec` so that
//! - header counts are checked against the message size before anything is allocated
//!   (a 12-byte packet claiming 65535 answers costs nothing),
//! - errors name the section and record they occurred in,
//! - the OPT record is read raw: hickory clamps the UDP size to ≥ 512 and drops the whole
//!   message on an ECS option it does not like, both wrong for a tracer,
//! - a message the capture cut short ([`decode_cut`]) is decoded as far as its bytes go, the
//!   way tcpdump prints `[|domain]`: header, questions and every record that fits whole.
use std::fmt::{self, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::{Name, RData, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, DecodeError, Restrict};
use serde::Serialize;

const HEADER_LEN: usize = 12;
/// Root name + QTYPE + QCLASS.
const MIN_QUESTION_LEN: usize = 5;
/// Root name + TYPE + CLASS + TTL + RDLENGTH.
const MIN_RECORD_LEN: usize = 11;
const TYPE_OPT: u16 = 41;
/// Answers shown by [`DnsMessage::summary_line`] before eliding the rest.
const SUMMARY_MAX_ANSWERS: usize = 4;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DnsMessage {
    pub id: u16,
    pub qr: bool,
    pub opcode: String,
    /// Full 12-bit RCODE: header bits plus the EDNS extended bits (RFC 6891 §6.1.3).
    pub rcode: String,
    pub flags: Flags,
    pub questions: Vec<Question>,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    /// Without the OPT pseudo-record, which is in `edns`.
    pub additional: Vec<Record>,
    pub edns: Option<Edns>,
    /// Set when the capture cut the message: what was not decoded. Absent for whole messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
}

/// How much of a message the capture (snaplen) cut off. The section counts are entries the
/// header announces that were not decoded because the capture ended before (or inside)
/// them; every entry that fit whole was decoded.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct Cut {
    /// Bytes of the message that were captured.
    pub captured_bytes: usize,
    /// The message's length on the wire (UDP length, or the DNS-over-TCP length prefix).
    pub message_bytes: usize,
    pub questions: u16,
    pub answers: u16,
    pub authority: u16,
    /// Including the OPT pseudo-record, if it was among them.
    pub additional: u16,
}

impl Cut {
    /// Entries not decoded, over all sections.
    pub fn entries(&self) -> u32 {
        u32::from(self.questions)
            + u32::from(self.answers)
            + u32::from(self.authority)
            + u32::from(self.additional)
    }
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct Flags {
    pub aa: bool,
    pub tc: bool,
    pub rd: bool,
    pub ra: bool,
    pub ad: bool,
    pub cd: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Question {
    /// FQDN with trailing dot, case as received (DNS 0x20 case randomisation survives).
    pub name: String,
    #[serde(rename = "type")]
    pub qtype: String,
    pub class: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    #[serde(rename = "type")]
    pub rtype: String,
    pub class: String,
    pub ttl: u32,
    /// Presentation-format rdata; RFC 3597 `\# len hex` for types without a summary, empty
    /// for empty rdata (RFC 2136 update prerequisites).
    pub data: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Edns {
    pub udp_size: u16,
    pub version: u8,
    pub dnssec_ok: bool,
    pub options: Vec<EdnsOption>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EdnsOption {
    pub code: u16,
    /// IANA mnemonic ("ECS", "COOKIE", "NSID", ...) or `OPT<code>`.
    pub name: String,
    /// ECS as `addr/source/scope` (e.g. `1.2.3.0/24/0`), everything else hex. An ECS option
    /// that cannot be read as an address is shown as hex too.
    pub data: String,
}

/// In message order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    Question,
    Answer,
    Authority,
    Additional,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Question => "question",
            Self::Answer => "answer",
            Self::Authority => "authority",
            Self::Additional => "additional",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("{0} bytes is shorter than the 12-byte DNS header")]
    TooShort(usize),
    #[error(
        "header counts (qd {qd}, an {an}, ns {ns}, ar {ar}) need at least {need} bytes \
         after the header, only {have} present"
    )]
    CountsExceedMessage {
        qd: u16,
        an: u16,
        ns: u16,
        ar: u16,
        need: usize,
        have: usize,
    },
    #[error("{section} #{index}: {reason}")]
    Malformed {
        section: Section,
        index: u16,
        reason: String,
    },
}

/// Decodes one DNS message (no TCP length prefix) that was captured whole.
pub fn decode(bytes: &[u8]) -> Result<DnsMessage, DnsError> {
    let header = Header::read(bytes).ok_or(DnsError::TooShort(bytes.len()))?;
    let Header { qd, an, ns, ar, .. } = header;
    let have = bytes.len().saturating_sub(HEADER_LEN);
    // At most 5 * 65535 + 11 * 3 * 65535: no overflow.
    let records = usize::from(an) + usize::from(ns) + usize::from(ar);
    let need = usize::from(qd) * MIN_QUESTION_LEN + records * MIN_RECORD_LEN;
    if need > have {
        return Err(DnsError::CountsExceedMessage {
            qd,
            an,
            ns,
            ar,
            need,
            have,
        });
    }
    decode_body(bytes, &header, None)
}

/// Decodes a message whose end the capture cut off: `bytes` is what was captured,
/// `message_bytes` its length on the wire. Header, questions and every record that fits
/// whole are decoded; [`DnsMessage::cut`] counts the entries that did not fit (it is `None`
/// when, after all, every entry did: only bytes after the message were missing).
///
/// `Ok(None)`: not even the 12-byte header was captured. An error means the captured part
/// is wrong in itself (a compression loop, a misframed record, …): malformed, cut or not.
pub fn decode_cut(bytes: &[u8], message_bytes: usize) -> Result<Option<DnsMessage>, DnsError> {
    let Some(header) = Header::read(bytes) else {
        return Ok(None);
    };
    decode_body(bytes, &header, Some(message_bytes)).map(Some)
}

/// The fixed 12-byte header (RFC 1035 §4.1.1).
struct Header {
    id: u16,
    b2: u8,
    b3: u8,
    qd: u16,
    an: u16,
    ns: u16,
    ar: u16,
}

impl Header {
    fn read(bytes: &[u8]) -> Option<Header> {
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
enum EntryError {
    /// The bytes ran out inside the entry: the end of a cut capture, or (whole capture)
    /// a message that is short in itself.
    OutOfBytes(DnsError),
    /// The entry is wrong in itself.
    Bad(DnsError),
}

impl EntryError {
    fn from_wire(section: Section, index: u16, what: &str, e: DecodeError) -> Self {
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
fn capacity(count: u16, bytes_left: usize, min_len: usize) -> usize {
    usize::from(count).min(bytes_left / min_len)
}

/// Everything after the header. `cut`: the message's length on the wire when the capture
/// holds only a prefix of it; running out of bytes then ends decoding instead of failing it.
fn decode_body(bytes: &[u8], h: &Header, cut: Option<usize>) -> Result<DnsMessage, DnsError> {
    let mut dec = BinDecoder::new(bytes);
    dec.read_slice(HEADER_LEN)
        .map_err(|e| wire(Section::Question, 0, "header", e))?;
    let cutting = cut.is_some();
    // Where the capture ended: the first entry (section, index) that was not decoded.
    let mut stopped: Option<(Section, u16)> = None;

    let mut questions = Vec::with_capacity(capacity(h.qd, dec.len(), MIN_QUESTION_LEN));
    for i in 0..h.qd {
        match read_question(&mut dec) {
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
        let (records, stop) = read_section(&mut dec, bytes, section, count, &mut edns, cutting)?;
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
        rcode: rcode_name(rcode),
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

impl DnsMessage {
    /// One line in tcpdump's style: `12345+ [1au] A? www.lab.test.` for a query,
    /// `12345 q: A? www.lab.test. NOERROR 1/0/1 A 10.250.0.80` for a response.
    ///
    /// Flags follow tcpdump: queries `+` RD, `%` CD, `$` AD; responses `*` AA, `-` RA
    /// clear, `|` TC, `$` AD. A non-QUERY opcode is shown in brackets.
    pub fn summary_line(&self) -> String {
        let mut s = String::with_capacity(96);
        // Writing to a String cannot fail.
        let _ = write!(s, "{}", self.id);
        if self.opcode != "QUERY" {
            let _ = write!(s, " [{}]", self.opcode);
        }
        let f = &self.flags;
        // Counts as the header gives them: what was decoded plus what the capture cut off.
        let cut = self.cut.unwrap_or_default();
        let answers = self.answers.len() + usize::from(cut.answers);
        let authority = self.authority.len() + usize::from(cut.authority);
        let additional =
            self.additional.len() + usize::from(self.edns.is_some()) + usize::from(cut.additional);
        if self.qr {
            for (on, c) in [(f.aa, '*'), (!f.ra, '-'), (f.tc, '|'), (f.ad, '$')] {
                if on {
                    s.push(c);
                }
            }
            if let Some(q) = self.questions.first() {
                s.push_str(" q: ");
                push_question(&mut s, q);
            }
            let _ = write!(s, " {} {answers}/{authority}/{additional}", self.rcode);
            for (i, rr) in self.answers.iter().enumerate() {
                if i == SUMMARY_MAX_ANSWERS {
                    s.push_str(", ...");
                    break;
                }
                s.push_str(if i == 0 { " " } else { ", " });
                let _ = write!(s, "{} {}", rr.rtype, rr.data);
            }
        } else {
            for (on, c) in [(f.rd, '+'), (f.cd, '%'), (f.ad, '$')] {
                if on {
                    s.push(c);
                }
            }
            for (n, tag) in [(answers, "a"), (authority, "n"), (additional, "au")] {
                if n > 0 {
                    let _ = write!(s, " [{n}{tag}]");
                }
            }
            for q in &self.questions {
                s.push(' ');
                push_question(&mut s, q);
            }
        }
        if let Some(cut) = &self.cut {
            s.push(' ');
            s.push_str(&cut.note());
        }
        s
    }
}

impl Cut {
    /// `[|cut by the capture at 200 of 731 bytes: 5 answers, 1 additional not decoded]`,
    /// after tcpdump's `[|domain]`.
    pub fn note(&self) -> String {
        let mut s = format!(
            "[|cut by the capture at {} of {} bytes",
            self.captured_bytes, self.message_bytes
        );
        let mut first = true;
        for (n, what) in [
            (self.questions, "question"),
            (self.answers, "answer"),
            (self.authority, "authority"),
            (self.additional, "additional"),
        ] {
            if n > 0 {
                s.push_str(if first { ": " } else { ", " });
                first = false;
                let plural = if n > 1 && matches!(what, "question" | "answer") {
                    "s"
                } else {
                    ""
                };
                let _ = write!(s, "{n} {what}{plural}");
            }
        }
        if !first {
            s.push_str(" not decoded");
        }
        s.push(']');
        s
    }
}

fn push_question(s: &mut String, q: &Question) {
    s.push_str(&q.qtype);
    if q.class != "IN" {
        s.push(' ');
        s.push_str(&q.class);
    }
    s.push_str("? ");
    s.push_str(&q.name);
}

/// EDNS as read from the OPT record, plus the RCODE bits the header lacks.
struct OptRecord {
    ext_rcode: u8,
    edns: Edns,
}

fn read_question(dec: &mut BinDecoder<'_>) -> Result<Question, DecodeError> {
    let name = Name::read(dec)?;
    let qtype = dec.read_u16()?.unverified(/*any u16 is a type*/);
    let class = dec.read_u16()?.unverified(/*any u16 is a class*/);
    Ok(Question {
        name: name_to_string(&name),
        qtype: type_name(qtype),
        class: class_name(class),
    })
}

/// Reads `count` records; with `cutting`, running out of bytes ends the section early and
/// returns the index of the first record not decoded.
fn read_section(
    dec: &mut BinDecoder<'_>,
    msg: &[u8],
    section: Section,
    count: u16,
    edns: &mut Option<OptRecord>,
    cutting: bool,
) -> Result<(Vec<Record>, Option<u16>), DnsError> {
    let mut records = Vec::with_capacity(capacity(count, dec.len(), MIN_RECORD_LEN));
    for index in 0..count {
        match read_record(dec, msg, section, index, edns) {
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
fn stop_at(
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
fn read_record(
    dec: &mut BinDecoder<'_>,
    msg: &[u8],
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
    let name =
        Name::read(dec).map_err(|e| EntryError::from_wire(section, index, "owner name", e))?;
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
        if !name.is_root() {
            return Err(err(format!(
                "OPT owner name {} is not the root",
                name_to_string(&name)
            )));
        }
        *edns = Some(read_opt(class, ttl, rdata).map_err(err)?);
        return Ok(None);
    }

    let data = rdata_summary(msg, rdata_start, rtype, rdata).map_err(err)?;
    Ok(Some(Record {
        name: name_to_string(&name),
        rtype: type_name(rtype),
        class: class_name(class),
        ttl,
        data,
    }))
}

fn read_opt(udp_size: u16, ttl: u32, mut rdata: &[u8]) -> Result<OptRecord, String> {
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

/// RFC 7871 §6: FAMILY, SOURCE PREFIX, SCOPE PREFIX, then the address cut to the prefix.
fn ecs_summary(data: &[u8]) -> Option<String> {
    let &[f0, f1, source, scope] = data.first_chunk::<4>()?;
    let addr = data.get(4..)?;
    match u16::from_be_bytes([f0, f1]) {
        1 => {
            let mut octets = [0u8; 4];
            octets.get_mut(..addr.len())?.copy_from_slice(addr);
            Some(format!("{}/{source}/{scope}", Ipv4Addr::from(octets)))
        }
        2 => {
            let mut octets = [0u8; 16];
            octets.get_mut(..addr.len())?.copy_from_slice(addr);
            Some(format!("{}/{source}/{scope}", Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

fn rdata_summary(msg: &[u8], start: usize, rtype: u16, rdata: &[u8]) -> Result<String, String> {
    if rdata.is_empty() {
        return Ok(String::new());
    }
    let mut s = String::with_capacity(48);
    match rtype {
        // A
        1 => {
            let octets: [u8; 4] = rdata
                .try_into()
                .map_err(|_| format!("A rdata is {} bytes, not 4", rdata.len()))?;
            push_ipv4(&mut s, octets);
        }
        // AAAA
        28 => {
            let octets: [u8; 16] = rdata
                .try_into()
                .map_err(|_| format!("AAAA rdata is {} bytes, not 16", rdata.len()))?;
            let _ = write!(s, "{}", Ipv6Addr::from(octets));
        }
        // NS, CNAME, PTR, DNAME: a single (possibly compressed) name.
        2 | 5 | 12 | 39 => {
            let mut rd = RdataReader::new(msg, start, rdata.len(), rtype)?;
            push_name(&mut s, &rd.name()?);
            rd.finish()?;
        }
        // MX
        15 => {
            let mut rd = RdataReader::new(msg, start, rdata.len(), rtype)?;
            let _ = write!(s, "{} ", rd.u16()?);
            push_name(&mut s, &rd.name()?);
            rd.finish()?;
        }
        // SRV (RFC 2782): priority weight port target
        33 => {
            let mut rd = RdataReader::new(msg, start, rdata.len(), rtype)?;
            let _ = write!(s, "{} {} {} ", rd.u16()?, rd.u16()?, rd.u16()?);
            push_name(&mut s, &rd.name()?);
            rd.finish()?;
        }
        // SOA: mname rname serial refresh retry expire minimum
        6 => {
            let mut rd = RdataReader::new(msg, start, rdata.len(), rtype)?;
            push_name(&mut s, &rd.name()?);
            s.push(' ');
            push_name(&mut s, &rd.name()?);
            let _ = write!(
                s,
                " {} {} {} {} {}",
                rd.u32()?,
                rd.u32()?,
                rd.u32()?,
                rd.u32()?,
                rd.u32()?
            );
            rd.finish()?;
        }
        // TXT: one or more <character-string>s
        16 => {
            let mut rest = rdata;
            while let Some((&len, tail)) = rest.split_first() {
                let text = tail.get(..usize::from(len)).ok_or_else(|| {
                    format!(
                        "TXT string declares {len} bytes, {} left in rdata",
                        tail.len()
                    )
                })?;
                if !s.is_empty() {
                    s.push(' ');
                }
                push_quoted(&mut s, text);
                rest = tail.get(usize::from(len)..).unwrap_or_default();
            }
        }
        // SVCB, HTTPS, CAA, NAPTR, HINFO, SSHFP, TLSA: hickory knows their presentation form.
        // Framing is already safe (rdlength checked), so if hickory rejects the contents the
        // record is still shown, generically.
        64 | 65 | 257 | 35 | 13 | 44 | 52 => {
            let mut dec = BinDecoder::new(msg);
            let parsed = dec.read_slice(start).and_then(|_| {
                let len = Restrict::new(u16::try_from(rdata.len()).unwrap_or(u16::MAX));
                RData::read(&mut dec, RecordType::from(rtype), len)
            });
            match parsed {
                Ok(rd) => {
                    let _ = write!(s, "{rd}");
                }
                Err(_) => push_generic(&mut s, rdata),
            }
        }
        _ => push_generic(&mut s, rdata),
    }
    Ok(s)
}

/// Reads rdata fields through a decoder over the whole message, since names in rdata may
/// point anywhere before them (RFC 1035 §4.1.4).
struct RdataReader<'a> {
    dec: BinDecoder<'a>,
    end: usize,
    rtype: u16,
}

impl<'a> RdataReader<'a> {
    fn new(msg: &'a [u8], start: usize, len: usize, rtype: u16) -> Result<Self, String> {
        let mut dec = BinDecoder::new(msg);
        dec.read_slice(start).map_err(|e| e.to_string())?;
        Ok(Self {
            dec,
            end: start.saturating_add(len),
            rtype,
        })
    }

    fn fail(&self, e: DecodeError) -> String {
        format!("{} rdata: {}", type_name(self.rtype), describe(e))
    }

    fn name(&mut self) -> Result<Name, String> {
        Name::read(&mut self.dec).map_err(|e| self.fail(e))
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.dec
            .read_u16()
            .map(Restrict::unverified)
            .map_err(|e| self.fail(e))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.dec
            .read_u32()
            .map(Restrict::unverified)
            .map_err(|e| self.fail(e))
    }

    /// The fields must fill the rdata exactly; anything else means the record is misframed.
    fn finish(self) -> Result<(), String> {
        let at = self.dec.index();
        if at == self.end {
            Ok(())
        } else {
            Err(format!(
                "{} fields end at offset {at}, rdata ends at {}",
                type_name(self.rtype),
                self.end
            ))
        }
    }
}

fn wire(section: Section, index: u16, what: &str, e: DecodeError) -> DnsError {
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

/// hickory's messages, reworded where they are cryptic for the hostile cases that matter.
fn describe(e: DecodeError) -> String {
    match e {
        DecodeError::PointerNotPriorToLabel { idx, ptr } => format!(
            "compression pointer at offset {idx} targets offset {ptr}, which is not before \
             the name (pointer loop, forward or out-of-range pointer)"
        ),
        DecodeError::LabelOverlapsWithOther { label, other } => {
            format!("compressed name at offset {label} runs into offset {other} (pointer loop)")
        }
        DecodeError::UnrecognizedLabelCode(b) => format!(
            "label length byte {b:#04x} has reserved high bits (label longer than 63 bytes?)"
        ),
        DecodeError::LabelBytesTooLong(n) => format!("label of {n} bytes exceeds 63"),
        DecodeError::DomainNameTooLong(_) => "domain name exceeds 255 bytes".into(),
        DecodeError::InsufficientBytes => "message ends in the middle of this entry".into(),
        other => other.to_string(),
    }
}

fn name_to_string(name: &Name) -> String {
    let mut s = String::with_capacity(name.len().saturating_add(2));
    push_name(&mut s, name);
    s
}

/// RFC 1035 §5.1 presentation form: `\X` for special characters, `\DDD` (decimal) for
/// non-printable bytes. Names read from the wire are always absolute, so each label ends in '.'.
fn push_name(s: &mut String, name: &Name) {
    let mut labels = name.iter().peekable();
    if labels.peek().is_none() {
        s.push('.');
        return;
    }
    for label in labels {
        // Fast path: ordinary hostname labels need no escaping and copy in one go.
        if label.iter().all(|&b| is_plain(b)) {
            if let Ok(text) = std::str::from_utf8(label) {
                s.push_str(text);
                s.push('.');
                continue;
            }
        }
        for &b in label {
            match b {
                b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$' => {
                    s.push('\\');
                    s.push(char::from(b));
                }
                0x21..=0x7e => s.push(char::from(b)),
                _ => push_decimal_escape(s, b),
            }
        }
        s.push('.');
    }
}

fn is_plain(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$')
}

fn push_quoted(s: &mut String, text: &[u8]) {
    s.push('"');
    for &b in text {
        match b {
            b'"' | b'\\' => {
                s.push('\\');
                s.push(char::from(b));
            }
            0x20..=0x7e => s.push(char::from(b)),
            _ => push_decimal_escape(s, b),
        }
    }
    s.push('"');
}

/// `Ipv4Addr`'s Display goes through the formatting machinery (~150 ns); this is the hot
/// path for A records.
fn push_ipv4(s: &mut String, octets: [u8; 4]) {
    for (i, o) in octets.into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if o >= 100 {
            s.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            s.push(char::from(b'0' + o / 10 % 10));
        }
        s.push(char::from(b'0' + o % 10));
    }
}

fn push_decimal_escape(s: &mut String, b: u8) {
    s.push('\\');
    s.push(char::from(b'0' + b / 100));
    s.push(char::from(b'0' + b / 10 % 10));
    s.push(char::from(b'0' + b % 10));
}

/// RFC 3597 §5 generic rdata.
fn push_generic(s: &mut String, rdata: &[u8]) {
    let _ = write!(s, "\\# {} ", rdata.len());
    push_hex(s, rdata);
}

fn hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len().saturating_mul(2));
    push_hex(&mut s, data);
    s
}

fn push_hex(s: &mut String, data: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in data {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

fn type_name(code: u16) -> String {
    match RecordType::from(code) {
        RecordType::Unknown(_) | RecordType::ZERO => match code {
            17 => "RP".into(),
            29 => "LOC".into(),
            99 => "SPF".into(),
            249 => "TKEY".into(),
            256 => "URI".into(),
            _ => format!("TYPE{code}"),
        },
        // hickory gives ANAME the private-use code 65305 (hickory-dns#723); not a real type.
        RecordType::ANAME => format!("TYPE{code}"),
        known => <&'static str>::from(known).into(),
    }
}

fn class_name(code: u16) -> String {
    match code {
        1 => "IN".into(),
        3 => "CH".into(),
        4 => "HS".into(),
        254 => "NONE".into(),
        255 => "ANY".into(),
        _ => format!("CLASS{code}"),
    }
}

fn opcode_name(code: u8) -> String {
    match code {
        0 => "QUERY".into(),
        1 => "IQUERY".into(),
        2 => "STATUS".into(),
        4 => "NOTIFY".into(),
        5 => "UPDATE".into(),
        6 => "DSO".into(),
        _ => format!("OPCODE{code}"),
    }
}

/// IANA "DNS RCODEs" registry names; 16 is BADVERS because in a header/OPT RCODE it can only
/// mean that (BADSIG lives in TSIG records).
fn rcode_name(code: u16) -> String {
    let name = match code {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        11 => "DSOTYPENI",
        16 => "BADVERS",
        17 => "BADKEY",
        18 => "BADTIME",
        19 => "BADMODE",
        20 => "BADNAME",
        21 => "BADALG",
        22 => "BADTRUNC",
        23 => "BADCOOKIE",
        _ => return format!("RCODE{code}"),
    };
    name.into()
}

fn edns_option_name(code: u16) -> String {
    let name = match code {
        1 => "LLQ",
        2 => "UL",
        3 => "NSID",
        5 => "DAU",
        6 => "DHU",
        7 => "N3U",
        8 => "ECS",
        9 => "EXPIRE",
        10 => "COOKIE",
        11 => "KEEPALIVE",
        12 => "PADDING",
        13 => "CHAIN",
        14 => "KEY-TAG",
        15 => "EDE",
        16 => "CLIENT-TAG",
        17 => "SERVER-TAG",
        18 => "REPORT-CHANNEL",
        19 => "ZONEVERSION",
        _ => return format!("OPT{code}"),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns as HEdns, Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption as HOption};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME, MX, PTR, SOA, SRV, TXT};
    use hickory_proto::rr::Record as HRecord;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn query_with_edns() -> Vec<u8> {
        let mut m = Message::new(12345, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(name("www.lab.test."), RecordType::A));
        let mut edns = HEdns::new();
        edns.set_max_payload(1232)
            .set_version(0)
            .set_dnssec_ok(true);
        let opts = edns.options_mut();
        opts.insert(HOption::Subnet(ClientSubnet::new(
            "1.2.3.0".parse().unwrap(),
            24,
            0,
        )));
        opts.insert(HOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
        m.set_edns(edns);
        m.to_vec().unwrap()
    }

    #[test]
    fn query_with_edns_ecs_cookie() {
        let m = decode(&query_with_edns()).unwrap();
        assert_eq!(m.id, 12345);
        assert!(!m.qr);
        assert_eq!(m.opcode, "QUERY");
        assert_eq!(m.rcode, "NOERROR");
        assert!(m.flags.rd && !m.flags.aa && !m.flags.ra);
        assert_eq!(
            m.questions,
            vec![Question {
                name: "www.lab.test.".into(),
                qtype: "A".into(),
                class: "IN".into()
            }]
        );
        assert!(m.additional.is_empty(), "OPT must not appear in additional");
        let edns = m.edns.as_ref().unwrap();
        assert_eq!(
            (edns.udp_size, edns.version, edns.dnssec_ok),
            (1232, 0, true)
        );
        assert_eq!(
            edns.options,
            vec![
                EdnsOption {
                    code: 8,
                    name: "ECS".into(),
                    data: "1.2.3.0/24/0".into()
                },
                EdnsOption {
                    code: 10,
                    name: "COOKIE".into(),
                    data: "0102030405060708".into()
                },
            ]
        );
        assert_eq!(m.summary_line(), "12345+ [1au] A? www.lab.test.");
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["questions"][0]["type"], "A");
        assert_eq!(json["edns"]["options"][0]["data"], "1.2.3.0/24/0");
    }

    fn rr(n: &str, ttl: u32, data: RData) -> HRecord {
        HRecord::from_rdata(name(n), ttl, data)
    }

    /// A response of 7 answers of common types, 1 authority, 1 additional and an OPT.
    fn common_response() -> Vec<u8> {
        let mut m = Message::new(4242, MessageType::Response, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.metadata.recursion_available = true;
        m.metadata.authoritative = true;
        m.add_query(Query::query(name("www.lab.test."), RecordType::A));
        m.add_answer(rr(
            "www.lab.test.",
            30,
            RData::CNAME(CNAME(name("web.lab.test."))),
        ));
        m.add_answer(rr("web.lab.test.", 30, RData::A(A::new(10, 250, 0, 80))));
        m.add_answer(rr(
            "web.lab.test.",
            30,
            RData::AAAA(AAAA("fd00::50".parse().unwrap())),
        ));
        m.add_answer(rr(
            "_dns._udp.lab.test.",
            60,
            RData::SRV(SRV::new(10, 5, 53, name("ns1.lab.test."))),
        ));
        m.add_answer(rr(
            "lab.test.",
            60,
            RData::TXT(TXT::from_bytes(vec![
                &b"v=spf1 -all"[..],
                &b"say \"hi\"\\"[..],
                &b"\x00\xff"[..],
            ])),
        ));
        m.add_answer(rr(
            "80.0.250.10.in-addr.arpa.",
            60,
            RData::PTR(PTR(name("web.lab.test."))),
        ));
        m.add_answer(rr(
            "lab.test.",
            60,
            RData::MX(MX::new(10, name("mx.lab.test."))),
        ));
        m.add_authority(rr(
            "lab.test.",
            300,
            RData::SOA(SOA::new(
                name("ns1.lab.test."),
                name("hostmaster.lab.test."),
                2024010101,
                3600,
                600,
                86400,
                30,
            )),
        ));
        m.add_additional(rr("ns1.lab.test.", 60, RData::A(A::new(10, 250, 0, 53))));
        m.set_edns(HEdns::new());
        m.to_vec().unwrap()
    }

    #[test]
    fn response_with_common_types() {
        let bytes = common_response();

        let d = decode(&bytes).unwrap();
        assert!(d.qr && d.flags.aa && d.flags.rd && d.flags.ra);
        let got: Vec<(&str, &str, &str)> = d
            .answers
            .iter()
            .map(|r| (r.name.as_str(), r.rtype.as_str(), r.data.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("www.lab.test.", "CNAME", "web.lab.test."),
                ("web.lab.test.", "A", "10.250.0.80"),
                ("web.lab.test.", "AAAA", "fd00::50"),
                ("_dns._udp.lab.test.", "SRV", "10 5 53 ns1.lab.test."),
                (
                    "lab.test.",
                    "TXT",
                    r#""v=spf1 -all" "say \"hi\"\\" "\000\255""#
                ),
                ("80.0.250.10.in-addr.arpa.", "PTR", "web.lab.test."),
                ("lab.test.", "MX", "10 mx.lab.test."),
            ]
        );
        assert_eq!(d.answers[0].ttl, 30);
        assert_eq!(d.answers[0].class, "IN");
        assert_eq!(
            d.authority[0].data,
            "ns1.lab.test. hostmaster.lab.test. 2024010101 3600 600 86400 30"
        );
        assert_eq!(d.additional.len(), 1);
        assert!(d.edns.is_some());
        assert_eq!(
            d.summary_line(),
            "4242* q: A? www.lab.test. NOERROR 7/1/2 CNAME web.lab.test., A 10.250.0.80, \
             AAAA fd00::50, SRV 10 5 53 ns1.lab.test., ..."
        );
    }

    #[test]
    fn summary_matches_example() {
        let mut m = Message::new(12345, MessageType::Response, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.metadata.recursion_available = true;
        m.add_query(Query::query(name("www.lab.test."), RecordType::A));
        m.add_answer(rr("www.lab.test.", 5, RData::A(A::new(10, 250, 0, 80))));
        m.set_edns(HEdns::new());
        let d = decode(&m.to_vec().unwrap()).unwrap();
        assert_eq!(
            d.summary_line(),
            "12345 q: A? www.lab.test. NOERROR 1/0/1 A 10.250.0.80"
        );
    }

    #[test]
    fn extended_rcode_badvers() {
        let mut m = Message::new(7, MessageType::Response, OpCode::Query);
        m.metadata.response_code = ResponseCode::BADVERS;
        m.add_query(Query::query(name("x.test."), RecordType::AAAA));
        m.set_edns(HEdns::new());
        let bytes = m.to_vec().unwrap();
        // Header carries only the low 4 bits (0); the rest is in the OPT TTL.
        assert_eq!(bytes[3] & 0x0f, 0);
        let d = decode(&bytes).unwrap();
        assert_eq!(d.rcode, "BADVERS");
        assert_eq!(d.summary_line(), "7- q: AAAA? x.test. BADVERS 0/0/1");
    }

    #[test]
    fn ipv4_formatting() {
        for ip in [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [10, 9, 100, 199],
            [1, 20, 0, 250],
        ] {
            let mut s = String::new();
            push_ipv4(&mut s, ip);
            assert_eq!(s, Ipv4Addr::from(ip).to_string());
        }
    }

    #[test]
    fn rcode_names_and_fallback() {
        assert_eq!(rcode_name(3), "NXDOMAIN");
        assert_eq!(rcode_name(2), "SERVFAIL");
        assert_eq!(rcode_name(23), "BADCOOKIE");
        assert_eq!(rcode_name(24), "RCODE24");
        assert_eq!(rcode_name(4095), "RCODE4095");
        assert_eq!(opcode_name(3), "OPCODE3");
        assert_eq!(type_name(65280), "TYPE65280");
        assert_eq!(type_name(65), "HTTPS");
        assert_eq!(class_name(3), "CH");
        assert_eq!(class_name(42), "CLASS42");
        assert_eq!(edns_option_name(65001), "OPT65001");
    }

    /// Builds `header` + raw body by hand.
    fn raw(id: u16, flags: u16, counts: [u16; 4], body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        for c in counts {
            v.extend_from_slice(&c.to_be_bytes());
        }
        v.extend_from_slice(body);
        v
    }

    fn reason(e: DnsError) -> String {
        match e {
            DnsError::Malformed { reason, .. } => reason,
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn nxdomain_with_unknown_type_and_class() {
        // q: TYPE65280 CLASS42? a. ; authority: a. 3 TYPE65280 ... rdata 0xbeef
        let mut body = vec![1, b'a', 0, 0xff, 0x00, 0, 42];
        body.extend_from_slice(&[0xc0, 12, 0xff, 0x00, 0, 1, 0, 0, 0, 3, 0, 2, 0xbe, 0xef]);
        let d = decode(&raw(9, 0x8183, [1, 0, 1, 0], &body)).unwrap();
        assert_eq!(d.rcode, "NXDOMAIN");
        assert_eq!(d.questions[0].qtype, "TYPE65280");
        assert_eq!(d.questions[0].class, "CLASS42");
        assert_eq!(d.authority[0].data, "\\# 2 beef");
        assert_eq!(
            d.summary_line(),
            "9 q: TYPE65280 CLASS42? a. NXDOMAIN 0/1/0"
        );
    }

    #[test]
    fn hostile_too_short_header() {
        assert_eq!(decode(&[]), Err(DnsError::TooShort(0)));
        assert_eq!(decode(&[0; 11]), Err(DnsError::TooShort(11)));
    }

    #[test]
    fn hostile_huge_counts() {
        let e = decode(&raw(1, 0, [65535, 65535, 65535, 65535], &[])).unwrap_err();
        assert!(
            matches!(e, DnsError::CountsExceedMessage { have: 0, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("qd 65535"));
        // Plausible counts but not enough bytes for even minimal records.
        let e = decode(&raw(1, 0, [0, 3, 0, 0], &[0; 20])).unwrap_err();
        assert!(matches!(
            e,
            DnsError::CountsExceedMessage {
                need: 33,
                have: 20,
                ..
            }
        ));
    }

    #[test]
    fn hostile_pointer_to_itself() {
        // Question name is a pointer to offset 12: itself.
        let e = decode(&raw(1, 0, [1, 0, 0, 0], &[0xc0, 12, 0, 1, 0, 1])).unwrap_err();
        let r = reason(e.clone());
        assert!(r.contains("pointer loop"), "{r}");
        assert!(e.to_string().starts_with("question #0:"), "{e}");
    }

    #[test]
    fn hostile_pointer_loop_between_names() {
        // Name A at 12: label "a" then pointer to 17; name B at 17: pointer back to 12.
        // A→B is a forward pointer; even if allowed, B→A would loop.
        let body = [1, b'a', 0xc0, 17, 0, 0xc0, 12, 0, 1, 0, 1];
        let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
        assert!(r.contains("compression pointer"), "{r}");
        // Backward pointer into the middle of a name that then points forward to itself.
        let body = [
            1, b'a', 0xc0, 14, // q0 name at 12: "a" + ptr→14 (its own pointer bytes)
            0, 1, 0, 1,
        ];
        let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
        assert!(r.contains("pointer"), "{r}");
    }

    #[test]
    fn hostile_pointer_out_of_range() {
        let body = [0xff, 0xff, 0, 1, 0, 1];
        let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
        assert!(r.contains("targets offset 16383"), "{r}");
    }

    #[test]
    fn hostile_pointer_chain_in_rdata() {
        // Valid question, answer CNAME whose target points forward (past the message).
        let mut body = vec![1, b'a', 0, 0, 5, 0, 1];
        body.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 1, 0, 2, 0xc0, 0x40]);
        let e = decode(&raw(1, 0x8180, [1, 1, 0, 0], &body)).unwrap_err();
        assert!(matches!(
            e,
            DnsError::Malformed {
                section: Section::Answer,
                index: 0,
                ..
            }
        ));
        assert!(e.to_string().contains("CNAME rdata"), "{e}");
    }

    #[test]
    fn hostile_label_too_long() {
        // 0x40 = 64: the top bits 01 are a reserved label type, not a length.
        let mut body = vec![0x40];
        body.extend_from_slice(&[b'x'; 64]);
        body.extend_from_slice(&[0, 0, 1, 0, 1]);
        let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
        assert!(r.contains("0x40"), "{r}");
    }

    #[test]
    fn hostile_name_too_long() {
        // 5 labels of 63 bytes = 320 bytes > 255.
        let mut body = Vec::new();
        for _ in 0..5 {
            body.push(63);
            body.extend_from_slice(&[b'z'; 63]);
        }
        body.extend_from_slice(&[0, 0, 1, 0, 1]);
        let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
        assert!(r.contains("255"), "{r}");
    }

    #[test]
    fn hostile_truncated_messages() {
        let full = query_with_edns();
        assert!(decode(&full).is_ok());
        for cut in 12..full.len() {
            assert!(decode(&full[..cut]).is_err(), "cut at {cut} decoded");
        }
        // Name without its terminating root label.
        let r =
            reason(decode(&raw(1, 0, [1, 0, 0, 0], &[3, b'a', b'b', b'c', 3, b'd'])).unwrap_err());
        assert!(r.contains("ends in the middle"), "{r}");
    }

    #[test]
    fn hostile_rdlength_past_end() {
        let body = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 1, 2];
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
        assert!(e.to_string().contains("rdata length 65535"), "{e}");
    }

    #[test]
    fn hostile_rdata_misframed() {
        // A record with 5 bytes of rdata.
        let body = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 5, 1, 2, 3, 4, 5];
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
        assert!(e.to_string().contains("A rdata is 5 bytes"), "{e}");
        // NS whose name ends before the rdata does (trailing junk inside rdlength).
        let body = [0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 3, 0, 0xaa, 0xbb];
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
        assert!(e.to_string().contains("NS fields end"), "{e}");
        // TXT string longer than the rdata.
        let body = [0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 2, 9, b'x'];
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
        assert!(e.to_string().contains("TXT string declares 9"), "{e}");
    }

    #[test]
    fn hostile_opt_placement_and_options() {
        let opt = |rdata: &[u8]| {
            let mut v = vec![0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0];
            v.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            v.extend_from_slice(rdata);
            v
        };
        // OPT in the answer section.
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &opt(&[]))).unwrap_err();
        assert!(e.to_string().contains("outside the additional"), "{e}");
        // Two OPTs.
        let mut two = opt(&[]);
        two.extend_from_slice(&opt(&[]));
        let e = decode(&raw(1, 0x8000, [0, 0, 0, 2], &two)).unwrap_err();
        assert!(e.to_string().contains("second OPT"), "{e}");
        // Option length beyond the OPT rdata.
        let e = decode(&raw(1, 0, [0, 0, 0, 1], &opt(&[0, 10, 0, 50, 1, 2]))).unwrap_err();
        assert!(e.to_string().contains("EDNS option 10 declares 50"), "{e}");
        // Option header cut.
        let e = decode(&raw(1, 0, [0, 0, 0, 1], &opt(&[0, 10, 0]))).unwrap_err();
        assert!(e.to_string().contains("needs 4 bytes"), "{e}");
        // Non-root owner.
        let mut named = vec![1, b'x'];
        named.extend_from_slice(&opt(&[])[..]);
        let e = decode(&raw(1, 0, [0, 0, 0, 1], &named)).unwrap_err();
        assert!(e.to_string().contains("not the root"), "{e}");
    }

    #[test]
    fn edns_raw_fields_and_odd_options() {
        // UDP size 100 (hickory would clamp to 512), version 1, ext rcode 1 (BADCOOKIE with
        // low 7), DO clear, ECS with unknown family 9 shown as hex, NSID, unknown option.
        let rdata = [
            0, 8, 0, 5, 0, 9, 32, 0, 1, // ECS family 9
            0, 3, 0, 2, b'n', b's', // NSID
            0xfd, 0xe9, 0, 0, // OPT65001, empty
            0, 8, 0, 6, 0, 2, 56, 0, 0x20, 0x01, // ECS v6 2001::/56 (address shortened)
        ];
        let mut body = vec![0, 0, 41, 0, 100, 1, 1, 0, 0];
        body.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        body.extend_from_slice(&rdata);
        let d = decode(&raw(3, 0x8007, [0, 0, 0, 1], &body)).unwrap();
        assert_eq!(d.rcode, "BADCOOKIE");
        let e = d.edns.unwrap();
        assert_eq!((e.udp_size, e.version, e.dnssec_ok), (100, 1, false));
        let opts: Vec<(&str, &str)> = e
            .options
            .iter()
            .map(|o| (o.name.as_str(), o.data.as_str()))
            .collect();
        assert_eq!(
            opts,
            vec![
                ("ECS", "0009200001"),
                ("NSID", "6e73"),
                ("OPT65001", ""),
                ("ECS", "2001::/56/0"),
            ]
        );
    }

    #[test]
    fn escaped_names() {
        // Label with a dot, a space and a 0xff byte.
        let body = [4, b'a', b'.', b' ', 0xff, 0, 0, 16, 0, 3];
        let d = decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap();
        assert_eq!(d.questions[0].name, "a\\.\\032\\255.");
        assert_eq!(d.questions[0].class, "CH");
        assert_eq!(d.summary_line(), "1 TXT CH? a\\.\\032\\255.");
        // DNS 0x20 mixed case survives.
        let body = [3, b'W', b'w', b'W', 3, b'L', b'a', b'B', 0, 0, 1, 0, 1];
        let d = decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap();
        assert_eq!(d.questions[0].name, "WwW.LaB.");
        // Root.
        let d = decode(&raw(1, 0x0100, [1, 0, 0, 0], &[0, 0, 2, 0, 1])).unwrap();
        assert_eq!(d.summary_line(), "1+ NS? .");
    }

    #[test]
    fn empty_rdata_tolerated() {
        // RFC 2136 prerequisite "name is in use": ANY class, empty rdata, UPDATE opcode.
        let body = [
            0, 0, 6, 0, 1, /* rr */ 0, 0, 1, 0, 255, 0, 0, 0, 0, 0, 0,
        ];
        let d = decode(&raw(5, 0x2800, [1, 1, 0, 0], &body)).unwrap();
        assert_eq!(d.opcode, "UPDATE");
        assert_eq!(d.answers[0].class, "ANY");
        assert_eq!(d.answers[0].data, "");
        assert!(d.summary_line().starts_with("5 [UPDATE]"));
    }

    #[test]
    fn garbage_never_panics() {
        let seeds = [query_with_edns(), {
            let mut m = Message::new(1, MessageType::Response, OpCode::Query);
            m.add_query(Query::query(name("a.b.c."), RecordType::SRV));
            m.add_answer(rr(
                "a.b.c.",
                1,
                RData::SRV(SRV::new(1, 2, 3, name("t.b.c."))),
            ));
            m.add_answer(rr("a.b.c.", 1, RData::TXT(TXT::new(vec!["x".into()]))));
            m.to_vec().unwrap()
        }];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let r = next();
            let mut msg = seeds[(r & 1) as usize].clone();
            for _ in 0..1 + (r >> 8) % 4 {
                let r = next();
                let i = (r as usize) % msg.len();
                msg[i] = (r >> 32) as u8;
            }
            if let Ok(m) = decode(&msg) {
                let _ = m.summary_line();
            }
            let cut = (next() as usize) % (msg.len() + 1);
            if let Ok(Some(m)) = decode_cut(&msg[..cut], msg.len()) {
                let _ = m.summary_line();
            }
        }
    }

    /// Where each entry of a well-formed message ends, walked independently of the decoder:
    /// (section, end offset, is OPT).
    fn entry_ends(msg: &[u8]) -> Vec<(Section, usize, bool)> {
        let count = |i: usize| usize::from(u16::from_be_bytes([msg[i], msg[i + 1]]));
        let skip_name = |mut at: usize| loop {
            let len = msg[at];
            if len & 0xc0 == 0xc0 {
                return at + 2;
            }
            at += 1 + usize::from(len);
            if len == 0 {
                return at;
            }
        };
        let mut at = HEADER_LEN;
        let mut ends = Vec::new();
        for _ in 0..count(4) {
            at = skip_name(at) + 4;
            ends.push((Section::Question, at, false));
        }
        for (section, n) in [
            (Section::Answer, count(6)),
            (Section::Authority, count(8)),
            (Section::Additional, count(10)),
        ] {
            for _ in 0..n {
                let fixed = skip_name(at);
                let rtype = u16::from_be_bytes([msg[fixed], msg[fixed + 1]]);
                let rdlen = usize::from(u16::from_be_bytes([msg[fixed + 8], msg[fixed + 9]]));
                at = fixed + 10 + rdlen;
                ends.push((section, at, rtype == TYPE_OPT));
            }
        }
        assert_eq!(at, msg.len());
        ends
    }

    /// A response cut at every byte offset: never a panic, never an error; below 12 bytes
    /// no message; otherwise the header, every entry that fits whole (and only those), and
    /// the right number of entries counted as cut in each section.
    #[test]
    fn cut_at_every_offset_decodes_what_fits() {
        let full = common_response();
        let whole = decode(&full).unwrap();
        let ends = entry_ends(&full);
        assert_eq!(ends.len(), 1 + 7 + 1 + 2);
        for n in 0..full.len() {
            let got = decode_cut(&full[..n], full.len());
            let m = match got {
                Ok(Some(m)) => m,
                Ok(None) => {
                    assert!(n < HEADER_LEN, "no message at {n} bytes");
                    continue;
                }
                Err(e) => panic!("cut at {n}: {e}"),
            };
            assert!(n >= HEADER_LEN);
            assert_eq!(
                (m.id, m.qr, m.flags),
                (whole.id, whole.qr, whole.flags),
                "at {n}"
            );
            assert_eq!(m.rcode, whole.rcode);
            let fits = |s: Section| {
                ends.iter()
                    .filter(|(sec, end, _)| *sec == s && *end <= n)
                    .count()
            };
            let total = |s: Section| ends.iter().filter(|(sec, ..)| *sec == s).count();
            let opt_fits = ends.iter().any(|(_, end, opt)| *opt && *end <= n);
            assert_eq!(m.questions[..], whole.questions[..fits(Section::Question)]);
            assert_eq!(
                m.answers[..],
                whole.answers[..fits(Section::Answer)],
                "at {n}"
            );
            assert_eq!(m.authority[..], whole.authority[..fits(Section::Authority)]);
            let additional = fits(Section::Additional) - usize::from(opt_fits);
            assert_eq!(m.additional[..], whole.additional[..additional], "at {n}");
            assert_eq!(m.edns.is_some(), opt_fits, "at {n}");
            let cut = m.cut.unwrap_or_else(|| panic!("cut at {n} not marked"));
            let left = |s: Section| (total(s) - fits(s)) as u16;
            assert_eq!(
                cut,
                Cut {
                    captured_bytes: n,
                    message_bytes: full.len(),
                    questions: left(Section::Question),
                    answers: left(Section::Answer),
                    authority: left(Section::Authority),
                    additional: left(Section::Additional),
                },
                "at {n}"
            );
            // The summary gives the header's counts and says what was cut.
            let line = m.summary_line();
            assert!(
                line.contains(" NOERROR 7/1/2") || fits(Section::Question) == 0,
                "{line}"
            );
            assert!(
                line.contains(&format!("[|cut by the capture at {n} of {}", full.len())),
                "{line}"
            );
            // Without the capture's word that bytes are missing, it is malformed.
            assert!(decode(&full[..n]).is_err(), "short message at {n} decoded");
        }
        // The whole message is not cut.
        assert_eq!(decode_cut(&full, full.len()), Ok(Some(whole)));
    }

    #[test]
    fn cut_note_and_summary() {
        let full = common_response();
        let ends = entry_ends(&full);
        // After the question and the first two answers.
        let n = ends[2].1 + 5;
        let m = decode_cut(&full[..n], full.len()).unwrap().unwrap();
        assert_eq!(m.answers.len(), 2);
        let c = m.cut.unwrap();
        assert_eq!(
            (c.answers, c.authority, c.additional, c.entries()),
            (5, 1, 2, 8)
        );
        assert_eq!(
            m.summary_line(),
            format!(
                "4242* q: A? www.lab.test. NOERROR 7/1/2 CNAME web.lab.test., A 10.250.0.80 \
                 [|cut by the capture at {n} of {} bytes: 5 answers, 1 authority, 2 additional \
                 not decoded]",
                full.len()
            )
        );
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["cut"]["answers"], 5);
        assert_eq!(json["cut"]["captured_bytes"], n);
        // A whole message has no `cut` field at all.
        let whole = serde_json::to_value(decode(&full).unwrap()).unwrap();
        assert!(whole.get("cut").is_none());
        // Cut inside the question: header only.
        let m = decode_cut(&full[..20], full.len()).unwrap().unwrap();
        assert!(m.questions.is_empty() && m.answers.is_empty());
        assert_eq!(m.cut.unwrap().questions, 1);
        assert!(
            m.summary_line().contains("1 question, 7 answers"),
            "{}",
            m.summary_line()
        );
    }

    /// A cut capture does not excuse what is wrong in the bytes it holds.
    #[test]
    fn cut_message_wrong_in_itself_stays_malformed() {
        // Question name pointing at itself, then the capture ends.
        let msg = raw(1, 0x8180, [1, 1, 0, 0], &[0xc0, 12, 0, 1, 0, 1, 0xc0]);
        let e = decode_cut(&msg, 200).unwrap_err();
        assert!(e.to_string().contains("pointer loop"), "{e}");
        // A whole A record of 5 bytes before the cut.
        let mut body = vec![0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 5, 1, 2, 3, 4, 5];
        body.extend_from_slice(&[0, 0, 1]);
        let e = decode_cut(&raw(1, 0x8000, [0, 2, 0, 0], &body), 100).unwrap_err();
        assert!(e.to_string().contains("A rdata is 5 bytes"), "{e}");
        // A record whose rdata runs past the bytes of a message that was not cut.
        let body = [0, 0, 16, 0, 1, 0, 0, 0, 0, 2, 0x58, 5, b'h', b'e'];
        let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
        assert!(e.to_string().contains("rdata length 600 runs past"), "{e}");
        // The same bytes as the start of a cut 700-byte message: the header, no answer.
        let m = decode_cut(&raw(1, 0x8000, [0, 1, 0, 0], &body), 700)
            .unwrap()
            .unwrap();
        assert!(m.answers.is_empty());
        assert_eq!(m.cut.unwrap().answers, 1);
    }

    /// Counts a cut header claims cost nothing: no allocation by count, no error.
    #[test]
    fn hostile_counts_in_a_cut_message() {
        let msg = raw(1, 0x8000, [65535, 65535, 65535, 65535], &[0, 0, 1]);
        let m = decode_cut(&msg, 9000).unwrap().unwrap();
        assert!(m.questions.is_empty());
        let c = m.cut.unwrap();
        assert_eq!(
            (c.questions, c.answers, c.authority, c.additional),
            (65535, 65535, 65535, 65535)
        );
        assert_eq!(decode_cut(&msg[..11], 9000), Ok(None));
    }
}
