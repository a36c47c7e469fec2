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

use hickory_proto::rr::RecordType;
use serde::Serialize;

/// A mnemonic (type, class, opcode, RCODE, EDNS option): almost always a fixed name, so
/// borrowed rather than allocated per message.
pub type Text = std::borrow::Cow<'static, str>;

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
    pub opcode: Text,
    /// Full 12-bit RCODE: header bits plus the EDNS extended bits (RFC 6891 §6.1.3).
    pub rcode: Rcode,
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
    pub qtype: RrType,
    pub class: RrClass,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    #[serde(rename = "type")]
    pub rtype: RrType,
    pub class: RrClass,
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
    pub name: Text,
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
mod message;
mod names;
mod rdata;
mod reader;
mod svcb;
#[cfg(test)]
mod tests;
mod types;

use message::*;
use names::*;
use rdata::*;
pub use types::{Rcode, RrClass, RrType};

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
    s.push_str(&q.qtype.name());
    if q.class != RrClass::IN {
        s.push(' ');
        s.push_str(&q.class.name());
    }
    s.push_str("? ");
    s.push_str(&q.name);
}
