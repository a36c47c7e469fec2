//! The load: dnsperf's query files, its runs over UDP and TCP in chunks read as they come,
//! and its answers per second.
use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::anyhow;

/// dnsperf's query mix: cached names, new names (each once per pass), NXDOMAIN, a large TXT.
pub(super) fn query_file(dir: &Path) -> crate::Result<(PathBuf, PathBuf)> {
    let mut q = String::new();
    for i in 0..20_000 {
        match i % 10 {
            0..=4 => q.push_str("www.lab.test A\nwww.lab.test AAAA\n"),
            5 | 6 => q.push_str(&format!("new{i}.lab.test A\n")),
            7 | 8 => q.push_str(&format!("nx{i}.nowhere.lab.test AAAA\n")),
            _ => q.push_str("big.lab.test TXT\n"),
        }
    }
    let udp = dir.join("soak-queries.txt");
    fs::write(&udp, q).map_err(|e| anyhow!("{}: {e}", udp.display()))?;
    let tcp = dir.join("soak-tcp.txt");
    fs::write(
        &tcp,
        "www.lab.test A\nbig.lab.test TXT\nmedium.lab.test TXT\n",
    )
    .map_err(|e| anyhow!("{}: {e}", tcp.display()))?;
    Ok((udp, tcp))
}

/// dnsperf's runs are this long: one that stops sending after a fault (a TCP dnsperf whose
/// connections the server closed spins on them; a UDP one stopped answering-and-sending after
/// the conntrack table was full) holds the load back for this long at most.
pub(super) const CHUNK_S: u64 = 30;

/// dnsperf (`args`, without `-l`) run again and again in [`CHUNK_S`] runs until `total_s`
/// after `start` or `stop`; a run not ended [`CHUNK_S`] + 5 s after it began is killed and
/// counted in `stuck`. Its output is read as it comes (a pipe left unread fills with its
/// messages and stops it) and returned, every run's one after the other.
pub(super) fn load(
    client_ns: &str,
    args: &[String],
    total_s: u64,
    start: Instant,
    stop: &AtomicBool,
    stuck: &AtomicU64,
) -> String {
    let mut out = String::new();
    loop {
        let left = total_s.saturating_sub(start.elapsed().as_secs());
        if left < 2 || stop.load(Ordering::Relaxed) {
            return out;
        }
        let secs = left.min(CHUNK_S);
        let l = secs.to_string();
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["-l", &l, "-S", "10", "-O", "suppress=timeout,unexpected"]);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", client_ns])
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let Ok(mut child) = cmd.spawn() else {
            thread::sleep(Duration::from_secs(1));
            continue;
        };
        let Some(mut so) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return out;
        };
        let reader = thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = so.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        let deadline = Instant::now() + Duration::from_secs(secs + 5);
        loop {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            if Instant::now() > deadline {
                stuck.fetch_add(1, Ordering::Relaxed);
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        out.push_str(&reader.join().unwrap_or_default());
    }
}

pub(super) fn epoch_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// dnsperf's `-S` lines (`EPOCH: QPS`, the rate of answers over the last interval) as
/// (seconds since `start`, queries per second).
pub(super) fn rates(out: &str, start: f64) -> Vec<(f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let (t, q) = l.split_once(": ")?;
            let t: f64 = t.trim().parse().ok()?;
            Some((t - start, q.trim().parse().ok()?))
        })
        .collect()
}

/// The rate dnsperf reported for the interval that ended nearest `t` (seconds), within 6 s.
pub(super) fn rate_at(rates: &[(f64, f64)], t: u64) -> Option<f64> {
    rates
        .iter()
        .map(|&(at, q)| ((at - t as f64).abs(), q))
        .filter(|(d, _)| *d <= 6.0)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, q)| q)
}
