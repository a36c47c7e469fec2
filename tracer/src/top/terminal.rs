//! The full-screen view's terminal and thread: raw mode and the alternate screen on start,
//! both undone on every way out — `q` or Ctrl-C (a key in raw mode: the run is asked to stop
//! through its quit flag), SIGTERM or SIGINT (the run stops, its sink stops this), an error
//! (the sink's abort), a panic anywhere (a hook restores the terminal before the message),
//! and a drop.
use std::{
    io::{self, Stdout},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use ratatui::{
    backend::CrosstermBackend,
    crossterm::{
        cursor,
        event::{self, Event, KeyEventKind},
        execute,
        terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
    },
    Terminal,
};

use super::{
    screen::{draw, Action, ViewState},
    tables::Tables,
};

/// How often keys are looked for.
const KEY_POLL: Duration = Duration::from_millis(100);

/// Leaves raw mode and the alternate screen, shows the cursor (harmless when not entered).
pub fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

/// Restores the terminal when dropped (the view thread's end, however it ends).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        restore();
    }
}

/// The terminal restored before any panic's message (the default hook's after it).
fn restore_on_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// The full-screen view: its thread, drawing the shared tables every interval and on keys.
pub struct Screen {
    tables: Arc<Mutex<Tables>>,
    quit: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    interval: Duration,
    color: bool,
    thread: Option<JoinHandle<()>>,
}

impl Screen {
    /// `quit` is the run's: set when a key asks to quit. `color`: false with `NO_COLOR`.
    pub fn new(
        tables: Arc<Mutex<Tables>>,
        quit: Arc<AtomicBool>,
        interval: Duration,
        color: bool,
    ) -> Self {
        Self {
            tables,
            quit,
            stop: Arc::new(AtomicBool::new(false)),
            interval,
            color,
            thread: None,
        }
    }

    /// Takes the terminal and starts drawing (once the run is attached: what it said on
    /// stderr before is left on the normal screen).
    pub fn start(&mut self) {
        if self.thread.is_some() {
            return;
        }
        restore_on_panic();
        let (tables, quit, stop) = (
            Arc::clone(&self.tables),
            Arc::clone(&self.quit),
            Arc::clone(&self.stop),
        );
        let (interval, color) = (self.interval, self.color);
        let spawned = std::thread::Builder::new()
            .name("top-screen".into())
            .spawn(move || {
                if let Err(e) = run(&tables, &quit, &stop, interval, color) {
                    restore();
                    log::warn!("top: the terminal: {e}");
                    // Without a screen, the run has nothing to show: it ends.
                    quit.store(true, Ordering::Relaxed);
                }
            });
        match spawned {
            Ok(t) => self.thread = Some(t),
            Err(e) => {
                log::warn!("top: no thread for the screen: {e}");
                self.quit.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Stops drawing and gives the terminal back as it was.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    tables: &Mutex<Tables>,
    quit: &AtomicBool,
    stop: &AtomicBool,
    interval: Duration,
    color: bool,
) -> io::Result<()> {
    terminal::enable_raw_mode()?;
    let _restore = Restore;
    execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
    let mut term: Terminal<CrosstermBackend<Stdout>> =
        Terminal::new(CrosstermBackend::new(io::stdout()))?;
    term.clear()?;
    let mut state = ViewState::new(0, color);
    let mut next_draw = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next_draw {
            next_draw = Instant::now() + interval;
            let size = term.size()?;
            // The table's rows: the screen less the status, tabs, header and keys lines.
            state.shown.rows = usize::from(size.height.saturating_sub(5));
            let snap = {
                let t = tables
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.snapshot(&state.shown, super::wall_now_ns())
            };
            term.draw(|f| draw(f, &snap, &state))?;
        }
        if event::poll(KEY_POLL)? {
            match event::read()? {
                Event::Key(k) if k.kind != KeyEventKind::Release => {
                    match state.key(k, state.which.columns().len()) {
                        Action::Quit => quit.store(true, Ordering::Relaxed),
                        Action::Redraw => next_draw = Instant::now(),
                        Action::Nothing => {}
                    }
                }
                Event::Resize(..) => next_draw = Instant::now(),
                _ => {}
            }
        }
    }
    Ok(())
}
