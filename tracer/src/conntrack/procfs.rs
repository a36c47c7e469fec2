//! `/proc/net/stat/nf_conntrack`: the per-CPU statistics in text, for kernels where
//! ctnetlink statistics fail.
//!
//! ct_cpu_seq_show (nf_conntrack_standalone.c) prints a header line of column names, then
//! one line of hex numbers per possible CPU, in CPU order, without the CPU number. Columns
//! are mapped by name; columns a kernel lacks stay 0.
use crate::event::CtCpuStats;

use super::ConntrackError;

/// At most this many CPUs are taken from a CPU list (guards against garbage ranges).
const MAX_CPUS: usize = 1 << 16;

/// Parses the file's text. `possible_cpus` (from `/sys/devices/system/cpu/possible`) gives
/// the CPU number of each line; without it, or if its length differs from the number of
/// lines, lines are numbered from 0.
pub fn parse_proc_stat(
    text: &str,
    possible_cpus: Option<&[u32]>,
) -> Result<Vec<CtCpuStats>, ConntrackError> {
    let bad = |detail: String| ConntrackError::Procfs {
        path: "nf_conntrack statistics".into(),
        detail,
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| bad("empty".into()))?
        .split_whitespace()
        .collect();
    if header
        .iter()
        .any(|h| !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        return Err(bad(format!("header is not column names: {header:?}")));
    }
    if !header
        .iter()
        .any(|h| ["found", "insert", "drop"].contains(h))
    {
        return Err(bad(format!("header names no known column: {header:?}")));
    }
    let rows: Vec<&str> = lines.collect();
    let cpus: Vec<u32> = match possible_cpus {
        Some(p) if p.len() == rows.len() => p.to_vec(),
        _ => (0..rows.len() as u32).collect(),
    };
    let mut out = Vec::with_capacity(rows.len());
    for (row, cpu) in rows.iter().zip(cpus) {
        let fields: Vec<&str> = row.split_whitespace().collect();
        if fields.len() != header.len() {
            return Err(bad(format!(
                "line for CPU {cpu} has {} columns, header {}",
                fields.len(),
                header.len()
            )));
        }
        let mut s = CtCpuStats {
            cpu,
            ..CtCpuStats::default()
        };
        for (name, field) in header.iter().zip(fields) {
            let value = u64::from_str_radix(field, 16)
                .map_err(|e| bad(format!("column {name} of CPU {cpu}: {field:?}: {e}")))?;
            let slot = match *name {
                "found" => &mut s.found,
                "invalid" => &mut s.invalid,
                "insert" => &mut s.insert,
                "insert_failed" => &mut s.insert_failed,
                "drop" => &mut s.drop,
                "early_drop" => &mut s.early_drop,
                "icmp_error" | "error" => &mut s.error,
                "search_restart" => &mut s.search_restart,
                "clashres" | "clash_resolve" => &mut s.clash_resolve,
                // Printed from `st->chaintoolong`.
                "chainlength" | "chaintoolong" | "chain_toolong" => &mut s.chain_toolong,
                // entries (a global count), and columns the kernel prints as 0.
                _ => continue,
            };
            *slot = value;
        }
        out.push(s);
    }
    Ok(out)
}

/// Parses a kernel CPU list (`0-3,8,10-11`), as in `/sys/devices/system/cpu/possible`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let n = part.trim().parse::<u32>().ok()?;
                (n, n)
            }
        };
        if hi < lo || (hi - lo) as usize >= MAX_CPUS.saturating_sub(out.len()) {
            return None;
        }
        out.extend(lo..=hi);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 6.18, two CPUs, after some DNS traffic through a DNAT.
    const SAMPLE: &str = "\
entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
0000000c  00000002 00000001 00000000 00000003 00000000 00000000 00000000 0000002a 00000001 00000001 00000000 00000000  00000000 00000000 00000000 00000000
0000000c  0000001f 00000000 00000000 00000000 00000000 00000000 00000004 000000ff 00000000 00000000 00000002 00000005  00000000 00000000 00000000 00000007
";

    #[test]
    fn columns_by_name() {
        let s = parse_proc_stat(SAMPLE, Some(&[0, 1])).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            CtCpuStats {
                cpu: 0,
                found: 1,
                invalid: 3,
                insert: 0x2a,
                insert_failed: 1,
                drop: 1,
                early_drop: 0,
                error: 0,
                search_restart: 0,
                clash_resolve: 2,
                chain_toolong: 0,
            }
        );
        assert_eq!(s[1].cpu, 1);
        assert_eq!(s[1].clash_resolve, 0x1f);
        assert_eq!(s[1].insert, 0xff);
        assert_eq!(s[1].chain_toolong, 4);
        assert_eq!(s[1].early_drop, 2);
        assert_eq!(s[1].error, 5);
        assert_eq!(s[1].search_restart, 7);
    }

    #[test]
    fn cpu_numbers_from_possible_list() {
        let s = parse_proc_stat(SAMPLE, Some(&[2, 5])).unwrap();
        assert_eq!((s[0].cpu, s[1].cpu), (2, 5));
        // A list that does not match the lines is not used.
        let s = parse_proc_stat(SAMPLE, Some(&[0, 1, 2])).unwrap();
        assert_eq!((s[0].cpu, s[1].cpu), (0, 1));
    }

    #[test]
    fn older_kernel_without_clashres() {
        let text = "entries searched found new invalid ignore delete delete_list insert insert_failed drop early_drop icmp_error expect_new expect_create expect_delete search_restart\n\
                    00000001 00000000 00000005 00000000 00000000 00000000 00000000 00000000 00000009 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n";
        let s = parse_proc_stat(text, None).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].found, s[0].insert, s[0].clash_resolve), (5, 9, 0));
    }

    #[test]
    fn malformed_text_is_an_error() {
        assert!(parse_proc_stat("", None).is_err());
        assert!(parse_proc_stat("entries found\n00000001\n", None).is_err());
        assert!(parse_proc_stat("entries found\n00000001 zz\n", None).is_err());
        assert!(parse_proc_stat("0001 0002\n0001 0002\n", None).is_err());
        assert!(parse_proc_stat("entries found\n1 ffffffffffffffffff\n", None).is_err());
        assert!(parse_proc_stat("entries fo-und\n1 2\n", None).is_err());
        // Only a header: no CPUs.
        assert_eq!(parse_proc_stat("entries found\n", None).unwrap(), vec![]);
        for cut in 0..SAMPLE.len() {
            let _ = parse_proc_stat(&SAMPLE[..cut], None);
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-3,7"), Some(vec![0, 2, 3, 7]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-4294967295"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}
