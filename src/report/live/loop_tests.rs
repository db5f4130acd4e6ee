//! Unit tests of the live view's loop: frames from a channel, keys from a script, a test
//! backend for the terminal.

use super::*;
use crate::profile::{Profile, ProfileMeta, PROFILE_SCHEMA_VERSION};
use crossterm::event::{KeyCode, KeyEvent, KeyEventState, KeyModifiers};
use ratatui::backend::TestBackend;
use std::collections::VecDeque;
use std::sync::mpsc;

/// Events in order, one per poll (None: the poll timed out).
struct Script {
    events: VecDeque<Option<Event>>,
    polls: usize,
}

impl Events for Script {
    fn next(&mut self, _: Duration) -> io::Result<Option<Event>> {
        self.polls += 1;
        assert!(self.polls < 1000, "the loop did not end");
        Ok(self.events.pop_front().flatten())
    }
}

fn script(events: Vec<Option<Event>>) -> Script {
    Script {
        events: events.into(),
        polls: 0,
    }
}

fn press(c: char) -> Option<Event> {
    Some(Event::Key(KeyEvent::new(
        KeyCode::Char(c),
        KeyModifiers::NONE,
    )))
}

/// A frame with no lines: `samples` ticks by `samples` seconds.
fn frame(samples: u64, exited: Option<i32>) -> LiveFrame {
    LiveFrame {
        profile: Profile {
            schema_version: PROFILE_SCHEMA_VERSION,
            meta: ProfileMeta::default(),
            total_s: 0.0,
            files: Vec::new(),
            stacks: Vec::new(),
            threads: Vec::new(),
            processes: Vec::new(),
            memory: None,
            gpu: None,
        },
        header: LiveHeader {
            samples,
            elapsed: Duration::from_secs(samples),
            exited,
            ..LiveHeader::default()
        },
    }
}

/// Runs the loop over `frames` (the sender dropped after them when `hang_up`) and
/// `events`; the exit, the app, the polls taken and the refresh periods reported.
fn run_loop(
    frames: Vec<LiveFrame>,
    hang_up: bool,
    events: Vec<Option<Event>>,
    opts: LiveOptions,
    quit: bool,
) -> (Exit, App, usize, Vec<Duration>) {
    let (tx, rx) = mpsc::channel();
    for f in frames {
        tx.send(f).unwrap();
    }
    let _keep = (!hang_up).then_some(tx);
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    let mut app = App::new(opts);
    let mut events = script(events);
    let mut periods = Vec::new();
    let exit = event_loop(
        &mut terminal,
        &mut app,
        &rx,
        &mut events,
        &mut |d| periods.push(d),
        &AtomicBool::new(quit),
    )
    .unwrap();
    (exit, app, events.polls, periods)
}

#[test]
fn only_the_newest_waiting_frame_is_taken() {
    let frames = vec![frame(10, None), frame(20, None), frame(30, None)];
    let (exit, app, _, _) = run_loop(
        frames,
        false,
        vec![press('q')],
        LiveOptions::default(),
        false,
    );
    assert_eq!(exit, Exit::Quit);
    assert_eq!(app.current().unwrap().header.samples, 30);
    // The frames before it were skipped, not taken as the interval's start: the window is
    // since start.
    assert_eq!(app.window.as_ref().unwrap().samples, 30);
}

#[test]
fn the_quit_flag_ends_the_loop() {
    let (exit, _, polls, _) = run_loop(vec![], false, vec![], LiveOptions::default(), true);
    assert_eq!((exit, polls), (Exit::Signal, 0));
}

#[test]
fn an_exit_ends_at_once_or_at_the_next_key() {
    let ended = || vec![frame(5, None), frame(6, Some(2))];
    let at_once = LiveOptions {
        exit_on_end: true,
        ..LiveOptions::default()
    };
    let (exit, _, polls, _) = run_loop(ended(), false, vec![], at_once, false);
    assert_eq!((exit, polls), (Exit::Ended(2), 0));
    // Without exit_on_end, the screen stays (the sender gone too) until a key.
    let events = vec![None, None, press('x')];
    let (exit, _, polls, _) = run_loop(ended(), true, events, LiveOptions::default(), false);
    assert_eq!((exit, polls), (Exit::Ended(2), 3));
}

#[test]
fn a_sender_gone_without_an_exit_ends_the_loop() {
    let (exit, _, _, _) = run_loop(
        vec![frame(1, None)],
        true,
        vec![],
        LiveOptions::default(),
        false,
    );
    assert_eq!(exit, Exit::Disconnected);
}

#[test]
fn refresh_keys_reach_the_caller_and_releases_are_ignored() {
    let release = Some(Event::Key(KeyEvent {
        code: KeyCode::Char('q'),
        modifiers: KeyModifiers::NONE,
        kind: KeyEventKind::Release,
        state: KeyEventState::NONE,
    }));
    let events = vec![press('+'), press('+'), release, press('-'), press('q')];
    let (exit, app, polls, periods) = run_loop(
        vec![frame(1, None)],
        false,
        events,
        LiveOptions::default(),
        false,
    );
    assert_eq!((exit, polls), (Exit::Quit, 5));
    let secs: Vec<f64> = periods.iter().map(Duration::as_secs_f64).collect();
    assert_eq!(secs, vec![2.0, 5.0, 2.0]);
    assert_eq!(app.refresh(), Duration::from_secs(2));
}
