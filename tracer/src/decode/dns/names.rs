//! Names, text and codes in presentation form, escaped the way `dig` does (RFC 1035 §5.1).
use std::fmt::Write as _;

use hickory_proto::rr::Name;

use super::*;

pub(super) fn name_to_string(name: &Name) -> String {
    let mut s = String::with_capacity(name.len().saturating_add(2));
    push_name(&mut s, name);
    s
}

/// RFC 1035 §5.1 presentation form: `\X` for special characters, `\DDD` (decimal) for
/// non-printable bytes. Names read from the wire are always absolute, so each label ends in '.'.
pub(super) fn push_name(s: &mut String, name: &Name) {
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

pub(super) fn is_plain(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$')
}

pub(super) fn push_quoted(s: &mut String, text: &[u8]) {
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
pub(super) fn push_ipv4(s: &mut String, octets: [u8; 4]) {
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

pub(super) fn push_decimal_escape(s: &mut String, b: u8) {
    s.push('\\');
    s.push(char::from(b'0' + b / 100));
    s.push(char::from(b'0' + b / 10 % 10));
    s.push(char::from(b'0' + b % 10));
}

/// RFC 3597 §5 generic rdata.
pub(super) fn push_generic(s: &mut String, rdata: &[u8]) {
    let _ = write!(s, "\\# {} ", rdata.len());
    push_hex(s, rdata);
}

pub(super) fn hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len().saturating_mul(2));
    push_hex(&mut s, data);
    s
}

pub(super) fn push_hex(s: &mut String, data: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in data {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

pub(super) fn type_name(code: u16) -> String {
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

pub(super) fn class_name(code: u16) -> String {
    match code {
        1 => "IN".into(),
        3 => "CH".into(),
        4 => "HS".into(),
        254 => "NONE".into(),
        255 => "ANY".into(),
        _ => format!("CLASS{code}"),
    }
}

pub(super) fn opcode_name(code: u8) -> String {
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
pub(super) fn rcode_name(code: u16) -> String {
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

pub(super) fn edns_option_name(code: u16) -> String {
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
