//! The live view's state: the frames it holds, what the user asked to see, and the keys.
//!
//! Owns: [`App`] (frames in with [`App::update`], keys in with [`App::key`], the screen
//! out with [`App::draw`], written in `screen`), [`LiveOptions`], [`Action`] and
//! [`WindowKind`].
//!
//! Must not: read the terminal, wait, or sample. The loop (`run`) feeds it, and tests
//! drive it with frames and keys alone.
//!
//! Frames:
//! - The newest frame and the one before it are kept; the window of the last interval
//!   is their difference.
//! - Paused, frames still come in, but the frames shown stay those of the moment of the
//!   pause.
//! - A reset takes the frame shown as the baseline, so every window then starts there at the
//!   earliest.

use super::columns::{columns_of, Extras};
use super::frame::{LiveFrame, LiveHeader};
use super::model::{self, Query, Row, SortKey, SORT_CYCLE};
use super::tally::Tally;
use crate::profile::TimeMode;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::sync::Arc;
use std::time::Duration;

/// How the live view starts.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveOptions {
    /// How often the caller sends frames; shown, and changed with `+` / `-`.
    pub refresh: Duration,
    /// When the COMMAND exits, [`run`](super::run) returns at once instead of waiting for
    /// a key.
    pub exit_on_end: bool,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            refresh: Duration::from_secs(1),
            exit_on_end: false,
        }
    }
}

/// What a key asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    None,
    /// The screen changed, so draw it.
    Redraw,
    /// Leave (`q`, Ctrl-C, or any key once the COMMAND exited).
    Quit,
    /// The refresh period changed to this (draw too).
    Refresh(Duration),
    /// The counts were reset (draw too).
    Reset,
}

/// The window every figure is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowKind {
    /// Between the last two frames.
    #[default]
    Interval,
    /// Since start, or since the last reset.
    SinceStart,
}

/// The refresh periods `+` and `-` step through, seconds.
const REFRESH_STEPS: [f64; 8] = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// What a frame says of the program beside its amounts.
#[derive(Debug, Clone)]
pub(crate) struct ProgramInfo {
    pub(crate) program: String,
    pub(crate) pid: i32,
    pub(crate) python_version: String,
    pub(crate) mode: TimeMode,
    /// Time could not be split into Python and native.
    pub(crate) unsplit: bool,
    pub(crate) free_threaded: bool,
}

/// One frame as the app keeps it.
#[derive(Debug)]
pub(crate) struct Snap {
    /// Frames are numbered as they come, from 1.
    pub(crate) seq: u64,
    pub(crate) tally: Tally,
    pub(crate) header: LiveHeader,
    pub(crate) info: ProgramInfo,
}

/// The live view.
#[derive(Debug)]
pub struct App {
    opts: LiveOptions,
    pub(crate) refresh: Duration,
    seq: u64,
    latest: Option<Arc<Snap>>,
    before: Option<Arc<Snap>>,
    /// The frames shown: (the one before, the one shown).
    shown: Option<(Option<Arc<Snap>>, Arc<Snap>)>,
    pub(crate) baseline: Option<Arc<Snap>>,
    pub(crate) window_kind: WindowKind,
    pub(crate) query: Query,
    /// The filter being typed (after `/`, before Enter).
    pub(crate) typing: Option<String>,
    pub(crate) help: bool,
    pub(crate) paused: bool,
    /// The window of the frames shown.
    pub(crate) window: Option<Tally>,
}

impl App {
    pub fn new(opts: LiveOptions) -> App {
        App {
            refresh: opts.refresh,
            opts,
            seq: 0,
            latest: None,
            before: None,
            shown: None,
            baseline: None,
            window_kind: WindowKind::Interval,
            query: Query::default(),
            typing: None,
            help: false,
            paused: false,
            window: None,
        }
    }

    /// Takes a new frame. Paused, it is kept but the screen shows the frames it showed.
    pub fn update(&mut self, frame: LiveFrame) {
        self.seq += 1;
        let m = &frame.profile.meta;
        let info = ProgramInfo {
            program: m.program.clone(),
            pid: m.pid,
            python_version: m.python_version.clone(),
            mode: m.mode,
            unsplit: m.split_unavailable.is_some(),
            free_threaded: m.free_threaded,
        };
        let snap = Arc::new(Snap {
            seq: self.seq,
            tally: Tally::of(&frame),
            header: frame.header,
            info,
        });
        // The frame that says the COMMAND exited comes at once, often a few milliseconds
        // after the one before: its interval alone is a sliver, with nothing sampled. The
        // last interval is then the one before it and the sliver, so the last screen shows
        // what the program last did.
        let ends = snap.header.exited.is_some()
            && self.before.is_some()
            && self
                .latest
                .as_ref()
                .is_some_and(|l| l.header.exited.is_none());
        if ends {
            self.latest = Some(snap);
        } else {
            self.before = self.latest.replace(snap);
        }
        if !self.paused {
            self.show_latest();
        }
    }

    /// Some(code) once the COMMAND exited (the newest frame says so, paused or not).
    pub fn exited(&self) -> Option<i32> {
        self.latest.as_ref().and_then(|s| s.header.exited)
    }

    /// The refresh period now (changed by `+` and `-`).
    pub fn refresh(&self) -> Duration {
        self.refresh
    }

    pub(crate) fn exit_on_end(&self) -> bool {
        self.opts.exit_on_end
    }

    /// The frame shown, if any came.
    pub(crate) fn current(&self) -> Option<&Snap> {
        self.shown.as_ref().map(|(_, cur)| &**cur)
    }

    fn show_latest(&mut self) {
        if let Some(cur) = &self.latest {
            self.shown = Some((self.before.clone(), cur.clone()));
        }
        self.recompute();
    }

    /// The window of the frames shown, from the start of the window asked for.
    fn recompute(&mut self) {
        let Some((prev, cur)) = &self.shown else {
            self.window = None;
            return;
        };
        // A baseline newer than the frame before the one shown starts the interval.
        let base = match self.window_kind {
            WindowKind::Interval => match (prev, &self.baseline) {
                (Some(p), Some(b)) if b.seq > p.seq => Some(b),
                (None, Some(b)) => Some(b),
                (p, _) => p.as_ref(),
            },
            WindowKind::SinceStart => self.baseline.as_ref(),
        };
        let base = base.filter(|b| b.seq <= cur.seq).map(|b| &b.tally);
        self.window = Some(cur.tally.since(base));
    }

    /// What the data shown has beyond time.
    pub(crate) fn extras(&self) -> Extras {
        let Some(cur) = self.current() else {
            return Extras::default();
        };
        let t = &cur.tally;
        Extras {
            memory: t.has_memory && self.query.thread.is_none(),
            native: t.lines.values().any(|l| !l.native.is_empty()),
            tasks: !t.line_tasks.is_empty(),
            unsplit: cur.info.unsplit,
        }
    }

    /// The sorts the view has, in the order `s` cycles through them.
    fn sorts(&self) -> Vec<SortKey> {
        let cols = columns_of(self.query.view, self.extras());
        SORT_CYCLE
            .into_iter()
            .filter(|k| cols.iter().any(|c| c.sort_key() == Some(*k)))
            .collect()
    }

    /// After the view or thread changed, a sort the view lacks becomes the total.
    fn keep_sort_valid(&mut self) {
        if !self.sorts().contains(&self.query.sort) {
            self.query.sort = SortKey::Total;
        }
    }

    /// The rows of the window shown.
    pub(crate) fn rows(&self) -> Vec<Row> {
        match &self.window {
            Some(w) => model::rows(w, &self.query),
            None => Vec::new(),
        }
    }

    /// Handles one key press.
    pub fn key(&mut self, k: KeyEvent) -> Action {
        let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl_c {
            return Action::Quit;
        }
        if let Some(text) = &mut self.typing {
            match k.code {
                KeyCode::Enter => {
                    self.query.filter = self.typing.take().unwrap_or_default();
                }
                KeyCode::Esc => {
                    self.typing = None;
                    self.query.filter.clear();
                }
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => return Action::None,
            }
            return Action::Redraw;
        }
        if self.exited().is_some() {
            // The COMMAND is gone, so any key leaves the last screen.
            return Action::Quit;
        }
        if self.help {
            if matches!(k.code, KeyCode::Char('q') | KeyCode::Char('Q')) {
                return Action::Quit;
            }
            self.help = false;
            return Action::Redraw;
        }
        match k.code {
            KeyCode::Char('q') | KeyCode::Char('Q') => return Action::Quit,
            KeyCode::Char('?') | KeyCode::Char('h') => self.help = true,
            KeyCode::Char('w') => {
                self.window_kind = match self.window_kind {
                    WindowKind::Interval => WindowKind::SinceStart,
                    WindowKind::SinceStart => WindowKind::Interval,
                };
                self.recompute();
            }
            KeyCode::Char('s') => self.cycle_sort(1),
            KeyCode::Char('S') => self.cycle_sort(-1),
            KeyCode::Char('v') => {
                self.query.view = self.query.view.next();
                self.keep_sort_valid();
            }
            KeyCode::Char('t') => self.cycle_thread(1),
            KeyCode::Char('T') => self.cycle_thread(-1),
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    self.show_latest();
                }
            }
            KeyCode::Char('r') => {
                self.baseline = self.shown.as_ref().map(|(_, cur)| cur.clone());
                self.recompute();
                return Action::Reset;
            }
            KeyCode::Char('/') => self.typing = Some(self.query.filter.clone()),
            KeyCode::Esc if !self.query.filter.is_empty() => self.query.filter.clear(),
            KeyCode::Char('+') | KeyCode::Char('=') => return self.step_refresh(1),
            KeyCode::Char('-') | KeyCode::Char('_') => return self.step_refresh(-1),
            _ => return Action::None,
        }
        Action::Redraw
    }

    fn cycle_sort(&mut self, step: isize) {
        let sorts = self.sorts();
        let at = sorts
            .iter()
            .position(|k| *k == self.query.sort)
            .unwrap_or(0) as isize;
        let n = sorts.len() as isize;
        if n > 0 {
            self.query.sort = sorts[(at + step).rem_euclid(n) as usize];
        }
    }

    /// All threads, then each thread by kernel id, then all again.
    fn cycle_thread(&mut self, step: isize) {
        let Some(cur) = self.current() else { return };
        let mut ids: Vec<Option<i32>> = vec![None];
        ids.extend(cur.tally.threads.keys().map(|t| Some(*t)));
        let at = ids
            .iter()
            .position(|t| *t == self.query.thread)
            .unwrap_or(0) as isize;
        let n = ids.len() as isize;
        self.query.thread = ids[(at + step).rem_euclid(n) as usize];
        self.keep_sort_valid();
    }

    /// The next longer (`+`) or shorter (`-`) refresh period of [`REFRESH_STEPS`].
    fn step_refresh(&mut self, dir: i32) -> Action {
        let now = self.refresh.as_secs_f64();
        let next = if dir > 0 {
            REFRESH_STEPS.iter().copied().find(|s| *s > now + 1e-9)
        } else {
            REFRESH_STEPS
                .iter()
                .rev()
                .copied()
                .find(|s| *s < now - 1e-9)
        };
        match next {
            Some(s) => {
                self.refresh = Duration::from_secs_f64(s);
                Action::Refresh(self.refresh)
            }
            None => Action::None,
        }
    }
}
