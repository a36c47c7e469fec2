//! Struct offsets, drop-reason names and the drop hook's type id from the running kernel's
//! BTF.
//!
//! Rust eBPF has no CO-RE field relocations, so the kfree_skb program reads `sk_buff`,
//! `net_device`, `net` and `nf_conn` through offsets that we look up here in
//! `/sys/kernel/btf/vmlinux` and hand over as a global. The file is read and its types
//! indexed once (a walk of the type section, nothing decoded ahead: the format is
//! Documentation/bpf/btf.rst's), and the same reading gives aya the id of the tp_btf
//! program's typedef, so the kernel's BTF is never parsed a second time.
use std::{collections::HashMap, ops::Range, path::Path};

use tracer_common::{KernelOffsets, SKB_WINDOW};

use super::KernelError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// `BTF_KIND_*` (include/uapi/linux/btf.h) of the types read here.
const KIND_PTR: u8 = 2;
const KIND_STRUCT: u8 = 4;
const KIND_UNION: u8 = 5;
const KIND_ENUM: u8 = 6;
const KIND_TYPEDEF: u8 = 8;
const KIND_VOLATILE: u8 = 9;
const KIND_CONST: u8 = 10;
const KIND_RESTRICT: u8 = 11;
const KIND_TYPE_TAG: u8 = 18;
const KIND_MAX: u8 = 19;
/// `struct btf_header`: magic, version, flags, hdr_len, type_off, type_len, str_off, str_len.
const HEADER_LEN: usize = 24;
const MAGIC: u16 = 0xeb9f;
/// `struct btf_type`: name_off, info, size/type; each kind's data follows it.
const TYPE_LEN: usize = 12;

/// The kernel's BTF, read once: its bytes and where each type's record starts.
pub struct KernelBtf {
    data: Vec<u8>,
    strings: Range<usize>,
    /// Where type id `i + 1`'s record starts in `data` (id 0 is `void`, no record).
    starts: Vec<u32>,
}

/// One `struct btf_type` record and its kind's data.
#[derive(Clone, Copy)]
struct Record<'a> {
    name_off: u32,
    kind: u8,
    vlen: usize,
    kind_flag: bool,
    /// The size of a struct, union or enum; the type a typedef or qualifier names.
    size_or_type: u32,
    extra: &'a [u8],
}

fn bad(what: &str) -> KernelError {
    KernelError::Btf(format!("{VMLINUX_BTF}: {what}"))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Bytes of a kind's data after its `struct btf_type`, `None` for a kind not in the format.
fn extra_len(kind: u8, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT's encoding, VAR's linkage, DECL_TAG's component index.
        1 | 14 | 17 => 4,
        // ARRAY's `struct btf_array`.
        3 => 12,
        // Members, DATASEC's variables, ENUM64's values: 12 bytes each.
        KIND_STRUCT | KIND_UNION | 15 | 19 => 12 * vlen,
        // ENUM's values, FUNC_PROTO's parameters: 8 bytes each.
        KIND_ENUM | 13 => 8 * vlen,
        0 | KIND_MAX.. => return None,
        _ => 0,
    })
}

impl KernelBtf {
    pub fn load() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, KernelError> {
        if !path.exists() {
            return Err(KernelError::NoBtf(path.display().to_string()));
        }
        let data = std::fs::read(path)
            .map_err(|e| KernelError::Btf(format!("{}: {e}", path.display())))?;
        Self::parse(data)
    }

    /// Indexes the types of a BTF blob of this machine's byte order.
    pub fn parse(data: Vec<u8>) -> Result<Self, KernelError> {
        let header = |i: usize| u32_at(&data, 8 + 4 * i).map(|v| v as usize);
        let magic = data.get(..2).map(|m| u16::from_ne_bytes([m[0], m[1]]));
        if magic != Some(MAGIC) {
            return Err(bad("not BTF of this byte order"));
        }
        let (Some(hdr_len), Some(type_off), Some(type_len), Some(str_off), Some(str_len)) = (
            u32_at(&data, 4).map(|v| v as usize),
            header(0),
            header(1),
            header(2),
            header(3),
        ) else {
            return Err(bad("header cut short"));
        };
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off)?;
            let end = start.checked_add(len)?;
            (hdr_len >= HEADER_LEN && end <= data.len()).then_some(start..end)
        };
        let (Some(types), Some(strings)) = (section(type_off, type_len), section(str_off, str_len))
        else {
            return Err(bad("sections out of the file"));
        };
        let mut starts = Vec::new();
        let mut at = types.start;
        while at < types.end {
            let info = u32_at(&data, at + 4).ok_or_else(|| bad("type cut short"))?;
            let kind = ((info >> 24) & 0x1f) as u8;
            let vlen = (info & 0xffff) as usize;
            let len =
                extra_len(kind, vlen).ok_or_else(|| bad(&format!("type kind {kind} unknown")))?;
            let next = at + TYPE_LEN + len;
            if next > types.end {
                return Err(bad("type cut short"));
            }
            starts.push(u32::try_from(at).map_err(|_| bad("too large"))?);
            at = next;
        }
        Ok(Self {
            data,
            strings,
            starts,
        })
    }

    fn record(&self, id: u32) -> Option<Record<'_>> {
        let at = *self.starts.get(usize::try_from(id).ok()?.checked_sub(1)?)? as usize;
        let info = u32_at(&self.data, at + 4)?;
        let kind = ((info >> 24) & 0x1f) as u8;
        let vlen = (info & 0xffff) as usize;
        let extra = at + TYPE_LEN;
        Some(Record {
            name_off: u32_at(&self.data, at)?,
            kind,
            vlen,
            kind_flag: info >> 31 == 1,
            size_or_type: u32_at(&self.data, at + 8)?,
            extra: self.data.get(extra..extra + extra_len(kind, vlen)?)?,
        })
    }

    /// The string at `off` of the string section ("" if there is none).
    fn name(&self, off: u32) -> &str {
        let Some(s) = self
            .strings
            .start
            .checked_add(off as usize)
            .filter(|s| *s < self.strings.end)
            .and_then(|s| self.data.get(s..self.strings.end))
        else {
            return "";
        };
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// The first type of `kind` named `name`, with its id.
    fn named(&self, kind: u8, name: &str) -> Option<(u32, Record<'_>)> {
        (1..=self.starts.len() as u32).find_map(|id| {
            let r = self.record(id)?;
            (r.kind == kind && self.name(r.name_off) == name).then_some((id, r))
        })
    }

    fn struct_named(&self, name: &str) -> Result<Record<'_>, KernelError> {
        self.named(KIND_STRUCT, name)
            .map(|(_, r)| r)
            .ok_or_else(|| KernelError::Btf(format!("struct {name} not in kernel BTF")))
    }

    /// Byte offset of `field` in struct `name`, looking through anonymous unions/structs.
    pub fn offset(&self, name: &str, field: &str) -> Result<u32, KernelError> {
        let s = self.struct_named(name)?;
        self.find_member(s, field, 0, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| KernelError::Btf(format!("{name}.{field} not in kernel BTF")))
    }

    pub fn size_of(&self, name: &str) -> Result<u32, KernelError> {
        Ok(self.struct_named(name)?.size_or_type)
    }

    /// The bit offset of `field` in the struct or union `s` (at `base_bits`), searched
    /// through its anonymous members; `depth` bounds the nesting.
    fn find_member(&self, s: Record<'_>, field: &str, base_bits: u32, depth: u8) -> Option<u32> {
        if depth > 8 {
            return None;
        }
        for m in s.extra.chunks_exact(12).take(s.vlen) {
            let (name_off, ty, offset) = (u32_at(m, 0)?, u32_at(m, 4)?, u32_at(m, 8)?);
            // With kind_flag, the top 8 bits are a bitfield's size.
            let bit_offset = if s.kind_flag {
                offset & 0xff_ffff
            } else {
                offset
            };
            let bits = base_bits.saturating_add(bit_offset);
            let name = self.name(name_off);
            if name == field {
                return Some(bits);
            }
            if name.is_empty() {
                let inner = self.through_qualifiers(ty)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                    if let Some(found) = self.find_member(inner, field, bits, depth + 1) {
                        return Some(found);
                    }
                }
            }
        }
        None
    }

    /// Type `id` past its typedefs and qualifiers (the anonymous aggregate of a member).
    fn through_qualifiers(&self, mut id: u32) -> Option<Record<'_>> {
        for _ in 0..8 {
            let r = self.record(id)?;
            match r.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = r.size_or_type;
                }
                _ => return Some(r),
            }
        }
        None
    }

    /// Offsets the kfree_skb program needs. Conntrack fields are optional: without
    /// CONFIG_NF_CONNTRACK `has_nfct` is 0 and drops carry no conntrack data.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, KernelError> {
        let mut o = KernelOffsets {
            skb_len: self.offset("sk_buff", "len")?,
            skb_head: self.offset("sk_buff", "head")?,
            skb_data: self.offset("sk_buff", "data")?,
            skb_network_header: self.offset("sk_buff", "network_header")?,
            skb_dev: self.offset("sk_buff", "dev")?,
            skb_sk: self.offset("sk_buff", "sk")?,
            skb_tail: self.offset("sk_buff", "tail")?,
            dev_ifindex: self.offset("net_device", "ifindex")?,
            dev_nd_net: self.offset("net_device", "nd_net")?,
            sk_net: self.offset("sock_common", "skc_net")?,
            net_cookie: match super::netns::netns_id_kind() {
                super::netns::NetnsIdKind::Cookie => self.offset("net", "net_cookie")?,
                super::netns::NetnsIdKind::Inode => {
                    self.offset("net", "ns")? + self.offset("ns_common", "inum")?
                }
            },
            net_id_is_inum: u32::from(
                super::netns::netns_id_kind() == super::netns::NetnsIdKind::Inode,
            ),
            ..KernelOffsets::UNSET
        };
        if let Some(w) = SkbWindow::new(
            o.skb_network_header,
            o.skb_tail,
            o.skb_head,
            self.size_of("sk_buff")?,
        ) {
            o.has_skb_window = 1;
            o.skb_window = w.start;
            o.window_network_header = w.network_header;
            o.window_tail = w.tail;
            o.window_head = w.head;
        }
        if let (Ok(nfct), Ok(status), Ok(th), Ok(th_size), Ok(tuple)) = (
            self.offset("sk_buff", "_nfct"),
            self.offset("nf_conn", "status"),
            self.offset("nf_conn", "tuplehash"),
            self.size_of("nf_conntrack_tuple_hash"),
            self.offset("nf_conntrack_tuple_hash", "tuple"),
        ) {
            o.skb_nfct = nfct;
            o.nfct_status = status;
            o.nfct_tuplehash = th;
            o.tuplehash_size = th_size;
            o.tuplehash_tuple = tuple;
            o.has_nfct = 1;
        }
        Ok(o)
    }

    /// `enum skb_drop_reason` value → name without the `SKB_DROP_REASON_` prefix.
    pub fn drop_reasons(&self) -> HashMap<u32, String> {
        let mut out = HashMap::new();
        let Some((_, e)) = self.named(KIND_ENUM, "skb_drop_reason") else {
            return out;
        };
        for v in e.extra.chunks_exact(8).take(e.vlen) {
            let (Some(name_off), Some(val)) = (u32_at(v, 0), u32_at(v, 4)) else {
                continue;
            };
            let name = self.name(name_off);
            let short = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(name);
            out.insert(val, short.to_string());
        }
        out
    }

    /// What aya's `BtfTracePoint::load` needs to find `btf_trace_<tracepoint>`'s id: a
    /// BTF with that typedef at its id in the kernel's, every type before it a placeholder
    /// pointer. aya reads nothing else of it (`programs/tp_btf.rs`: the id goes to the
    /// kernel, which checks it against its own BTF), so it is not parsed a second time.
    pub fn for_tracepoint(&self, tracepoint: &str) -> Result<aya::Btf, KernelError> {
        let name = format!("btf_trace_{tracepoint}");
        let (id, _) = self
            .named(KIND_TYPEDEF, &name)
            .ok_or_else(|| KernelError::Btf(format!("typedef {name} not in kernel BTF")))?;
        let count = id as usize;
        let type_len = count * TYPE_LEN;
        let strings = [&[0u8][..], name.as_bytes(), &[0]].concat();
        let mut blob = Vec::with_capacity(HEADER_LEN + type_len + strings.len());
        blob.extend_from_slice(&MAGIC.to_ne_bytes());
        blob.extend_from_slice(&[1, 0]);
        for v in [HEADER_LEN, 0, type_len, type_len, strings.len()] {
            blob.extend_from_slice(
                &u32::try_from(v)
                    .map_err(|_| bad("too large"))?
                    .to_ne_bytes(),
            );
        }
        let record = |name_off: u32, kind: u8| {
            [name_off, u32::from(kind) << 24, 0]
                .into_iter()
                .flat_map(u32::to_ne_bytes)
        };
        for _ in 1..count {
            blob.extend(record(0, KIND_PTR));
        }
        blob.extend(record(1, KIND_TYPEDEF));
        blob.extend_from_slice(&strings);
        aya::Btf::parse(&blob, aya::Endianness::default())
            .map_err(|e| KernelError::Btf(format!("{name}: {e}")))
    }
}

/// The [`SKB_WINDOW`] bytes of `struct sk_buff` from which the kfree_skb program takes
/// `network_header` (`u16`), `tail` (`u32`, an offset from `head` on 64-bit kernels) and
/// `head` (a pointer) with one `bpf_probe_read_kernel`, and where each lies in them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkbWindow {
    /// Offset of the window in `sk_buff`: 8-aligned, and the window ends inside the struct
    /// (the copy must not reach the next slab object, nor a KFENCE guard page after it).
    pub start: u32,
    pub network_header: u32,
    pub tail: u32,
    pub head: u32,
}

impl SkbWindow {
    /// `None` if the three fields (at these offsets of an `skb_size`-byte `sk_buff`) do not
    /// fit one window, or one is not aligned to its size (the program reads each at its
    /// offset masked to that alignment): the program then reads them one by one.
    pub fn new(network_header: u32, tail: u32, head: u32, skb_size: u32) -> Option<Self> {
        let window = SKB_WINDOW as u32;
        let fields = [(network_header, 2), (tail, 4), (head, 8)];
        let first = fields.iter().map(|&(off, _)| off).min()?;
        let last = fields.iter().map(|&(off, size)| off + size).max()?;
        let start = (first & !7).min(skb_size.checked_sub(window)? & !7);
        if last > start + window || fields.iter().any(|&(off, size)| off % size != 0) {
            return None;
        }
        Some(Self {
            start,
            network_header: network_header - start,
            tail: tail - start,
            head: head - start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_from_running_kernel() {
        let Ok(btf) = KernelBtf::load() else {
            eprintln!("skipped: no {VMLINUX_BTF} on this kernel");
            return;
        };
        let o = btf.kernel_offsets().unwrap();
        // sk_buff starts with the next/prev/dev union; head and data are far into it.
        assert!(o.skb_head > 64 && o.skb_data > o.skb_head);
        assert!(o.skb_dev > 0 && o.skb_dev < o.skb_head);
        assert_eq!(o.tuplehash_size % 8, 0);
        // Every kernel this runs on has them in one window.
        assert_eq!(o.has_skb_window, 1, "{o:?}");
        assert_eq!(o.skb_window + o.window_head, o.skb_head);
        assert_eq!(o.skb_window + o.window_tail, o.skb_tail);
        assert_eq!(o.skb_window + o.window_network_header, o.skb_network_header);
        let reasons = btf.drop_reasons();
        assert!(reasons.values().any(|n| n == "NETFILTER_DROP"));
        // aya's BTF for the drop hook holds its typedef at the kernel's id.
        let id = btf.named(KIND_TYPEDEF, "btf_trace_kfree_skb").unwrap().0;
        let aya_btf = btf.for_tracepoint("kfree_skb").unwrap();
        let again = KernelBtf::parse(aya_btf.to_bytes()).unwrap();
        assert_eq!(
            again.named(KIND_TYPEDEF, "btf_trace_kfree_skb").unwrap().0,
            id
        );
    }

    /// Offsets through an anonymous union behind a qualifier, a bitfield's offset, the
    /// drop reasons and the drop hook's id, from a BTF made here (every kernel's layout is
    /// checked by `offsets_from_running_kernel` where it runs).
    #[test]
    fn reads_members_through_anonymous_unions_and_enum_values() {
        let mut strings = vec![0u8];
        let mut name = |s: &str| -> u32 {
            let at = strings.len() as u32;
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
            at
        };
        let (int, a, b, x, y, s, reason, none, nosock, hook) = (
            name("int"),
            name("a"),
            name("b"),
            name("x"),
            name("y"),
            name("s"),
            name("skb_drop_reason"),
            name("SKB_DROP_REASON_NOT_SPECIFIED"),
            name("SKB_DROP_REASON_NO_SOCKET"),
            name("btf_trace_kfree_skb"),
        );
        let t = |name: u32, kind: u8, vlen: u32, flag: bool, sot: u32| {
            [
                name,
                u32::from(kind) << 24 | vlen | u32::from(flag) << 31,
                sot,
            ]
        };
        let mut w: Vec<u32> = Vec::new();
        // 1: int, 4 bytes.
        w.extend(t(int, 1, 0, false, 4));
        w.push(32);
        // 2: union { int a; int b; }.
        w.extend(t(0, KIND_UNION, 2, false, 4));
        w.extend([a, 1, 0, b, 1, 0]);
        // 3: const of 2.
        w.extend(t(0, KIND_CONST, 0, false, 2));
        // 4: struct s { int x:3 at bit 32; const union at bit 64; int y at bit 128 }.
        w.extend(t(s, KIND_STRUCT, 3, true, 24));
        w.extend([x, 1, 3 << 24 | 32, 0, 3, 64, y, 1, 128]);
        // 5: enum skb_drop_reason.
        w.extend(t(reason, KIND_ENUM, 2, false, 4));
        w.extend([none, 2, nosock, 3]);
        // 6: the hook's typedef.
        w.extend(t(hook, KIND_TYPEDEF, 0, false, 0));
        let types: Vec<u8> = w.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_ne_bytes());
        data.extend_from_slice(&[1, 0]);
        for v in [HEADER_LEN, 0, types.len(), types.len(), strings.len()] {
            data.extend_from_slice(&(v as u32).to_ne_bytes());
        }
        data.extend(&types);
        data.extend(&strings);

        let btf = KernelBtf::parse(data.clone()).unwrap();
        assert_eq!(btf.offset("s", "x").unwrap(), 4);
        assert_eq!(btf.offset("s", "b").unwrap(), 8);
        assert_eq!(btf.offset("s", "y").unwrap(), 16);
        assert!(btf.offset("s", "z").is_err());
        assert!(btf.offset("t", "x").is_err());
        assert_eq!(btf.size_of("s").unwrap(), 24);
        let reasons = btf.drop_reasons();
        assert_eq!(reasons.len(), 2);
        assert_eq!(reasons[&2], "NOT_SPECIFIED");
        assert_eq!(reasons[&3], "NO_SOCKET");
        let aya_btf = btf.for_tracepoint("kfree_skb").unwrap();
        let again = KernelBtf::parse(aya_btf.to_bytes()).unwrap();
        assert_eq!(
            again.named(KIND_TYPEDEF, "btf_trace_kfree_skb").unwrap().0,
            6
        );
        assert!(btf.for_tracepoint("consume_skb").is_err());

        // Wrong magic, a type cut short, an unknown kind: errors, never a panic.
        let mut wrong = data.clone();
        wrong[0] ^= 0xff;
        assert!(KernelBtf::parse(wrong).is_err());
        for cut in [3, 20, HEADER_LEN + 5, HEADER_LEN + types.len() - 2] {
            assert!(
                KernelBtf::parse(data[..cut].to_vec()).is_err(),
                "cut at {cut}"
            );
        }
        let mut unknown = data.clone();
        unknown[HEADER_LEN + 7] = 31;
        assert!(KernelBtf::parse(unknown).is_err());
    }
}

#[cfg(test)]
mod window_tests {
    use super::SkbWindow;

    /// `sk_buff` offsets (network_header, tail, head) and size of Debian's kernels, read from
    /// their BTF: 5.10.0-46 (also 6.18 here) and 6.1.0-57 / 6.12.117.
    #[test]
    fn debian_kernels_fit_one_window() {
        assert_eq!(
            SkbWindow::new(180, 184, 192, 224),
            Some(SkbWindow {
                start: 176,
                network_header: 4,
                tail: 8,
                head: 16
            })
        );
        assert_eq!(
            SkbWindow::new(184, 188, 200, 232),
            Some(SkbWindow {
                start: 184,
                network_header: 0,
                tail: 4,
                head: 16
            })
        );
    }

    /// CONFIG_KCOV's `u64 kcov_handle` after `mac_header` still fits, to the window's last
    /// byte.
    #[test]
    fn kcov_handle_still_fits() {
        let w = SkbWindow::new(180, 192, 200, 232).unwrap();
        assert_eq!((w.start, w.head + 8), (176, 32));
    }

    #[test]
    fn fields_too_far_apart_take_the_separate_reads() {
        // head 40 bytes after network_header.
        assert_eq!(SkbWindow::new(180, 200, 216, 256), None);
        // head before network_header, far away.
        assert_eq!(SkbWindow::new(180, 184, 64, 224), None);
    }

    /// A window that would run past the struct is moved back to end at its last byte.
    #[test]
    fn window_stays_inside_the_struct() {
        let w = SkbWindow::new(200, 204, 208, 216).unwrap();
        assert_eq!(w.start, 184);
        assert_eq!((w.network_header, w.tail, w.head), (16, 20, 24));
        assert_eq!(SkbWindow::new(0, 4, 8, 24), None);
    }

    /// The program reads each field at its offset masked to the field's alignment.
    #[test]
    fn misaligned_fields_take_the_separate_reads() {
        assert_eq!(SkbWindow::new(181, 184, 192, 224), None);
        assert_eq!(SkbWindow::new(180, 186, 192, 224), None);
        assert_eq!(SkbWindow::new(180, 184, 196, 224), None);
    }
}
