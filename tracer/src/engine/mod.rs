//! The live engine under `trace`, the agent and doctor: load the kernel programs, attach
//! them to every interface asked for (and follow new ones), read the ring buffer and
//! conntrack, and run each turn through the [`Runner`]; at a stop, read what the kernel had
//! queued, decide what is still open, detach. The modes differ only in their sinks.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, RwLock,
    },
    time::Duration,
};

use tokio::signal::unix::{signal, SignalKind};

mod conntrack;
mod redirects;
use redirects::Redirects;

use crate::{
    decode::decoder::Decoder,
    event::{KernelCounters, KernelSetup, ShedChange, SourceEvent},
    evidence::{recorder::RecorderConfig, Evidence, EvidenceOptions},
    kernel::{
        attach::{AttachSpec, Attacher, Names},
        kallsyms::Kallsyms,
        shed::Shedder,
        KernelError, KernelMaps, ProbeOptions, Probes,
    },
    names::SharedNames,
    output::{otlp::OtlpError, record::StatsRecord, sink::Sinks},
    pipeline::{Pipeline, PipelineConfig, TICK, TICK_NS},
    runner::{stop::StopPolicy, Runner, Tick},
    source::live::{DropReserve, LiveSource},
    time::Clock,
};

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Kernel(KernelError),
    /// `setns(2)` refused: entering another network namespace takes CAP_SYS_ADMIN.
    #[error("entering another network namespace needs CAP_SYS_ADMIN; run dnspath as root ({0})")]
    NetnsPermission(String),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    #[error("-w {0}")]
    Pcapng(String),
    #[error(transparent)]
    Otlp(#[from] OtlpError),
}

impl From<KernelError> for LiveError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::NetnsPermission { op, path, errno } => {
                LiveError::NetnsPermission(format!("{op} {}: {errno}", path.display()))
            }
            e => LiveError::Kernel(e),
        }
    }
}

/// What a live run captures and how: every live mode (`trace`, the agent, doctor). What
/// `trace` writes is [`OutputOptions`](crate::trace::OutputOptions)'.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub attach: AttachSpec,
    /// What the kernel programs capture (ports, snaplen, drops, `-vv`).
    pub capture: ProbeOptions,
    /// Run the correlate and detect stages (transactions, loops, races); without them only
    /// packet and drop records come out (`trace --view packets`).
    pub transactions: bool,
    /// Unanswered-query timeout of the correlate stage.
    pub timeout: Duration,
    pub duration: Option<Duration>,
    /// `-w FILE` (every captured packet and drop also into pcapng files, `-` for standard
    /// output), its rotation, and the flight recorder `--record DIR`.
    pub evidence: EvidenceOptions,
    /// A record for every packet. The agent and doctor, whose sinks count packets from the
    /// stats and write none, ask for only the malformed and cut ones (unless evidence is
    /// kept, which annotates every packet).
    pub every_packet: bool,
}

impl RunOptions {
    /// The node-wide run of the agent and doctor: every network namespace, transactions,
    /// a record only for the unusual packets, and the flight recorder if `record` is set.
    /// Not bounded in time: doctor sets `duration`.
    pub fn node_wide(
        capture: ProbeOptions,
        timeout: Duration,
        record: Option<RecorderConfig>,
    ) -> Self {
        Self {
            attach: AttachSpec {
                all_netns: true,
                ..Default::default()
            },
            capture,
            transactions: true,
            timeout,
            duration: None,
            evidence: EvidenceOptions {
                // Packets waiting for their transaction: as much as the recorder's ring, so
                // that `--record-buffer` sizes the recorder's memory (twice it) under the
                // DaemonSet's limit.
                buffer_bytes: record.as_ref().map_or(0, |r| r.ring_bytes),
                record,
                ..Default::default()
            },
            every_packet: false,
        }
    }
}

/// How a live run ended.
#[derive(Clone, Debug)]
pub struct LiveSummary {
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

/// How often the sinks get the running totals (`Sink::periodic`: metrics, progress).
const PERIODIC_NS: u64 = 1_000_000_000;

/// The most a stop spends reading what the kernel had queued: the DaemonSet's grace period
/// is 10 s, and the end of the run (the last transactions, the sinks) comes after it.
const STOP_READ_NS: u64 = 3_000_000_000;

/// Runs until a signal (SIGINT, SIGTERM, SIGHUP), `duration`, the stop policy (`--count`,
/// `--until loop`), or the output's reader going away; returns the final stats. Each turn's
/// records get their pods' names, then go to `sinks` (with the evidence of
/// `opts.evidence` put first). Every way out, errors included, detaches and drops the
/// probes (which removes their pin directory).
pub async fn run_live(
    opts: RunOptions,
    sinks: &mut Sinks<'_>,
    policy: &mut StopPolicy,
) -> Result<LiveSummary, LiveError> {
    // Handlers first: a signal while loading or attaching must not kill us with the
    // programs pinned; it is seen by the run loop's first turn.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    crate::memory::no_huge_pages();
    // Start-up's big parses are handed back as they are freed (until the run loop starts).
    crate::memory::purge_at_once(true);
    let mut probes = Probes::load(&opts.capture)?;
    let ring = probes.take_events()?;
    let mut reserve = DropReserve::new(probes.take_drop_reserve()?);
    // The run loop's own handles: it never waits for the watcher's lock on the probes.
    let mut maps = probes.maps()?;
    let probes = Arc::new(Mutex::new(probes));

    let names = Arc::new(RwLock::new(Names::default()));
    // Namespaces the attacher finds (at start-up too) and loses, for conntrack to follow.
    let (ns_tx, ns_rx) = std::sync::mpsc::sync_channel(conntrack::NS_CHANGES);
    let mut spec = opts.attach.clone();
    if opts.transactions {
        spec.ns_changes = Some(ns_tx);
    }
    let mut attacher = Attacher::new(Arc::clone(&probes), spec, Arc::clone(&names))?;
    attacher.scan()?;
    probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .initial_attach_done();
    attacher.require_some()?;
    let attached = attacher.attached_count();
    let setup = probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .setup
        .clone();
    eprintln!("dnspath: {}", setup_line(&setup));
    let reasons = std::mem::take(
        &mut probes
            .lock()
            .map_err(|_| KernelError::Poisoned("probe"))?
            .drop_reasons,
    );
    // Whatever can fail comes before the watcher thread, which holds the probes until it
    // is stopped and joined.
    let mut source = LiveSource::new(ring)?;
    let confirm_hook = probes
        .lock()
        .map_err(|_| KernelError::Poisoned("probe"))?
        .confirm_hook;
    let ports: Vec<String> = opts.capture.ports.iter().map(u16::to_string).collect();
    eprintln!(
        "dnspath: tracing {attached} interface(s){}, ports {}{}; Ctrl-C to stop",
        if opts.attach.all_netns {
            " in all network namespaces"
        } else {
            ""
        },
        ports.join(","),
        if opts.capture.drops {
            ", with kernel drops"
        } else {
            ""
        }
    );

    let clock = Clock::boot();
    let timeout_ns = u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX);
    if opts.evidence.wanted() {
        sinks.push_front(Box::new(Evidence::new(
            &opts.evidence,
            opts.transactions,
            timeout_ns,
            clock,
            opts.capture.snaplen,
            &names,
            clock.now_ns(),
        )));
    }
    sinks.started(&setup, crate::time::boottime_ns());
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = attacher.spawn(Arc::clone(&stop));
    // Conntrack of the namespaces where DNAT happens, for joining hops across NAT.
    let (ct_tx, ct_rx) =
        std::sync::mpsc::sync_channel::<SourceEvent>(crate::conntrack::QUEUE_EVENTS);
    // The watch thread's counters: the `stats` records' and metrics' `conntrack`.
    let ct_counters = Arc::new(crate::conntrack::WatchCounters::default());
    // Namespaces gone, from the conntrack thread: the ports they taught are forgotten.
    let (gone_tx, gone_rx) = std::sync::mpsc::sync_channel::<u64>(conntrack::NS_CHANGES);
    let ct_watchers = if opts.transactions {
        conntrack::start(&opts, &ct_tx, &ct_counters, ns_rx, gone_tx)
    } else {
        None
    };
    // The live run's own counts in a `stats` record.
    let live_stats = |mut s: StatsRecord, reserve: &DropReserve, redirects: &Redirects| {
        if opts.transactions {
            let mut ct = ct_counters.snapshot();
            ct.netns_changes_lost = opts.attach.netns_changes_lost.load(Ordering::Relaxed);
            s.conntrack = Some(ct);
            s.learnt_ports = Some(redirects.stats());
        }
        s.drops_reserve = Some(reserve.read);
        s
    };
    drop(ct_tx);

    let output_names = Arc::clone(&names);
    let redirect_names = Arc::clone(&names);
    let mut decoder = Decoder::new(clock, names, Kallsyms::load(), reasons);
    decoder.set_confirm_hook(confirm_hook);
    if !opts.every_packet && !opts.evidence.wanted() {
        decoder.unusual_packets_only();
    }
    let mut pipeline = Pipeline::new(
        decoder,
        PipelineConfig {
            transactions: opts.transactions,
            timeout_ns,
            shed_loops: true,
            // dnspath runs in the node's namespace (DaemonSet, `kubectl debug node`).
            node_netns: crate::kernel::netns::current_netns_cookie().ok(),
        },
        clock,
    );
    pipeline.enable_kernel_shedding();
    crate::memory::release_freed();
    crate::memory::purge_at_once(false);
    // Every turn hands over what it decided (`batch_at` 0).
    let mut runner = Runner::new(pipeline, output_names, sinks, 0);
    let mut shedder = Shedder::default();
    let mut shed_changes: Vec<ShedChange> = Vec::new();
    let deadline = async {
        match opts.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(deadline);
    // Wakes the loop when nothing else does; the tick's work itself is due by the clock.
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_tick_ns = clock.now_ns().saturating_add(TICK_NS);
    let mut next_periodic_ns = clock.now_ns().saturating_add(PERIODIC_NS);

    let mut events: Vec<SourceEvent> = Vec::new();
    let mut ct_events: Vec<SourceEvent> = Vec::new();
    let refresh_counters = |pipeline: &mut Pipeline, maps: &KernelMaps| {
        if let Ok(c) = maps.counters() {
            pipeline.set_kernel_counters(KernelCounters::from_array(&c));
        }
    };
    // The events of one turn: conntrack first (the batch's packets may have been NATed by
    // these entries), then the ring buffer's, then drops that found it full, once what came
    // before them is read.
    // Ports a watched one is redirected to (a DNS proxy in a pod), captured once seen.
    let mut redirects = Redirects::new(&opts.capture.ports);
    let mut gather = |events: &mut Vec<SourceEvent>,
                      runner: &mut Runner,
                      redirects: &mut Redirects,
                      source: &LiveSource,
                      reserve: &mut DropReserve,
                      maps: &mut KernelMaps| {
        ct_events.extend(ct_rx.try_iter());
        learn_redirects(redirects, &ct_events, maps, &redirect_names);
        for netns in gone_rx.try_iter() {
            forget_redirects(redirects, netns, maps);
        }
        runner.push(&mut ct_events);
        reserve.poll_after(source, events);
    };

    // From here on, nothing returns before the watchers are stopped and joined.
    let mut failure: Option<LiveError> = None;
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
            _ = tick.tick() => {}
        }
        // The tick's work is due by the clock, not by the timer's branch: a ring buffer
        // holding more than a batch stays readable, so under a load the loop cannot drain
        // the read branch is always ready — and tokio's readiness spends no task budget, so
        // the loop would never yield, the runtime's driver never run, and neither the timer,
        // the signals nor `--duration` ever fire (the soak saw `dnspath_packets_total` 0 for
        // ten minutes). Each tick also yields, giving the driver its turn.
        let now = clock.now_ns();
        if now >= next_tick_ns {
            next_tick_ns = now.saturating_add(TICK_NS);
            ticked = true;
            source.poll_now(&mut events);
            if now >= next_periodic_ns {
                next_periodic_ns = now.saturating_add(PERIODIC_NS);
                refresh_counters(runner.pipeline_mut(), &maps);
                sinks.periodic(&live_stats(runner.stats(), &reserve, &redirects), now);
            }
            tokio::task::yield_now().await;
        }
        gather(
            &mut events,
            &mut runner,
            &mut redirects,
            &source,
            &mut reserve,
            &mut maps,
        );
        // The whole turn is written even when it ends the run: what it holds was decided
        // before the stop.
        let at = Tick::Live {
            clock_ns: clock.now_ns(),
            behind: source.behind(),
        };
        let turn = runner.turn(&mut events, at, sinks, policy, clock.now_ns());
        runner.pipeline_mut().take_shed_changes(&mut shed_changes);
        shedder.apply(&mut maps, &mut shed_changes);
        if ticked {
            maps.flush_kernel_log();
            let now = clock.now_ns();
            shedder.poll(&mut maps, |q, n| {
                runner.pipeline_mut().kernel_shed(q, n, now)
            });
        }
        match turn {
            Ok(()) => {
                if let Some(why) = policy.stop() {
                    stopped_by = why;
                    break 'run;
                }
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

    if stopped_by.starts_with("SIG") {
        // Said at once: what follows (detaching, reading what the kernel already queued)
        // takes a while on a busy node.
        eprintln!("dnspath: {stopped_by}: stopping");
    }
    stop.store(true, Ordering::Relaxed);
    let (warnings, attach_failures) = watcher.join().unwrap_or_default();
    if let Some(e) = ct_watchers.and_then(|w| w.stop().error) {
        log::warn!("conntrack watcher: {e}");
    }
    let ct_lost = ct_counters.snapshot().lost;
    if ct_lost > 0 {
        log::warn!(
            "conntrack: {ct_lost} events lost (socket overruns, dumps cut, a full queue); \
             some hops may be joined by the fallback method"
        );
    }
    for w in warnings {
        log::debug!("{w}");
    }
    if let Some(e) = failure {
        sinks.abort(clock.now_ns());
        return Err(e);
    }
    let loop_found = policy.loop_found();
    if output_closed {
        sinks.abort(clock.now_ns());
        return Ok(LiveSummary {
            stats: runner.stats(),
            loop_found,
            output_closed,
        });
    }
    // What arrived before detaching still counts, unless `--count` was reached, or reading
    // it takes longer than [`STOP_READ_NS`] (a starved CPU under a flood): then the rest
    // stays unread (counted in `stats.unread`). Each batch read is decided and written as
    // in the run, not held until the end (a full ring buffer is ~25,000 packets).
    let mut end: std::io::Result<()> = Ok(());
    if !policy.count_reached() {
        let give_up_at = clock.now_ns().saturating_add(STOP_READ_NS);
        loop {
            source.poll_now(&mut events);
            gather(
                &mut events,
                &mut runner,
                &mut redirects,
                &source,
                &mut reserve,
                &mut maps,
            );
            if events.is_empty() {
                break;
            }
            let at = Tick::Live {
                clock_ns: clock.now_ns(),
                behind: source.behind(),
            };
            end = runner.turn(&mut events, at, sinks, policy, clock.now_ns());
            runner.pipeline_mut().take_shed_changes(&mut shed_changes);
            shedder.apply(&mut maps, &mut shed_changes);
            if end.is_err() {
                break;
            }
            if clock.now_ns() >= give_up_at {
                log::warn!(
                    "stopping: the kernel's queue not read to its end within {} s; the rest is counted unread",
                    STOP_READ_NS / 1_000_000_000
                );
                break;
            }
        }
    }
    if reserve.read > 0 {
        log::info!(
            "{} kernel drop(s) came through the reserve ring while the ring buffer was full",
            reserve.read
        );
    }
    let now = clock.now_ns();
    shedder.finish(&mut maps, |q, n| {
        runner.pipeline_mut().kernel_shed(q, n, now)
    });
    // The open transactions come out in batches, each to the sinks before the next.
    if end.is_ok() {
        end = runner.finish(clock.now_ns(), sinks, policy);
    }
    let loop_found = policy.loop_found();
    refresh_counters(runner.pipeline_mut(), &maps);
    let mut stats = live_stats(runner.stats(), &reserve, &redirects);
    stats.not_written = policy.not_written();
    stats.stopped_by = Some(stopped_by.to_string());
    if let Some(k) = stats.decode.kernel.as_mut() {
        // Matched by the kernel, neither read nor lost: still queued when the run stopped.
        stats.unread = k.counters.packets_matched.saturating_sub(
            stats
                .decode
                .packets
                .saturating_add(stats.decode.lost)
                .saturating_add(k.counters.packets_shed),
        );
        let mut setup = setup;
        setup.attach_failures = attach_failures;
        k.setup = Some(setup);
    }
    // Every sink finishes (the evidence files are completed) even when the last batch
    // failed; the batch's error comes first.
    let finished = sinks.finish(&mut stats, clock.now_ns());
    match end.and(finished) {
        Ok(()) => {}
        Err(e) if is_broken_pipe(&e) => output_closed = true,
        Err(e) => return Err(e.into()),
    }
    Ok(LiveSummary {
        stats,
        loop_found,
        output_closed,
    })
}

/// Captures the ports conntrack's `events` show a watched port redirected to, the first
/// time each is seen (said on stderr: the user did not ask for it).
fn learn_redirects(
    redirects: &mut Redirects,
    events: &[SourceEvent],
    maps: &mut KernelMaps,
    names: &SharedNames,
) {
    for ev in events {
        let SourceEvent::Conntrack(ct) = ev else {
            continue;
        };
        let refused = redirects.refused;
        if let Some(l) = redirects.learn(ct) {
            let port = l.port;
            match maps.capture_port_in(l.netns, port) {
                Ok(()) => eprintln!(
                    "dnspath: capturing port {port} too in {}: conntrack shows {} redirected to {} (a DNS proxy in the pod)",
                    netns_name(names, l.netns),
                    ct.orig.dst,
                    ct.reply.src
                ),
                Err(e) => log::warn!("capturing port {port}, where DNS is redirected: {e}"),
            }
        } else if refused == 0 && redirects.refused > 0 {
            log::warn!(
                "{} ports learnt where DNS is redirected, the most captured; {} in {} is not, \
                 nor any more until a namespace goes (counted in stats.learnt_ports.refused)",
                redirects::MAX_LEARNED,
                ct.reply.src.port(),
                netns_name(names, ct.netns)
            );
        }
    }
}

/// `netns NAME`, or `netns 0x…` for a namespace not named yet.
fn netns_name(names: &SharedNames, netns: u64) -> String {
    match names.read().ok().as_ref().and_then(|n| n.netns(netns)) {
        Some(name) => format!("netns {name}"),
        None => format!("netns {netns:#x}"),
    }
}

/// Stops capturing the ports namespace `netns` taught: it is gone.
fn forget_redirects(redirects: &mut Redirects, netns: u64, maps: &mut KernelMaps) {
    for (port, elsewhere) in redirects.forget(netns) {
        if let Err(e) = maps.release_port_in(netns, port, elsewhere) {
            log::warn!("no longer capturing port {port} of netns {netns:#x}, which is gone: {e}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_netns_entry_says_which_capability() {
        let e = LiveError::from(KernelError::NetnsPermission {
            op: "setns",
            path: "/run/netns/x".into(),
            errno: nix::errno::Errno::EPERM,
        });
        assert!(matches!(e, LiveError::NetnsPermission(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "entering another network namespace needs CAP_SYS_ADMIN; run dnspath as root \
             (setns /run/netns/x: EPERM: Operation not permitted)"
        );
        // Other namespace errors stay kernel errors.
        let e = LiveError::from(KernelError::Netns("no network namespace named x".into()));
        assert!(
            matches!(e, LiveError::Kernel(KernelError::Netns(_))),
            "{e:?}"
        );
    }
}
