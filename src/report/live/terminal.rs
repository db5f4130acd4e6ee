//! The terminal while the live view runs: taken over, and always given back.
//!
//! Owns:
//! - [`TerminalGuard`]: raw mode, the alternate screen and a hidden cursor while it lives;
//!   all three restored when it drops, and by a panic hook before the panic's message
//!   prints (so the message lands on the normal screen, in a usable terminal);
//! - [`quit_on_signals`]: SIGTERM, SIGHUP and SIGINT set a flag that the loop reads;
//! - [`is_terminal`]: whether stdout is a terminal at all.
//!
//! Must not: draw (ratatui does) or decide what a signal means beyond setting the flag.

use crossterm::cursor::{Hide, Show};
use crossterm::style::{Attribute, SetAttribute};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen,
};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::io::{self, IsTerminal as _, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// Whether the terminal is taken over now (a guard lives and has not restored it).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The panic hook is installed once per process.
static HOOK: Once = Once::new();
/// Set by the signal handler of [`quit_on_signals`].
static QUIT: AtomicBool = AtomicBool::new(false);

/// Whether stdout is a terminal (the live view needs one; the caller checks first).
pub fn is_terminal() -> bool {
    io::stdout().is_terminal()
}

/// Writes what takes the screen over: the alternate screen, cleared, cursor hidden.
pub fn enter_sequence(w: &mut impl Write) -> io::Result<()> {
    crossterm::queue!(w, EnterAlternateScreen, Hide, Clear(ClearType::All))?;
    w.flush()
}

/// Writes what gives the screen back: attributes reset, cursor shown, the normal screen.
/// Raw mode is not bytes, so [`restore_terminal`] leaves it too.
pub fn restore_sequence(w: &mut impl Write) -> io::Result<()> {
    crossterm::queue!(
        w,
        SetAttribute(Attribute::Reset),
        Show,
        LeaveAlternateScreen
    )?;
    w.flush()
}

/// Gives the terminal back if it was taken over, both the screen ([`restore_sequence`]) and
/// the input mode. Does nothing the second time, so the guard, the panic hook and a
/// caller may all call it.
pub fn restore_terminal() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = restore_sequence(&mut io::stdout());
        let _ = disable_raw_mode();
    }
}

/// The terminal taken over for the live view, given back on drop.
#[derive(Debug)]
pub struct TerminalGuard {
    _private: (),
}

impl TerminalGuard {
    /// Takes the terminal over (raw mode, the alternate screen, cursor hidden) and installs
    /// the panic hook that gives it back.
    /// Errors: stdout is no terminal, or the terminal refused a mode (all undone then).
    pub fn enter() -> io::Result<TerminalGuard> {
        install_panic_hook();
        enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        if let Err(e) = enter_sequence(&mut io::stdout()) {
            restore_terminal();
            return Err(e);
        }
        Ok(TerminalGuard { _private: () })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// A panic anywhere gives the terminal back first, then says what it says as before.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
    });
}

extern "C" fn on_quit_signal(_: libc::c_int) {
    QUIT.store(true, Ordering::SeqCst);
}

/// Catches SIGTERM, SIGHUP and SIGINT. Each sets the flag returned, which
/// [`run`](super::run) reads between polls (so the terminal is restored by the guard,
/// never from the handler). The handlers stay for the rest of the process.
/// Errors: a handler could not be installed.
pub fn quit_on_signals() -> io::Result<&'static AtomicBool> {
    let action = SigAction::new(
        SigHandler::Handler(on_quit_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
        // SAFETY: `on_quit_signal` only stores to a static atomic (lock-free on every
        // target we build), which is async-signal-safe.
        unsafe { signal::sigaction(s, &action) }.map_err(io::Error::from)?;
    }
    Ok(&QUIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_undoes_what_enter_did() {
        let mut enter = Vec::new();
        enter_sequence(&mut enter).unwrap();
        let mut restore = Vec::new();
        restore_sequence(&mut restore).unwrap();
        // DEC private modes: 1049 is the alternate screen, 25 the cursor; `h` sets, `l`
        // resets.
        let (enter, restore) = (
            String::from_utf8(enter).unwrap(),
            String::from_utf8(restore).unwrap(),
        );
        assert!(enter.contains("\x1b[?1049h") && enter.contains("\x1b[?25l"));
        assert!(restore.contains("\x1b[?1049l") && restore.contains("\x1b[?25h"));
        // The cursor shows before the normal screen comes back (some terminals keep the
        // cursor state per screen).
        assert!(restore.find("\x1b[?25h") < restore.find("\x1b[?1049l"));
    }
}
