//! `top`, the live view: a full-screen table of the hottest lines, redrawn as frames of
//! the recording come in.
//!
//! Owns: the screen and the keys, from frames the session hands over ([`LiveFrame`]) to
//! the terminal, and [`run`], the loop that joins them.
//!
//! Must not: sample, read a process or wait on the sampler. The session takes frames on
//! its side and sends them down a channel. The loop takes the newest without blocking,
//! so a slow terminal never slows a tick.
//!
//! Files:
//! - `frame`: [`LiveFrame`], what the session sends.
//! - `tally`: a frame's figures as amounts, and windows as differences of two frames.
//! - `model`: the rows of a window (view, thread, filter, sort).
//! - `columns`: which columns a view has and which fit the width.
//! - `app`: [`App`], the state and the keys.
//! - `header`, `screen`, `cells`: what the screen shows, and where.
//! - `terminal`: the terminal taken over and given back; the quit signals.
//! - `wake`: [`Wake`], rung with each frame so the loop sees it at once.

mod app;
mod cells;
mod columns;
mod frame;
mod header;
mod model;
mod screen;
mod tally;
mod terminal;
mod wake;

pub use app::{Action, App, LiveOptions};
pub use frame::{LiveFrame, LiveGpu, LiveHeader, LiveProcess};
pub use terminal::{
    enter_sequence, is_terminal, quit_on_signals, restore_sequence, restore_terminal, TerminalGuard,
};
pub use wake::Wake;

use crossterm::event::{Event, KeyEventKind};
use ratatui::backend::{Backend, CrosstermBackend};
use ratatui::Terminal;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

/// How long the loop waits for a key or a frame's [`Wake`] before it looks at the quit
/// flag again, so a signal is seen within this.
const POLL: Duration = Duration::from_millis(50);

/// Why [`run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `q` or Ctrl-C.
    Quit,
    /// The quit flag was set (SIGTERM, SIGHUP, SIGINT, or the caller).
    Signal,
    /// The COMMAND exited with this code; `exit_on_end`, or a key after it.
    Ended(i32),
    /// The sender hung up without saying that the COMMAND exited.
    Disconnected,
}

/// Where the loop's events come from: the terminal, or a test's script.
pub(crate) trait Events {
    /// The next event within `timeout`, or None.
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Event>>;
}

/// The terminal's events, through crossterm; a ring of `wake` ends the wait too.
struct TerminalEvents {
    wake: Wake,
}

impl Events for TerminalEvents {
    /// Waits on stdin ourselves, and asks crossterm only with a zero timeout, because
    /// crossterm's reader spins on a terminal that hung up (135,000 reads in 2 s, seen), so it must
    /// never be the one waiting when the terminal goes away.
    fn next(&mut self, timeout: Duration) -> io::Result<Option<Event>> {
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the terminal hung up");
        if hung_up(0, None) {
            return Err(gone());
        }
        // Events crossterm holds already (a key read with another, a resize).
        if crossterm::event::poll(Duration::ZERO)? {
            return crossterm::event::read().map(Some);
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if hung_up(ms, Some(&self.wake)) {
            return Err(gone());
        }
        if crossterm::event::poll(Duration::ZERO)? {
            return crossterm::event::read().map(Some);
        }
        Ok(None)
    }
}

/// Whether the terminal on stdin hung up (its window closed, its tmux server killed). A
/// hung-up terminal is always ready to read. Without this check the loop spun at a full
/// core's worth of polls, found running an hour after its terminal went away.
///
/// Waits up to `ms` milliseconds for stdin to be readable or `wake` to ring (its rings are
/// taken); true when stdin hung up.
fn hung_up(ms: i32, wake: Option<&Wake>) -> bool {
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [
        pollfd(libc::STDIN_FILENO),
        pollfd(wake.map_or(-1, Wake::raw_fd)),
    ];
    // SAFETY: two pollfds we own (a negative fd is ignored by poll); a bounded timeout.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if fds[1].revents & libc::POLLIN != 0 {
        if let Some(w) = wake {
            w.drain();
        }
    }
    n > 0 && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Shows the live view on this terminal until the user quits, `quit` is set, or the
/// COMMAND exits (at once with `opts.exit_on_end`, else at the next key).
/// - Frames come from `rx`, about one per refresh. The loop never blocks on it. It takes
///   what has come, keeps the newest, and draws.
/// - The sender rings `wake` with each frame, and the loop's wait on the terminal ends then.
/// - `+` and `-` change the refresh period. `on_refresh` is told the new one, for the
///   sender to follow.
/// - The terminal is given back on every return, on error and on panic
///   ([`TerminalGuard`]).
///
/// Errors: the terminal could not be taken over or written to.
pub fn run(
    rx: Receiver<LiveFrame>,
    wake: Wake,
    opts: LiveOptions,
    on_refresh: &mut dyn FnMut(Duration),
    quit: &AtomicBool,
) -> io::Result<Exit> {
    let guard = TerminalGuard::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
    let mut app = App::new(opts);
    let exit = event_loop(
        &mut terminal,
        &mut app,
        &rx,
        &mut TerminalEvents { wake },
        on_refresh,
        quit,
    );
    drop(terminal);
    drop(guard);
    exit
}

/// [`run`]'s loop, on any backend and event source.
pub(crate) fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    rx: &Receiver<LiveFrame>,
    events: &mut dyn Events,
    on_refresh: &mut dyn FnMut(Duration),
    quit: &AtomicBool,
) -> io::Result<Exit>
where
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut dirty = true;
    let mut hung_up = false;
    loop {
        if quit.load(Ordering::SeqCst) {
            return Ok(Exit::Signal);
        }
        let mut newest = None;
        loop {
            match rx.try_recv() {
                Ok(f) => newest = Some(f),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    hung_up = true;
                    break;
                }
            }
        }
        if let Some(f) = newest {
            app.update(f);
            dirty = true;
        }
        if dirty {
            terminal.draw(|f| app.draw(f)).map_err(io::Error::other)?;
            dirty = false;
        }
        match app.exited() {
            Some(code) if app.exit_on_end() => return Ok(Exit::Ended(code)),
            None if hung_up => return Ok(Exit::Disconnected),
            _ => {}
        }
        let event = match events.next(POLL) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
            // Nobody to show it to, as a hang-up signal would have said.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(Exit::Signal),
            Err(e) => return Err(e),
        };
        match event {
            Some(Event::Key(k)) if k.kind != KeyEventKind::Release => match app.key(k) {
                Action::Quit => {
                    return Ok(match app.exited() {
                        Some(code) => Exit::Ended(code),
                        None => Exit::Quit,
                    })
                }
                Action::None => {}
                Action::Refresh(d) => {
                    on_refresh(d);
                    dirty = true;
                }
                Action::Redraw | Action::Reset => dirty = true,
            },
            // Drawing fits the new size (ratatui resizes its buffers first).
            Some(Event::Resize(..)) => dirty = true,
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "loop_tests.rs"]
mod loop_tests;
