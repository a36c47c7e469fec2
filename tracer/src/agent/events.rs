//! The agent's event stream: NDJSON on stdout (the container's log), one line for each thing a
//! person acts on — not one per packet or query.
//!
//! - Detections' records as their [`Detection::notice`](crate::detect::Detection::notice)
//!   says (`loop` records `detected`, `ongoing`, `ended`; `race` records with verdict
//!   `race-drop`; …), and `drop` records of DNS packets (not the `benign` ones), pass
//!   through as `trace -o json` writes them (docs/output.md), at most
//!   `max_lines_per_window` of each kind per window (a loop's `detected` and `ended` always
//!   pass); what was held back is one `suppressed` line per kind at the end of the window.
//! - Unanswered (or dropped) client questions and SERVFAIL answers are folded per server
//!   and window into one `unanswered` / `servfail` line with the `count` folded and a few
//!   examples. At most `max_keys` servers are kept per window; the rest fold into server
//!   `*` (and are counted in [`Events::keys_folded`]). With `--record`, a line names the
//!   flight recorder's files of the questions it folded (`evidence`).
//! - `agent` lines when the agent starts and stops, and a `warning` when the `stats`
//!   records show events lost (ring buffer full) during the window.
//! - `finding` lines: every `findings_window_ns` (`--findings-window`, 60 s), the records of
//!   that window folded by `dnspath doctor`'s traffic checks ([`Watch`]) into findings,
//!   ranked, at most `max_lines_per_window` of them (the rest one `suppressed` line) — the
//!   same findings, thresholds and words as `doctor`'s report (docs/doctor.md).
use std::{io::Write, net::SocketAddr};

use serde::Serialize;

use crate::{
    detect::{Detected, Notice},
    findings::{
        finding::{rank, Finding, FindingKind},
        servers::{Failure, PerServer},
        watch::{Watch, TRAFFIC_KINDS},
    },
    output::{
        record::{DropRecord, QuestionRecord, Record, StatsRecord, TransactionRecord},
        report,
    },
    time::Clock,
};

#[derive(Clone, Copy, Debug)]
pub struct EventsConfig {
    /// Aggregation and rate-limit window.
    pub window_ns: u64,
    /// Servers kept per window (unanswered and SERVFAIL together).
    pub max_keys: usize,
    /// Passed-through lines of one kind (drop, race, loop updates) per window.
    pub max_lines_per_window: u32,
    /// Example questions kept per aggregated line.
    pub examples: usize,
    /// The findings window (`--findings-window`): records folded into findings, emitted
    /// and reset this often.
    pub findings_window_ns: u64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            window_ns: 10_000_000_000,
            max_keys: 256,
            max_lines_per_window: 20,
            examples: 3,
            findings_window_ns: 60_000_000_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("writing the event stream: {0}")]
    Write(#[from] std::io::Error),
    #[error("encoding an event: {0}")]
    Json(#[from] serde_json::Error),
}

/// One line of the stream.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    Agent(AgentEvent),
    Drop(DropRecord),
    #[serde(rename = "fragment_loss")]
    FragmentLoss(crate::output::record::FragmentLossRecord),
    Unanswered(Aggregate),
    Servfail(Aggregate),
    Suppressed(Suppressed),
    Warning(Warning),
    Finding(FindingEvent),
    /// A detection's record (a loop, a race drop, …), under its own `type`.
    #[serde(untagged)]
    Detected(Detected),
}

/// A finding of `dnspath doctor`'s traffic checks over one findings window.
#[derive(Clone, Debug, Serialize)]
pub struct FindingEvent {
    /// End of the window.
    pub ts_ns: u64,
    pub time: String,
    pub window_start_ns: u64,
    /// `kind`, `severity`, `subject`, `seen`, `why`, `evidence`, `fix`, `count` as in
    /// docs/doctor.md.
    #[serde(flatten)]
    pub finding: Finding,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentEvent {
    /// `start` or `stop`.
    pub state: &'static str,
    pub ts_ns: u64,
    pub time: String,
    pub version: &'static str,
    /// What the agent was started on (kernel, attach mode) or why it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// An example of what an aggregated line folded.
#[derive(Clone, Debug, Serialize)]
pub struct Example {
    pub client: String,
    pub client_netns: String,
    pub question: QuestionRecord,
    pub summary: String,
    /// The flight recorder's file of this question (`--record`), when one was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// Client questions to one server that went unanswered (or got SERVFAIL) in one window.
#[derive(Clone, Debug, Serialize)]
pub struct Aggregate {
    /// End of the window.
    pub ts_ns: u64,
    pub time: String,
    pub window_start_ns: u64,
    /// The server as the clients addressed it (a Service ClusterIP, a stub, a pod), or `*`
    /// for servers beyond `max_keys`.
    pub server: String,
    /// Client questions folded into this line.
    pub count: u64,
    /// The first few of them.
    pub examples: Vec<Example>,
    /// The flight recorder's files (`--record`) of the folded questions: each file once, the
    /// first [`MAX_EVIDENCE`] of them (incidents close in time share a file).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// Evidence files named per aggregated line.
pub const MAX_EVIDENCE: usize = 8;

/// Lines of one kind held back by the rate limit in one window.
#[derive(Clone, Debug, Serialize)]
pub struct Suppressed {
    pub ts_ns: u64,
    pub time: String,
    pub window_start_ns: u64,
    /// `drop`, `race`, `loop` or `finding`.
    pub event: &'static str,
    pub count: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Warning {
    pub ts_ns: u64,
    pub time: String,
    /// `events_lost`.
    pub kind: &'static str,
    /// Growth in the window of `stats.lost` (packets) and `stats.drops_lost`.
    pub lost: u64,
    pub drops_lost: u64,
    pub message: String,
}

/// The rate limit's kinds: drops (and fragment losses) first, then each detection by its
/// place in [`Detected::NAMES`].
const LIMITED_DROP: usize = 0;

fn limited_name(kind: usize) -> &'static str {
    match kind {
        LIMITED_DROP => "drop",
        k => Detected::NAMES.get(k - 1).copied().unwrap_or("detection"),
    }
}

/// What an aggregated line is keyed by: the server of the transaction's first leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ServerKey {
    Addr(SocketAddr),
    /// A transaction without legs.
    Unknown,
    /// Beyond `max_keys`.
    Overflow,
}

impl ServerKey {
    fn name(self) -> String {
        match self {
            ServerKey::Addr(a) => a.to_string(),
            ServerKey::Unknown => "unknown".to_string(),
            ServerKey::Overflow => OVERFLOW_KEY.to_string(),
        }
    }
}

#[derive(Debug, Default)]
struct Folded {
    count: u64,
    examples: Vec<Example>,
    evidence: Vec<String>,
}

/// Turns records into events. Holds at most `max_keys` aggregation keys and a few counters.
#[derive(Debug)]
pub struct Events {
    cfg: EventsConfig,
    clock: Clock,
    window_start: Option<u64>,
    /// Client questions to a server that failed them, by how; at most `max_keys` keys (the
    /// table's refused ones are the questions folded into server `*`).
    failed: PerServer<(Failure, ServerKey), Folded>,
    /// Lines passed and held back this window, by kind (`limited_name`).
    passed: Vec<u32>,
    held: Vec<u64>,
    /// Totals of the latest `stats` record (lost, drops_lost), and growth this window.
    lost_totals: (u64, u64),
    lost_growth: (u64, u64),
    findings: FindingsWindow,
}

/// The findings window: its records folded, and what the last closed one found.
#[derive(Default)]
struct FindingsWindow {
    start: Option<u64>,
    watch: Watch,
    /// Findings per kind of [`TRAFFIC_KINDS`] in the last closed window.
    last: [u64; TRAFFIC_KINDS.len()],
    /// Windows closed.
    closed: u64,
    /// Records not followed (a table of the watch full), over the run.
    untracked: u64,
}

impl std::fmt::Debug for FindingsWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FindingsWindow")
            .field("start", &self.start)
            .field("last", &self.last)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

const OVERFLOW_KEY: &str = "*";

impl Events {
    pub fn new(cfg: EventsConfig, clock: Clock) -> Self {
        Self {
            cfg,
            clock,
            window_start: None,
            failed: PerServer::default(),
            passed: vec![0; 1 + Detected::NAMES.len()],
            held: vec![0; 1 + Detected::NAMES.len()],
            lost_totals: (0, 0),
            lost_growth: (0, 0),
            findings: FindingsWindow::default(),
        }
    }

    /// Findings per kind ([`TRAFFIC_KINDS`]) of the last closed findings window, and how
    /// many windows have closed.
    pub fn findings_last(&self) -> ([(FindingKind, u64); TRAFFIC_KINDS.len()], u64) {
        let mut out = TRAFFIC_KINDS.map(|k| (k, 0));
        for (o, n) in out.iter_mut().zip(self.findings.last) {
            o.1 = n;
        }
        (out, self.findings.closed)
    }

    /// Records the findings windows did not follow (a table full), over the run.
    pub fn findings_untracked(&self) -> u64 {
        self.findings.untracked + self.findings.watch.untracked()
    }

    /// Questions folded into server `*` because `max_keys` servers were already kept, over
    /// the run.
    pub fn keys_folded(&self) -> u64 {
        self.failed.refused()
    }

    /// Servers kept in the current window (unanswered and SERVFAIL together; at most
    /// `max_keys`, plus `*`).
    pub fn keys(&self) -> usize {
        self.failed.len()
    }

    pub fn agent(&self, state: &'static str, now_ns: u64, detail: Option<String>) -> Event {
        Event::Agent(AgentEvent {
            state,
            ts_ns: now_ns,
            time: self.clock.wall(now_ns).to_string(),
            version: env!("CARGO_PKG_VERSION"),
            detail,
        })
    }

    /// One record of the pipeline, at `now_ns` (the pipeline's clock).
    pub fn observe(&mut self, record: &Record, now_ns: u64, out: &mut Vec<Event>) {
        self.tick(now_ns, out);
        self.findings.watch.observe(record);
        match record {
            Record::Transaction(t) => self.fold_transaction(t),
            Record::Detected(d) => {
                let kind = 1 + d.index();
                let pass = match d.get().notice() {
                    Notice::Always => true,
                    Notice::Limited => self.admit(kind),
                    Notice::Never => false,
                };
                if pass {
                    out.push(Event::Detected(d.clone()));
                }
            }
            Record::Drop(d) if d.benign.is_none() => {
                if self.admit(LIMITED_DROP) {
                    out.push(Event::Drop(d.as_ref().clone()));
                }
            }
            // A datagram lost on the way is a drop for the person reading the log.
            Record::FragmentLoss(f) => {
                if self.admit(LIMITED_DROP) {
                    out.push(Event::FragmentLoss(f.as_ref().clone()));
                }
            }
            Record::Stats(s) => self.count_loss(s),
            Record::Summary(_) => {}
            Record::Drop(_) | Record::Packet(_) => {}
        }
    }

    /// Closes the window when it is over: its aggregated lines, what the rate limit held
    /// back, and a loss warning. Call it periodically (e.g. every second) as well, so that a
    /// quiet period still closes its window.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        let start = *self.window_start.get_or_insert(now_ns);
        if now_ns.saturating_sub(start) >= self.cfg.window_ns {
            self.close_window(now_ns, out);
        }
        let start = *self.findings.start.get_or_insert(now_ns);
        if now_ns.saturating_sub(start) >= self.cfg.findings_window_ns {
            self.close_findings(now_ns, out);
        }
    }

    /// Closes the findings window now: its findings, ranked, as `finding` lines (at most
    /// `max_lines_per_window`, the rest one `suppressed` line).
    pub fn close_findings(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        let start = self.findings.start.unwrap_or(now_ns);
        let watch = std::mem::take(&mut self.findings.watch);
        self.findings.untracked += watch.untracked();
        let mut found = watch.findings();
        drop(watch);
        rank(&mut found);
        self.findings.last =
            TRAFFIC_KINDS.map(|k| found.iter().filter(|f| f.kind == k).count() as u64);
        self.findings.closed += 1;
        self.findings.start = Some(now_ns);
        let time = self.clock.wall(now_ns).to_string();
        let max = self.cfg.max_lines_per_window as usize;
        let held = found.len().saturating_sub(max) as u64;
        for finding in found.into_iter().take(max) {
            out.push(Event::Finding(FindingEvent {
                ts_ns: now_ns,
                time: time.clone(),
                window_start_ns: start,
                finding,
            }));
        }
        if held > 0 {
            out.push(Event::Suppressed(Suppressed {
                ts_ns: now_ns,
                time,
                window_start_ns: start,
                event: "finding",
                count: held,
            }));
        }
    }

    /// Closes the window now, whatever its age (at stop).
    pub fn close_window(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        let start = self.window_start.unwrap_or(now_ns);
        let time = self.clock.wall(now_ns).to_string();
        let mut failed = self.failed.take();
        for failure in [Failure::Unanswered, Failure::Servfail] {
            let mut lines: Vec<(String, Folded)> = failed
                .extract_if(.., |k, _| k.0 == failure)
                .map(|((_, k), f)| (k.name(), f))
                .collect();
            lines.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(&b.0)));
            for (server, f) in lines {
                let a = Aggregate {
                    ts_ns: now_ns,
                    time: time.clone(),
                    window_start_ns: start,
                    server,
                    count: f.count,
                    examples: f.examples,
                    evidence: f.evidence,
                };
                out.push(match failure {
                    Failure::Servfail => Event::Servfail(a),
                    Failure::Unanswered => Event::Unanswered(a),
                });
            }
        }
        for (kind, held) in self.held.iter_mut().enumerate() {
            let held = std::mem::take(held);
            if held > 0 {
                out.push(Event::Suppressed(Suppressed {
                    ts_ns: now_ns,
                    time: time.clone(),
                    window_start_ns: start,
                    event: limited_name(kind),
                    count: held,
                }));
            }
        }
        self.passed.fill(0);
        let (lost, drops_lost) = std::mem::take(&mut self.lost_growth);
        if lost > 0 || drops_lost > 0 {
            out.push(Event::Warning(Warning {
                ts_ns: now_ns,
                time,
                kind: "events_lost",
                lost,
                drops_lost,
                message: format!(
                    "the kernel matched {lost} packet(s) and {drops_lost} drop(s) that never reached dnspath in the last {:.0} s (ring buffer full: the agent is falling behind)",
                    now_ns.saturating_sub(start) as f64 / 1e9
                ),
            }));
        }
        self.window_start = Some(now_ns);
    }

    fn admit(&mut self, kind: usize) -> bool {
        let (Some(passed), Some(held)) = (self.passed.get_mut(kind), self.held.get_mut(kind))
        else {
            return true;
        };
        if *passed < self.cfg.max_lines_per_window {
            *passed += 1;
            true
        } else {
            *held += 1;
            false
        }
    }

    fn fold_transaction(&mut self, t: &TransactionRecord) {
        let Some(failure) = Failure::of_question(t) else {
            return;
        };
        let server = t
            .legs
            .first()
            .map_or(ServerKey::Unknown, |l| ServerKey::Addr(l.server));
        let folded = match self.failed.tally((failure, server), self.cfg.max_keys) {
            Some(folded) => folded,
            None => self.failed.overflow((failure, ServerKey::Overflow)),
        };
        folded.count += 1;
        if folded.examples.len() < self.cfg.examples {
            folded.examples.push(Example {
                client: t.client.to_string(),
                client_netns: t.client_netns.to_string(),
                question: t.question.clone(),
                summary: report::transaction_summary(t),
                evidence: t.evidence.clone(),
            });
        }
        if let Some(file) = &t.evidence {
            if folded.evidence.len() < MAX_EVIDENCE && !folded.evidence.contains(file) {
                folded.evidence.push(file.clone());
            }
        }
    }

    fn count_loss(&mut self, s: &StatsRecord) {
        let grew = |now: u64, was: u64| if now >= was { now - was } else { now };
        let (lost, drops) = self.lost_totals;
        self.lost_growth.0 += grew(s.decode.lost, lost);
        self.lost_growth.1 += grew(s.decode.drops_lost, drops);
        self.lost_totals = (s.decode.lost, s.decode.drops_lost);
    }
}

/// [`Events`] written as NDJSON, one line per event, flushed after each batch.
pub struct EventSink<W: Write> {
    events: Events,
    out: W,
    buf: Vec<Event>,
}

impl<W: Write> EventSink<W> {
    pub fn new(cfg: EventsConfig, clock: Clock, out: W) -> Self {
        Self {
            events: Events::new(cfg, clock),
            out,
            buf: Vec::new(),
        }
    }

    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Where the lines go.
    pub fn out(&mut self) -> &mut W {
        &mut self.out
    }

    /// The `agent` `start` line.
    pub fn start(&mut self, now_ns: u64, detail: Option<String>) -> Result<(), EventsError> {
        let e = self.events.agent("start", now_ns, detail);
        self.buf.push(e);
        self.write_buffered()
    }

    pub fn observe(&mut self, record: &Record, now_ns: u64) -> Result<(), EventsError> {
        self.events.observe(record, now_ns, &mut self.buf);
        self.write_buffered()
    }

    pub fn tick(&mut self, now_ns: u64) -> Result<(), EventsError> {
        self.events.tick(now_ns, &mut self.buf);
        self.write_buffered()
    }

    /// Closes the window and writes the `agent` `stop` line.
    pub fn stop(&mut self, now_ns: u64, detail: Option<String>) -> Result<(), EventsError> {
        self.events.close_window(now_ns, &mut self.buf);
        self.events.close_findings(now_ns, &mut self.buf);
        let e = self.events.agent("stop", now_ns, detail);
        self.buf.push(e);
        self.write_buffered()
    }

    fn write_buffered(&mut self) -> Result<(), EventsError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let result = self.buf.iter().try_for_each(|e| {
            serde_json::to_writer(&mut self.out, e)?;
            self.out.write_all(b"\n").map_err(EventsError::from)
        });
        self.buf.clear();
        result?;
        self.out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
