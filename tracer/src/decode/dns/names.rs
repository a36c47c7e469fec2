//! Names, text and codes in presentation form, escaped the way `dig` does (RFC 1035 §5.1).
use std::fmt::Write as _;

use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, DecodeError, Restrict};

use super::*;

pub(super) fn name_to_string(name: &Name) -> String {
    let mut s = String::with_capacity(name.len().saturating_add(2));
    push_name(&mut s, name);
    s
}

/// RFC 1035 §5.1 presentation form: `\X` for special characters, `\DDD` (decimal) for
/// non-printable bytes. Names read from the wire are always absolute, so each label ends in '.'.
///
/// The reference form of what [`NameReader`] writes (it is used where speed does not matter).
pub(super) fn push_name(s: &mut String, name: &Name) {
    let mut labels = name.iter().peekable();
    if labels.peek().is_none() {
        s.push('.');
        return;
    }
    for label in labels {
        for &b in label {
            match LABEL_ESCAPE[usize::from(b)] {
                PLAIN => s.push(char::from(b)),
                BACKSLASH => {
                    s.push('\\');
                    s.push(char::from(b));
                }
                _ => push_decimal_escape(s, b),
            }
        }
        s.push('.');
    }
}

/// How a byte of a label is written: as itself, after a backslash, or as `\DDD`.
const PLAIN: u8 = 0;
const BACKSLASH: u8 = 1;
const DECIMAL: u8 = 2;
const LABEL_ESCAPE: [u8; 256] = {
    let mut t = [DECIMAL; 256];
    let mut b = 0x21;
    while b <= 0x7e {
        t[b] = match b as u8 {
            b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$' => BACKSLASH,
            _ => PLAIN,
        };
        b += 1;
    }
    t
};

/// Room for the text of the names read so far in one message: at least one name at worst,
/// whose `len()` is at most 255 and whose text is at most 4 characters (`\DDD`) per byte.
const TEXT_ROOM: usize = 4 * Name::MAX_LENGTH + 4;
/// Label starts remembered for [`NameReader`]'s compression-pointer shortcut.
const ENTRIES: usize = 32;

/// A label boundary in the uncompressed part of a name read earlier: the wire offset where
/// the rest of that name starts, and its presentation text.
#[derive(Clone, Copy, Default)]
struct Entry {
    /// Wire offset of the label's length byte.
    wire: u32,
    /// End of the name's uncompressed part on the wire (after its root byte or pointer).
    seg_end: u32,
    text_start: u32,
    text_end: u32,
}

/// Reads the names of one message with hickory's `Name::read` and gives their presentation
/// text (as [`push_name`] writes it), writing it once into one buffer instead of a `String`
/// per label check.
///
/// Shortcut: a name that is nothing but a compression pointer (the usual owner name of an
/// answer, `0xc00c`) to a label boundary in the uncompressed part of a name already read
/// successfully, ending before the pointer, is not read again. hickory would read exactly
/// that earlier name's labels from that boundary on, under checks the earlier read already
/// passed: the pointer targets an earlier offset, every label byte of the uncompressed part
/// lies before the pointer, pointers later in the chain were checked against a start no later
/// than this one, and a suffix of a name is no longer than the name. So the shortcut
/// reaches the same verdict and the same text; anything else goes to `Name::read`.
pub(super) struct NameReader<'m> {
    msg: &'m [u8],
    text: [u8; TEXT_ROOM],
    text_len: usize,
    entries: [Entry; ENTRIES],
    entries_len: usize,
    /// Text of a name that did not fit `text` (cannot happen; kept so nothing can panic).
    spill: String,
    /// Off in tests comparing the shortcut with `Name::read`.
    pub(super) shortcut: bool,
    /// Names the shortcut gave.
    #[cfg(test)]
    pub(super) hits: usize,
}

impl<'m> NameReader<'m> {
    /// `msg`: the whole message (or what was captured of it) that decoders read names from.
    pub(super) fn new(msg: &'m [u8]) -> Self {
        NameReader {
            msg,
            text: [0; TEXT_ROOM],
            text_len: 0,
            entries: [Entry::default(); ENTRIES],
            entries_len: 0,
            spill: String::new(),
            shortcut: true,
            #[cfg(test)]
            hits: 0,
        }
    }

    pub(super) fn msg(&self) -> &'m [u8] {
        self.msg
    }

    /// Reads the name at `dec`'s position (`dec` reads `msg`) and returns its text.
    pub(super) fn read(&mut self, dec: &mut BinDecoder<'_>) -> Result<&str, DecodeError> {
        let at = dec.index();
        if self.shortcut && dec.peek().map(Restrict::unverified) == Some(0) {
            // The root (the OPT record's owner): `Name::read` takes the zero byte and
            // checks nothing else.
            dec.read_u8()?;
            return Ok(".");
        }
        if let Some(e) = self.pointer_to_known(at) {
            dec.read_slice(2)?;
            #[cfg(test)]
            {
                self.hits += 1;
            }
            return Ok(self.str_at(e.text_start as usize, e.text_end as usize));
        }
        let name = Name::read(dec)?;
        let consumed = dec.index().saturating_sub(at);
        Ok(self.write(&name, at, consumed))
    }

    /// The entry a name at `at` made of one pointer leads to, if it is known.
    fn pointer_to_known(&self, at: usize) -> Option<Entry> {
        if !self.shortcut || self.entries_len == 0 {
            return None;
        }
        let &[hi, lo] = self.msg.get(at..)?.first_chunk::<2>()?;
        if hi & 0xc0 != 0xc0 {
            return None;
        }
        let target = u32::from(u16::from_be_bytes([hi & 0x3f, lo]));
        let at = u32::try_from(at).ok()?;
        self.entries
            .get(..self.entries_len)?
            .iter()
            .find(|e| e.wire == target && e.seg_end <= at)
            .copied()
    }

    /// Writes `name`'s text, read from `at` over `consumed` wire bytes, and remembers the
    /// label boundaries of its uncompressed part.
    fn write(&mut self, name: &Name, at: usize, consumed: usize) -> &str {
        // `len()` counts label bytes and dots; a byte becomes at most 4 characters.
        if TEXT_ROOM - self.text_len.min(TEXT_ROOM) < name.len().saturating_mul(4) {
            // Forget the names read so far; a message with this much name text is rare.
            self.text_len = 0;
            self.entries_len = 0;
        }
        // Wire bytes of the labels (length bytes included): `len()` counts a dot per label.
        let labels_len = if name.is_root() { 0 } else { name.len() };
        // The uncompressed part: every label when the name ends in its root byte here,
        // otherwise those before the 2-byte pointer.
        let uncompressed = if consumed == labels_len + 1 {
            labels_len
        } else {
            consumed.saturating_sub(2)
        };
        let seg_end = u32::try_from(at.saturating_add(consumed)).unwrap_or(u32::MAX);
        let start = self.text_len;
        let first_entry = self.entries_len;
        let mut w = Writer {
            buf: &mut self.text,
            len: start,
            overflow: false,
        };
        let mut wire = at;
        let mut label_count = 0usize;
        for label in name.iter() {
            label_count += 1;
            let next = wire + 1 + label.len();
            // Pointers reach offsets up to 0x3fff only.
            if next <= at + uncompressed && wire <= 0x3fff && self.entries_len < ENTRIES {
                if let Some(e) = self.entries.get_mut(self.entries_len) {
                    *e = Entry {
                        wire: wire as u32,
                        seg_end,
                        text_start: w.len as u32,
                        text_end: 0,
                    };
                    self.entries_len += 1;
                }
            }
            wire = next;
            if label.iter().all(|&b| LABEL_ESCAPE[usize::from(b)] == PLAIN) {
                w.put(label);
            } else {
                for &b in label {
                    match LABEL_ESCAPE[usize::from(b)] {
                        PLAIN => w.put(&[b]),
                        BACKSLASH => w.put(&[b'\\', b]),
                        _ => w.put(&[b'\\', b'0' + b / 100, b'0' + b / 10 % 10, b'0' + b % 10]),
                    }
                }
            }
            w.put(b".");
        }
        if label_count == 0 {
            w.put(b".");
        }
        let (end, overflow) = (w.len, w.overflow);
        if overflow {
            self.entries_len = first_entry;
            self.spill = name_to_string(name);
            return &self.spill;
        }
        self.text_len = end;
        for e in self
            .entries
            .iter_mut()
            .take(self.entries_len)
            .skip(first_entry)
        {
            e.text_end = end as u32;
        }
        self.str_at(start, end)
    }

    fn str_at(&self, start: usize, end: usize) -> &str {
        // Only ASCII is ever written, so this cannot fail.
        self.text
            .get(start..end)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
    }
}

/// Appends to a fixed buffer; `overflow` instead of a panic when it is full.
struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
    overflow: bool,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflow = true,
        }
    }
}

/// Kept out of line: inlined into `rdata_summary` (as it came to be when that module
/// changed) its byte loop took 17% more instructions (callgrind, golden `fragments`).
#[inline(never)]
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

/// `u32`'s Display without the formatting machinery.
pub(super) fn push_u32(s: &mut String, v: u32) {
    let mut started = false;
    let mut power = 1_000_000_000;
    while power > 0 {
        let digit = (v / power % 10) as u8;
        if digit != 0 || started || power == 1 {
            s.push(char::from(b'0' + digit));
            started = true;
        }
        power /= 10;
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

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

pub(super) fn push_hex(s: &mut String, data: &[u8]) {
    for &b in data {
        s.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
        s.push(char::from(HEX_DIGITS[usize::from(b & 0x0f)]));
    }
}

pub(super) fn type_name(code: u16) -> Text {
    match known_type_name(code) {
        Some(name) => name.into(),
        None => format!("TYPE{code}").into(),
    }
}

/// The mnemonic of a type that has one; `TYPE<code>` is written for the others.
pub(super) fn known_type_name(code: u16) -> Option<&'static str> {
    match RecordType::from(code) {
        RecordType::Unknown(_) | RecordType::ZERO => match code {
            17 => Some("RP"),
            29 => Some("LOC"),
            99 => Some("SPF"),
            249 => Some("TKEY"),
            256 => Some("URI"),
            _ => None,
        },
        // hickory gives ANAME the private-use code 65305 (hickory-dns#723); not a real type.
        RecordType::ANAME => None,
        known => Some(<&'static str>::from(known)),
    }
}

pub(super) fn class_name(code: u16) -> Text {
    match code {
        1 => "IN".into(),
        3 => "CH".into(),
        4 => "HS".into(),
        254 => "NONE".into(),
        255 => "ANY".into(),
        _ => format!("CLASS{code}").into(),
    }
}

pub(super) fn opcode_name(code: u8) -> Text {
    match code {
        0 => "QUERY".into(),
        1 => "IQUERY".into(),
        2 => "STATUS".into(),
        4 => "NOTIFY".into(),
        5 => "UPDATE".into(),
        6 => "DSO".into(),
        _ => format!("OPCODE{code}").into(),
    }
}

/// IANA "DNS RCODEs" registry names; 16 is BADVERS because in a header/OPT RCODE it can only
/// mean that (BADSIG lives in TSIG records).
pub(super) fn rcode_name(code: u16) -> Text {
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
        _ => return format!("RCODE{code}").into(),
    };
    name.into()
}

pub(super) fn edns_option_name(code: u16) -> Text {
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
        _ => return format!("OPT{code}").into(),
    };
    name.into()
}
