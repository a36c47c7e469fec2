//! Kernel address → `symbol+0xoff`, from /proc/kallsyms (read once at start).
use std::fs;

/// The kernel's function symbols, sorted by address: 121,793 on this 6.18 host, kept as one
/// string of names and two arrays (4.2 MiB; a `String` each took ~7.4, held by every live run
/// for its drops' locations).
#[derive(Default)]
pub struct Kallsyms {
    addrs: Vec<u64>,
    /// End of each name in `names` (its start is the previous one's end).
    ends: Vec<u32>,
    names: String,
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
        let mut syms: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then_some((addr, name))
            })
            .collect();
        syms.sort_unstable_by_key(|(a, _)| *a);
        let mut k = Self {
            addrs: Vec::with_capacity(syms.len()),
            ends: Vec::with_capacity(syms.len()),
            names: String::with_capacity(syms.iter().map(|(_, n)| n.len()).sum()),
        };
        for (addr, name) in syms {
            let Ok(end) = u32::try_from(k.names.len() + name.len()) else {
                // Over 4 GiB of names: not a kernel's; the rest stay unnamed.
                break;
            };
            k.names.push_str(name);
            k.addrs.push(addr);
            k.ends.push(end);
        }
        k
    }

    /// The symbol at or below `addr`: its address and name.
    fn below(&self, addr: u64) -> Option<(u64, &str)> {
        if addr == 0 {
            return None;
        }
        let i = self.addrs.partition_point(|a| *a <= addr).checked_sub(1)?;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)? as usize,
            None => 0,
        };
        let end = *self.ends.get(i)? as usize;
        Some((*self.addrs.get(i)?, self.names.get(start..end)?))
    }

    /// `name+0xoff`, or the bare address if unknown.
    pub fn symbolize(&self, addr: u64) -> String {
        match self.below(addr) {
            Some((a, name)) => format!("{name}+{:#x}", addr - a),
            None => format!("{addr:#x}"),
        }
    }

    /// Just the function name (for matching, e.g. `nf_hook_slow`).
    pub fn function(&self, addr: u64) -> Option<&str> {
        self.below(addr).map(|(_, n)| n)
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
        assert_eq!(k.function(0xffffffff81000005), Some("_stext"));
        assert_eq!(k.function(0xffffffff81000301), Some("next_fn"));
        assert_eq!(k.symbolize(0x10), "0x10");
        assert_eq!(k.function(0), None);
    }

    /// The names of the running kernel come out as /proc/kallsyms spells them.
    #[test]
    fn this_kernels_functions_are_named() {
        let Ok(text) = fs::read_to_string("/proc/kallsyms") else {
            return;
        };
        let k = Kallsyms::parse(&text);
        let Some((addr, name)) = text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let addr = u64::from_str_radix(it.next()?, 16).ok()?;
            let kind = it.next()?;
            let name = it.next()?;
            (addr != 0 && kind == "T").then(|| (addr, name.to_owned()))
        }) else {
            return;
        };
        // Another symbol may share the address; whichever is named, it is at `addr`.
        let named = k.function(addr).unwrap();
        assert!(text.contains(&format!(" {named}")), "{named} for {name}");
        assert_eq!(k.symbolize(addr), format!("{named}+0x0"));
    }
}
