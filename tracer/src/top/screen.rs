//! The full-screen view drawn from a [`Snapshot`]: the status line, a banner per active
//! loop, the table chosen with its sort column marked, and the keys; and what each key
//! does. No terminal here (the tests draw into ratatui's `TestBackend`); every string off
//! the wire was escaped by the snapshot's cells and lines.
use ratatui::{
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Cell as TuiCell, Paragraph, Row, Table as TuiTable},
    Frame,
};

use super::{
    snapshot::{Shown, Snapshot, Which},
    table::Table,
};

/// The smallest screen the view is laid out for (`kubectl exec` into a small terminal).
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

/// What the person looking has chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewState {
    pub which: Which,
    pub shown: Shown,
    /// Colours (off with `NO_COLOR`): without them, bold and reverse video only.
    pub color: bool,
}

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    Redraw,
    Nothing,
}

impl ViewState {
    pub fn new(rows: usize, color: bool) -> Self {
        Self {
            which: Which::Clients,
            shown: Shown::new(rows),
            color,
        }
    }

    /// `q`, Esc, Ctrl-C: quit; Tab, `1` `2` `3` (`c` `s` `n`): the table; ←/→ (`<` `>`): the
    /// sort column; `r`: the order.
    pub fn key(&mut self, k: KeyEvent, columns: usize) -> Action {
        let sort = &mut self.shown.sort[self.which.index()];
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
            KeyCode::Char('q' | 'Q') | KeyCode::Esc => Action::Quit,
            KeyCode::Tab => {
                self.which = Which::ALL[(self.which.index() + 1) % 3];
                Action::Redraw
            }
            KeyCode::BackTab => {
                self.which = Which::ALL[(self.which.index() + 2) % 3];
                Action::Redraw
            }
            KeyCode::Char('1' | 'c') => self.show(Which::Clients),
            KeyCode::Char('2' | 's') => self.show(Which::Servers),
            KeyCode::Char('3' | 'n') => self.show(Which::Names),
            KeyCode::Right | KeyCode::Char('>') => {
                sort.0 = (sort.0 + 1) % columns.max(1);
                Action::Redraw
            }
            KeyCode::Left | KeyCode::Char('<') => {
                sort.0 = (sort.0 + columns.max(1) - 1) % columns.max(1);
                Action::Redraw
            }
            KeyCode::Char('r') => {
                sort.1 = !sort.1;
                Action::Redraw
            }
            _ => Action::Nothing,
        }
    }

    fn show(&mut self, w: Which) -> Action {
        self.which = w;
        Action::Redraw
    }

    fn style(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }
}

/// Column widths for `width` cells: the first column takes what the others leave (at least
/// 24, a pod's name or `netns/address`); columns that do not fit are left out from the right
/// (the columns are in the order they matter).
fn widths(t: &Table, width: u16) -> Vec<u16> {
    let mut w: Vec<u16> = t.columns.iter().map(|c| c.width).collect();
    loop {
        let rest: u16 = w.iter().skip(1).sum::<u16>() + w.len().saturating_sub(1) as u16;
        if rest + 24 <= width || w.len() <= 2 {
            if let Some(first) = w.first_mut() {
                *first = width
                    .saturating_sub(rest)
                    .max(12)
                    .min(first.saturating_mul(2));
            }
            return w;
        }
        w.pop();
    }
}

/// Draws `snap` as `state` chose.
pub fn draw(frame: &mut Frame<'_>, snap: &Snapshot, state: &ViewState) {
    let area = frame.area();
    let banners = snap.loop_banners();
    let [top, banner, tabs, body, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(u16::try_from(banners.len().min(3)).unwrap_or(3)),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    let when = snap.time.get(11..19).unwrap_or(&snap.time);
    let title = Line::from(vec![
        Span::styled("dnspath top", Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!(" {when}  {}", snap.status_short())),
    ]);
    frame.render_widget(Paragraph::new(title), top);
    let banner_style = state
        .style(Color::Red)
        .add_modifier(Modifier::BOLD | Modifier::REVERSED);
    let lines: Vec<Line<'_>> = banners
        .into_iter()
        .take(3)
        .map(|b| Line::styled(b, banner_style))
        .collect();
    frame.render_widget(Paragraph::new(lines), banner);

    let table = snap.table(state.which);
    let (by, desc) = state.shown.sort[state.which.index()];
    let mut spans = Vec::new();
    for w in Which::ALL {
        let name = snap.table(w).name;
        if w == state.which {
            spans.push(Span::styled(
                format!("[{name}]"),
                state.style(Color::Cyan).add_modifier(Modifier::BOLD),
            ));
        } else {
            spans.push(Span::raw(format!(" {name} ")));
        }
        spans.push(Span::raw(" "));
    }
    let sort_title = table.columns.get(by).map_or("", |c| c.title);
    spans.push(Span::raw(format!(
        "  sort: {sort_title} {}",
        if desc { "↓" } else { "↑" }
    )));
    if table.folded > 0 {
        spans.push(Span::styled(
            format!("  {} beyond the table's rows", table.folded),
            state.style(Color::Yellow),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), tabs);
    draw_table(frame, table, body, by, state);
    let keys = "q quit · tab/1-3 table · ←/→ sort column · r reverse";
    frame.render_widget(
        Paragraph::new(Line::styled(
            keys,
            Style::default().add_modifier(Modifier::DIM),
        )),
        help,
    );
}

fn draw_table(frame: &mut Frame<'_>, t: &Table, area: Rect, by: usize, state: &ViewState) {
    let w = widths(t, area.width);
    let aligned = |text: String, number: bool| {
        let line = Line::from(text);
        TuiCell::from(if number {
            line.alignment(Alignment::Right)
        } else {
            line
        })
    };
    let header = Row::new(t.columns.iter().take(w.len()).enumerate().map(|(i, c)| {
        let number = i > 0
            && t.rows
                .first()
                .and_then(|r| r.get(i))
                .is_some_and(|c| c.is_number());
        let cell = aligned(c.title.to_string(), number);
        if i == by {
            cell.style(Style::default().add_modifier(Modifier::REVERSED))
        } else {
            cell
        }
    }))
    .style(state.style(Color::Cyan).add_modifier(Modifier::BOLD));
    let rows = t.rows.iter().map(|r| {
        Row::new(
            r.iter()
                .take(w.len())
                .map(|c| aligned(c.text(), c.is_number())),
        )
    });
    let table = TuiTable::new(rows, w.iter().map(|n| Constraint::Length(*n)))
        .header(header)
        .column_spacing(1);
    frame.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, buffer::Buffer, Terminal};

    use super::*;
    use crate::{
        detect::loops::LoopState,
        output::Record,
        test_support::fixtures::{loop_record, service_transaction},
        top::tables::Tables,
    };

    fn screen_text(buf: &Buffer) -> Vec<String> {
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect()
    }

    fn render(tables: &Tables, state: &ViewState, w: u16, h: u16) -> Vec<String> {
        let snap = tables.snapshot(&state.shown, 0);
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| draw(f, &snap, state)).unwrap();
        screen_text(term.backend().buffer())
    }

    /// At 80×24: the status, a loop's banner, the clients' header and row, the keys; a
    /// name off the wire is escaped; Tab shows the servers, with the CoreDNS backend.
    #[test]
    fn the_view_fits_80_by_24_and_switches_tables() {
        let mut t = Tables::default();
        for port in 0..3 {
            t.add(&service_transaction(
                "www.lab.test.",
                "A",
                5000 + port,
                "NOERROR",
            ));
        }
        t.add(&Record::detected(loop_record(7, LoopState::Detected, 1)));
        let Record::Transaction(mut evil) = service_transaction("e.lab.test.", "A", 1, "NOERROR")
        else {
            panic!("a transaction")
        };
        evil.pod.pod = Some("ns/\u{1b}[2Jevil".into());
        t.add(&Record::Transaction(evil));
        t.roll(1.0);
        let mut state = ViewState::new(10, false);
        let lines = render(&t, &state, MIN_WIDTH, MIN_HEIGHT);
        let all = lines.join("\n");
        assert!(lines[0].starts_with("dnspath top"), "{all}");
        assert!(lines[0].contains("loops 1  drops 0"), "{all}");
        assert!(
            lines[1].contains("LOOP 7: storm.lab.test. A going round"),
            "{all}"
        );
        assert!(lines[2].contains("[clients]"), "{all}");
        assert!(lines[3].starts_with("CLIENT"), "{all}");
        assert!(
            lines[3].contains("QUES") && lines[3].contains("P99ms"),
            "{all}"
        );
        let row = lines
            .iter()
            .find(|l| l.starts_with("client/10.244.1.2"))
            .unwrap_or_else(|| panic!("{all}"));
        assert!(row.contains(" 3 "), "3 questions: {row}");
        assert!(all.contains("ns/\\x1b[2Jevil"), "{all}");
        assert!(!all.contains('\u{1b}'), "{all}");
        assert!(lines[23].starts_with("q quit"), "{all}");

        let tab = KeyEvent::new(KeyCode::Tab, KeyModifiers::NONE);
        assert_eq!(state.key(tab, 12), Action::Redraw);
        let lines = render(&t, &state, MIN_WIDTH, MIN_HEIGHT);
        let all = lines.join("\n");
        assert!(lines[2].contains("[servers]"), "{all}");
        assert!(
            lines.iter().any(|l| l.starts_with("10.244.1.3:53")),
            "{all}"
        );
        let q = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        assert_eq!(state.key(q, 12), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(state.key(ctrl_c, 12), Action::Quit);
    }

    /// ←/→ move the sort column, `r` turns the order round.
    #[test]
    fn keys_move_the_sort_column() {
        let mut state = ViewState::new(5, true);
        let at = |s: &ViewState| s.shown.sort[0];
        assert_eq!(at(&state), (2, true));
        state.key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE), 12);
        assert_eq!(at(&state), (3, true));
        for _ in 0..4 {
            state.key(KeyEvent::new(KeyCode::Left, KeyModifiers::NONE), 12);
        }
        assert_eq!(at(&state), (11, true));
        state.key(KeyEvent::new(KeyCode::Char('r'), KeyModifiers::NONE), 12);
        assert_eq!(at(&state), (11, false));
    }
}
