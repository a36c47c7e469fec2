//! `top`'s tables: every record the filter keeps, counted by client, by server and by
//! question, and the node's status (packets, loss, races, loops, kernel drops). Each table
//! is capped: a row that comes when it is full is counted in `other`. Rates are per
//! interval: [`Tables::roll`] closes one.
use std::collections::BTreeMap;

use crate::output::record::Detected;
use crate::{
    correlate::record::{LegOutcome, Outcome, TransactionRecord},
    decode::dns::Rcode,
    detect::{
        loops::{LoopRecord, LoopState},
        race::RaceVerdict,
    },
    output::{
        record::{Record, StatsRecord},
        report::loop_path,
        tally::{client_of, served_legs, Capped, Latency, ServedLeg, ServerRole},
    },
};

use super::table::{Cell, Table, CLIENT_COLUMNS, NAME_COLUMNS, SERVER_COLUMNS};

/// Rows each table counts; beyond, `other`.
pub(super) const MAX_CLIENTS: usize = 2048;
pub(super) const MAX_SERVERS: usize = 1024;
pub(super) const MAX_NAMES: usize = 4096;
/// Kernel drop reasons counted by name; beyond, `other`.
const MAX_REASONS: usize = 128;
/// Active loops remembered (the correlator reports at most 1,024).
const MAX_LOOPS: usize = 1024;

/// A count over the run and over the interval being counted, with the last interval's rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    pub total: u64,
    window: u64,
    /// Per second, over the last interval closed.
    pub per_s: f64,
}

impl Rate {
    fn add(&mut self) {
        self.total += 1;
        self.window += 1;
    }

    fn roll(&mut self, secs: f64) {
        self.per_s = if secs > 0.0 {
            self.window as f64 / secs
        } else {
            0.0
        };
        self.window = 0;
    }
}

/// One client: its questions and what became of them.
#[derive(Clone, Debug, Default)]
pub struct ClientRow {
    pub questions: Rate,
    pub answered: u64,
    pub nxdomain: u64,
    pub servfail: u64,
    pub unanswered: u64,
    pub late: u64,
    pub dropped: u64,
    /// Lookups (a lookup's first search step): questions ÷ lookups is the search list's
    /// expansion.
    pub lookups: u64,
    pub latency: Latency,
}

/// One server (where queries were delivered).
#[derive(Clone, Debug, Default)]
pub struct ServerRow {
    pub pod: Option<String>,
    pub role: Option<ServerRole>,
    pub queries: Rate,
    pub noerror: u64,
    pub nxdomain: u64,
    pub servfail: u64,
    /// Answered with another rcode (REFUSED, FORMERR, …).
    pub other_rcode: u64,
    /// Unanswered, dropped or late.
    pub unanswered: u64,
    pub latency: Latency,
    /// A forwarder's own time, and its upstream's, on the legs it forwarded.
    pub own: Latency,
    pub upstream: Latency,
}

/// One question (name and type).
#[derive(Clone, Debug, Default)]
pub struct NameRow {
    pub questions: Rate,
    pub answered: u64,
    pub nxdomain: u64,
    pub servfail: u64,
    /// Not answered: unanswered, dropped, late, pending.
    pub failed: u64,
    /// The last outcome: its rcode when answered, else the outcome's word.
    pub last: String,
}

/// A forwarding loop going on now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveLoop {
    pub id: u64,
    pub question: String,
    pub path: String,
}

/// The status line's counts.
#[derive(Clone, Debug)]
pub struct Status {
    /// Packets read, over the run (from the pipeline's counts).
    pub packets: u64,
    /// Per second over the last interval.
    pub packets_per_s: f64,
    packets_at_roll: u64,
    /// Ring-buffer events lost (packets and drops).
    pub lost: u64,
    /// Conntrack races seen (any verdict), and those that dropped a query.
    pub races: u64,
    pub race_drops: u64,
    /// Loops detected over the run.
    pub loops_detected: u64,
    pub loops: BTreeMap<u64, ActiveLoop>,
    /// Kernel drops of DNS packets (not normal socket life), by reason.
    pub drops: Capped<String, u64>,
}

/// Every table `top` shows.
#[derive(Debug)]
pub struct Tables {
    pub clients: Capped<String, ClientRow>,
    pub servers: Capped<String, ServerRow>,
    pub names: Capped<(String, String), NameRow>,
    pub status: Status,
    /// Seconds counted (the intervals closed).
    pub elapsed_s: f64,
}

impl Default for Tables {
    fn default() -> Self {
        Self {
            clients: Capped::new(MAX_CLIENTS),
            servers: Capped::new(MAX_SERVERS),
            names: Capped::new(MAX_NAMES),
            status: Status {
                packets: 0,
                packets_per_s: 0.0,
                packets_at_roll: 0,
                lost: 0,
                races: 0,
                race_drops: 0,
                loops_detected: 0,
                loops: BTreeMap::new(),
                drops: Capped::new(MAX_REASONS),
            },
            elapsed_s: 0.0,
        }
    }
}

fn is(rc: &Option<Rcode>, want: &Rcode) -> bool {
    rc.as_ref() == Some(want)
}

impl Tables {
    /// Counts one record (already past the filter).
    pub fn add(&mut self, r: &Record) {
        match r {
            Record::Transaction(t) => self.add_transaction(t),
            Record::Detected(Detected::Loop(l)) => self.add_loop(l),
            Record::Detected(Detected::Race(r)) => {
                self.status.races += 1;
                if r.verdict == RaceVerdict::RaceDrop {
                    self.status.race_drops += 1;
                }
            }
            Record::Drop(d) if d.benign.is_none() => {
                *self.status.drops.row(d.reason.clone()) += 1;
            }
            Record::Stats(s) => self.add_stats(s),
            _ => {}
        }
    }

    /// The pipeline's running totals (live: once a second).
    pub fn add_stats(&mut self, s: &StatsRecord) {
        self.status.packets = s.decode.packets;
        self.status.lost = s.decode.lost + s.decode.drops_lost;
        if s.correlate
            .as_ref()
            .is_some_and(|c| c.detect.loops.active == 0)
        {
            self.status.loops.clear();
        }
    }

    fn add_loop(&mut self, l: &LoopRecord) {
        match l.state {
            LoopState::Detected | LoopState::Ongoing => {
                if l.state == LoopState::Detected {
                    self.status.loops_detected += 1;
                }
                if self.status.loops.len() < MAX_LOOPS || self.status.loops.contains_key(&l.id) {
                    self.status.loops.insert(
                        l.id,
                        ActiveLoop {
                            id: l.id,
                            question: format!("{} {}", l.question.name, l.question.qtype),
                            path: loop_path(l),
                        },
                    );
                }
            }
            LoopState::Ended => {
                self.status.loops.remove(&l.id);
            }
        }
    }

    fn add_transaction(&mut self, t: &TransactionRecord) {
        let c = self.clients.row(client_of(t));
        c.questions.add();
        match t.outcome {
            Outcome::Answered => c.answered += 1,
            Outcome::Unanswered | Outcome::Pending => c.unanswered += 1,
            Outcome::Late => c.late += 1,
            Outcome::Dropped => c.dropped += 1,
        }
        if is(&t.rcode, &Rcode::NXDOMAIN) {
            c.nxdomain += 1;
        }
        if is(&t.rcode, &Rcode::SERVFAIL) {
            c.servfail += 1;
        }
        if t.lookup.step == 0 {
            c.lookups += 1;
        }
        if let (Outcome::Answered, Some(ns)) = (t.outcome, t.latency_ns) {
            c.latency.add(ns);
        }
        for leg in served_legs(t) {
            self.add_leg(leg);
        }
        let n = self
            .names
            .row((t.question.name.clone(), t.question.qtype.to_string()));
        n.questions.add();
        match (t.outcome, &t.rcode) {
            (Outcome::Answered, rc) => {
                n.answered += 1;
                if is(rc, &Rcode::NXDOMAIN) {
                    n.nxdomain += 1;
                }
                if is(rc, &Rcode::SERVFAIL) {
                    n.servfail += 1;
                }
                n.last = rc.as_deref().unwrap_or(t.outcome.as_str()).to_string();
            }
            (o, _) => {
                n.failed += 1;
                n.last = o.as_str().to_string();
            }
        }
    }

    fn add_leg(&mut self, leg: ServedLeg) {
        let s = self.servers.row(leg.backend.to_string());
        s.queries.add();
        if s.pod.is_none() {
            s.pod = leg.pod;
        }
        // A server asked both by clients and by a forwarder is shown as the first.
        s.role.get_or_insert(leg.role);
        match (leg.outcome, &leg.rcode) {
            (LegOutcome::Answered | LegOutcome::Truncated, Some(rc)) => {
                if *rc == Rcode::NOERROR {
                    s.noerror += 1;
                } else if *rc == Rcode::NXDOMAIN {
                    s.nxdomain += 1;
                } else if *rc == Rcode::SERVFAIL {
                    s.servfail += 1;
                } else {
                    s.other_rcode += 1;
                }
                if let Some(ns) = leg.latency_ns {
                    s.latency.add(ns);
                }
            }
            (LegOutcome::Unanswered | LegOutcome::Dropped | LegOutcome::Late, _) => {
                s.unanswered += 1;
            }
            _ => {}
        }
        if let Some((own, up)) = leg.split {
            s.own.add(own);
            s.upstream.add(up);
        }
    }

    /// Closes an interval of `secs` seconds: the rates are its.
    pub fn roll(&mut self, secs: f64) {
        self.elapsed_s += secs;
        let st = &mut self.status;
        st.packets_per_s = if secs > 0.0 {
            st.packets.saturating_sub(st.packets_at_roll) as f64 / secs
        } else {
            0.0
        };
        st.packets_at_roll = st.packets;
        for rate in self
            .clients
            .rows_mut()
            .map(|r| &mut r.questions)
            .chain(self.servers.rows_mut().map(|r| &mut r.queries))
            .chain(self.names.rows_mut().map(|r| &mut r.questions))
        {
            rate.roll(secs);
        }
    }

    /// Rates over the whole run instead of the last interval (`--once`).
    pub fn rates_over_run(&mut self, secs: f64) {
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        self.status.packets_per_s = per_s(self.status.packets);
        for rate in self
            .clients
            .rows_mut()
            .map(|r| &mut r.questions)
            .chain(self.servers.rows_mut().map(|r| &mut r.queries))
            .chain(self.names.rows_mut().map(|r| &mut r.questions))
        {
            rate.per_s = per_s(rate.total);
        }
    }

    /// The clients' table, every row (unsorted).
    pub fn clients_table(&self) -> Table {
        let mut t = Table::new("clients", CLIENT_COLUMNS);
        for (name, r) in self.clients.rows() {
            let p = |q: f64| Cell::Ms(r.latency.quantile_ms(q));
            t.rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Rate(r.questions.per_s),
                Cell::Count(r.questions.total),
                Cell::Percent(percent(r.answered, r.questions.total)),
                Cell::Count(r.nxdomain),
                Cell::Count(r.servfail),
                Cell::Count(r.unanswered),
                p(0.5),
                p(0.99),
                Cell::Count(r.late),
                Cell::Count(r.dropped),
                Cell::Ratio((r.lookups > 0).then(|| r.questions.total as f64 / r.lookups as f64)),
            ]);
        }
        t.folded = self.clients.other().1;
        t
    }

    /// The servers' table.
    pub fn servers_table(&self) -> Table {
        let mut t = Table::new("servers", SERVER_COLUMNS);
        for (addr, r) in self.servers.rows() {
            t.rows.push(vec![
                Cell::Text(addr.clone()),
                Cell::Rate(r.queries.per_s),
                Cell::Count(r.queries.total),
                Cell::Count(r.noerror),
                Cell::Count(r.nxdomain),
                Cell::Count(r.servfail),
                Cell::Count(r.unanswered),
                Cell::Ms(r.latency.quantile_ms(0.5)),
                Cell::Ms(r.latency.quantile_ms(0.99)),
                Cell::Ms(r.own.quantile_ms(0.5)),
                Cell::Ms(r.upstream.quantile_ms(0.5)),
                Cell::Text(
                    r.role
                        .map(ServerRole::as_str)
                        .unwrap_or_default()
                        .to_string(),
                ),
                Cell::Count(r.other_rcode),
                Cell::Text(r.pod.clone().unwrap_or_default()),
            ]);
        }
        t.folded = self.servers.other().1;
        t
    }

    /// The questions' table.
    pub fn names_table(&self) -> Table {
        let mut t = Table::new("names", NAME_COLUMNS);
        for ((name, qtype), r) in self.names.rows() {
            t.rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Text(qtype.clone()),
                Cell::Rate(r.questions.per_s),
                Cell::Count(r.questions.total),
                Cell::Count(r.answered),
                Cell::Count(r.nxdomain),
                Cell::Count(r.servfail),
                Cell::Count(r.failed),
                Cell::Text(r.last.clone()),
            ]);
        }
        t.folded = self.names.other().1;
        t
    }
}

fn percent(n: u64, of: u64) -> Option<f64> {
    (of > 0).then(|| (n as f64 / of as f64 * 1000.0).round() / 10.0)
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
