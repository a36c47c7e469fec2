//! `dnspath analyze`: a capture file through the same decode stage and sinks as a live trace.
//!
//! A file that ends early or is corrupt part-way is not a failure: what was read before the
//! damage is decoded and reported, and the damage is described ([`AnalyzeReport::stopped_by`]).
//! Only a file with no readable header at all is an error.
use std::{
    io::{self, Write},
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

mod join;
mod nodes;

pub use nodes::{analyze_nodes, run_nodes, NodeCapture, NodesReport};

use crate::{
    decode::{
        decoder::Decoder,
        frag::WatchedDatagrams,
        parse_ip,
        tunnel::{decapsulate, Decap},
        Transport,
    },
    event::SourceEvent,
    kallsyms::Kallsyms,
    names::{Names, SharedNames},
    output::{
        filter::Filter,
        record::StatsRecord,
        sink::{Sink, Sinks},
        summarize::SummarySink,
        text::TextSink,
        writer::{RecordsOut, WriterSink},
        Format, JsonSink, View,
    },
    pipeline::{Pipeline, PipelineConfig, TICK_NS},
    runner::{stop::StopPolicy, Runner, Tick},
    source::file::{CaptureFormat, FileError, FileProgress, FileSource, LinkSkips},
    time::Clock,
};

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("writing output: {0}")]
    Io(io::Error),
}

impl From<io::Error> for AnalyzeError {
    fn from(e: io::Error) -> Self {
        AnalyzeError::Io(e)
    }
}

#[derive(Clone, Debug)]
pub struct AnalyzeOptions {
    /// Capture file; `-` reads standard input.
    pub path: PathBuf,
    pub format: Format,
    pub view: View,
    /// Unanswered-query timeout of the correlate stage, in capture time.
    pub timeout: Duration,
    /// Decode only UDP/TCP packets from or to one of these ports; empty: every IP packet.
    pub ports: Vec<u16>,
    /// What is written (`--name`, `--failures`, …); every stage still sees everything.
    pub filter: Filter,
}

/// Packets read from the file that did not reach the decoder, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Link-layer reasons (not IP, cut inside the link header, unsupported link type,
    /// unreadable pcapng block); its `filtered` is the sum of the three below.
    pub link: LinkSkips,
    /// UDP/TCP with neither port in `--port`.
    pub other_port: u64,
    /// IP but neither UDP nor TCP (ICMP, ...), or a non-first IP fragment.
    pub not_udp_tcp: u64,
    /// IP or UDP/TCP headers (or a tunnel's) cut short or invalid, so the ports are unknown.
    pub unreadable_ip: u64,
}

impl Skipped {
    pub fn total(&self) -> u64 {
        self.link.total()
    }
}

/// Everything a run found, for the summary on stderr.
#[derive(Debug)]
pub struct AnalyzeReport {
    pub stats: StatsRecord,
    pub format: CaptureFormat,
    pub progress: FileProgress,
    pub skipped: Skipped,
    /// Link types in the file that are not read (their packets are in `skipped`).
    pub unsupported_linktypes: Vec<u32>,
    /// The first unreadable pcapng packet block, if any.
    pub first_bad_block: Option<String>,
    /// pcapng blocks read without some of their optional fields (lossily or ignored), and
    /// the first of them.
    pub repaired_blocks: (u64, Option<String>),
    /// Kernel drops read back from a file of `trace -w` (interface `dnspath/drops`).
    pub drops: u64,
    /// The first of those whose comment could not be read, and why.
    pub first_unreadable_drop: Option<String>,
    /// What ended reading before the end of the file; everything before it was decoded.
    pub stopped_by: Option<FileError>,
}

impl AnalyzeReport {
    /// Lines for stderr: what was read and skipped, then warnings.
    pub fn summary_lines(&self, name: &str) -> Vec<String> {
        let s = &self.skipped;
        let mut reasons = Vec::new();
        let mut reason = |n: u64, what: &str| {
            if n > 0 {
                reasons.push(format!("{n} {what}"));
            }
        };
        reason(s.other_port, "on other ports");
        reason(
            s.not_udp_tcp,
            "not UDP/TCP (or later IP fragments of datagrams not on a watched port)",
        );
        reason(s.unreadable_ip, "with unreadable IP/UDP/TCP headers");
        reason(s.link.not_ip, "not IP");
        reason(s.link.link_truncated, "cut inside the link-layer header");
        reason(s.link.unsupported_link, "of an unsupported link type");
        reason(s.link.bad_block, "in unreadable pcapng blocks");
        reason(
            s.link.unreadable_drops,
            "kernel drops recorded by dnspath trace -w whose comment could not be read",
        );
        let drops = if self.drops > 0 {
            format!(
                ", {} kernel drops recorded by dnspath trace -w read back as drops",
                self.drops
            )
        } else {
            String::new()
        };
        let mut lines = vec![format!(
            "{name} ({}): {} packets read, {} decoded as DNS traffic{drops}, {} skipped{}",
            self.format,
            self.progress.packets,
            self.stats.decode.packets,
            s.total(),
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", reasons.join(", "))
            }
        )];
        for lt in &self.unsupported_linktypes {
            lines.push(format!(
                "warning: link type {lt} is not supported (Ethernet, raw IP, Linux SLL/SLL2, BSD loopback are); its packets were skipped"
            ));
        }
        if let Some(first) = &self.first_bad_block {
            lines.push(format!(
                "warning: {} unreadable packet block(s) skipped; the first: {first}",
                s.link.bad_block
            ));
        }
        if let Some(first) = &self.first_unreadable_drop {
            lines.push(format!(
                "warning: {} kernel drop(s) with an unreadable comment skipped; the first: {first}",
                s.link.unreadable_drops
            ));
        }
        if let (n, Some(first)) = &self.repaired_blocks {
            lines.push(format!(
                "warning: {n} block(s) with unreadable optional fields read without them; the first: {first}"
            ));
        }
        if let Some(e) = &self.stopped_by {
            lines.push(format!(
                "warning: {e}; stopped there: the {} packets before it were analyzed",
                self.progress.packets
            ));
        }
        lines
    }
}

/// Collects output in memory and hands it to `out` in large writes. The sinks serialize
/// with many small writes; behind `Box<dyn Write>` each is a dynamic call into a
/// `BufWriter`, which dominated the time per record. A concrete type lets them inline.
struct BatchWriter {
    buf: Vec<u8>,
    out: Box<dyn Write + Send>,
}

const BATCH: usize = 1 << 16;

impl BatchWriter {
    fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            buf: Vec::with_capacity(BATCH * 2),
            out,
        }
    }
}

impl Write for BatchWriter {
    #[inline]
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.write_all(b)?;
        Ok(b.len())
    }

    #[inline]
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= BATCH {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        self.out.flush()
    }
}

/// Records handed to the sinks at a time.
const RECORDS_A_BATCH: usize = 256;

/// 65536-bit set of ports.
struct PortSet(Option<Box<[u64; 1024]>>);

impl PortSet {
    fn new(ports: &[u16]) -> Self {
        if ports.is_empty() {
            return PortSet(None);
        }
        let mut bits = Box::new([0u64; 1024]);
        for &p in ports {
            if let Some(w) = bits.get_mut(usize::from(p >> 6)) {
                *w |= 1 << (p & 63);
            }
        }
        PortSet(Some(bits))
    }

    fn contains(bits: &[u64; 1024], p: u16) -> bool {
        bits.get(usize::from(p >> 6))
            .is_some_and(|w| w & (1 << (p & 63)) != 0)
    }
}

/// Which packets reach the decoder (`--port`), and what the others were.
struct PortFilter<'a> {
    ports: &'a PortSet,
    skipped: Skipped,
    fragmented: WatchedDatagrams,
}

impl<'a> PortFilter<'a> {
    fn new(ports: &'a PortSet) -> Self {
        Self {
            ports,
            skipped: Skipped::default(),
            fragmented: WatchedDatagrams::default(),
        }
    }

    fn keep(&mut self, ip: &[u8]) -> bool {
        let Some(bits) = &self.ports.0 else {
            return true;
        };
        let skipped = &mut self.skipped;
        // A tunnel's packet is kept for the ports of the packet inside it.
        let ip = match decapsulate(ip) {
            Ok(Decap::Plain) => ip,
            Ok(Decap::Inner { offset, .. }) => ip.get(offset..).unwrap_or_default(),
            Ok(Decap::NotIp(_)) => {
                skipped.not_udp_tcp += 1;
                return false;
            }
            Err(_) => {
                skipped.unreadable_ip += 1;
                return false;
            }
        };
        match parse_ip(ip) {
            Ok(p) => match p.transport {
                Transport::Udp { sport, dport, .. } | Transport::Tcp { sport, dport, .. } => {
                    let hit = PortSet::contains(bits, sport) || PortSet::contains(bits, dport);
                    skipped.other_port += u64::from(!hit);
                    if hit {
                        self.fragmented.note_kept(ip);
                    }
                    hit
                }
                // Later fragments of a datagram on a watched port: reassembled by the decoder.
                Transport::Other { .. } if self.fragmented.is_later_fragment(ip) => true,
                Transport::Other { .. } => {
                    skipped.not_udp_tcp += 1;
                    false
                }
            },
            Err(_) => {
                skipped.unreadable_ip += 1;
                false
            }
        }
    }
}

/// Reads the whole file (or up to its first damage), writes a record per DNS message and
/// the final `stats` record to `out`, and reports what happened; writes nothing to stderr.
pub fn analyze(
    opts: &AnalyzeOptions,
    out: Box<dyn Write + Send>,
) -> Result<AnalyzeReport, AnalyzeError> {
    let names = Arc::new(RwLock::new(Names::default()));
    let source = FileSource::open(&opts.path, Arc::clone(&names))?;
    analyze_source(source, names, opts, out)
}

/// [`analyze`] of a capture already opened (`opts.path` is not read): the fuzz targets
/// hand it bytes from memory.
pub fn analyze_source<R: std::io::Read>(
    mut source: FileSource<R>,
    names: SharedNames,
    opts: &AnalyzeOptions,
    out: Box<dyn Write + Send>,
) -> Result<AnalyzeReport, AnalyzeError> {
    let clock = Clock::Epoch;
    let decoder = Decoder::new(
        clock,
        Arc::clone(&names),
        Kallsyms::default(),
        Default::default(),
    );
    // Without conntrack, hops across DNAT are joined by the fallback method.
    let pipeline = Pipeline::new(
        decoder,
        PipelineConfig {
            transactions: opts.view.transactions(),
            timeout_ns: u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX),
            // A file is not read at line rate: every packet is decoded.
            shed_loops: false,
            node_netns: None,
        },
        clock,
    );
    // The records shown, as text or NDJSON, after the run's summary (with transactions).
    let shown = RecordsOut::new(opts.view, opts.filter.clone());
    let writer: Box<dyn Sink> = match opts.format {
        Format::Json => Box::new(WriterSink::new(
            shown,
            JsonSink::new(BatchWriter::new(out), Default::default()),
        )),
        Format::Text => Box::new(WriterSink::new(shown, TextSink::new(BatchWriter::new(out)))),
    };
    let mut sinks = Sinks::new();
    if opts.view.transactions() {
        sinks.push(Box::new(SummarySink::new(
            opts.format,
            opts.filter.clone(),
            Box::new(std::io::stderr()),
        )));
    }
    sinks.push(writer);
    // Handed over in batches: the same output, the list's calls shared by many packets.
    let mut runner = Runner::new(pipeline, names, &sinks, RECORDS_A_BATCH);
    let mut policy = StopPolicy::default();

    let ports = PortSet::new(&opts.ports);
    let mut filter = PortFilter::new(&ports);
    let mut keep = |ip: &[u8]| filter.keep(ip);

    let mut events: Vec<SourceEvent> = Vec::with_capacity(1);
    let mut stopped_by = None;
    // Capture time: the latest timestamp so far (files are mostly, not strictly, in order).
    let mut now: u64 = 0;
    let mut last_tick: u64 = 0;
    loop {
        let event = match source.next_event(&mut keep) {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                stopped_by = Some(e);
                break;
            }
        };
        let ts_ns = match &event {
            SourceEvent::Packet(p) => p.ts_ns,
            SourceEvent::Drop(d) => d.ts_ns,
            _ => now,
        };
        now = now.max(ts_ns);
        events.push(event);
        let tick = if now.saturating_sub(last_tick) >= TICK_NS {
            last_tick = now;
            Tick::At(now)
        } else {
            Tick::No
        };
        runner.turn(&mut events, tick, &mut sinks, &mut policy, now)?;
    }
    runner.finish(now, &mut sinks, &mut policy)?;
    let mut stats = runner.stats();
    sinks.finish(&mut stats, now)?;
    Ok(report_of(&source, filter.skipped, stats, stopped_by))
}

/// What a run found in `source`, once read.
fn report_of<R: std::io::Read>(
    source: &FileSource<R>,
    mut skipped: Skipped,
    stats: StatsRecord,
    stopped_by: Option<FileError>,
) -> AnalyzeReport {
    skipped.link = source.skips();
    AnalyzeReport {
        stats,
        format: source.format(),
        progress: source.progress(),
        skipped,
        unsupported_linktypes: source.unsupported_linktypes().to_vec(),
        first_bad_block: source.first_bad_block().map(str::to_string),
        repaired_blocks: {
            let (n, first) = source.repaired_blocks();
            (n, first.map(str::to_string))
        },
        drops: source.drops(),
        first_unreadable_drop: source.first_unreadable_drop().map(str::to_string),
        stopped_by,
    }
}

/// [`analyze`], then the summary and any warning on stderr. A file damaged part-way is not
/// an error (see the module doc); one that is not a capture at all is.
pub fn run(opts: AnalyzeOptions, out: Box<dyn Write + Send>) -> Result<StatsRecord, AnalyzeError> {
    let report = analyze(&opts, out)?;
    let name = if opts.path.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        opts.path.display().to_string()
    };
    // The file's name and what it holds are not ours: escaped, as on stdout.
    for line in report.summary_lines(&name) {
        eprintln!("dnspath: {}", crate::output::escape(&line));
    }
    Ok(report.stats)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::output::filter::FilterSpec;

    /// Collects what the sink writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let total = (28 + payload.len()) as u16;
        let mut p = vec![
            0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    /// `a.test. A IN`, id 0x1234, RD.
    fn query() -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(b"\x01a\x04test\x00\x00\x01\x00\x01");
        m
    }

    /// A raw-IP (linktype 101) pcap of `frames`.
    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        use pcap_file::{
            pcap::{PcapHeader, PcapPacket, PcapWriter},
            DataLink, Endianness,
        };
        let header = PcapHeader {
            datalink: DataLink::RAW,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
        for (i, frame) in frames.iter().enumerate() {
            let ts = Duration::from_secs(1_700_000_000 + i as u64);
            w.write_packet(&PcapPacket::new(ts, frame.len() as u32, frame))
                .unwrap();
        }
        w.into_writer()
    }

    fn run_on(bytes: &[u8], ports: &[u16], view: View) -> (AnalyzeReport, Vec<serde_json::Value>) {
        run_filtered(bytes, ports, view, Filter::default())
    }

    fn run_filtered(
        bytes: &[u8],
        ports: &[u16],
        view: View,
        filter: Filter,
    ) -> (AnalyzeReport, Vec<serde_json::Value>) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "dnspath-analyze-unit-{}-{n}.pcap",
            std::process::id()
        ));
        std::fs::write(&path, bytes).unwrap();
        let out = Captured::default();
        let opts = AnalyzeOptions {
            path: path.clone(),
            format: Format::Json,
            view,
            timeout: Duration::from_secs(5),
            ports: ports.to_vec(),
            filter,
        };
        let report = analyze(&opts, Box::new(out.clone()));
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let recs = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (report.unwrap(), recs)
    }

    /// A question for `name` (one label under `test.`) of type `qtype`, id `id`; with
    /// `rcode`, its response (from the server back to the client).
    fn message(id: u16, label: &[u8], qtype: u16, rcode: Option<u8>) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        match rcode {
            Some(rc) => m.extend_from_slice(&[0x81, 0x80 | rc]),
            None => m.extend_from_slice(&[1, 0]),
        }
        m.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        m.push(label.len() as u8);
        m.extend_from_slice(label);
        m.extend_from_slice(b"\x04test\x00");
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&[0, 1]);
        let mut p = if rcode.is_some() {
            udp(53, 40000 + id, &m)
        } else {
            udp(40000 + id, 53, &m)
        };
        if rcode.is_some() {
            let (src, dst) = ([10, 0, 0, 2], [10, 0, 0, 1]);
            p[12..16].copy_from_slice(&src);
            p[16..20].copy_from_slice(&dst);
        }
        p
    }

    #[test]
    fn filters_select_records_and_stats_count_everything() {
        let file = pcap(&[
            message(1, b"a", 1, None),
            message(1, b"a", 1, Some(2)), // SERVFAIL
            message(2, b"B", 28, None),
            message(2, b"B", 28, Some(0)),
            message(3, b"c", 1, None),
            message(3, b"c", 1, Some(3)), // NXDOMAIN
        ]);
        let names = |recs: &[serde_json::Value]| -> Vec<String> {
            recs.iter()
                .filter(|r| r["type"] != "stats" && r["type"] != "summary")
                .map(|r| {
                    let q = if r["type"] == "packet" {
                        &r["dns"]["questions"][0]["name"]
                    } else {
                        &r["question"]["name"]
                    };
                    format!("{} {}", r["type"].as_str().unwrap(), q.as_str().unwrap())
                })
                .collect()
        };
        let filter = |f: &dyn Fn(&mut FilterSpec)| {
            let mut spec = FilterSpec::default();
            f(&mut spec);
            Filter::new(&spec).unwrap()
        };
        let stats = |recs: &[serde_json::Value]| {
            recs.iter().rfind(|r| r["type"] == "stats").unwrap()["packets"].clone()
        };

        let (_, recs) = run_filtered(&file, &[53], View::Both, filter(&|s| s.failures = true));
        assert_eq!(names(&recs), ["packet a.test.", "transaction a.test."]);
        assert_eq!(stats(&recs), 6);

        let (_, recs) = run_filtered(
            &file,
            &[53],
            View::Both,
            filter(&|s| s.names = vec!["b.TEST".into()]),
        );
        assert_eq!(
            names(&recs),
            ["packet B.test.", "packet B.test.", "transaction b.test."]
        );
        assert_eq!(stats(&recs), 6);

        let (_, recs) = run_filtered(
            &file,
            &[53],
            View::Both,
            filter(&|s| {
                s.rcodes = vec!["NXDOMAIN".into()];
                s.qtypes = vec!["A".into()];
            }),
        );
        assert_eq!(names(&recs), ["packet c.test.", "transaction c.test."]);
        assert_eq!(stats(&recs), 6);
    }

    #[test]
    fn port_filter_counts_what_it_skips() {
        let mut icmp = udp(0, 0, &[]);
        icmp[9] = 1;
        let frames = vec![
            udp(40000, 53, &query()),
            udp(40000, 9, b"x"),
            icmp,
            vec![0x45, 0],
        ];
        let (report, recs) = run_on(&pcap(&frames), &[53], View::Packets);
        assert_eq!(report.progress.packets, 4);
        assert_eq!(report.stats.decode.packets, 1);
        assert_eq!(
            (
                report.skipped.other_port,
                report.skipped.not_udp_tcp,
                report.skipped.unreadable_ip
            ),
            (1, 1, 1)
        );
        assert!(report.stopped_by.is_none());
        let p = &recs[0];
        assert_eq!(p["type"], "packet");
        assert_eq!(p["src"], "10.0.0.1:40000");
        assert_eq!(p["dns"]["questions"][0]["name"], "a.test.");
        assert_eq!(p["ifname"], "if0");
        assert!(p["netns"]
            .as_str()
            .unwrap()
            .starts_with("dnspath-analyze-unit-"));
        assert_eq!(p["time"], "2023-11-14T22:13:20.000000Z");
        assert_eq!(recs.last().unwrap()["type"], "stats");
        let summary = report.summary_lines("f.pcap").join("\n");
        assert!(
            summary
                .contains("4 packets read, 1 decoded as DNS traffic, 3 skipped (1 on other ports"),
            "{summary}"
        );

        // No ports: everything IP reaches the decoder.
        let (all, _) = run_on(&pcap(&frames), &[], View::Packets);
        assert_eq!(all.stats.decode.packets, 4);
    }

    #[test]
    fn a_cut_file_is_reported_with_what_came_before() {
        let frames = vec![udp(40000, 53, &query()), udp(40001, 53, &query())];
        let bytes = pcap(&frames);
        let (report, recs) = run_on(&bytes[..bytes.len() - 3], &[53], View::Both);
        assert_eq!(report.stats.decode.packets, 1);
        let e = report.stopped_by.as_ref().unwrap();
        assert!(e.to_string().contains("packet record 2"), "{e}");
        let summary = report.summary_lines("f.pcap");
        assert!(
            summary.last().unwrap().starts_with("warning: "),
            "{summary:?}"
        );
        // The unanswered query is still reported, as cut short by the end of the capture.
        assert!(recs.iter().any(|r| r["type"] == "transaction"), "{recs:?}");
        assert_eq!(recs.last().unwrap()["type"], "stats");
    }
}
