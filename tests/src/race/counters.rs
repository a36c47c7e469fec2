//! The node's conntrack counters: `insert_failed`, `drop` and `clash_resolve` per CPU.
use super::{check, invalid_data};
use crate::{Lab, LabError};

/// Per-CPU `(insert_failed, drop, clash_resolve)` of the node namespace's conntrack, from
/// `/proc/net/stat/nf_conntrack` (hex; columns `insert_failed`, `drop`, `clashres`; a
/// kernel without `clashres` reports 0 there).
pub fn ct_stats(lab: &Lab) -> Result<Vec<(u64, u64, u64)>, LabError> {
    let args = ["cat", "/proc/net/stat/nf_conntrack"];
    let out = lab.exec(lab.node_ns(), &args);
    let text = check(&args, out)?;
    parse_ct_stats(&text).map_err(|e| invalid_data(format!("/proc/net/stat/nf_conntrack: {e}")))
}

/// Column sums of [`ct_stats`] rows.
pub fn ct_totals(rows: &[(u64, u64, u64)]) -> (u64, u64, u64) {
    rows.iter()
        .fold((0, 0, 0), |(a, b, c), (x, y, z)| (a + x, b + y, c + z))
}

/// Parses `/proc/net/stat/nf_conntrack`: a header of column names, then one line of hex
/// numbers per CPU.
pub fn parse_ct_stats(text: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty")?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let insert_failed = col("insert_failed").ok_or("no insert_failed column")?;
    let drop = col("drop").ok_or("no drop column")?;
    let clashres = col("clashres");
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != header.len() {
            return Err(format!(
                "row {n} has {} fields, header {}",
                fields.len(),
                header.len()
            ));
        }
        let hex = |i: usize| {
            u64::from_str_radix(fields[i], 16).map_err(|e| format!("row {n} {:?}: {e}", fields[i]))
        };
        rows.push((
            hex(insert_failed)?,
            hex(drop)?,
            clashres.map(hex).transpose()?.unwrap_or(0),
        ));
    }
    Ok(rows)
}
