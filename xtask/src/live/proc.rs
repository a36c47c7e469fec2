//! /proc accounting: CPU time and peak memory of processes.
use std::fs;

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Fields of /proc/PID/stat after the command name (field 3 first).
pub(super) fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.rsplit_once(')')?.1;
    Some(
        after_comm
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// utime+stime of `pid` (all its threads) in seconds; with `children`, plus those of its
/// waited-for children (cutime+cstime).
pub(super) fn cpu_s(pid: &str, children: bool) -> Option<f64> {
    let f = stat_fields(pid)?;
    // proc(5): utime 14, stime 15, cutime 16, cstime 17; index 0 is field 3.
    let mut ticks = f.get(11)? + f.get(12)?;
    if children {
        ticks += f.get(13)? + f.get(14)?;
    }
    Some(ticks as f64 / clk_tck())
}

/// Peak resident set of `pid`, KiB.
pub(super) fn vm_hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Resident memory now (VmRSS), KiB: the steady state, where VmHWM also holds start-up's
/// peak (parsing the kernel's BTF).
pub(super) fn vm_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// cutime+cstime of this process: the CPU of every child it has reaped.
pub(super) fn cpu_children_self() -> f64 {
    stat_fields("self")
        .and_then(|f| Some((f.get(13)? + f.get(14)?) as f64 / clk_tck()))
        .unwrap_or(0.0)
}

/// utime+stime in seconds of each thread of `pid`, by thread id, with the thread's name.
pub(super) fn thread_cpu_s(pid: &str) -> Vec<(String, String, f64)> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String, f64)> = dir
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_string_lossy().into_owned();
            let stat = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let (head, after_comm) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            let f: Vec<u64> = after_comm
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0))
                .collect();
            Some((tid, name, (f.get(11)? + f.get(12)?) as f64 / clk_tck()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// [`thread_cpu_delta`] as one line, `name 1.23 s, …`, threads under 10 ms left out.
pub(super) fn thread_cpu_line(
    before: &[(String, String, f64)],
    after: &[(String, String, f64)],
) -> String {
    thread_cpu_delta(before, after)
        .iter()
        .filter(|(_, s)| *s >= 0.01)
        .map(|(n, s)| format!("{n} {s:.2} s"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The CPU each thread name took between two [`thread_cpu_s`] readings (threads that
/// started in between count from zero), largest first.
pub(super) fn thread_cpu_delta(
    before: &[(String, String, f64)],
    after: &[(String, String, f64)],
) -> Vec<(String, f64)> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    for (tid, name, a) in after {
        let b = before
            .iter()
            .find(|(t, n, _)| t == tid && n == name)
            .map_or(0.0, |x| x.2);
        match by_name.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 += a - b,
            None => by_name.push((name.clone(), a - b)),
        }
    }
    by_name.sort_by(|x, y| y.1.total_cmp(&x.1));
    by_name
}
