//! Struct offsets and drop-reason names from the running kernel's BTF.
//!
//! Rust eBPF has no CO-RE field relocations, so the kfree_skb program reads `sk_buff`,
//! `net_device`, `net` and `nf_conn` through offsets that we look up here in
//! `/sys/kernel/btf/vmlinux` and hand over as a global.
use std::{collections::HashMap, path::Path};

use btf_rs::{Btf, Type};
use tracer_common::{KernelOffsets, SKB_WINDOW};

use super::KernelError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF, loaded once.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn load() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, KernelError> {
        if !path.exists() {
            return Err(KernelError::NoBtf(path.display().to_string()));
        }
        let btf = Btf::from_file(path)
            .map_err(|e| KernelError::Btf(format!("{}: {e}", path.display())))?;
        Ok(Self { btf })
    }

    fn struct_named(&self, name: &str) -> Result<btf_rs::Struct, KernelError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| KernelError::Btf(format!("type {name}: {e}")))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| KernelError::Btf(format!("struct {name} not in kernel BTF")))
    }

    /// Byte offset of `field` in struct `name`, looking through anonymous unions/structs.
    pub fn offset(&self, name: &str, field: &str) -> Result<u32, KernelError> {
        let s = self.struct_named(name)?;
        self.find_member(&s, field, 0)?
            .map(|bits| bits / 8)
            .ok_or_else(|| KernelError::Btf(format!("{name}.{field} not in kernel BTF")))
    }

    pub fn size_of(&self, name: &str) -> Result<u32, KernelError> {
        let s = self.struct_named(name)?;
        u32::try_from(s.size()).map_err(|_| KernelError::Btf(format!("size of {name}")))
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        field: &str,
        base_bits: u32,
    ) -> Result<Option<u32>, KernelError> {
        for m in &s.members {
            let name = self
                .btf
                .resolve_name(m)
                .map_err(|e| KernelError::Btf(e.to_string()))?;
            let bits = base_bits.saturating_add(m.bit_offset());
            if name == field {
                return Ok(Some(bits));
            }
            if name.is_empty() {
                let mut t = self
                    .btf
                    .resolve_chained_type(m)
                    .map_err(|e| KernelError::Btf(e.to_string()))?;
                // Skip qualifiers/typedefs to reach the anonymous aggregate.
                for _ in 0..8 {
                    match t {
                        Type::Typedef(_) | Type::Volatile(_) | Type::Const(_) => {
                            let Some(bt) = t.as_btf_type() else { break };
                            t = self
                                .btf
                                .resolve_chained_type(bt)
                                .map_err(|e| KernelError::Btf(e.to_string()))?;
                        }
                        _ => break,
                    }
                }
                if let Type::Struct(inner) | Type::Union(inner) = t {
                    if let Some(found) = self.find_member(&inner, field, bits)? {
                        return Ok(Some(found));
                    }
                }
            }
        }
        Ok(None)
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
        let Ok(types) = self.btf.resolve_types_by_name("skb_drop_reason") else {
            return out;
        };
        for t in types {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if let Ok(name) = self.btf.resolve_name(m) {
                        let short = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(&name);
                        out.insert(m.val(), short.to_string());
                    }
                }
            }
        }
        out
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
