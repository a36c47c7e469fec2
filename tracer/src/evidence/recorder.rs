//! `--record DIR`: the flight recorder. The last packets (annotated, as `-w` writes them)
//! stay in a ring bounded in bytes and time; when an incident happens — a loop detected, a
//! race drop, a kernel drop of a DNS packet, an unanswered query, a SERVFAIL — the packets
//! from `before` ahead of it to `after` past it go into one pcapng file in DIR, named by the
//! incident's time and kind, with the incidents in the section header's comments.
//!
//! - Incidents whose windows overlap share a file: one that comes while a file is still
//!   collecting extends it (up to [`MAX_EXTENSION_NS`] past the first incident's window),
//!   one inside the window of a file already written is named by that file.
//! - A storm does not write a file per packet: at most `files_per_minute` new files; the
//!   incidents beyond that are counted (`not_written`), not recorded.
//! - DIR holds at most `dir_max_bytes` of our files (`dnspath-*.pcapng`): the oldest go first.
//!
//! An incident's record comes out of the pipeline after its packets (a transaction is
//! decided at its answer or timeout), so the ring keeps `before + after` plus the
//! annotation delay; a file is written once every packet of its window has been released.
use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    sync::Arc,
};

pub use crate::output::evidence::RecordStats;
use crate::{
    evidence::{annotate::EvidencePacket, files, pcapng::PcapngSink},
    names::SharedNames,
    output::escape,
    time::Clock,
};

/// How far past its first incident's window a file may be extended by later ones.
pub const MAX_EXTENSION_NS: u64 = 60_000_000_000;
/// Windows of written files remembered, for incidents that fall inside them.
const RECENT_FILES: usize = 32;

#[derive(Clone, Debug)]
pub struct RecorderConfig {
    pub dir: PathBuf,
    pub before_ns: u64,
    pub after_ns: u64,
    /// Bytes of packets the ring (and each file being collected) holds at most.
    pub ring_bytes: usize,
    /// Bytes of our files DIR holds at most.
    pub dir_max_bytes: u64,
    pub files_per_minute: u32,
    /// How long packets may wait for their annotation before they reach the ring.
    pub delay_ns: u64,
}

struct Capture {
    start_ns: u64,
    end_ns: u64,
    /// The first incident's time (bounds extensions).
    first_ns: u64,
    path: PathBuf,
    incidents: Vec<String>,
    packets: Vec<Arc<EvidencePacket>>,
    bytes: usize,
}

pub struct Recorder {
    cfg: RecorderConfig,
    clock: Clock,
    snaplen: u32,
    names: SharedNames,
    ring: VecDeque<Arc<EvidencePacket>>,
    ring_bytes: usize,
    open: Vec<Capture>,
    /// (start, end, file) of files written.
    recent: VecDeque<(u64, u64, PathBuf)>,
    /// When (live clock) the last files were started, for the rate limit.
    started: VecDeque<u64>,
    stats: RecordStats,
}

fn size_of(p: &EvidencePacket) -> usize {
    // Beyond its bytes and comment: the packet in its shared block, the buffer's header,
    // its places in the ring and a file, and the allocator's rounding.
    p.data.len() + p.comment.capacity() + std::mem::size_of::<EvidencePacket>() + 128
}

impl Recorder {
    pub fn new(cfg: RecorderConfig, clock: Clock, snaplen: u32, names: SharedNames) -> Self {
        Self {
            cfg,
            clock,
            snaplen,
            names,
            ring: VecDeque::new(),
            ring_bytes: 0,
            open: Vec::new(),
            recent: VecDeque::new(),
            started: VecDeque::new(),
            stats: RecordStats::default(),
        }
    }

    pub fn stats(&self) -> RecordStats {
        self.stats.clone()
    }

    /// A released packet: into the ring, and into each file collecting its time.
    pub fn packet(&mut self, p: EvidencePacket) {
        let p = Arc::new(p);
        let keep_ns = self.cfg.before_ns + self.cfg.after_ns + self.cfg.delay_ns;
        self.ring_bytes += size_of(&p);
        self.ring.push_back(Arc::clone(&p));
        while let Some(old) = self.ring.front() {
            if self.ring_bytes <= self.cfg.ring_bytes
                && old.ts_ns.saturating_add(keep_ns) >= p.ts_ns
            {
                break;
            }
            self.ring_bytes = self.ring_bytes.saturating_sub(size_of(old));
            self.ring.pop_front();
        }
        for c in self.open.iter_mut() {
            if p.ts_ns >= c.start_ns && p.ts_ns <= c.end_ns {
                if c.bytes + size_of(&p) > self.cfg.ring_bytes {
                    self.stats.packets_cut += 1;
                    continue;
                }
                c.bytes += size_of(&p);
                c.packets.push(Arc::clone(&p));
            }
        }
    }

    /// An incident at `ts_ns` (`kind`: `loop`, `race-drop`, `drop`, `unanswered`,
    /// `servfail`); returns the file that holds (or will hold) it, or `None` when it is not
    /// recorded (rate limit, write errors).
    pub fn incident(
        &mut self,
        kind: &str,
        detail: &str,
        ts_ns: u64,
        now_ns: u64,
    ) -> Option<String> {
        self.stats.incidents += 1;
        let line = format!(
            "incident {kind} at {}: {}",
            self.clock.wall(ts_ns),
            escape(detail)
        );
        let start = ts_ns.saturating_sub(self.cfg.before_ns);
        let end = ts_ns.saturating_add(self.cfg.after_ns);
        if let Some(c) = self
            .open
            .iter_mut()
            .find(|c| start <= c.end_ns && end >= c.start_ns)
        {
            let limit = c.first_ns + self.cfg.after_ns + MAX_EXTENSION_NS;
            c.end_ns = c.end_ns.max(end.min(limit));
            c.incidents.push(line);
            return Some(c.path.to_string_lossy().into_owned());
        }
        if let Some((_, _, path)) = self
            .recent
            .iter()
            .find(|(s, e, _)| ts_ns >= *s && ts_ns <= *e)
        {
            return Some(path.to_string_lossy().into_owned());
        }
        while self
            .started
            .front()
            .is_some_and(|&t| t + 60_000_000_000 <= now_ns)
        {
            self.started.pop_front();
        }
        if self.started.len() >= self.cfg.files_per_minute as usize {
            self.stats.not_written += 1;
            return None;
        }
        let path = self.name(kind, ts_ns)?;
        self.started.push_back(now_ns);
        let mut c = Capture {
            start_ns: start,
            end_ns: end,
            first_ns: ts_ns,
            path: path.clone(),
            incidents: vec![line],
            packets: Vec::new(),
            bytes: 0,
        };
        for p in self
            .ring
            .iter()
            .filter(|p| p.ts_ns >= start && p.ts_ns <= end)
        {
            c.bytes += size_of(p);
            c.packets.push(Arc::clone(p));
        }
        self.open.push(c);
        Some(path.to_string_lossy().into_owned())
    }

    /// `dnspath-20261130T232652.123Z-race-drop.pcapng` (a free name: `-2`, `-3`, … added).
    fn name(&mut self, kind: &str, ts_ns: u64) -> Option<PathBuf> {
        let when = files::strftime("%Y%m%dT%H%M%S%.3fZ", self.clock.epoch_ns(ts_ns)).ok()?;
        for n in 1..100 {
            let suffix = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            let path = self
                .cfg
                .dir
                .join(format!("dnspath-{when}-{kind}{suffix}.pcapng"));
            let taken = self.open.iter().any(|c| c.path == path) || path.exists();
            if !taken {
                return Some(path);
            }
        }
        self.stats.not_written += 1;
        None
    }

    /// Writes the files whose window is over: every packet before `released_before` has
    /// been released.
    pub fn tick(&mut self, released_before: u64) {
        let mut i = 0;
        while i < self.open.len() {
            if self.open.get(i).is_some_and(|c| c.end_ns < released_before) {
                let c = self.open.remove(i);
                self.write(c);
            } else {
                i += 1;
            }
        }
    }

    /// The end of the run: every file still collecting is written as it stands.
    pub fn finish(&mut self) {
        for c in std::mem::take(&mut self.open) {
            self.write(c);
        }
    }

    fn write(&mut self, mut c: Capture) {
        c.packets.sort_by_key(|p| p.ts_ns);
        let incidents = c.incidents.len() as u64;
        let mut comments = vec![format!(
            "dnspath flight recorder: {} incident(s); packets from {} to {}",
            c.incidents.len(),
            self.clock.wall(c.start_ns),
            self.clock.wall(c.end_ns)
        )];
        comments.append(&mut c.incidents);
        let result = files::create_private(&c.path)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                PcapngSink::new(
                    std::io::BufWriter::new(f),
                    self.clock,
                    self.snaplen.saturating_add(128),
                    self.names.clone(),
                    &comments,
                )
                .map_err(|e| e.to_string())
            })
            .and_then(|mut s| {
                for p in &c.packets {
                    s.write(p);
                }
                s.flush();
                s.failed().map_or(Ok(()), |e| Err(e.to_string()))
            });
        match result {
            Ok(()) => {
                self.stats.files += 1;
                self.recent
                    .push_back((c.start_ns, c.end_ns, c.path.clone()));
                if self.recent.len() > RECENT_FILES {
                    self.recent.pop_front();
                }
                self.trim_dir(&c.path);
            }
            Err(e) => {
                // Half a file is no evidence: gone, and its incidents counted.
                let _ = std::fs::remove_file(&c.path);
                self.stats.not_written += incidents;
                if self.stats.failed.is_none() {
                    eprintln!(
                        "dnspath: error: --record {}: {}; the trace goes on",
                        escape(&c.path.to_string_lossy()),
                        escape(&e)
                    );
                }
                self.stats.failed = Some(e);
            }
        }
    }

    /// Deletes our oldest files until DIR holds at most `dir_max_bytes` of them (never
    /// `newest`).
    fn trim_dir(&mut self, newest: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.cfg.dir) else {
            return;
        };
        let mut ours: Vec<(String, PathBuf, u64)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let size = e.metadata().ok()?.len();
                (name.starts_with("dnspath-") && name.ends_with(".pcapng"))
                    .then(|| (name, e.path(), size))
            })
            .collect();
        ours.sort();
        let mut total: u64 = ours.iter().map(|o| o.2).sum();
        for (_, path, size) in ours {
            if total <= self.cfg.dir_max_bytes {
                break;
            }
            if path == newest {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total = total.saturating_sub(size);
                    self.stats.files_deleted += 1;
                }
                Err(e) => log::warn!(
                    "--record: removing {}: {e}",
                    escape(&path.to_string_lossy())
                ),
            }
        }
    }
}

#[cfg(test)]
#[path = "recorder_tests.rs"]
mod tests;
