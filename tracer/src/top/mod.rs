//! `dnspath top`: the live engine ([`crate::engine`], as under `trace --all-netns`) with one
//! sink, [`TopSink`], that counts the records into tables — clients, servers, questions and
//! the node's status (docs/top.md) — and shows them: full-screen (ratatui on crossterm), or in
//! batch (`--once`'s text, `-o json` snapshots) for scripts and tests.
mod screen;
mod sink;
mod snapshot;
mod table;
mod tables;
mod terminal;

use std::{
    io::Write,
    sync::{atomic::AtomicBool, Arc, Mutex},
    time::Duration,
};

pub use screen::{draw, Action, ViewState, MIN_HEIGHT, MIN_WIDTH};
pub use sink::{TopOutput, TopSink};
pub use snapshot::{Shown, Snapshot, Which};
pub use table::{Cell, Column, Table};
pub use tables::Tables;
pub use terminal::{restore, Screen};

use crate::{
    engine::{run_live, LiveError, LiveSummary, RunOptions},
    output::{filter::Filter, sink::Sinks, Format},
    runner::stop::StopPolicy,
};

/// How `top` runs and shows its tables.
#[derive(Clone, Debug)]
pub struct TopOptions {
    pub run: RunOptions,
    /// Rates are per interval; the screen and `-o json` refresh each one (at least 1 s: the
    /// run's totals come once a second).
    pub interval: Duration,
    /// The full-screen view; else batch.
    pub screen: bool,
    /// Batch: one table at the end (rates over the whole run), not a snapshot an interval.
    pub once: bool,
    pub format: Format,
    /// Rows a batch table shows (the screen: as many as fit).
    pub rows: usize,
    pub shown: Shown,
    /// What is counted (`--pod`, `--name`, …, as `trace`'s).
    pub filter: Filter,
    /// Colours on the screen (`NO_COLOR` turns them off).
    pub color: bool,
}

/// Unix-epoch nanoseconds now.
fn wall_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The run: attaches to every namespace, counts until a signal, `--duration` or `q`, writes
/// or draws the tables, detaches. Batch output goes to `out`.
pub async fn run(opts: TopOptions, out: Box<dyn Write + Send>) -> Result<LiveSummary, LiveError> {
    let tables = Arc::new(Mutex::new(Tables::default()));
    let quit = Arc::new(AtomicBool::new(false));
    let output = if opts.screen {
        TopOutput::Screen(Screen::new(
            Arc::clone(&tables),
            Arc::clone(&quit),
            opts.interval,
            opts.color,
        ))
    } else {
        let mut shown = opts.shown.clone();
        shown.rows = opts.rows;
        TopOutput::Batch {
            format: opts.format,
            once: opts.once,
            shown,
            out,
        }
    };
    let interval_ns = u64::try_from(opts.interval.as_nanos()).unwrap_or(u64::MAX);
    let mut sinks = Sinks::new();
    sinks.push(Box::new(TopSink::new(
        tables,
        opts.filter,
        interval_ns,
        output,
    )));
    let mut policy = StopPolicy::default().with_quit(quit);
    run_live(opts.run, &mut sinks, &mut policy).await
}
