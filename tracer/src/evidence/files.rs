//! `trace -w FILE` with tcpdump's rotation: `-C MB` starts a new file once this one holds
//! that many million bytes, `-G SECONDS` once its first packet is that old, `-W N` keeps
//! only the newest N files (older ones deleted). Names: a `FILE` with `%` is a strftime
//! pattern (UTC, the file's start); otherwise, when rotating, a sequence number goes
//! before the extension (`trace-00001.pcapng`); `-C` with a pattern adds the number too.
//! Files are created 0600: packets are private.
//!
//! A file that cannot be created or written (read-only or full directory) is one error,
//! printed once; the trace goes on without the file, and what was written stays readable
//! (pcapng is whole blocks, each flushed by the buffered writer or not at all).
use std::{
    collections::VecDeque,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

pub use crate::output::evidence::WriteStats;
use crate::{
    evidence::{annotate::EvidencePacket, pcapng::PcapngSink},
    names::SharedNames,
    output::escape,
    time::Clock,
};

#[derive(Clone, Debug, Default)]
pub struct Rotation {
    /// `-C`: bytes per file.
    pub max_bytes: Option<u64>,
    /// `-G`: time per file.
    pub every: Option<Duration>,
    /// `-W`: files kept.
    pub keep: Option<usize>,
}

impl Rotation {
    pub fn rotates(&self) -> bool {
        self.max_bytes.is_some() || self.every.is_some() || self.keep.is_some()
    }
}

pub struct PcapngFiles {
    path: PathBuf,
    rotation: Rotation,
    clock: Clock,
    snaplen: u32,
    names: SharedNames,
    current: Option<PcapngSink<Box<dyn Write + Send>>>,
    /// The current file and the bytes that reached it, to cut it after the last whole block
    /// when a write fails.
    on_disk: Option<(std::fs::File, Arc<AtomicU64>)>,
    /// Capture time of the current file's first packet.
    started_ns: u64,
    seq: u64,
    kept: VecDeque<PathBuf>,
    stats: WriteStats,
}

impl PcapngFiles {
    /// Nothing is created before the first packet, so that each file's name and time are
    /// its first packet's.
    pub fn new(
        path: PathBuf,
        rotation: Rotation,
        clock: Clock,
        snaplen: u32,
        names: SharedNames,
    ) -> Self {
        Self {
            path,
            rotation,
            clock,
            snaplen,
            names,
            current: None,
            on_disk: None,
            started_ns: 0,
            seq: 0,
            kept: VecDeque::new(),
            stats: WriteStats::default(),
        }
    }

    pub fn stats(&self) -> WriteStats {
        let mut s = self.stats.clone();
        if let Some(c) = &self.current {
            let (p, d) = c.written();
            s.packets += p;
            s.drops += d;
        }
        s
    }

    pub fn failed(&self) -> Option<&str> {
        self.stats.failed.as_deref()
    }

    /// Opens the first file now, so that a file that cannot be created says so at the start.
    pub fn open_now(&mut self, now_ns: u64) {
        if self.current.is_none() && self.stats.failed.is_none() {
            self.open(now_ns);
        }
    }

    pub fn write(&mut self, p: &EvidencePacket) {
        if self.stats.failed.is_some() {
            return;
        }
        let due = self.current.as_ref().is_some_and(|c| {
            self.rotation.max_bytes.is_some_and(|m| c.bytes() >= m)
                || self.rotation.every.is_some_and(|e| {
                    p.ts_ns.saturating_sub(self.started_ns)
                        >= u64::try_from(e.as_nanos()).unwrap_or(u64::MAX)
                })
        });
        if due {
            self.close();
        }
        if self.current.is_none() {
            self.open(p.ts_ns);
        }
        if let Some(c) = self.current.as_mut() {
            c.write(p);
            if let Some(why) = c.failed().map(str::to_string) {
                self.fail(why);
            }
        }
    }

    pub fn flush(&mut self) {
        if let Some(c) = self.current.as_mut() {
            c.flush();
            if let Some(why) = c.failed().map(str::to_string) {
                self.fail(why);
            }
        }
    }

    fn close(&mut self) {
        self.flush();
        self.on_disk = None;
        if let Some(c) = self.current.take() {
            let (p, d) = c.written();
            self.stats.packets += p;
            self.stats.drops += d;
        }
    }

    fn fail(&mut self, why: String) {
        if self.stats.failed.is_none() {
            eprintln!(
                "dnspath: error: -w {}: {}; the trace goes on without the pcapng file",
                escape(&self.path.to_string_lossy()),
                escape(&why)
            );
            self.stats.failed = Some(why);
        }
        if let Some(c) = self.current.take() {
            let (p, d) = c.written();
            self.stats.packets += p;
            self.stats.drops += d;
            // A full disk took part of a block: what ends with whole blocks stays readable.
            if let Some((f, reached)) = self.on_disk.take() {
                let whole = c.whole_blocks_up_to(reached.load(Ordering::Relaxed));
                if let Err(e) = f.set_len(whole) {
                    log::warn!("-w: cutting the file after its last whole block: {e}");
                }
            }
        }
    }

    fn open(&mut self, ts_ns: u64) {
        self.seq += 1;
        let path = match file_name(
            &self.path,
            &self.rotation,
            self.seq,
            self.clock.epoch_ns(ts_ns),
        ) {
            Ok(p) => p,
            Err(e) => return self.fail(e),
        };
        let out: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::BufWriter::new(std::io::stdout()))
        } else {
            match create_private(&path) {
                Ok(f) => {
                    let reached = Arc::new(AtomicU64::new(0));
                    self.on_disk = f.try_clone().ok().map(|c| (c, Arc::clone(&reached)));
                    Box::new(std::io::BufWriter::new(Counted { inner: f, reached }))
                }
                Err(e) => return self.fail(format!("{}: {e}", path.display())),
            }
        };
        // Headers (up to 60 + 8 bytes of IPv6 and UDP, or 60 of TCP) plus the DNS snaplen.
        let comment =
            "dnspath trace: every DNS packet at every hop; interfaces are netns/ifname".to_string();
        match PcapngSink::new(
            out,
            self.clock,
            self.snaplen.saturating_add(128),
            self.names.clone(),
            &[comment],
        ) {
            Ok(s) => self.current = Some(s),
            Err(e) => return self.fail(format!("{}: {e}", path.display())),
        }
        self.started_ns = ts_ns;
        self.stats.files += 1;
        if let Some(keep) = self.rotation.keep {
            self.kept.push_back(path);
            while self.kept.len() > keep.max(1) {
                if let Some(old) = self.kept.pop_front() {
                    match std::fs::remove_file(&old) {
                        Ok(()) => self.stats.files_deleted += 1,
                        Err(e) => {
                            log::warn!("-W: removing {}: {e}", escape(&old.to_string_lossy()))
                        }
                    }
                }
            }
        }
    }
}

/// A file that counts the bytes that reached it.
struct Counted {
    inner: std::fs::File,
    reached: Arc<AtomicU64>,
}

impl Write for Counted {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        self.reached.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Creates (or truncates) `path` readable by its owner only.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// The name of file number `seq` (from 1) starting at `epoch_ns`; an error for a bad
/// strftime pattern.
pub fn file_name(
    path: &Path,
    rotation: &Rotation,
    seq: u64,
    epoch_ns: u64,
) -> Result<PathBuf, String> {
    let s = path.to_string_lossy();
    let pattern = s.contains('%');
    let mut name = if pattern {
        strftime(&s, epoch_ns)?
    } else {
        s.into_owned()
    };
    if (!pattern && rotation.rotates()) || (pattern && rotation.max_bytes.is_some()) {
        let (stem, ext) = split_ext(&name);
        name = format!("{stem}-{seq:05}{ext}");
    }
    Ok(PathBuf::from(name))
}

/// `name` formatted as strftime(3) does, in UTC.
pub fn strftime(pattern: &str, epoch_ns: u64) -> Result<String, String> {
    use std::fmt::Write as _;
    let secs = i64::try_from(epoch_ns / 1_000_000_000).unwrap_or(i64::MAX);
    let nanos = u32::try_from(epoch_ns % 1_000_000_000).unwrap_or(0);
    let t = chrono::DateTime::from_timestamp(secs, nanos)
        .ok_or_else(|| format!("time {epoch_ns} out of range"))?;
    let mut out = String::new();
    write!(out, "{}", t.format(pattern))
        .map_err(|_| format!("{pattern}: not a strftime pattern chrono knows"))?;
    Ok(out)
}

/// `dir/trace.pcapng` → (`dir/trace`, `.pcapng`); no extension: (`name`, ``).
fn split_ext(name: &str) -> (&str, &str) {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    match name[base..].rfind('.') {
        Some(i) if i > 0 => name.split_at(base + i),
        _ => (name, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_tcpdump_rotates_them() {
        let none = Rotation::default();
        let size = Rotation {
            max_bytes: Some(1_000_000),
            ..Default::default()
        };
        let time = Rotation {
            every: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let p = Path::new("/tmp/x/trace.pcapng");
        let t = 1_700_000_000_000_000_000; // 2023-11-14T22:13:20Z
        assert_eq!(file_name(p, &none, 1, t).unwrap(), p);
        assert_eq!(
            file_name(p, &size, 3, t).unwrap(),
            Path::new("/tmp/x/trace-00003.pcapng")
        );
        assert_eq!(
            file_name(Path::new("/tmp/x.d/trace"), &size, 2, t).unwrap(),
            Path::new("/tmp/x.d/trace-00002")
        );
        let pat = Path::new("/tmp/dns-%Y%m%dT%H%M%S.pcapng");
        assert_eq!(
            file_name(pat, &time, 9, t).unwrap(),
            Path::new("/tmp/dns-20231114T221320.pcapng")
        );
        assert_eq!(
            file_name(pat, &size, 9, t).unwrap(),
            Path::new("/tmp/dns-20231114T221320-00009.pcapng")
        );
        assert!(strftime("%Q", t).is_err());
    }
}
