//! SVCB and HTTPS record data in RFC 9460's presentation format (§2.1, Appendix A):
//! `1 . alpn="h3,h2" ipv4hint=192.0.2.1,192.0.2.2 port=443`: SvcParams separated by single
//! spaces, lists comma-separated, values quoted where they hold characters a zone file
//! would split on, escapes (`\,` inside list items, `\DDD` for bytes that are not printable)
//! as Appendix A says. Unknown keys are `keyNNNNN=…`; a value a known key cannot have
//! (a port of three bytes) makes the whole record generic (RFC 3597), as a parser would
//! refuse it.
use std::{fmt::Write as _, net::Ipv6Addr};

use super::{
    names::{push_decimal_escape, push_ipv4, push_u32, NameReader},
    reader::RdataReader,
};

/// The key's registered name (RFC 9460 §14.3.2, the ECH draft for `ech`), or `keyNNNNN`.
fn push_key(s: &mut String, key: u16) {
    match key {
        0 => s.push_str("mandatory"),
        1 => s.push_str("alpn"),
        2 => s.push_str("no-default-alpn"),
        3 => s.push_str("port"),
        4 => s.push_str("ipv4hint"),
        5 => s.push_str("ech"),
        6 => s.push_str("ipv6hint"),
        _ => {
            s.push_str("key");
            push_u32(s, key.into());
        }
    }
}

/// A value as a `<character-string>` (RFC 1035 §5.1, RFC 9460 Appendix A): printable
/// ASCII as it is (`"` and `\` escaped), other bytes `\DDD`; quoted when it holds a space,
/// a comma or a zone-file delimiter, or is empty.
fn push_char_string(s: &mut String, v: &[u8]) {
    let quote = v.is_empty()
        || v.iter()
            .any(|b| matches!(b, b' ' | b',' | b';' | b'(' | b')' | b'"'));
    if quote {
        s.push('"');
    }
    for &b in v {
        match b {
            b'"' | b'\\' => {
                s.push('\\');
                s.push(char::from(b));
            }
            0x21..=0x7e => s.push(char::from(b)),
            b' ' if quote => s.push(' '),
            _ => push_decimal_escape(s, b),
        }
    }
    if quote {
        s.push('"');
    }
}

/// The `alpn` value: its alpn-ids as a comma-separated list (Appendix A.1: `,` and `\`
/// inside an item escaped with `\`), then as a character-string.
fn push_alpn(s: &mut String, v: &[u8]) -> Option<()> {
    let mut list = Vec::with_capacity(v.len() + 4);
    let mut rest = v;
    while let Some((&len, tail)) = rest.split_first() {
        let id = tail.get(..usize::from(len))?;
        // An alpn-id is at least one byte (RFC 9460 §7.1.1).
        if id.is_empty() {
            return None;
        }
        if !list.is_empty() {
            list.push(b',');
        }
        for &b in id {
            if matches!(b, b',' | b'\\') {
                list.push(b'\\');
            }
            list.push(b);
        }
        rest = tail.get(usize::from(len)..).unwrap_or_default();
    }
    if list.is_empty() {
        return None;
    }
    push_char_string(s, &list);
    Some(())
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// RFC 4648 §4 base64, padded.
fn push_base64(s: &mut String, v: &[u8]) {
    let digit = |n: u32| char::from(BASE64[(n & 63) as usize]);
    for chunk in v.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        s.push(digit(n >> 18));
        s.push(digit(n >> 12));
        s.push(if chunk.len() > 1 { digit(n >> 6) } else { '=' });
        s.push(if chunk.len() > 2 { digit(n) } else { '=' });
    }
}

/// One SvcParam's value in presentation form, or `None` if the key cannot have it.
fn push_value(s: &mut String, key: u16, v: &[u8]) -> Option<()> {
    match key {
        // mandatory: keys, 2 bytes each, at least one.
        0 => {
            if v.is_empty() || !v.len().is_multiple_of(2) {
                return None;
            }
            s.push('=');
            for (i, k) in v.chunks_exact(2).enumerate() {
                if i > 0 {
                    s.push(',');
                }
                push_key(s, u16::from_be_bytes([k[0], k[1]]));
            }
        }
        1 => {
            s.push('=');
            push_alpn(s, v)?;
        }
        // no-default-alpn: no value.
        2 => {
            if !v.is_empty() {
                return None;
            }
        }
        3 => {
            let port: [u8; 2] = v.try_into().ok()?;
            s.push('=');
            push_u32(s, u16::from_be_bytes(port).into());
        }
        4 => {
            if v.is_empty() || !v.len().is_multiple_of(4) {
                return None;
            }
            s.push('=');
            for (i, a) in v.chunks_exact(4).enumerate() {
                if i > 0 {
                    s.push(',');
                }
                push_ipv4(s, [a[0], a[1], a[2], a[3]]);
            }
        }
        5 => {
            if v.is_empty() {
                return None;
            }
            s.push('=');
            push_base64(s, v);
        }
        6 => {
            if v.is_empty() || !v.len().is_multiple_of(16) {
                return None;
            }
            s.push('=');
            for (i, a) in v.chunks_exact(16).enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let octets: [u8; 16] = a.try_into().ok()?;
                let _ = write!(s, "{}", Ipv6Addr::from(octets));
            }
        }
        // An unknown key with an empty value is the key alone (§2.1).
        _ if v.is_empty() => {}
        _ => {
            s.push('=');
            push_char_string(s, v);
        }
    }
    Some(())
}

/// SVCB (64) / HTTPS (65) rdata at `start` (`len` bytes) of the message: `Ok(None)` when a
/// SvcParam is not what its key allows (shown generically by the caller).
pub(super) fn svcb_summary(
    names: &mut NameReader<'_>,
    start: usize,
    rdata: &[u8],
    rtype: u16,
) -> Result<Option<String>, String> {
    let mut rd = RdataReader::new(names.msg(), start, rdata.len(), rtype)?;
    let mut s = String::with_capacity(64);
    push_u32(&mut s, rd.u16()?.into());
    s.push(' ');
    s.push_str(rd.name(names)?);
    let params = rdata.get(rd.offset_in(start)..).unwrap_or_default();
    let mut rest = params;
    let mut last: Option<u16> = None;
    while !rest.is_empty() {
        let (Some(&[k0, k1, l0, l1]), Some(tail)) = (rest.first_chunk::<4>(), rest.get(4..)) else {
            return Ok(None);
        };
        let (key, len) = (
            u16::from_be_bytes([k0, k1]),
            usize::from(u16::from_be_bytes([l0, l1])),
        );
        // Keys in strictly increasing order (§2.2), values inside the rdata.
        let Some(value) = tail.get(..len) else {
            return Ok(None);
        };
        if last.is_some_and(|l| key <= l) {
            return Ok(None);
        }
        last = Some(key);
        s.push(' ');
        push_key(&mut s, key);
        if push_value(&mut s, key, value).is_none() {
            return Ok(None);
        }
        rest = tail.get(len..).unwrap_or_default();
    }
    Ok(Some(s))
}

#[cfg(test)]
#[path = "svcb_tests.rs"]
mod tests;
