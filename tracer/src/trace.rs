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
    correlate::{
        loops::{LoopRecord, LoopState},
        CorrelateConfig, Correlator, Observed,
    },
    event::{KernelCounters, KernelSetup, SourceEvent},
    kernel::{
        attach::{AttachSpec, Attacher, Names},
        btf::KernelBtf,
        kallsyms::Kallsyms,
        netns, KernelError, ProbeOptions, Probes,
    },
    output::{self, Format, Record, View},
    pipeline::{Clock, Decoder},
    source::live::LiveSource,
};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
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
}

/// How a trace ended.
#[derive(Clone, Debug)]
pub struct TraceSummary {
    pub stats: output::record::StatsRecord,
    /// A forwarding loop was reported (`--until loop` stops there).
    pub loop_found: bool,
}

/// Runs until a signal, `duration`, `count` or (with `until_loop`) a loop; returns the
/// final stats.
pub async fn run(
    opts: TraceOptions,
    out: Box<dyn Write + Send>,
) -> Result<TraceSummary, TraceError> {
    let probes = Probes::load(&ProbeOptions {
        ports: opts.ports.clone(),
        snaplen: opts.snaplen,
        drops: opts.drops,
    })?;
    let probes = Arc::new(Mutex::new(probes));
    let ring = probes
        .lock()
        .map_err(|_| KernelError::Netns("probe lock poisoned".into()))?
        .take_events()?;

    let names = Arc::new(RwLock::new(Names::default()));
    let mut attacher = Attacher::new(Arc::clone(&probes), opts.attach.clone(), Arc::clone(&names));
    attacher.scan()?;
    attacher.require_some()?;
    let attached = attacher.attached_count();
    let setup = probes
        .lock()
        .map_err(|_| KernelError::Netns("probe lock poisoned".into()))?
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
    // Handlers before announcing readiness: a Ctrl-C right after must stop us cleanly.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
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

    let mut source = LiveSource::new(ring)?;
    let clock = Clock::boot();
    let mut decoder = Decoder::new(clock, names, Kallsyms::load(), reasons);
    decoder.set_confirm_hook(
        probes
            .lock()
            .map_err(|_| KernelError::Netns("probe lock poisoned".into()))?
            .confirm_hook,
    );
    let mut correlator = opts.view.transactions().then(|| {
        decoder.collect_observations();
        Correlator::new(
            CorrelateConfig {
                timeout_ns: opts.timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
                ..Default::default()
            },
            clock,
        )
    });
    let mut loop_found = false;
    let mut sink = output::sink(opts.format, out);
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
    let mut packets_out: u64 = 0;
    let refresh_counters = |decoder: &mut Decoder| {
        if let Ok(p) = probes.lock() {
            if let Ok(c) = p.counters() {
                decoder.set_kernel_counters(KernelCounters::from_array(&c));
            }
        }
    };

    'run: loop {
        tokio::select! {
            r = source.next_batch(&mut events) => { r?; }
            _ = sigint.recv() => break 'run,
            _ = sigterm.recv() => break 'run,
            _ = &mut deadline => break 'run,
            _ = tick.tick() => {
                ticks += 1;
                if ticks.is_multiple_of(20) {
                    refresh_counters(&mut decoder);
                }
            }
        }
        for ev in events.drain(..) {
            decoder.on_event(ev, &mut records);
        }
        if let Some(c) = correlator.as_mut() {
            hand_over(&mut decoder, c, &ct_rx);
            c.tick(clock.now_ns(), &mut records);
        }
        for r in records.drain(..) {
            if matches!(r, Record::Packet(_)) {
                packets_out += 1;
                if !opts.view.packets() {
                    continue;
                }
            }
            if let Record::Loop(l) = &r {
                follow_loop(&mut decoder, l);
                loop_found |= l.state == LoopState::Detected;
            }
            sink.write(&r)?;
            if opts.until_loop && loop_found {
                sink.flush()?;
                break 'run;
            }
            if opts.count.is_some_and(|n| packets_out >= n) {
                sink.flush()?;
                break 'run;
            }
        }
        sink.flush()?;
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
    // What arrived before detaching still counts.
    if opts.count.is_none_or(|n| packets_out < n) {
        source.drain(&mut events);
        for ev in events.drain(..) {
            decoder.on_event(ev, &mut records);
        }
    }
    if let Some(c) = correlator.as_mut() {
        hand_over(&mut decoder, c, &ct_rx);
        c.flush(clock.now_ns(), &mut records);
    }
    for r in records.drain(..) {
        if matches!(r, Record::Packet(_)) && !opts.view.packets() {
            continue;
        }
        if let Record::Loop(l) = &r {
            loop_found |= l.state == LoopState::Detected;
        }
        sink.write(&r)?;
    }
    refresh_counters(&mut decoder);
    let mut stats = decoder.stats();
    stats.correlate = correlator.as_ref().map(Correlator::stats);
    if let Some(k) = stats.kernel.as_mut() {
        let mut setup = setup;
        setup.attach_failures = attach_failures;
        k.setup = Some(setup);
    }
    sink.write(&Record::Stats(stats.clone()))?;
    sink.flush()?;
    Ok(TraceSummary { stats, loop_found })
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

/// Under a loop, only count its packets; when it ends, decode them again.
fn follow_loop(decoder: &mut Decoder, l: &LoopRecord) {
    let q = &l.question;
    match l.state {
        LoopState::Detected => decoder.summarise_question(&q.name, &q.qtype, &q.class),
        LoopState::Ended => decoder.stop_summarising(&q.name, &q.qtype, &q.class),
        LoopState::Ongoing => {}
    }
}

/// What the correlate stage gets after each batch: conntrack events and statistics, the
/// decoded observations, and the counts of loop packets that were only counted.
fn hand_over(
    decoder: &mut Decoder,
    c: &mut Correlator,
    rx: &std::sync::mpsc::Receiver<SourceEvent>,
) {
    let mut observed: Vec<Observed> = Vec::new();
    decoder.take_observed(&mut observed);
    let mut summarised = Vec::new();
    decoder.take_summarised(&mut summarised);
    feed_conntrack(rx, c);
    for o in observed {
        c.on_observed(o);
    }
    for s in summarised {
        c.summarised(&s.name, &s.qtype, &s.class, s.count, s.last_ts);
    }
}

fn feed_conntrack(rx: &std::sync::mpsc::Receiver<SourceEvent>, c: &mut Correlator) {
    while let Ok(ev) = rx.try_recv() {
        match ev {
            SourceEvent::Conntrack(ct) => c.on_conntrack(&ct),
            SourceEvent::CtStats(s) => c.on_ct_stats(s),
            _ => {}
        }
    }
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
