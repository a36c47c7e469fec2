//! `dnspath trace`: the live run: load, attach, read, decode, write, detach.
use std::{
    io::Write,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, RwLock,
    },
    time::Duration,
};

use tokio::signal::unix::{signal, SignalKind};

use crate::{
    correlate::loops::LoopState,
    decode::decoder::Decoder,
    event::{KernelCounters, KernelSetup, ShedChange, SourceEvent},
    kernel::{
        attach::{AttachSpec, Attacher, Names, SharedNames},
        btf::KernelBtf,
        kallsyms::Kallsyms,
        netns,
        shed::Shedder,
        KernelError, ProbeOptions, Probes,
    },
    output::{self, filter::Filter, pcapng::PcapngSink, record::StatsRecord, Format, Record, View},
    pipeline::{Pipeline, PipelineConfig},
    source::live::LiveSource,
    time::Clock,
};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Kernel(KernelError),
    /// `setns(2)` refused: entering another network namespace takes CAP_SYS_ADMIN.
    #[error("entering another network namespace needs CAP_SYS_ADMIN; run dnspath as root ({0})")]
    NetnsPermission(String),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    #[error("-w {0}")]
    Pcapng(String),
}

impl From<KernelError> for TraceError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::Netns(msg) if is_setns_eperm(&msg) => TraceError::NetnsPermission(msg),
            e => TraceError::Kernel(e),
        }
    }
}

/// Whether a namespace error is `setns(2)` failing with EPERM (nix spells it
/// `EPERM: Operation not permitted`): the capability is missing, not the namespace.
pub fn is_setns_eperm(msg: &str) -> bool {
    msg.starts_with("setns ") && msg.contains("EPERM") && !msg.contains("CAP_SYS_ADMIN")
}

#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub attach: AttachSpec,
    pub ports: Vec<u16>,
    pub snaplen: u32,
    pub format: Format,
    pub view: View,
    /// Unanswered-query timeout of the correlate stage.
    pub timeout: Duration,
    pub duration: Option<Duration>,
    /// Stop after this many packet records.
    pub count: Option<u64>,
    pub drops: bool,
    /// Stop as soon as a forwarding loop is reported.
    pub until_loop: bool,
    /// `-w FILE`: every captured packet and drop also into this pcapng file (`-` for
    /// standard output).
    pub write: Option<std::path::PathBuf>,
    /// What is written (`--pod`, `--name`, …); every stage still sees everything.
    pub filter: Filter,
}

/// The `-w` file, created 0600 (packets are private).
fn pcapng_sink(
    path: &std::path::Path,
    snaplen: u32,
    clock: Clock,
    names: crate::kernel::attach::SharedNames,
) -> Result<PcapngSink<Box<dyn Write + Send>>, TraceError> {
    let out: Box<dyn Write + Send> = if path.as_os_str() == "-" {
        Box::new(std::io::BufWriter::new(std::io::stdout()))
    } else {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| TraceError::Pcapng(format!("{}: {e}", path.display())))?;
        Box::new(std::io::BufWriter::new(f))
    };
    // Headers (up to 60 + 8 bytes of IPv6 and UDP, or 60 of TCP) plus the DNS snaplen.
    PcapngSink::new(out, clock, snaplen.saturating_add(128), names)
        .map_err(|e| TraceError::Pcapng(format!("{}: {e}", path.display())))
}

/// Pushes `events` through the pipeline; with a `-w` file, each packet and drop also goes
/// there, with what the decoder made of it.
fn push_events(
    events: &mut Vec<SourceEvent>,
    pipeline: &mut Pipeline,
    records: &mut Vec<Record>,
    pcap: &mut Option<PcapngSink<Box<dyn Write + Send>>>,
) {
    let Some(w) = pcap.as_mut() else {
        for ev in events.drain(..) {
            pipeline.push(ev, records);
        }
        return;
    };
    for ev in events.drain(..) {
        let from = records.len();
        match ev {
            SourceEvent::Packet(p) => {
                pipeline.push(SourceEvent::Packet(p.clone()), records);
                let made: Vec<&output::record::PacketRecord> = records
                    .get(from..)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|r| match r {
                        Record::Packet(pr) => Some(pr),
                        _ => None,
                    })
                    .collect();
                w.packet(&p, &made);
            }
            SourceEvent::Drop(d) => {
                pipeline.push(SourceEvent::Drop(d.clone()), records);
                // Drops in namespaces not traced make no record and stay out of the file.
                if let Some(r) =
                    records
                        .get(from..)
                        .unwrap_or_default()
                        .iter()
                        .find_map(|r| match r {
                            Record::Drop(dr) => Some(dr),
                            _ => None,
                        })
                {
                    w.drop(&d, r);
                }
            }
            ev => pipeline.push(ev, records),
        }
    }
}

/// How a trace ended.
#[derive(Clone, Debug)]
pub struct TraceSummary {
    pub stats: StatsRecord,
    /// A forwarding loop was reported (`--until loop` stops there).
    pub loop_found: bool,
    /// The reader of the output went away (`dnspath trace | head`): the run stopped there,
    /// and `stats` was not written.
    pub output_closed: bool,
}

fn is_broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Where a live run's records go: `trace` writes them ([`TraceWriter`]), the agent counts
/// them and reports what people act on.
pub trait LiveSink {
    /// Attached: what this kernel gave.
    fn started(&mut self, _setup: &KernelSetup, _now_ns: u64) {}
    /// Each turn of the run loop (at least every 50 ms): the records decided since the last
    /// turn, to take. Returns whether the run should stop now.
    fn batch(&mut self, records: &mut Vec<Record>, now_ns: u64) -> std::io::Result<bool>;
    /// About once a second: the running totals.
    fn periodic(&mut self, _stats: &StatsRecord, _now_ns: u64) {}
    /// The run is over: its last records went to [`LiveSink::batch`]; these are the final
    /// totals.
    fn finish(&mut self, stats: &StatsRecord, now_ns: u64) -> std::io::Result<()>;
    /// `--count` was reached: the ring buffer's rest is left unread.
    fn count_reached(&self) -> bool {
        false
    }
    /// A forwarding loop was reported (`--until loop`).
    fn loop_found(&self) -> bool {
        false
    }
    /// Packet records decided after a `--count` stop and not written.
    fn not_written(&self) -> u64 {
        0
    }
}

/// `trace`'s sink: records written as text or NDJSON, `--count` and `--until loop` applied.
pub struct TraceWriter {
    writer: BatchWriter,
    sink: Box<dyn output::Sink + Send>,
}

impl TraceWriter {
    pub fn new(opts: &TraceOptions, out: Box<dyn Write + Send>) -> Self {
        Self {
            writer: BatchWriter::new(opts),
            sink: output::sink(opts.format, out),
        }
    }
}

impl LiveSink for TraceWriter {
    fn batch(&mut self, records: &mut Vec<Record>, _now_ns: u64) -> std::io::Result<bool> {
        self.writer.write(records, self.sink.as_mut())
    }
    fn finish(&mut self, stats: &StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        self.sink.write(&Record::Stats(stats.clone()))?;
        self.sink.flush()
    }
    fn count_reached(&self) -> bool {
        self.writer.count_reached()
    }
    fn loop_found(&self) -> bool {
        self.writer.loop_found
    }
    fn not_written(&self) -> u64 {
        self.writer.not_written
    }
}

/// [`run_live`] with records written to `out` as `opts` says.
pub async fn run(
    opts: TraceOptions,
    out: Box<dyn Write + Send>,
) -> Result<TraceSummary, TraceError> {
    let mut sink = TraceWriter::new(&opts, out);
    run_live(opts, &mut sink).await
}

/// Runs until a signal (SIGINT, SIGTERM, SIGHUP), `duration`, the sink's stop (`--count`,
/// `--until loop`), or the output's reader going away; returns the final stats. Every way
/// out, errors included, detaches and drops the probes (which removes their pin directory).
pub async fn run_live(
    opts: TraceOptions,
    sink: &mut dyn LiveSink,
) -> Result<TraceSummary, TraceError> {
    // Handlers first: a signal while loading or attaching must not kill us with the
    // programs pinned; it is seen by the run loop's first turn.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let probes = Probes::load(&ProbeOptions {
        ports: opts.ports.clone(),
        snaplen: opts.snaplen,
        drops: opts.drops,
    })?;
    let probes = Arc::new(Mutex::new(probes));
    let ring = probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .take_events()?;

    let names = Arc::new(RwLock::new(Names::default()));
    let mut attacher = Attacher::new(Arc::clone(&probes), opts.attach.clone(), Arc::clone(&names));
    attacher.scan()?;
    attacher.require_some()?;
    let attached = attacher.attached_count();
    let setup = probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .setup
        .clone();
    eprintln!("dnspath: {}", setup_line(&setup));
    let reasons = if opts.drops {
        KernelBtf::load()
            .map(|b| b.drop_reasons())
            .unwrap_or_default()
    } else {
        Default::default()
    };
    // Whatever can fail comes before the watcher thread, which holds the probes until it
    // is stopped and joined.
    let mut source = LiveSource::new(ring)?;
    let confirm_hook = probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .confirm_hook;
    let ports: Vec<String> = opts.ports.iter().map(u16::to_string).collect();
    eprintln!(
        "dnspath: tracing {attached} interface(s){}, ports {}{}; Ctrl-C to stop",
        if opts.attach.all_netns {
            " in all network namespaces"
        } else {
            ""
        },
        ports.join(","),
        if opts.drops {
            ", with kernel drops"
        } else {
            ""
        }
    );

    let clock = Clock::boot();
    let mut pcap = match &opts.write {
        Some(path) => Some(pcapng_sink(path, opts.snaplen, clock, Arc::clone(&names))?),
        None => None,
    };
    sink.started(&setup, crate::time::boottime_ns());
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = attacher.spawn(Arc::clone(&stop));
    // Conntrack of the namespaces where DNAT happens, for joining hops across NAT.
    let (ct_tx, ct_rx) = std::sync::mpsc::channel::<SourceEvent>();
    let ct_watchers = if opts.view.transactions() {
        start_conntrack(&opts, &ct_tx, &stop)
    } else {
        Vec::new()
    };
    drop(ct_tx);

    let output_names = Arc::clone(&names);
    let mut decoder = Decoder::new(clock, names, Kallsyms::load(), reasons);
    decoder.set_confirm_hook(confirm_hook);
    let mut pipeline = Pipeline::new(
        decoder,
        PipelineConfig {
            transactions: opts.view.transactions(),
            timeout_ns: u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX),
            shed_loops: true,
        },
        clock,
    );
    pipeline.enable_kernel_shedding();
    let mut shedder = Shedder::default();
    let mut shed_changes: Vec<ShedChange> = Vec::new();
    let deadline = async {
        match opts.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut ticks: u64 = 0;

    let mut events: Vec<SourceEvent> = Vec::new();
    let mut records: Vec<Record> = Vec::new();
    let refresh_counters = |pipeline: &mut Pipeline| {
        if let Ok(p) = probes.lock() {
            if let Ok(c) = p.counters() {
                pipeline.set_kernel_counters(KernelCounters::from_array(&c));
            }
        }
    };

    // From here on, nothing returns before the watchers are stopped and joined.
    let mut failure: Option<TraceError> = None;
    let mut output_closed = false;
    // Why the run ended, for `stats.stopped_by`.
    let mut stopped_by = "error";
    'run: loop {
        let mut ticked = false;
        tokio::select! {
            r = source.next_batch(&mut events) => {
                if let Err(e) = r {
                    failure = Some(e.into());
                    break 'run;
                }
            }
            _ = sigint.recv() => { stopped_by = "SIGINT"; break 'run }
            _ = sigterm.recv() => { stopped_by = "SIGTERM"; break 'run }
            _ = sighup.recv() => { stopped_by = "SIGHUP"; break 'run }
            _ = &mut deadline => { stopped_by = "duration"; break 'run }
            _ = tick.tick() => {
                ticked = true;
                ticks += 1;
                if ticks.is_multiple_of(20) {
                    refresh_counters(&mut pipeline);
                    sink.periodic(&pipeline.stats(), clock.now_ns());
                }
            }
        }
        // Conntrack first: the batch's packets may have been NATed by these entries.
        while let Ok(ev) = ct_rx.try_recv() {
            pipeline.push(ev, &mut records);
        }
        push_events(&mut events, &mut pipeline, &mut records, &mut pcap);
        pipeline.tick(clock.now_ns(), &mut records);
        pipeline.take_shed_changes(&mut shed_changes);
        if ticked || !shed_changes.is_empty() {
            if let Ok(mut p) = probes.lock() {
                shedder.apply(&mut p, &mut shed_changes);
                if ticked {
                    let now = clock.now_ns();
                    shedder.poll(&mut p, |q, n| pipeline.kernel_shed(q, n, now));
                }
            }
        }
        // The whole batch is written even when it ends the run: what it holds was decided
        // before the stop.
        annotate_pods(&mut records, &output_names);
        match sink.batch(&mut records, clock.now_ns()) {
            Ok(false) => {}
            Ok(true) => {
                stopped_by = if sink.count_reached() {
                    "count"
                } else {
                    "loop"
                };
                break 'run;
            }
            Err(e) if is_broken_pipe(&e) => {
                output_closed = true;
                stopped_by = "output closed";
                break 'run;
            }
            Err(e) => {
                failure = Some(e.into());
                break 'run;
            }
        }
    }

    stop.store(true, Ordering::Relaxed);
    let (warnings, attach_failures) = watcher.join().unwrap_or_default();
    let mut ct_lost = 0;
    for w in ct_watchers {
        if let Ok(summary) = w.join() {
            ct_lost += summary.lost;
            if let Some(e) = summary.error {
                log::warn!("conntrack watcher: {e}");
            }
        }
    }
    if ct_lost > 0 {
        log::warn!("conntrack: {ct_lost} events lost (socket overruns); some hops may be joined by the fallback method");
    }
    for w in warnings {
        log::debug!("{w}");
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let loop_found = sink.loop_found();
    if output_closed {
        return Ok(TraceSummary {
            stats: pipeline.stats(),
            loop_found,
            output_closed,
        });
    }
    // What arrived before detaching still counts, unless `--count` was reached: then the
    // rest stays unread (counted in `stats.unread`).
    if !sink.count_reached() {
        source.drain(&mut events);
        while let Ok(ev) = ct_rx.try_recv() {
            pipeline.push(ev, &mut records);
        }
        push_events(&mut events, &mut pipeline, &mut records, &mut pcap);
    }
    if let Ok(mut p) = probes.lock() {
        let now = clock.now_ns();
        shedder.finish(&mut p, |q, n| pipeline.kernel_shed(q, n, now));
    }
    pipeline.finish(clock.now_ns(), &mut records);
    if let Some(w) = pcap.as_mut() {
        w.flush();
        let (p, d) = w.written();
        match w.failed() {
            None => eprintln!("dnspath: wrote {p} packets and {d} drops to the pcapng file"),
            Some(why) => eprintln!(
                "dnspath: the pcapng file stopped after {p} packets and {d} drops: {}",
                output::escape(why)
            ),
        }
    }
    annotate_pods(&mut records, &output_names);
    let end = sink.batch(&mut records, clock.now_ns());
    let loop_found = sink.loop_found();
    refresh_counters(&mut pipeline);
    let mut stats = pipeline.stats();
    stats.not_written = sink.not_written();
    stats.stopped_by = Some(stopped_by.to_string());
    if let Some(k) = stats.kernel.as_mut() {
        // Matched by the kernel, neither read nor lost: still queued when the run stopped.
        stats.unread = k.counters.packets_matched.saturating_sub(
            stats
                .packets
                .saturating_add(stats.lost)
                .saturating_add(k.counters.packets_shed),
        );
        let mut setup = setup;
        setup.attach_failures = attach_failures;
        k.setup = Some(setup);
    }
    match end.and_then(|_| sink.finish(&stats, clock.now_ns())) {
        Ok(()) => {}
        Err(e) if is_broken_pipe(&e) => output_closed = true,
        Err(e) => return Err(e.into()),
    }
    Ok(TraceSummary {
        stats,
        loop_found,
        output_closed,
    })
}

/// Writes each batch of records and decides when the run stops: `--count` limits the packet
/// records, `--until loop` stops at the first detected loop. A stop ends the run after the
/// batch it happened in: the transactions, drops, races and loops of that batch (decided
/// before the stop) are written all the same; only packets beyond `--count` are not.
struct BatchWriter {
    count: Option<u64>,
    until_loop: bool,
    show_packets: bool,
    /// Packet records counted against `count` (written, or hidden by the view).
    packets_out: u64,
    /// Packet records decided after `count` was reached (in the batch of the stop, or
    /// unfinished TCP messages reported at the end): counted, not written.
    not_written: u64,
    loop_found: bool,
    filter: Filter,
}

impl BatchWriter {
    fn new(opts: &TraceOptions) -> Self {
        Self {
            count: opts.count,
            until_loop: opts.until_loop,
            show_packets: opts.view.packets(),
            packets_out: 0,
            not_written: 0,
            loop_found: false,
            filter: opts.filter.clone(),
        }
    }

    fn count_reached(&self) -> bool {
        self.count.is_some_and(|n| self.packets_out >= n)
    }

    /// Writes (and empties) `records`; returns whether the run should stop now.
    fn write(
        &mut self,
        records: &mut Vec<Record>,
        sink: &mut (dyn output::Sink + Send),
    ) -> std::io::Result<bool> {
        for r in records.drain(..) {
            if matches!(r, Record::Packet(_)) {
                if self.count_reached() {
                    self.not_written += 1;
                    continue;
                }
                self.packets_out += 1;
                if !self.show_packets {
                    continue;
                }
            }
            if let Record::Loop(l) = &r {
                self.loop_found |= l.state == LoopState::Detected;
            }
            if !self.filter.keep(&r) {
                continue;
            }
            sink.write(&r)?;
        }
        sink.flush()?;
        Ok(self.count_reached() || (self.until_loop && self.loop_found))
    }
}

/// Names the pods of every place in `records` (one map lookup each), for every sink. Under
/// the names lock only as long as the lookups take.
fn annotate_pods(records: &mut [Record], names: &SharedNames) {
    if records.is_empty() {
        return;
    }
    if let Ok(names) = names.read() {
        for r in records.iter_mut() {
            output::pods::annotate(r, &names);
        }
    }
}

/// The start-up line saying what this kernel gave us, e.g.
/// `kernel 6.1.0-57-amd64: tc attach clsact; drops tp_btf/kfree_skb (with reason)`.
fn setup_line(s: &KernelSetup) -> String {
    let drops = if s.hooks.contains(&"tp_btf/kfree_skb") {
        if s.drop_reason {
            "drops tp_btf/kfree_skb (with reason)"
        } else {
            "drops tp_btf/kfree_skb (no reason: kernel < 5.17)"
        }
    } else {
        "drops off"
    };
    let race = if s.hooks.contains(&crate::kernel::CONFIRM_HOOK) {
        format!("; race hook {}", crate::kernel::CONFIRM_HOOK)
    } else {
        String::new()
    };
    let mut line = format!(
        "kernel {}: tc attach {}; {drops}{race}; netns ids: {}",
        s.release.escape_debug(),
        s.tc_attach,
        s.netns_id
    );
    for d in &s.degraded {
        line.push_str(&format!("; degraded: {}", d.escape_debug()));
    }
    line
}

/// One conntrack watcher thread per namespace where NAT is expected: ours, those named with
/// `--netns`, and with `--all-netns` every named one (`/run/netns`, where CNI plugins put pod
/// namespaces), at most [`MAX_CT_WATCHERS`]. Without conntrack: a warning, and hops across
/// NAT are joined by the fallback method.
fn start_conntrack(
    opts: &TraceOptions,
    tx: &std::sync::mpsc::Sender<SourceEvent>,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<crate::conntrack::WatchSummary>> {
    const MAX_CT_WATCHERS: usize = 64;
    let mut namespaces = Vec::new();
    if let Ok(own) = netns::own_netns() {
        namespaces.push(own);
    }
    for n in netns::named_netns() {
        if namespaces.iter().any(|m| m.id == n.id) {
            continue;
        }
        if opts.attach.all_netns || opts.attach.netns.contains(&n.name) {
            namespaces.push(n);
        }
    }
    if namespaces.len() > MAX_CT_WATCHERS {
        log::warn!(
            "conntrack: watching {MAX_CT_WATCHERS} of {} namespaces",
            namespaces.len()
        );
        namespaces.truncate(MAX_CT_WATCHERS);
    }
    let mut handles = Vec::new();
    for ns in namespaces {
        let Ok(cookie) = netns::with_netns(&ns.path, netns::current_netns_cookie) else {
            continue;
        };
        // Statistics every 200 ms: a race drop is judged by the per-CPU counters sampled
        // on both sides of it.
        let watch = crate::conntrack::WatchOptions {
            ports: opts.ports.clone(),
            stats_interval: Some(Duration::from_millis(200)),
            ..Default::default()
        };
        match crate::conntrack::spawn_watch_with(
            ns.path.clone(),
            cookie,
            watch,
            tx.clone(),
            Arc::clone(stop),
        ) {
            Ok(h) => handles.push(h),
            Err(e) => log::warn!(
                "conntrack in {}: {e}; joining hops across NAT without it",
                ns.name
            ),
        }
    }
    handles
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::loops::{LoopKind, LoopRecord},
        output::record::{
            DropRecord, LookupRef, PacketRecord, QuestionRecord, StatsRecord, TransactionRecord,
        },
    };

    /// Keeps what is written.
    #[derive(Default)]
    struct Collect(Vec<Record>);

    impl output::Sink for Collect {
        fn write(&mut self, record: &Record) -> std::io::Result<()> {
            self.0.push(record.clone());
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn opts(count: Option<u64>, until_loop: bool, view: View) -> TraceOptions {
        TraceOptions {
            attach: AttachSpec::default(),
            filter: Filter::default(),
            ports: vec![53],
            snaplen: 2048,
            format: Format::Json,
            view,
            timeout: Duration::from_secs(5),
            duration: None,
            count,
            drops: true,
            until_loop,
            write: None,
        }
    }

    fn packet(ts_ns: u64) -> Record {
        Record::Packet(PacketRecord {
            pod: Default::default(),
            ts_ns,
            time: String::new(),
            cpu: None,
            netns: "n".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            dir: "ingress",
            proto: "udp",
            src: "10.0.0.1:5000".into(),
            dst: "10.0.0.2:53".into(),
            len: 60,
            caplen: 60,
            vlan: None,
            dns: None,
            malformed: None,
            capture_truncated: false,
        })
    }

    fn question() -> QuestionRecord {
        QuestionRecord {
            name: "www.lab.test.".into(),
            qtype: "A".into(),
            class: "IN".into(),
        }
    }

    fn transaction(id: u64) -> Record {
        Record::Transaction(TransactionRecord {
            pod: Default::default(),
            id,
            lookup: LookupRef { id, step: 0 },
            ts_ns: 1,
            time: String::new(),
            client: "10.0.0.1:5000".into(),
            client_netns: "n".into(),
            question: question(),
            outcome: "answered",
            rcode: Some("NOERROR".into()),
            answers: vec!["A 10.250.0.80".into()],
            answer_cut: None,
            latency_ns: Some(1000),
            summary: "NOERROR A 10.250.0.80 in 0.00 ms".into(),
            legs: Vec::new(),
        })
    }

    fn drop_record(ts_ns: u64) -> Record {
        Record::Drop(DropRecord {
            pod: Default::default(),
            ts_ns,
            time: String::new(),
            cpu: 0,
            netns: "n".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            reason: "NETFILTER_DROP".into(),
            reason_code: Some(6),
            confirm_failed: None,
            location: "nf_hook_slow+0x9e".into(),
            proto: "udp",
            src: "10.0.0.1:5000".into(),
            dst: "10.0.0.2:53".into(),
            len: 60,
            ct: None,
            dns: None,
            malformed: None,
            capture_truncated: false,
            benign: None,
        })
    }

    fn loop_record(state: LoopState) -> Record {
        Record::Loop(LoopRecord {
            id: 1,
            state,
            kind: LoopKind::Cycle,
            ts_ns: 1,
            time: String::new(),
            question: question(),
            zone: "lab.test.".into(),
            loop_plugin_probe: false,
            cycle: Vec::new(),
            path: String::new(),
            hop_count: 2,
            rate_pps: 0,
            packets: 0,
            summarised: 0,
            clients: Vec::new(),
            first_seen_ns: 1,
            detected_ns: 1,
            last_seen_ns: 1,
        })
    }

    fn kinds(recs: &[Record]) -> Vec<String> {
        recs.iter()
            .map(|r| match r {
                Record::Packet(p) => format!("packet {}", p.ts_ns),
                Record::Drop(d) => format!("drop {}", d.ts_ns),
                Record::Transaction(t) => format!("transaction {}", t.id),
                Record::Loop(l) => format!("loop {:?}", l.state),
                Record::Race(_) => "race".into(),
                Record::FragmentLoss(f) => format!("fragment_loss {}", f.ts_ns),
                Record::Stats(_) => "stats".into(),
            })
            .collect()
    }

    /// `--count 2`: the batch holding the second packet also holds a drop and the
    /// transactions the correlate stage finished; they are written, later packets are not,
    /// and the run stops after the batch.
    #[test]
    fn count_stop_writes_the_rest_of_its_batch_but_no_more_packets() {
        let mut w = BatchWriter::new(&opts(Some(2), false, View::Both));
        let mut sink = Collect::default();
        let mut batch = vec![packet(1)];
        assert!(!w.write(&mut batch, &mut sink).unwrap());
        let mut batch = vec![
            packet(2),
            drop_record(3),
            packet(4),
            transaction(7),
            transaction(8),
        ];
        assert!(w.write(&mut batch, &mut sink).unwrap());
        assert!(batch.is_empty());
        // At the end: the correlator's flush, and packets drained from the ring.
        let mut last = vec![
            packet(5),
            transaction(9),
            Record::Stats(StatsRecord::default()),
        ];
        w.write(&mut last, &mut sink).unwrap();
        // Packets 4 and 5 were decided after the stop: counted, not written.
        assert_eq!(w.not_written, 2);
        assert_eq!(
            kinds(&sink.0),
            [
                "packet 1",
                "packet 2",
                "drop 3",
                "transaction 7",
                "transaction 8",
                "transaction 9",
                "stats"
            ]
        );
    }

    /// `--view transactions --count 1`: packets count though they are not shown.
    #[test]
    fn count_applies_to_hidden_packets() {
        let mut w = BatchWriter::new(&opts(Some(1), false, View::Transactions));
        let mut sink = Collect::default();
        let mut batch = vec![packet(1), transaction(1), packet(2), transaction(2)];
        assert!(w.write(&mut batch, &mut sink).unwrap());
        assert_eq!(kinds(&sink.0), ["transaction 1", "transaction 2"]);
        assert_eq!(w.packets_out, 1);
    }

    /// `--until loop`: the records after the detected loop in its batch are still written.
    #[test]
    fn until_loop_writes_the_rest_of_the_batch() {
        let mut w = BatchWriter::new(&opts(None, true, View::Both));
        let mut sink = Collect::default();
        let mut batch = vec![
            packet(1),
            loop_record(LoopState::Detected),
            transaction(3),
            drop_record(4),
        ];
        let stop = w.write(&mut batch, &mut sink).unwrap();
        assert!(stop && w.loop_found);
        assert_eq!(
            kinds(&sink.0),
            ["packet 1", "loop Detected", "transaction 3", "drop 4"]
        );
        // Without a loop, no stop.
        let mut w = BatchWriter::new(&opts(None, true, View::Both));
        let mut batch = vec![packet(1), loop_record(LoopState::Ongoing)];
        assert!(!w.write(&mut batch, &mut sink).unwrap());
    }
}
