//! What happened to DNS in a run, said once when `trace` or `analyze` stops: the
//! questions, their outcomes and rcodes with ratios, latency percentiles, the busiest
//! clients and servers, and every failure class seen with one example. The record and its
//! text are here; `summarize.rs` counts the records into it. Text goes to stderr (stdout stays
//! the records alone, for a pipe); JSON is a `summary` record on stdout just before `stats`
//! (docs/output.md).
use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    decode::{
        dns::RrType,
        record::{Names, PodRef, RecordKind},
    },
    output::escape,
};

/// Rows the busiest lists show.
pub const BUSIEST: usize = 5;

/// One count and its share of the questions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Share {
    /// The outcome word, or the rcode.
    pub what: String,
    pub count: u64,
    /// Of the questions, 0 to 1, four decimals.
    pub ratio: f64,
}

/// A row of the busiest lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Busiest {
    /// The client (pod, or `netns/address`), or the server (its address).
    pub name: String,
    /// The server's pod, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Questions asked (a client), or queries received (a server).
    pub count: u64,
}

/// A failure class seen, how often, and the first of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailureClass {
    /// `unanswered`, `dropped`, `late`, `pending` (a question's outcome), `SERVFAIL` or
    /// `REFUSED` (its answer), `loop`, `race-drop` (a race's verdict), `kernel drop REASON`,
    /// `fragment loss`.
    pub class: String,
    pub count: u64,
    pub example: String,
}

/// The run's DNS in one record (`type` `summary`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SummaryRecord {
    /// Client questions (transactions) shown.
    pub questions: u64,
    /// Each outcome seen: count and ratio of the questions.
    pub outcomes: Vec<Share>,
    /// Each rcode the clients got: count and ratio of the questions.
    pub rcodes: Vec<Share>,
    /// Of the answered questions' latency, milliseconds (within 6.25 %).
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub busiest_clients: Vec<Busiest>,
    pub busiest_servers: Vec<Busiest>,
    pub failures: Vec<FailureClass>,
    /// Clients and servers beyond the 4096 of each counted (folded, not listed).
    pub folded: u64,
}

/// A summary is never filtered, and names no pod of its own.
impl RecordKind for SummaryRecord {
    fn is_filtered(&self) -> bool {
        false
    }
    fn any_pod(&self, _f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        false
    }
    fn any_question(&self, _f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        false
    }
    fn is_failure(&self) -> bool {
        false
    }
    fn annotate_pods(&mut self, _names: &Names) {}
}

fn shares(s: &[Share]) -> String {
    s.iter()
        .map(|s| format!("{} {} ({:.1} %)", s.what, s.count, s.ratio * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v} ms"))
}

/// The summary as text lines, each starting `--- `; names escaped.
pub fn summary_text(s: &SummaryRecord) -> String {
    let mut out = format!("--- summary: {} question(s)", s.questions);
    if s.questions > 0 {
        let _ = write!(
            out,
            ": {}; rcodes {}; latency p50 {}, p90 {}, p99 {}",
            shares(&s.outcomes),
            if s.rcodes.is_empty() {
                "-".to_string()
            } else {
                shares(&s.rcodes)
            },
            ms(s.p50_ms),
            ms(s.p90_ms),
            ms(s.p99_ms)
        );
        let list = |rows: &[Busiest]| {
            rows.iter()
                .map(|b| match &b.pod {
                    Some(p) => format!("{} ({}) {}", escape(&b.name), escape(p), b.count),
                    None => format!("{} {}", escape(&b.name), b.count),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = write!(
            out,
            "\n--- busiest clients: {}; busiest servers: {}",
            list(&s.busiest_clients),
            list(&s.busiest_servers)
        );
        if s.folded > 0 {
            let _ = write!(out, " ({} beyond the tables' rows, not listed)", s.folded);
        }
    }
    if s.failures.is_empty() {
        out.push_str("\n--- failures: none");
    }
    for f in &s.failures {
        let _ = write!(
            out,
            "\n--- failure {} ×{}, e.g. {}",
            f.class, f.count, f.example
        );
    }
    out
}
