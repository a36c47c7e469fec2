//! One of `top`'s tables as it is shown: its columns (declared once: the JSON keys, the
//! headers, the widths of the full-screen view), rows of typed cells, sorting by any column,
//! and the batch text.
use std::{cmp::Ordering, fmt::Write as _};

use serde::{ser::SerializeMap, Serialize, Serializer};

use crate::output::escape;

/// A column: its JSON key, its header, its width on the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub key: &'static str,
    pub title: &'static str,
    pub width: u16,
}

const fn col(key: &'static str, title: &'static str, width: u16) -> Column {
    Column { key, title, width }
}

pub(super) const CLIENT_COLUMNS: &[Column] = &[
    col("client", "CLIENT", 32),
    col("qps", "Q/S", 6),
    col("questions", "QUES", 5),
    col("answered_pct", "ANS%", 5),
    col("nxdomain", "NXDOM", 5),
    col("servfail", "SRVF", 4),
    col("unanswered", "UNANS", 5),
    col("p50_ms", "P50ms", 6),
    col("p99_ms", "P99ms", 6),
    col("late", "LATE", 4),
    col("dropped", "DROP", 4),
    col("search", "SRCH", 4),
];

pub(super) const SERVER_COLUMNS: &[Column] = &[
    col("server", "SERVER", 21),
    col("qps", "Q/S", 6),
    col("queries", "QUERIES", 7),
    col("noerror", "NOERR", 5),
    col("nxdomain", "NXDOM", 5),
    col("servfail", "SRVF", 4),
    col("unanswered", "UNANS", 5),
    col("p50_ms", "P50ms", 6),
    col("p99_ms", "P99ms", 6),
    col("own_p50_ms", "OWNms", 6),
    col("upstream_p50_ms", "UPms", 6),
    col("role", "ROLE", 8),
    col("other_rcode", "OTHER", 5),
    col("pod", "POD", 24),
];

pub(super) const NAME_COLUMNS: &[Column] = &[
    col("name", "NAME", 40),
    col("qtype", "TYPE", 5),
    col("qps", "Q/S", 6),
    col("questions", "QUES", 5),
    col("answered", "ANS", 5),
    col("nxdomain", "NXDOM", 5),
    col("servfail", "SRVF", 4),
    col("failed", "FAIL", 4),
    col("last", "LAST", 10),
];

/// A value of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Words, some from the wire: escaped before any terminal.
    Text(String),
    Count(u64),
    /// Per second.
    Rate(f64),
    Percent(Option<f64>),
    /// Milliseconds.
    Ms(Option<f64>),
    Ratio(Option<f64>),
}

impl Cell {
    fn number(&self) -> Option<f64> {
        match self {
            Cell::Text(_) => None,
            Cell::Count(n) => Some(*n as f64),
            Cell::Rate(r) => Some(*r),
            Cell::Percent(v) | Cell::Ms(v) | Cell::Ratio(v) => *v,
        }
    }

    /// Numbers right-aligned on screen.
    pub fn is_number(&self) -> bool {
        !matches!(self, Cell::Text(_))
    }

    /// As a terminal shows it (escaped; `-` for no value).
    pub fn text(&self) -> String {
        let opt = |v: &Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
        };
        match self {
            Cell::Text(s) => escape(s).into_owned(),
            Cell::Count(n) => n.to_string(),
            Cell::Rate(r) => format!("{r:.1}"),
            Cell::Percent(v) => opt(v, 1),
            Cell::Ms(v) => opt(v, 2),
            Cell::Ratio(v) => opt(v, 2),
        }
    }

    fn cmp(&self, other: &Cell) -> Ordering {
        match (self, other) {
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
            _ => {
                let (a, b) = (self.number(), other.number());
                a.partial_cmp(&b).unwrap_or(Ordering::Equal)
            }
        }
    }
}

/// Written as JSON: text as it is, numbers as numbers (rates to 0.01), `null` for no value.
impl Serialize for Cell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Text(t) => s.serialize_str(t),
            Cell::Count(n) => s.serialize_u64(*n),
            Cell::Rate(r) => s.serialize_f64((r * 100.0).round() / 100.0),
            Cell::Percent(v) | Cell::Ms(v) | Cell::Ratio(v) => v.serialize(s),
        }
    }
}

/// Rows under columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    pub rows: Vec<Vec<Cell>>,
    /// Records that came for a new row when the table was full (counted in no row shown).
    pub folded: u64,
}

impl Table {
    pub fn new(name: &'static str, columns: &'static [Column]) -> Self {
        Self {
            name,
            columns,
            rows: Vec::new(),
            folded: 0,
        }
    }

    /// The column whose key is `key`.
    pub fn column(&self, key: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.key == key)
    }

    /// Sorted by column `by` (largest first when `descending`), ties by the first column.
    pub fn sort(&mut self, by: usize, descending: bool) {
        self.rows.sort_by(|a, b| {
            let (x, y) = (a.get(by), b.get(by));
            let o = match (x, y) {
                (Some(x), Some(y)) => x.cmp(y),
                _ => Ordering::Equal,
            };
            let o = if descending { o.reverse() } else { o };
            o.then_with(|| match (a.first(), b.first()) {
                (Some(x), Some(y)) => x.cmp(y),
                _ => Ordering::Equal,
            })
        });
    }

    /// The first `n` rows only.
    pub fn truncate(&mut self, n: usize) {
        self.rows.truncate(n);
    }

    /// Aligned text under a header line: each column as wide as its widest cell, numbers
    /// right-aligned, two spaces between columns.
    pub fn text(&self) -> String {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(Cell::text).collect())
            .collect();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cells
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|s| s.chars().count())
                    .chain([c.title.len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let numeric: Vec<bool> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .first()
                    .and_then(|r| r.get(i))
                    .is_some_and(Cell::is_number)
            })
            .collect();
        let line = |items: &mut dyn Iterator<Item = (usize, &str)>| {
            let mut s = String::new();
            for (i, item) in items {
                let w = widths.get(i).copied().unwrap_or(0);
                if i > 0 {
                    s.push_str("  ");
                }
                if numeric.get(i).copied().unwrap_or(false) {
                    let _ = write!(s, "{item:>w$}");
                } else {
                    let _ = write!(s, "{item:<w$}");
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&mut self.columns.iter().map(|c| c.title).enumerate());
        for r in &cells {
            out.push('\n');
            out.push_str(&line(&mut r.iter().map(String::as_str).enumerate()));
        }
        out
    }
}

/// `{"rows": [{column: value, …}, …], "folded": n}`.
impl Serialize for Table {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Row<'a>(&'static [Column], &'a [Cell]);
        impl Serialize for Row<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.1.len()))?;
                for (c, v) in self.0.iter().zip(self.1) {
                    m.serialize_entry(c.key, v)?;
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(2))?;
        let rows: Vec<Row<'_>> = self.rows.iter().map(|r| Row(self.columns, r)).collect();
        m.serialize_entry("rows", &rows)?;
        m.serialize_entry("folded", &self.folded)?;
        m.end()
    }
}
