//! The tables at one moment, sorted and cut to the rows shown: what the full-screen view
//! draws, `--once` prints as text and `-o json` writes as one line (`type` `top`).
use std::fmt::Write as _;

use serde::Serialize;

use crate::output::escape;

use super::{
    table::{Column, Table, CLIENT_COLUMNS, NAME_COLUMNS, SERVER_COLUMNS},
    tables::{ActiveLoop, Tables},
};

/// Which of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Clients,
    Servers,
    Names,
}

impl Which {
    pub const ALL: [Which; 3] = [Which::Clients, Which::Servers, Which::Names];

    pub fn index(self) -> usize {
        match self {
            Which::Clients => 0,
            Which::Servers => 1,
            Which::Names => 2,
        }
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            Which::Clients => CLIENT_COLUMNS,
            Which::Servers => SERVER_COLUMNS,
            Which::Names => NAME_COLUMNS,
        }
    }

    /// The column sorted by when nothing else is asked: the questions (queries) counted.
    pub fn default_sort(self) -> usize {
        match self {
            Which::Clients => 2,
            Which::Servers => 2,
            Which::Names => 3,
        }
    }
}

/// How the tables are shown: rows per table, and each table's sort column and order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub rows: usize,
    pub sort: [(usize, bool); 3],
}

impl Shown {
    pub fn new(rows: usize) -> Self {
        Self {
            rows,
            sort: Which::ALL.map(|w| (w.default_sort(), true)),
        }
    }

    /// Sorted by the column `key` of each table that has it (the others keep theirs);
    /// `None` when no table has it.
    pub fn sorted_by(mut self, key: &str, descending: bool) -> Option<Self> {
        let mut found = false;
        for w in Which::ALL {
            if let Some(i) = w.columns().iter().position(|c| c.key == key) {
                self.sort[w.index()] = (i, descending);
                found = true;
            }
        }
        found.then_some(self)
    }
}

/// A kernel drop reason and its count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropCount {
    pub reason: String,
    pub count: u64,
}

/// The status line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusView {
    pub packets: u64,
    pub packets_per_s: f64,
    pub lost: u64,
    pub races: u64,
    pub race_drops: u64,
    pub loops_detected: u64,
    /// Loops going on now: each a banner until it ends.
    pub loops_active: Vec<LoopView>,
    /// Kernel drops of DNS packets by reason, most first.
    pub drops: Vec<DropCount>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoopView {
    pub id: u64,
    pub question: String,
    pub path: String,
}

impl From<&ActiveLoop> for LoopView {
    fn from(l: &ActiveLoop) -> Self {
        Self {
            id: l.id,
            question: l.question.clone(),
            path: l.path.clone(),
        }
    }
}

/// Everything shown at one moment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Wall-clock time, RFC 3339 UTC.
    pub time: String,
    /// Seconds the tables have counted.
    pub elapsed_s: f64,
    pub status: StatusView,
    pub clients: Table,
    pub servers: Table,
    pub names: Table,
}

impl Tables {
    /// The three tables, in [`Which::ALL`]'s order.
    pub fn tables(&self) -> [Table; 3] {
        [
            self.clients_table(),
            self.servers_table(),
            self.names_table(),
        ]
    }

    /// The tables now, as `shown`.
    pub fn snapshot(&self, shown: &Shown, wall_ns: u64) -> Snapshot {
        let [mut clients, mut servers, mut names] = self.tables();
        for (t, (by, desc)) in [&mut clients, &mut servers, &mut names]
            .into_iter()
            .zip(shown.sort)
        {
            t.sort(by, desc);
            t.truncate(shown.rows);
        }
        let st = &self.status;
        let mut drops: Vec<DropCount> = st
            .drops
            .rows()
            .map(|(r, n)| DropCount {
                reason: r.clone(),
                count: *n,
            })
            .collect();
        let (other, folded) = st.drops.other();
        if folded > 0 {
            drops.push(DropCount {
                reason: "other".into(),
                count: *other,
            });
        }
        drops.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
        Snapshot {
            kind: "top",
            time: crate::time::WallTime(wall_ns).to_string(),
            elapsed_s: (self.elapsed_s * 1000.0).round() / 1000.0,
            status: StatusView {
                packets: st.packets,
                packets_per_s: (st.packets_per_s * 10.0).round() / 10.0,
                lost: st.lost,
                races: st.races,
                race_drops: st.race_drops,
                loops_detected: st.loops_detected,
                loops_active: st.loops.values().map(LoopView::from).collect(),
                drops,
            },
            clients,
            servers,
            names,
        }
    }
}

impl Snapshot {
    pub fn table(&self, w: Which) -> &Table {
        match w {
            Which::Clients => &self.clients,
            Which::Servers => &self.servers,
            Which::Names => &self.names,
        }
    }

    /// The status in one line (escaped).
    pub fn status_line(&self) -> String {
        let s = &self.status;
        let mut line = format!(
            "{:.1} pkts/s, {} packets, {} lost, {} races ({} dropped a query), {} loops active",
            s.packets_per_s,
            s.packets,
            s.lost,
            s.races,
            s.race_drops,
            s.loops_active.len()
        );
        if s.drops.is_empty() {
            line.push_str(", kernel drops: none");
        } else {
            line.push_str(", kernel drops:");
            for d in &s.drops {
                let _ = write!(line, " {} {}", escape(&d.reason), d.count);
            }
        }
        line
    }

    /// The status for the screen's first line, short enough for 80 columns (escaped).
    pub fn status_short(&self) -> String {
        let s = &self.status;
        let mut line = format!(
            "{:.0} pkt/s  lost {}  races {}  loops {}  drops",
            s.packets_per_s,
            s.lost,
            s.races,
            s.loops_active.len()
        );
        if s.drops.is_empty() {
            line.push_str(" 0");
        }
        for d in &s.drops {
            let _ = write!(line, " {} {}", escape(&d.reason), d.count);
        }
        line
    }

    /// Each active loop's banner (escaped).
    pub fn loop_banners(&self) -> Vec<String> {
        self.status
            .loops_active
            .iter()
            .map(|l| {
                format!(
                    "LOOP {}: {} going round {}",
                    l.id,
                    escape(&l.question),
                    escape(&l.path)
                )
            })
            .collect()
    }

    /// `--once`'s text: the status, the banners, each table under its name.
    pub fn text(&self) -> String {
        let mut out = format!(
            "dnspath top: {} s counted; {}",
            self.elapsed_s,
            self.status_line()
        );
        for b in self.loop_banners() {
            out.push('\n');
            out.push_str(&b);
        }
        for w in Which::ALL {
            let t = self.table(w);
            let _ = write!(out, "\n\n{} ({} shown", t.name, t.rows.len());
            if t.folded > 0 {
                let _ = write!(out, ", {} record(s) beyond the table's rows", t.folded);
            }
            out.push_str(")\n");
            out.push_str(&t.text());
        }
        out
    }
}
