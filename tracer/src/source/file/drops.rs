//! Kernel drops in a file dnspath wrote (`trace -w`, `--record`): each is the dropped packet
//! on the interface `dnspath/drops`, and its comment says what the live run knew of the drop
//! (docs/output.md, "Evidence"). This module writes the comment's fields that only a drop
//! has and reads a drop's comment back into the drop the live source produced.
//!
//! A drop's comment, after `dnspath at=dnspath/drops` and the notes of its transaction, race
//! or loop:
//!
//! ```text
//! drop=REASON@LOCATION netns=NS ifname=IF pkt=ID cpu=N netns_cookie=0x… ifindex=N
//!   [reason_code=N] [confirm_failed=true|false]
//!   [ct_status=0x… ct_orig=PROTO/SRC>DST ct_reply=PROTO/SRC>DST] [benign=[…]] [dns=[…]]
//! ```
//!
//! Everything from `drop=` up to the first bracketed value is dnspath's own (names of the
//! kernel's reasons and symbols, namespace and interface names with spaces made `_`,
//! numbers, addresses); `dns=[…]` holds what came off the wire and is never read here (the
//! decoder decodes the packet itself). Notes before `drop=` hold no wire strings either;
//! their bracketed values are skipped whole.
use std::{fmt::Write as _, net::SocketAddr};

use crate::event::{CtFlow, CtSnapshot, NamedDrop, Proto};

/// Why a drop's comment could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropCommentError {
    #[error("no comment")]
    NoComment,
    #[error("the comment has no `{0}=` field")]
    Missing(&'static str),
    #[error("`{key}=` is given twice")]
    Duplicate { key: String },
    #[error("`{key}=` has an unreadable value {value:?}")]
    Bad { key: &'static str, value: String },
    #[error("a bracketed value is not closed")]
    Unclosed,
}

/// What a drop's comment says: the live source's drop, less the packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropComment {
    pub named: NamedDrop,
    pub cpu: u32,
    /// Names of the namespace and interface where the kernel dropped it, as the interface
    /// blocks of the same file spell them (`netns/ifname`); `ifname` is empty for a drop
    /// with no device.
    pub netns: String,
    pub ifname: String,
    pub ct: Option<CtSnapshot>,
}

/// The drop-only fields that follow `pkt=` in a drop's comment (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct DropDetails {
    pub cpu: u32,
    pub netns_cookie: u64,
    pub ifindex: u32,
    pub reason_code: Option<u32>,
    pub confirm_failed: Option<bool>,
    pub ct: Option<CtSnapshot>,
}

impl DropDetails {
    /// Appends ` cpu=… netns_cookie=… ifindex=…` and the optional fields to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = write!(
            out,
            " cpu={} netns_cookie={:#x} ifindex={}",
            self.cpu, self.netns_cookie, self.ifindex
        );
        if let Some(code) = self.reason_code {
            let _ = write!(out, " reason_code={code}");
        }
        if let Some(failed) = self.confirm_failed {
            let _ = write!(out, " confirm_failed={failed}");
        }
        if let Some(ct) = &self.ct {
            let _ = write!(out, " ct_status={:#x} ct_orig=", ct.status);
            write_flow(out, &ct.orig);
            out.push_str(" ct_reply=");
            write_flow(out, &ct.reply);
        }
    }
}

/// `PROTO/SRC>DST`, PROTO `udp`, `tcp` or the number (a value never starts with `[`, which
/// opens a bracketed one).
fn write_flow(out: &mut String, f: &CtFlow) {
    let _ = match Proto::from_number(f.proto) {
        Proto::Ip => write!(out, "{}/{}>{}", f.proto, f.src, f.dst),
        p => write!(out, "{p}/{}>{}", f.src, f.dst),
    };
}

/// The fields of one comment, in order: `(key, value)`, bracketed values whole; `None` for
/// a word that is not `key=value`.
fn fields<'a>(
    comment: &'a str,
) -> impl Iterator<Item = Result<Option<(&'a str, &'a str)>, DropCommentError>> + 'a {
    let mut rest = comment;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches(' ');
        if rest.is_empty() {
            return None;
        }
        let word_end = rest.find(' ').unwrap_or(rest.len());
        let Some((key, after)) = rest.get(..word_end).and_then(|w| w.split_once('=')) else {
            rest = rest.get(word_end..).unwrap_or("");
            return Some(Ok(None));
        };
        let key_len = key.len() + 1;
        if after.starts_with('[') {
            // Up to the first `]` that ends a word (notes' brackets hold no `] `).
            let value_start = key_len;
            let tail = rest.get(value_start..).unwrap_or("");
            let end = tail.match_indices(']').map(|(i, _)| i).find(|&i| {
                tail.get(i + 1..)
                    .is_none_or(|t| t.is_empty() || t.starts_with(' '))
            });
            let Some(end) = end else {
                rest = "";
                return Some(Err(DropCommentError::Unclosed));
            };
            let value = tail.get(..=end).unwrap_or("");
            rest = tail.get(end + 1..).unwrap_or("");
            return Some(Ok(Some((key, value))));
        }
        let value = after;
        rest = rest.get(word_end..).unwrap_or("");
        Some(Ok(Some((key, value))))
    })
}

fn flow(key: &'static str, v: &str) -> Result<CtFlow, DropCommentError> {
    let bad = || DropCommentError::Bad {
        key,
        value: v.to_string(),
    };
    let (proto, addrs) = v.split_once('/').ok_or_else(bad)?;
    let (src, dst) = addrs.split_once('>').ok_or_else(bad)?;
    Ok(CtFlow {
        src: src.parse::<SocketAddr>().map_err(|_| bad())?,
        dst: dst.parse::<SocketAddr>().map_err(|_| bad())?,
        proto: match Proto::transport_named(proto) {
            Some(p) => p.number(),
            None => proto.parse::<u8>().map_err(|_| bad())?,
        },
    })
}

fn number<T: TryFrom<u64>>(key: &'static str, v: &str) -> Result<T, DropCommentError> {
    let n = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse::<u64>().ok(),
    };
    n.and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| DropCommentError::Bad {
            key,
            value: v.to_string(),
        })
}

/// Reads a drop's comment (the whole `frame.comment`) back into what the live source knew.
/// `drop=`, `netns=` and `ifname=` are required; the other fields are absent in files of
/// older versions (then `cpu` is 0 and the rest unknown). Unknown fields are ignored.
pub fn parse_drop_comment(comment: &str) -> Result<DropComment, DropCommentError> {
    let mut drop: Option<(&str, &str)> = None;
    let mut seen: Vec<&str> = Vec::new();
    let mut netns = None;
    let mut ifname = None;
    let mut cpu = None;
    let mut netns_cookie = None;
    let mut ifindex = None;
    let mut reason_code = None;
    let mut confirm_failed = None;
    let (mut ct_status, mut ct_orig, mut ct_reply) = (None, None, None);
    for field in fields(comment) {
        let Some((key, value)) = field? else { continue };
        if drop.is_none() {
            if key == "drop" {
                let bad = || DropCommentError::Bad {
                    key: "drop",
                    value: value.to_string(),
                };
                let (reason, location) = value.split_once('@').ok_or_else(bad)?;
                if reason.is_empty() || location.is_empty() {
                    return Err(bad());
                }
                drop = Some((reason, location));
            }
            continue;
        }
        // From the first bracketed value on, the comment is free text (`dns=[…]`).
        if value.starts_with('[') {
            break;
        }
        if seen.contains(&key) {
            return Err(DropCommentError::Duplicate {
                key: key.to_string(),
            });
        }
        seen.push(key);
        match key {
            "netns" => netns = Some(value),
            "ifname" => ifname = Some(value),
            "cpu" => cpu = Some(number::<u32>("cpu", value)?),
            "netns_cookie" => netns_cookie = Some(number::<u64>("netns_cookie", value)?),
            "ifindex" => ifindex = Some(number::<u32>("ifindex", value)?),
            "reason_code" => reason_code = Some(number::<u32>("reason_code", value)?),
            "confirm_failed" => {
                confirm_failed = Some(match value {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(DropCommentError::Bad {
                            key: "confirm_failed",
                            value: value.to_string(),
                        })
                    }
                })
            }
            "ct_status" => ct_status = Some(number::<u64>("ct_status", value)?),
            "ct_orig" => ct_orig = Some(value),
            "ct_reply" => ct_reply = Some(value),
            _ => {}
        }
    }
    let (reason, location) = drop.ok_or(DropCommentError::Missing("drop"))?;
    let nonempty = |v: Option<&str>, key: &'static str| match v {
        None => Err(DropCommentError::Missing(key)),
        Some("") => Err(DropCommentError::Bad {
            key,
            value: String::new(),
        }),
        Some(v) => Ok(v.to_string()),
    };
    let netns = nonempty(netns, "netns")?;
    // Empty for a drop with no device (a socket's queue purged, ifindex 0).
    let ifname = ifname
        .ok_or(DropCommentError::Missing("ifname"))?
        .to_string();
    let ct = match (ct_status, ct_orig, ct_reply) {
        (None, None, None) => None,
        (Some(status), Some(orig), Some(reply)) => Some(CtSnapshot {
            status,
            orig: flow("ct_orig", orig)?,
            reply: flow("ct_reply", reply)?,
        }),
        (None, ..) => return Err(DropCommentError::Missing("ct_status")),
        (_, None, _) => return Err(DropCommentError::Missing("ct_orig")),
        (.., None) => return Err(DropCommentError::Missing("ct_reply")),
    };
    // `symbol+0xoff`; a bare address (`0x…`) has no symbol.
    let function = location
        .split_once('+')
        .map(|(f, _)| f.to_string())
        .unwrap_or_default();
    Ok(DropComment {
        named: NamedDrop {
            reason: reason.to_string(),
            reason_code,
            location: location.to_string(),
            function,
            confirm_failed,
            netns_cookie,
            ifindex,
        },
        cpu: cpu.unwrap_or(0),
        netns,
        ifname,
        ct,
    })
}

#[cfg(test)]
#[path = "drops_tests.rs"]
mod tests;
