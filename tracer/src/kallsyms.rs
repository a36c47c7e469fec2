//! Kernel address → `symbol+0xoff`, from /proc/kallsyms (read once at start).
use std::fs;

#[derive(Default)]
pub struct Kallsyms {
    /// Sorted by address.
    syms: Vec<(u64, String)>,
}

impl Kallsyms {
    /// Loads /proc/kallsyms; without it (or with `kptr_restrict` zeroing the addresses)
    /// locations are shown as raw addresses.
    pub fn load() -> Self {
        let Ok(text) = fs::read_to_string("/proc/kallsyms") else {
            return Self::default();
        };
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Self {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort_unstable_by_key(|(a, _)| *a);
        Self { syms }
    }

    /// `name+0xoff`, or the bare address if unknown.
    pub fn symbolize(&self, addr: u64) -> String {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        match i.checked_sub(1).and_then(|i| self.syms.get(i)) {
            Some((a, name)) if addr != 0 => format!("{name}+{:#x}", addr - a),
            _ => format!("{addr:#x}"),
        }
    }

    /// Just the function name (for matching, e.g. `nf_hook_slow`).
    pub fn function(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        i.checked_sub(1)
            .and_then(|i| self.syms.get(i))
            .filter(|_| addr != 0)
            .map(|(_, n)| n.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_symbol_below() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t nf_hook_slow\nffffffff81000200 D data_sym\nffffffff81000300 T next_fn\n",
        );
        assert_eq!(k.symbolize(0xffffffff81000142), "nf_hook_slow+0x42");
        assert_eq!(k.function(0xffffffff81000250), Some("nf_hook_slow"));
        assert_eq!(k.symbolize(0x10), "0x10");
    }
}
