//! `dnspath top`'s command line: its flags, their checks, and the run.
use std::{io::IsTerminal, process::ExitCode, time::Duration};

use clap::Args;
use dnspath::{
    engine::RunOptions,
    kernel::attach::AttachSpec,
    output::Format,
    top::{self, Shown, TopOptions, MIN_HEIGHT, MIN_WIDTH},
};

use crate::{
    args::{CaptureArgs, FilterArgs, HostRootArgs, TimeoutArgs},
    units::{parse_secs, Secs},
};

#[derive(Args)]
pub struct TopArgs {
    /// Seconds between refreshes (the rates are per interval), e.g. `2`, `5s`; at least 1.
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = parse_secs)]
    interval: Secs,
    /// Batch: count until stopped (`--duration`, Ctrl-C), then print the tables once, rates
    /// over the whole run.
    #[arg(long)]
    once: bool,
    /// Stop after this long: seconds, or e.g. `30s`, `1m30s`.
    #[arg(long, value_name = "DURATION", value_parser = parse_secs)]
    duration: Option<Secs>,
    /// Batch output: `text` (with `--once`) or `json` (a snapshot line every interval, and
    /// one at the end; with `--once`, the end's alone). Without it, and on a terminal, the
    /// full-screen view.
    #[arg(short, long, value_enum)]
    output: Option<Format>,
    /// Rows of each table in batch output.
    #[arg(long, value_name = "N", default_value_t = 20)]
    rows: usize,
    /// Sort every table that has this column by it, largest first (e.g. `p99_ms`,
    /// `unanswered`; the column names of `-o json`) [default: questions, queries].
    #[arg(long, value_name = "COLUMN")]
    sort: Option<String>,
    #[command(flatten)]
    capture: CaptureArgs,
    #[command(flatten)]
    timeout: TimeoutArgs,
    #[command(flatten)]
    host_root: HostRootArgs,
    #[command(flatten)]
    filter: FilterArgs,
}

/// `NO_COLOR` set and not empty (no-color.org) turns colours off.
fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn options(a: TopArgs, kernel_log: bool, terminal: bool) -> anyhow::Result<TopOptions> {
    a.capture.check()?;
    let duration = a.duration.map(|s| s.positive("--duration")).transpose()?;
    let interval = a
        .interval
        .positive("--interval")?
        .max(Duration::from_secs(1));
    let screen = !a.once && a.output.is_none() && terminal;
    if !screen && a.output != Some(Format::Json) && !a.once {
        anyhow::bail!(
            "standard output is not a terminal: give --once (a table at the end) or -o json (a snapshot every interval)"
        );
    }
    if screen {
        if let Ok((w, h)) = ratatui::crossterm::terminal::size() {
            if w < MIN_WIDTH || h < MIN_HEIGHT {
                anyhow::bail!(
                    "the terminal is {w}×{h}: top needs at least {MIN_WIDTH}×{MIN_HEIGHT} (or --once, -o json)"
                );
            }
        }
    }
    let shown = match &a.sort {
        None => Shown::new(a.rows),
        Some(key) => Shown::new(a.rows).sorted_by(key, true).ok_or_else(|| {
            anyhow::anyhow!("--sort {key}: no table has this column (see docs/top.md)")
        })?,
    };
    a.host_root.apply()?;
    Ok(TopOptions {
        run: RunOptions {
            attach: AttachSpec {
                all_netns: true,
                ..Default::default()
            },
            capture: a.capture.probe(kernel_log),
            transactions: true,
            timeout: a.timeout.timeout.positive("--timeout")?,
            duration,
            evidence: Default::default(),
            // Counted from the stats: no packet record is made for the tables.
            every_packet: false,
        },
        interval,
        screen,
        once: a.once,
        format: a.output.unwrap_or(Format::Text),
        rows: a.rows.max(1),
        shown,
        filter: a.filter.filter()?,
        color: color(),
    })
}

pub fn run(a: TopArgs, kernel_log: bool) -> anyhow::Result<ExitCode> {
    let opts = options(a, kernel_log, std::io::stdout().is_terminal())?;
    let screen = opts.screen;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = Box::new(std::io::BufWriter::new(std::io::stdout()));
    let result = rt.block_on(top::run(opts, out));
    if screen {
        // Whatever happened, the terminal is the person's again before an error is said.
        top::restore();
    }
    result?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    fn options(args: &[&str], terminal: bool) -> anyhow::Result<dnspath::top::TopOptions> {
        let cli = Cli::try_parse_from(["dnspath", "top"].iter().chain(args))?;
        let Command::Top(a) = cli.command else {
            unreachable!("parsed as top")
        };
        super::options(a, false, terminal)
    }

    #[test]
    fn batch_or_screen_from_the_flags_and_the_terminal() {
        let o = options(&["--once", "--duration", "10"], false).unwrap();
        assert!(o.once && !o.screen);
        assert_eq!(o.run.duration, Some(std::time::Duration::from_secs(10)));
        assert!(o.run.attach.all_netns && o.run.transactions);
        let o = options(&["-o", "json", "--interval", "0.2"], false).unwrap();
        assert!(!o.screen);
        assert_eq!(
            o.interval,
            std::time::Duration::from_secs(1),
            "at least 1 s"
        );
        let e = options(&[], false).err().unwrap().to_string();
        assert!(e.contains("not a terminal"), "{e}");
        let o = options(
            &["--once", "--sort", "p99_ms", "--pod", "kube-system/*"],
            false,
        )
        .unwrap();
        assert_eq!(o.shown.sort[0], (8, true));
        assert_eq!(o.shown.sort[1], (8, true), "the servers have p99_ms too");
        assert!(o.filter.is_active());
        let e = options(&["--once", "--sort", "nope"], false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--sort nope"), "{e}");
    }
}
