//! The words of the correlate and detect stages' reports: names of their enums, wall-clock
//! time, and the one-line summaries and paths people read, written from the reports' facts
//! (for JSON records, terminal text and the agent's events alike).
use std::{
    fmt::{self, Write as _},
    net::SocketAddr,
};

use crate::{
    correlate::{
        record::{Answered, Join, LegOutcome, NodeCache, Outcome, Summary, TransactionRecord},
        LegRole,
    },
    decode::dns::Cut,
    detect::{
        loops::{LoopHop, LoopKind, LoopRecord, LoopState, Peer},
        race::{RaceNetns, RaceRecord, RaceVerdict},
    },
    time::format_duration as dur,
};

/// Unix-epoch nanoseconds as RFC 3339 wall-clock time, microseconds, UTC (as
/// [`Clock::wall`](crate::time::Clock::wall) writes it).
pub fn wall(wall_ns: u64) -> impl fmt::Display {
    crate::time::WallTime(wall_ns)
}

pub use crate::correlate::record::proto_name;

pub fn role_name(role: LegRole) -> &'static str {
    match role {
        LegRole::Query => "query",
        LegRole::Retry => "retry",
        LegRole::TcpFallback => "tcp-fallback",
        LegRole::Forward => "forward",
    }
}

pub fn join_name(join: Join) -> &'static str {
    match join {
        Join::SameTuple => "same-tuple",
        Join::Conntrack => "conntrack",
        Join::Fallback => "fallback",
    }
}

pub fn leg_outcome_name(outcome: LegOutcome) -> &'static str {
    match outcome {
        LegOutcome::Answered => "answered",
        LegOutcome::Truncated => "truncated",
        LegOutcome::Dropped => "dropped",
        LegOutcome::Late => "late",
        LegOutcome::Pending => "pending",
        LegOutcome::Unanswered => "unanswered",
    }
}

pub fn node_cache_name(c: NodeCache) -> &'static str {
    match c {
        NodeCache::Hit => "hit",
        NodeCache::Miss => "miss",
        NodeCache::Bypass => "bypass",
    }
}

pub fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Answered => "answered",
        Outcome::Dropped => "dropped",
        Outcome::Late => "late",
        Outcome::Pending => "pending",
        Outcome::Unanswered => "unanswered",
    }
}

pub fn verdict_name(verdict: RaceVerdict) -> &'static str {
    match verdict {
        RaceVerdict::RaceDrop => "race-drop",
        RaceVerdict::ResolvedClash => "resolved-clash",
        RaceVerdict::Suspected => "suspected",
    }
}

pub fn loop_state_name(state: LoopState) -> &'static str {
    match state {
        LoopState::Detected => "detected",
        LoopState::Ongoing => "ongoing",
        LoopState::Ended => "ended",
    }
}

pub fn loop_kind_name(kind: LoopKind) -> &'static str {
    match kind {
        LoopKind::Cycle => "cycle",
        LoopKind::Amplification => "amplification",
    }
}

/// `answer cut by the capture at 200 of 731 bytes: 1 of 8 answers seen`.
pub fn cut_note(c: &Cut, answers_seen: usize) -> String {
    let at = format!(
        "answer cut by the capture at {} of {} bytes",
        c.captured_bytes, c.message_bytes
    );
    if c.questions > 0 {
        format!("{at}: question not seen whole")
    } else if c.answers > 0 {
        let total = answers_seen + usize::from(c.answers);
        format!("{at}: {answers_seen} of {total} answers seen")
    } else {
        format!("{at}, after its answers")
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A transaction in one line, e.g. `timeout after 5.0 s, retried, answered at +5.02 s:
/// NOERROR`.
pub fn transaction_summary(t: &TransactionRecord) -> String {
    let retried_note = |retried: bool| if retried { ", retried" } else { "" };
    match &t.summary {
        Summary::Answered(how) => {
            let rcode = t.rcode.as_deref().unwrap_or("");
            let answers = match t.answers.len() {
                0 => String::new(),
                1..=3 => format!(" {}", t.answers.join(", ")),
                n => format!(" {}, … ({n} answers)", t.answers[..2].join(", ")),
            };
            let lat = dur(t.latency_ns.unwrap_or(0));
            let how = match how {
                Answered::OverTcp => {
                    format!("truncated, retried over TCP, {rcode}{answers} at +{lat}")
                }
                Answered::AfterTimeout { timeout_ns, drop } => {
                    let cause = match drop {
                        Some((reason, location)) => {
                            format!("query dropped ({reason} at {location}), ")
                        }
                        None => String::new(),
                    };
                    format!(
                        "{cause}timeout after {:.1} s, retried, answered at +{lat}: {rcode}{answers}",
                        seconds(*timeout_ns)
                    )
                }
                Answered::Directly => format!("{rcode}{answers} in {lat}"),
            };
            match &t.answer_cut {
                Some(c) => format!("{how}; {}", cut_note(c, t.answers.len())),
                None => how,
            }
        }
        Summary::AnswerLost {
            location,
            netns,
            ifname,
            retried,
        } => format!(
            "answer lost on the way: {location} at {netns}/{ifname}, unanswered{}",
            retried_note(*retried)
        ),
        Summary::Dropped {
            reason,
            location,
            retried,
        } => format!(
            "dropped by the kernel ({reason} at {location}), unanswered{}",
            retried_note(*retried)
        ),
        Summary::Late {
            answer_ns,
            gave_up_ns,
            reason,
            location,
            retried,
        } => {
            let rcode = t.rcode.as_deref().unwrap_or("");
            let mut s = format!(
                "answer {rcode} came at +{} after the client had given up (socket closed: {reason} at {location})",
                dur(*answer_ns)
            );
            if let Some(g) = gave_up_ns {
                let _ = write!(
                    s,
                    ", {} after its own {} timeout",
                    dur(answer_ns.saturating_sub(*g)),
                    dur(*g)
                );
            }
            s.push_str(", unanswered for the client");
            s.push_str(retried_note(*retried));
            s
        }
        Summary::Pending => "no answer yet when the input ended".to_string(),
        Summary::Unanswered {
            timeout_ns,
            retries,
        } => {
            let mut s = format!("unanswered after {:.1} s", seconds(*timeout_ns));
            if let Some(n) = retries {
                let _ = write!(s, ", retried {n} time(s)");
            }
            s
        }
    }
}

/// A race record in one line, e.g. `lookup of api.lab.test. took 5.00 s: A dropped by
/// conntrack race at +0.60 ms, retried at +5.00 s`.
pub fn race_summary(r: &RaceRecord) -> String {
    if r.verdict == RaceVerdict::ResolvedClash {
        return format!(
            "{} conntrack clash(es) resolved by the kernel on CPU {}: the race happened, nothing was lost",
            r.counters.clash_resolve,
            r.cpu.unwrap_or(0)
        );
    }
    let (name, qtype, offset) = match &r.dropped {
        Some(q) => (
            q.question.name.as_str(),
            q.question.qtype.name(),
            q.offset_ns,
        ),
        None => ("", "".into(), 0),
    };
    let what = match r.verdict {
        RaceVerdict::RaceDrop => format!(
            "{qtype} dropped by conntrack race at +{}",
            dur(r.drop_offset_ns.unwrap_or(offset))
        ),
        _ => format!("{qtype} unanswered, no kernel evidence (suspected race)"),
    };
    let how = match r.retry_ns {
        Some(retry) => format!(", retried at +{}", dur(retry)),
        None => ", no retry seen".to_string(),
    };
    match r.total_delay_ns {
        Some(total) => format!("lookup of {name} took {}: {what}{how}", dur(total)),
        None => format!("lookup of {name}: {what}{how}"),
    }
}

/// The namespace of a race record: its name, `netns:0x…` for a bare cookie, or empty.
pub fn race_netns(netns: &RaceNetns) -> String {
    match netns {
        RaceNetns::Unknown => String::new(),
        RaceNetns::Name(n) => n.clone(),
        RaceNetns::Cookie(c) => format!("netns:{c:#x}"),
    }
}

pub fn peer(p: &Peer) -> String {
    match p {
        Peer::Socket(s) => s.to_string(),
        Peer::Host(ip) => ip.to_string(),
    }
}

/// Where a loop's query was sent: `(not visible)` for an amplification.
pub fn loop_server(h: &LoopHop) -> String {
    match h.server {
        Some(s) => s.to_string(),
        None => "(not visible)".to_string(),
    }
}

/// `namespace/interface` where a loop's query arrived, or empty.
pub fn loop_at(h: &LoopHop) -> String {
    match &h.at {
        Some((netns, ifname)) => format!("{netns}/{ifname}"),
        None => String::new(),
    }
}

/// The cycle in one line, e.g. `10.244.1.4:53 → 10.96.0.10:53 ⇒DNAT 10.244.1.3:53 (…) → …`.
pub fn loop_path(l: &LoopRecord) -> String {
    let Some(first) = l.cycle.first() else {
        return String::new();
    };
    let mut p = peer(&first.from);
    for h in &l.cycle {
        let (server, backend) = (loop_server(h), peer(&h.backend));
        let _ = write!(p, " → {server}");
        if backend != server {
            let _ = write!(p, " ⇒DNAT {backend}");
        }
        let _ = write!(p, " ({})", loop_at(h));
    }
    p
}

/// The question's parent domain.
pub fn zone(name: &str) -> &str {
    match name.split_once('.') {
        Some((_, rest)) if !rest.is_empty() => rest,
        _ => ".",
    }
}

/// A loop's client sockets, in text order.
pub fn loop_clients(l: &LoopRecord) -> Vec<String> {
    let mut c: Vec<String> = l.clients.iter().map(SocketAddr::to_string).collect();
    c.sort();
    c
}
