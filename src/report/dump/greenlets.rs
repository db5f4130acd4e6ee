//! `dump`'s greenlets in text: each greenlet's state and stack (innermost frame first, as
//! a thread's), the running ones first; the running greenlet's stack is its thread's,
//! shown above, and is not repeated.

use crate::python::GreenletSnapshot;
use std::fmt::Write;

pub(super) fn to_text(out: &mut String, g: &GreenletSnapshot) {
    out.push('\n');
    if g.greenlets.is_empty() {
        match &g.error {
            Some(why) => {
                let _ = writeln!(out, "Greenlets: none read: {why}");
            }
            None => {
                let _ = writeln!(out, "Greenlets: none alive");
            }
        }
    } else {
        let n = g.greenlets.len();
        let _ = writeln!(
            out,
            "Greenlets: {n} (innermost frame first; a running one's stack is its thread's, above)"
        );
        if let Some(why) = &g.error {
            let _ = writeln!(out, "  <not all read: {why}>");
        }
    }
    for gl in &g.greenlets {
        let main = if gl.main { ", main" } else { "" };
        let _ = writeln!(
            out,
            "\nGreenlet {:#x} ({}{main}): {}",
            gl.id,
            gl.type_name,
            gl.state.as_str()
        );
        if let Some(err) = &gl.error {
            let _ = writeln!(out, "    <stack not read: {err}>");
        }
        for (i, f) in gl.frames.iter().enumerate() {
            super::python_line(out, i, f);
        }
        if gl.truncated {
            let _ = writeln!(
                out,
                "    ... stack truncated after {} frames",
                gl.frames.len()
            );
        }
    }
    if g.finished > 0 {
        let s = if g.finished == 1 { "" } else { "s" };
        let _ = writeln!(out, "\n<{} finished greenlet{s} not shown>", g.finished);
    }
    if g.truncated {
        let _ = writeln!(
            out,
            "<the collector's lists were not all read ({} objects visited): there may be \
             more greenlets>",
            g.objects_visited
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use crate::python::{Frame, GreenletInfo, GreenletSnapshot, GreenletState};

    fn greenlet(
        id: u64,
        type_name: &str,
        state: GreenletState,
        frames: Vec<Frame>,
    ) -> GreenletInfo {
        GreenletInfo {
            id,
            type_name: type_name.into(),
            state,
            main: false,
            frames,
            truncated: false,
            error: None,
        }
    }

    fn with_greenlets() -> crate::python::Snapshot {
        let mut s = sample();
        let waiting = vec![
            Frame {
                function: "sleep".into(),
                filename: "/g/hub.py".into(),
                line: Some(166),
                native: false,
            },
            Frame {
                function: "main".into(),
                filename: "/tmp/a.py".into(),
                line: Some(80),
                native: false,
            },
        ];
        let mut main = greenlet(0x20, "greenlet.greenlet", GreenletState::Suspended, waiting);
        main.main = true;
        let mut torn = greenlet(0x30, "Greenlet", GreenletState::Suspended, Vec::new());
        torn.error = Some("a greenlet's top frame is no frame object".into());
        s.greenlets = Some(GreenletSnapshot {
            greenlets: vec![
                greenlet(0x10, "Hub", GreenletState::Running, Vec::new()),
                main,
                torn,
                greenlet(
                    0x40,
                    "greenlet.greenlet",
                    GreenletState::Unstarted,
                    Vec::new(),
                ),
            ],
            finished: 2,
            objects_visited: 1234,
            truncated: true,
            error: None,
        });
        s
    }

    /// After the threads: each greenlet's header, a suspended one's frames, why one's
    /// stack is missing; then the finished ones counted and the bounds said.
    #[test]
    fn greenlets_follow_the_threads_in_text() {
        let text = super::super::to_text(&with_greenlets());
        let tail = text
            .split_once("\nGreenlets:")
            .expect("a greenlets section")
            .1;
        assert_eq!(
            tail,
            " 4 (innermost frame first; a running one's stack is its thread's, above)\n\
             \n\
             Greenlet 0x10 (Hub): running\n\
             \n\
             Greenlet 0x20 (greenlet.greenlet, main): suspended\n    \
             #0   sleep (/g/hub.py:166)\n    \
             #1   main (/tmp/a.py:80)\n\
             \n\
             Greenlet 0x30 (Greenlet): suspended\n    \
             <stack not read: a greenlet's top frame is no frame object>\n\
             \n\
             Greenlet 0x40 (greenlet.greenlet): not started\n\
             \n\
             <2 finished greenlets not shown>\n\
             <the collector's lists were not all read (1234 objects visited): there may be \
             more greenlets>\n"
        );
        // None found: said in one line; no snapshot (greenlet not imported): nothing.
        let mut none = sample();
        none.greenlets = Some(GreenletSnapshot {
            error: Some("greenlets of Python 3.13 are not read: a free-threaded build".into()),
            ..GreenletSnapshot::default()
        });
        let text = super::super::to_text(&none);
        assert!(text.ends_with(
            "\nGreenlets: none read: greenlets of Python 3.13 are not read: a free-threaded \
             build\n"
        ));
        assert!(!super::super::to_text(&sample()).contains("reenlet"));
    }

    /// The JSON has the fields docs/dump-json.md documents, and none where greenlet is not
    /// imported.
    #[test]
    fn greenlets_json_has_the_documented_fields() {
        let v = super::super::to_json(&with_greenlets());
        let g = &v["greenlets"];
        assert_eq!(g["finished"], 2);
        assert_eq!(g["objects_visited"], 1234);
        assert_eq!(g["truncated"], true);
        assert!(g.get("error").is_none());
        let list = g["greenlets"].as_array().expect("a list");
        assert_eq!(list.len(), 4);
        assert_eq!(list[0]["state"], "running");
        assert_eq!(list[0]["type"], "Hub");
        assert_eq!(list[1]["main"], true);
        assert_eq!(list[1]["frames"][1]["line"], 80);
        assert!(list[0].get("main").is_none());
        assert_eq!(list[3]["state"], "unstarted");
        assert!(list[2]["error"].as_str().is_some());
        assert!(super::super::to_json(&sample()).get("greenlets").is_none());
    }
}
