//! `dnspath analyze a.pcapng b.pcapng …`: one capture per node. Each node's capture goes
//! through stages of its own (decode, correlate, detect: what that node's agent would have
//! made of it), the files read together in capture time; the nodes' transactions then meet
//! in the join stage ([`super::join`]), where a query that crossed nodes becomes one
//! transaction. Every record names its node (`node`; text: `[node] `); the run's summary is
//! of them all, a joined query counted once.
use std::{
    cell::RefCell,
    io::{Read, Write},
    path::{Path, PathBuf},
    rc::Rc,
    sync::{Arc, RwLock},
};

use super::{
    join::NodeJoin, report_of, AnalyzeError, AnalyzeOptions, AnalyzeReport, BatchWriter,
    PortFilter, PortSet,
};
use crate::{
    decode::decoder::Decoder,
    event::SourceEvent,
    kallsyms::Kallsyms,
    names::Names,
    output::{
        otlp::ids::IdKey,
        record::{StatsRecord, TransactionRecord},
        sink::{Batch, Sink, Sinks},
        summarize::SummarySink,
        text::TextSink,
        writer::RecordsOut,
        Format, JsonSink, Record, RecordWriter,
    },
    pipeline::{Pipeline, PipelineConfig, TICK_NS},
    runner::{stop::StopPolicy, Runner, Tick},
    source::file::{netns_name_for, FileError, FileSource},
    time::Clock,
};

/// One node's capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCapture {
    pub node: String,
    pub path: PathBuf,
}

impl NodeCapture {
    /// `NAME=PATH`, or a path (its node: the file's stem). An argument with a `=` that is
    /// itself an existing file is a path.
    pub fn parse(arg: impl AsRef<std::ffi::OsStr>) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let arg = arg.as_ref();
        let bytes = arg.as_bytes();
        // A node name is text; the path after it may be any bytes (so may a whole path).
        let named = bytes.iter().position(|&b| b == b'=').and_then(|i| {
            let node = std::str::from_utf8(&bytes[..i]).ok()?;
            (!node.is_empty() && !Path::new(arg).exists()).then(|| Self {
                node: node.to_string(),
                path: PathBuf::from(std::ffi::OsStr::from_bytes(&bytes[i + 1..])),
            })
        });
        named.unwrap_or_else(|| Self {
            node: netns_name_for(Path::new(arg)),
            path: PathBuf::from(arg),
        })
    }
}

/// What a node's capture was, how far it was read.
struct Node<'a> {
    name: Arc<str>,
    source: FileSource<Box<dyn Read + Send>>,
    /// The node's stages, handing what they decide to `records` through `sinks`.
    runner: Runner,
    sinks: Sinks<'static>,
    policy: StopPolicy,
    /// The turn's event (one at a time: the nodes' files are read in capture time).
    events: Vec<SourceEvent>,
    ports: PortFilter<'a>,
    next: Option<SourceEvent>,
    /// The time of the last event read (events without one come at it).
    last_ts: u64,
    ended: bool,
    stopped_by: Option<FileError>,
    records: Rc<RefCell<Vec<Record>>>,
}

/// A node's one sink: what its runner decides waits in the node's records for [`route`].
struct Collect(Rc<RefCell<Vec<Record>>>);

impl Sink for Collect {
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        self.0.borrow_mut().extend_from_slice(batch.records);
        Ok(())
    }
    fn batch_owned(&mut self, records: &mut Vec<Record>, _batch: Batch<'_>) -> std::io::Result<()> {
        self.0.borrow_mut().append(records);
        Ok(())
    }
    fn finish(&mut self, _stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// The text or NDJSON writer, told each record's node (`None`: the whole run's).
enum Out {
    Json(JsonSink<BatchWriter>),
    Text(TextSink<BatchWriter>),
}

impl Out {
    fn write(&mut self, node: Option<&str>, r: &Record) -> std::io::Result<()> {
        match self {
            Out::Json(j) => {
                j.set_node(node);
                j.write(r)
            }
            Out::Text(t) => {
                t.set_node(node);
                t.write(r)
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Json(j) => j.flush(),
            Out::Text(t) => t.flush(),
        }
    }
}

/// Where the nodes' records go once decided (transactions once joined): the run's summary
/// counts them (with transactions: not `--view packets`), the writer shows what the view
/// and filters keep.
struct Shown {
    records: RecordsOut,
    summary: Option<SummarySink>,
    out: Out,
}

impl Shown {
    fn record(&mut self, node: &str, r: &Record, now_ns: u64) -> std::io::Result<()> {
        if let Some(s) = &mut self.summary {
            s.batch(Batch {
                records: std::slice::from_ref(r),
                sources: &[],
                packets_allowed: None,
                packet_records_held: 0,
                now_ns,
            })?;
        }
        if self.records.keep(r, &mut None) {
            self.out.write(Some(node), r)?;
        }
        Ok(())
    }

    /// The summary (text: on stderr; JSON: a record before the nodes' `stats`), then each
    /// node's `stats`.
    fn finish<'n>(
        &mut self,
        stats: impl Iterator<Item = (&'n str, &'n StatsRecord)>,
        now_ns: u64,
    ) -> std::io::Result<()> {
        if let Some(s) = &mut self.summary {
            let mut run = StatsRecord::default();
            s.finish(&mut run, now_ns)?;
            if let Some(summary) = run.summary {
                self.out.write(None, &Record::Summary(summary))?;
            }
        }
        for (node, stats) in stats {
            self.out
                .write(Some(node), &Record::Stats(Box::new(stats.clone())))?;
        }
        self.out.flush()
    }
}

/// What a run of several nodes' captures found.
#[derive(Debug)]
pub struct NodesReport {
    /// Each capture's, in the order given.
    pub nodes: Vec<AnalyzeReport>,
    /// Served halves joined to their client's half.
    pub joined: u64,
    /// Transactions written before their other halves could come, for the join's bound.
    pub written_early: u64,
}

/// Extra capture time a transaction waits for its other halves, beyond the timeout: the
/// correlator's retry and answer graces and the join's clock tolerance, rounded up.
const HOLD_AFTER_TIMEOUT_NS: u64 = 5_000_000_000;

/// Reads every node's capture (each up to its first damage), writes every record with its
/// node and the transactions joined across nodes, then the run's summary (with transactions:
/// JSON, a `summary` record; text, on stderr) and a `stats` record per node; a report per
/// node, in the order given.
pub fn analyze_nodes(
    opts: &AnalyzeOptions,
    captures: &[NodeCapture],
    out: Box<dyn Write + Send>,
) -> Result<NodesReport, AnalyzeError> {
    let clock = Clock::Epoch;
    let timeout_ns = u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX);
    let ports = PortSet::new(&opts.ports);
    let mut nodes = Vec::with_capacity(captures.len());
    for c in captures {
        // Namespace ids are per file: each node has its own names.
        let names = Arc::new(RwLock::new(Names::default()));
        let source = FileSource::open(&c.path, Arc::clone(&names))?;
        let decoder = Decoder::new(
            clock,
            Arc::clone(&names),
            Kallsyms::default(),
            Default::default(),
        );
        let pipeline = Pipeline::new(
            decoder,
            PipelineConfig {
                transactions: opts.view.transactions(),
                timeout_ns,
                shed_loops: false,
                node_netns: None,
            },
            clock,
        );
        let records = Rc::new(RefCell::new(Vec::new()));
        let mut sinks = Sinks::new();
        sinks.push(Box::new(Collect(Rc::clone(&records))));
        nodes.push(Node {
            name: Arc::from(c.node.as_str()),
            source,
            runner: Runner::new(pipeline, names, &sinks, 0),
            sinks,
            policy: StopPolicy::default(),
            events: Vec::with_capacity(1),
            ports: PortFilter::new(&ports),
            next: None,
            last_ts: 0,
            ended: false,
            stopped_by: None,
            records,
        });
    }
    let mut shown = Shown {
        records: RecordsOut::new(opts.view, opts.filter.clone()),
        summary: opts.view.transactions().then(|| {
            SummarySink::new(
                opts.format,
                opts.filter.clone(),
                Box::new(std::io::stderr()),
            )
        }),
        out: match opts.format {
            Format::Json => Out::Json(JsonSink::new(BatchWriter::new(out), Default::default())),
            Format::Text => Out::Text(TextSink::new(BatchWriter::new(out))),
        },
    };
    let mut join = NodeJoin::new(
        IdKey::default(),
        nodes.iter().map(|n| Arc::clone(&n.name)).collect(),
        timeout_ns.saturating_add(HOLD_AFTER_TIMEOUT_NS),
    );
    let mut joined = Vec::new();
    let mut now: u64 = 0;
    let mut last_tick: u64 = 0;
    loop {
        // The next event of every node that has one; the earliest of them goes first.
        for n in nodes.iter_mut().filter(|n| n.next.is_none() && !n.ended) {
            let ports = &mut n.ports;
            match n.source.next_event(|ip: &[u8]| ports.keep(ip)) {
                Ok(Some(e)) => n.next = Some(e),
                Ok(None) => n.ended = true,
                Err(e) => {
                    n.stopped_by = Some(e);
                    n.ended = true;
                }
            }
        }
        let ts_of = |n: &Node<'_>| match &n.next {
            Some(SourceEvent::Packet(p)) => p.ts_ns,
            Some(SourceEvent::Drop(d)) => d.ts_ns,
            _ => n.last_ts,
        };
        let Some(i) = (0..nodes.len())
            .filter(|&i| nodes.get(i).is_some_and(|n| n.next.is_some()))
            .min_by_key(|&i| nodes.get(i).map_or(u64::MAX, ts_of))
        else {
            break;
        };
        let Some(n) = nodes.get_mut(i) else { break };
        let ts = ts_of(n);
        n.last_ts = n.last_ts.max(ts);
        now = now.max(ts);
        if let Some(e) = n.next.take() {
            n.events.push(e);
            n.runner
                .turn(&mut n.events, Tick::No, &mut n.sinks, &mut n.policy, now)?;
        }
        if now.saturating_sub(last_tick) >= TICK_NS {
            for n in &mut nodes {
                n.runner.turn(
                    &mut n.events,
                    Tick::At(now),
                    &mut n.sinks,
                    &mut n.policy,
                    now,
                )?;
            }
            last_tick = now;
        }
        route(&mut nodes, &mut join, now, &mut shown, &mut joined)?;
        join.ready(Some(now), &mut joined);
        write_joined(&nodes, &mut joined, now, &mut shown)?;
    }
    // Every node's open transactions at once: the join pairs them across nodes.
    for n in &mut nodes {
        n.runner.finish(now, &mut n.sinks, &mut n.policy)?;
    }
    route(&mut nodes, &mut join, now, &mut shown, &mut joined)?;
    join.ready(None, &mut joined);
    write_joined(&nodes, &mut joined, now, &mut shown)?;
    let stats: Vec<StatsRecord> = nodes.iter().map(|n| n.runner.stats()).collect();
    shown.finish(nodes.iter().map(|n| &*n.name).zip(&stats), now)?;
    let mut reports = Vec::with_capacity(nodes.len());
    for (n, stats) in nodes.into_iter().zip(stats) {
        reports.push(report_of(&n.source, n.ports.skipped, stats, n.stopped_by));
    }
    Ok(NodesReport {
        nodes: reports,
        joined: join.joined,
        written_early: join.written_early,
    })
}

/// Each node's new records: transactions to the join stage, the rest written.
fn route(
    nodes: &mut [Node<'_>],
    join: &mut NodeJoin,
    now: u64,
    shown: &mut Shown,
    early: &mut Vec<(usize, TransactionRecord)>,
) -> Result<(), AnalyzeError> {
    for (i, n) in nodes.iter_mut().enumerate() {
        for r in n.records.borrow_mut().drain(..) {
            match r {
                Record::Transaction(t) => join.push(i, *t, now, early),
                r => shown.record(&n.name, &r, now)?,
            }
        }
    }
    Ok(())
}

fn write_joined(
    nodes: &[Node<'_>],
    joined: &mut Vec<(usize, TransactionRecord)>,
    now: u64,
    shown: &mut Shown,
) -> Result<(), AnalyzeError> {
    for (i, t) in joined.drain(..) {
        let name = nodes.get(i).map_or("", |n| &*n.name);
        shown.record(name, &Record::Transaction(Box::new(t)), now)?;
    }
    Ok(())
}

/// [`analyze_nodes`], then each capture's summary and warnings on stderr.
pub fn run_nodes(
    opts: AnalyzeOptions,
    captures: &[NodeCapture],
    out: Box<dyn Write + Send>,
) -> Result<Vec<StatsRecord>, AnalyzeError> {
    let report = analyze_nodes(&opts, captures, out)?;
    let mut stats = Vec::with_capacity(report.nodes.len());
    for (c, report) in captures.iter().zip(report.nodes) {
        let name = format!("{} (node {})", c.path.display(), c.node);
        for line in report.summary_lines(&name) {
            eprintln!("dnspath: {}", crate::output::escape(&line));
        }
        stats.push(report.stats);
    }
    eprintln!(
        "dnspath: {} served quer(ies) joined to their client's transaction on another node",
        report.joined
    );
    if report.written_early > 0 {
        eprintln!(
            "dnspath: warning: {} transaction(s) written before their other nodes' halves could join them (more than {} waiting)",
            report.written_early,
            super::join::MAX_HELD
        );
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_is_named_by_its_argument_or_its_file() {
        let c = NodeCapture::parse("node-a=/tmp/x/a.pcapng");
        assert_eq!(
            (c.node.as_str(), c.path.to_str()),
            ("node-a", Some("/tmp/x/a.pcapng"))
        );
        let c = NodeCapture::parse("/tmp/x/worker-2.pcapng");
        assert_eq!(
            (c.node.as_str(), c.path.to_str()),
            ("worker-2", Some("/tmp/x/worker-2.pcapng"))
        );
        // An existing file with `=` in its name is that file.
        let path = std::env::temp_dir().join(format!("dnspath-n={}.pcap", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let arg = path.to_str().unwrap();
        let c = NodeCapture::parse(arg);
        let _ = std::fs::remove_file(&path);
        assert_eq!(c.path.to_str(), Some(arg));
    }
}
