//! How values read on a terminal, for every text a person reads (the text output, the run's
//! summary, `top`, the detections' own lines): strings not made by dnspath escaped, clock
//! times, counts, places.
use std::{borrow::Cow, fmt::Write};

use crate::{decode::record::PodRef, time::WallTime};

pub use crate::time::format_duration as dur;

/// The text-output form of a string dnspath did not make itself (interface, namespace,
/// process and file names, kernel symbols, anything from the wire or the host): control
/// characters (C0 and C1, DEL: newlines, ESC, ...) and the invisible Unicode characters that
/// reorder or hide text (bidi overrides, zero-width) are shown as `\xHH` / `\u{HHHH}`, so
/// that such a string can neither break a line, forge one nor drive the terminal. A string
/// that was not UTF-8 was already made so lossily (U+FFFD) where it was read. Backslashes are
/// left alone: DNS names come here in their presentation form (`\DDD`), and escaping again
/// must change nothing.
pub fn escape(s: &str) -> Cow<'_, str> {
    fn hidden(c: char) -> bool {
        c.is_control()
            || matches!(c,
                '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}')
    }
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !hidden(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// `HH:MM:SS.micros` from an RFC 3339 time.
pub fn clock(time: &str) -> &str {
    time.get(11..26).unwrap_or(time)
}

/// `HH:MM:SS.micros` of a record's time.
pub fn record_clock(time: WallTime) -> String {
    wall_clock(time.0)
}

/// `HH:MM:SS.micros` of Unix-epoch nanoseconds.
pub fn wall_clock(wall_ns: u64) -> String {
    let t = WallTime(wall_ns).to_string();
    clock(&t).to_string()
}

/// Where something was seen: `namespace/interface`, with a pod's `k8s-namespace/name` in
/// place of its network namespace's name, and after the node-side end of its veth.
pub fn at(netns: &str, ifname: &str, pod: &PodRef) -> String {
    let label = pod
        .pod
        .as_deref()
        .map(|p| escape(p).into_owned())
        .or_else(|| pod.pod_uid.as_deref().map(|u| format!("pod:{}", escape(u))));
    let ifname = if ifname.is_empty() {
        String::new()
    } else {
        format!("/{}", escape(ifname))
    };
    match label {
        Some(l) if pod.pod_veth => format!("{}{ifname}({l})", escape(netns)),
        Some(l) => format!("{l}{ifname}"),
        None => format!("{}{ifname}", escape(netns)),
    }
}

/// `n` with its digits in groups of three (`1,220,254`): a rate or count read at a glance.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}
