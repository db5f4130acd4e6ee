//! The HTML report: one self-contained page (docs/html.md).
//!
//! The page is the profile's data as compact JSON inside a `<script type="application/json">`
//! element, plus inline CSS and JavaScript (ours, `html/report.css` and `html/report.js`)
//! that build the DOM from it, lazily (a file's table when it is opened, a flame graph's
//! boxes for the frames wide enough to see). Nothing is fetched. A Content-Security-Policy
//! forbids every network request, and the page carries no web font, image or script
//! from elsewhere.
//!
//! Safety: text from the profile (file names, source, function names, the command) goes
//! into the page only inside the JSON, where `<`, `>`, `&` and the line separators U+2028 /
//! U+2029 are written as `\uXXXX` escapes (so no `</script>` can end the element), and the
//! script puts it into the DOM only as text (`textContent`), never as markup. The `<title>`
//! is HTML-escaped.
//!
//! Flame graphs: the time graph's boxes are seconds, the memory graph's KiB allocated.
//! Stacks carry no time split of their own, so each stack's seconds are split in the
//! proportions of the line it was charged to (its innermost frame with a line in the line
//! table), and a box is coloured by the mix of Python / native / system of the stacks under
//! it (grey: stacks whose line has no split). Memory boxes are coloured by the Python share
//! of the allocating line (grey where unknown). Boxes smaller than [`PRUNE_FRACTION`] of the
//! whole are left out (their parent's width still counts them).
//!
//! Must not: read files; everything comes from the profile.

use super::terminal;
use crate::profile::{Frame, Profile};
use serde_json::{json, Value};
use std::collections::HashMap;

const CSS: &str = include_str!("html/report.css");
const JS: &str = include_str!("html/report.js");

/// Flame-graph boxes below this fraction of the graph's total are not embedded.
pub const PRUNE_FRACTION: f64 = 1e-5;

/// The page's bytes.
pub fn render(p: &Profile) -> Vec<u8> {
    let (title, _) = terminal::header_fields(p);
    let data = script_safe(&data(p).to_string());
    let mut out = String::with_capacity(data.len() + CSS.len() + JS.len() + 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n",
    );
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str("<title>");
    out.push_str(&html_escape(&title));
    out.push_str("</title>\n<style>\n");
    out.push_str(CSS);
    out.push_str("</style></head><body>\n<noscript>This report needs JavaScript to show the profile.</noscript>\n<div id=\"app\"></div>\n<script type=\"application/json\" id=\"data\">");
    out.push_str(&data);
    out.push_str("</script>\n<script>\n");
    out.push_str(JS);
    out.push_str("</script>\n</body></html>\n");
    out.into_bytes()
}

/// Escapes text for HTML element content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON made safe inside a `<script>` element. The characters that could end it or start
/// markup are `\u` escapes (valid only inside JSON strings, the only place they can occur).
fn script_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A number rounded to `digits` decimals, written as an integer when it is one (compact).
fn num(x: f64, digits: i32) -> Value {
    if !x.is_finite() {
        return json!(0);
    }
    let m = 10f64.powi(digits);
    let r = (x * m).round() / m;
    if r.fract() == 0.0 && r.abs() < 1e15 {
        json!(r as i64)
    } else {
        json!(r)
    }
}

/// Interned strings (function and file names of frames).
#[derive(Default)]
struct Interner {
    names: Vec<String>,
    index: HashMap<String, usize>,
    frames: Vec<Value>,
    frame_index: HashMap<Frame, usize>,
}

impl Interner {
    fn name(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.names.push(s.to_string());
        self.index.insert(s.to_string(), self.names.len() - 1);
        self.names.len() - 1
    }
    /// A frame's index. The frames table is flat: name, file, line (0: none) per frame.
    fn frame(&mut self, f: &Frame) -> usize {
        if let Some(&i) = self.frame_index.get(f) {
            return i;
        }
        let n = self.name(&f.function);
        let file = self.name(&f.filename);
        self.frames.push(json!(n));
        self.frames.push(json!(file));
        self.frames.push(json!(f.line.unwrap_or(0)));
        let i = self.frame_index.len();
        self.frame_index.insert(f.clone(), i);
        i
    }
}

/// A flame-graph node under construction: the value and its split (Python, native,
/// system; their sum may be less than the value where the split is unknown).
struct Node {
    frame: usize,
    value: f64,
    split: [f64; 3],
    children: HashMap<usize, usize>,
}

/// Folds stacks (innermost first) with their value and split into a tree, and writes it in
/// preorder as parallel arrays: `f` frame, `v` value, `c` child count, and the split's
/// shares of the value in whole percent (`p`, `n`, `s`; only those in `parts`).
fn tree<'a>(
    stacks: impl Iterator<Item = (&'a [Frame], f64, [f64; 3])>,
    interner: &mut Interner,
    parts: usize,
    scale: f64,
) -> Value {
    let mut nodes = vec![Node {
        frame: usize::MAX,
        value: 0.0,
        split: [0.0; 3],
        children: HashMap::new(),
    }];
    for (frames, value, split) in stacks {
        let mut at = 0;
        let add = |n: &mut Node| {
            n.value += value;
            for (acc, x) in n.split.iter_mut().zip(split) {
                *acc += x;
            }
        };
        add(&mut nodes[0]);
        for f in frames.iter().rev() {
            let fi = interner.frame(f);
            let next = match nodes[at].children.get(&fi) {
                Some(&i) => i,
                None => {
                    nodes.push(Node {
                        frame: fi,
                        value: 0.0,
                        split: [0.0; 3],
                        children: HashMap::new(),
                    });
                    let i = nodes.len() - 1;
                    nodes[at].children.insert(fi, i);
                    i
                }
            };
            add(&mut nodes[next]);
            at = next;
        }
    }
    let total = nodes[0].value;
    let min = total * PRUNE_FRACTION;
    let (mut f, mut v, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let mut sp: [Vec<Value>; 3] = Default::default();
    let mut todo = vec![0usize];
    while let Some(i) = todo.pop() {
        let n = &nodes[i];
        let mut kids: Vec<usize> = n
            .children
            .values()
            .copied()
            .filter(|&k| nodes[k].value >= min && nodes[k].value > 0.0)
            .collect();
        // Widest first; ties by frame for a stable page.
        kids.sort_by(|&a, &b| {
            nodes[b]
                .value
                .total_cmp(&nodes[a].value)
                .then(nodes[a].frame.cmp(&nodes[b].frame))
        });
        f.push(if n.frame == usize::MAX {
            json!(-1)
        } else {
            json!(n.frame)
        });
        v.push(num(n.value * scale, 0));
        c.push(json!(kids.len()));
        for (k, out) in sp.iter_mut().enumerate().take(parts) {
            let share = if n.value > 0.0 {
                100.0 * n.split[k] / n.value
            } else {
                0.0
            };
            out.push(num(share, 0));
        }
        todo.extend(kids.into_iter().rev());
    }
    let mut t = json!({"f": f, "v": v, "c": c});
    for (k, key) in ["p", "n", "s"].iter().enumerate().take(parts) {
        t[*key] = Value::Array(std::mem::take(&mut sp[k]));
    }
    t
}

/// The page's data (docs/html.md names what the script expects).
fn data(p: &Profile) -> Value {
    let (title, fields) = terminal::header_fields(p);
    let header: Vec<Value> = fields
        .iter()
        .map(|f| json!([f.label, f.text, f.emphasis as u8]))
        .collect();
    // GPU columns, timeline and flame graph when a GPU was used.
    let gpu = p.gpu.as_ref().filter(|g| g.has_data());
    // Each line's split (for the time graph) and memory Python share (for the memory graph).
    let mut split_of: HashMap<(&str, u32), ([f64; 3], f64)> = HashMap::new();
    let mut hottest: Option<(usize, u32, f64)> = None;
    let files: Vec<Value> = p
        .files
        .iter()
        .enumerate()
        .map(|(fi, f)| {
            let lines: Vec<Value> = f
                .lines
                .iter()
                .map(|l| {
                    let t = l.total_pct();
                    if t >= terminal::MATTER_PCT && hottest.is_none_or(|(_, _, b)| t > b) {
                        hottest = Some((fi, l.line, t));
                    }
                    split_of.insert(
                        (&f.filename, l.line),
                        (
                            [l.cpu_python_pct, l.cpu_native_pct, l.cpu_system_pct],
                            l.memory.as_ref().map_or(-1.0, |m| m.mem_python_pct),
                        ),
                    );
                    // The text once, so it is left out here when the file's whole text has it.
                    let in_full = (l.line as usize)
                        .checked_sub(1)
                        .and_then(|i| f.full_source.get(i))
                        .is_some_and(|t| *t == l.source);
                    let mut row = vec![
                        json!(l.line),
                        num(l.cpu_python_pct, 2),
                        num(l.cpu_native_pct, 2),
                        num(l.cpu_system_pct, 2),
                        json!(if in_full { "" } else { l.source.as_str() }),
                    ];
                    if let Some(m) = &l.memory {
                        row.extend([
                            num(m.mem_python_pct, 1),
                            num(m.mem_peak_mb, 2),
                            num(m.copy_mb_s, 2),
                            num(m.mem_alloc_mb, 2),
                            Value::Array(m.mem_timeline.iter().map(|x| num(*x, 2)).collect()),
                        ]);
                    }
                    if gpu.is_some() {
                        let g = l.gpu.clone().unwrap_or_default();
                        row.extend([num(g.gpu_pct, 2), num(g.gpu_mem_peak_mb, 2)]);
                    }
                    Value::Array(row)
                })
                .collect();
            let functions: Vec<Value> = f
                .functions
                .iter()
                .map(|g| {
                    json!([
                        g.function,
                        g.first_line.unwrap_or(0),
                        num(g.cpu_python_pct, 2),
                        num(g.cpu_native_pct, 2),
                        num(g.cpu_system_pct, 2)
                    ])
                })
                .collect();
            // With the whole text, the page finds the context lines itself.
            let context: Vec<Value> = if f.full_source.is_empty() {
                f.context
                    .iter()
                    .map(|c| json!([c.line, c.source]))
                    .collect()
            } else {
                Vec::new()
            };
            let mut v = json!({
                "n": f.filename,
                "pct": num(f.cpu_pct, 2),
                "l": lines,
                "fn": functions,
                "ctx": context,
            });
            // `--native`: each line's native functions, by line: [[function, module, pct]].
            let native: serde_json::Map<String, Value> = f
                .lines
                .iter()
                .filter(|l| !l.native_functions.is_empty())
                .map(|l| {
                    let fns = l
                        .native_functions
                        .iter()
                        .map(|n| json!([n.function, n.module, num(n.pct, 2)]))
                        .collect();
                    (l.line.to_string(), Value::Array(fns))
                })
                .collect();
            if !native.is_empty() {
                v["nf"] = Value::Object(native);
            }
            // `--native` with memory: the native functions each line's allocations came
            // from, by line: [[function, module, MB]].
            let allocated: serde_json::Map<String, Value> = f
                .lines
                .iter()
                .filter_map(|l| Some((l.line, l.memory.as_ref()?)))
                .filter(|(_, m)| !m.mem_native_functions.is_empty())
                .map(|(line, m)| {
                    let fns = m
                        .mem_native_functions
                        .iter()
                        .map(|n| json!([n.function, n.module, num(n.mb, 2)]))
                        .collect();
                    (line.to_string(), Value::Array(fns))
                })
                .collect();
            if !allocated.is_empty() {
                v["mf"] = Value::Object(allocated);
            }
            if !f.full_source.is_empty() {
                v["full"] = json!(f.full_source);
            }
            v
        })
        .collect();
    let mut interner = Interner::default();
    let charged = |frames: &[Frame]| {
        frames.iter().find_map(|fr| {
            fr.line
                .and_then(|l| split_of.get(&(fr.filename.as_ref(), l)).copied())
        })
    };
    let time_tree = tree(
        p.stacks.iter().map(|s| {
            let split = match charged(&s.frames) {
                Some((sp, _)) => {
                    let t = sp[0] + sp[1] + sp[2];
                    if t > 0.0 {
                        [sp[0] / t, sp[1] / t, sp[2] / t].map(|x| x * s.seconds)
                    } else {
                        [0.0; 3]
                    }
                }
                None => [0.0; 3],
            };
            (&s.frames[..], s.seconds, split)
        }),
        &mut interner,
        3,
        1e6,
    );
    let mut d = json!({
        "title": title,
        "header": header,
        "unsplit": p.meta.split_unavailable.is_some(),
        "wall": p.meta.mode == crate::profile::TimeMode::Wall,
        "duration": num(p.meta.duration_s, 3),
        "total": num(p.total_s, 4),
        "hot": terminal::HOT_PCT,
        "matter": terminal::MATTER_PCT,
        "context": crate::profile::SOURCE_CONTEXT,
        "hottest": hottest.map(|(f, l, _)| json!([f, l])),
        "files": files,
        "ft": time_tree,
    });
    if let Some(m) = &p.memory {
        let mem_tree = tree(
            m.stacks.iter().map(|s| {
                let v = s.alloc_kib as f64;
                let split = match charged(&s.frames) {
                    Some((_, py)) if py >= 0.0 => [py / 100.0 * v, (1.0 - py / 100.0) * v, 0.0],
                    _ => [0.0; 3],
                };
                (&s.frames[..], v, split)
            }),
            &mut interner,
            2,
            1.0,
        );
        d["mem"] = json!({
            "peak": num(m.peak_mb, 2),
            "timeline": m.timeline.iter().map(|x| json!([num(x[0], 3), num(x[1], 2)])).collect::<Vec<_>>(),
            "leaks": m.leaks.iter().map(|l| json!([
                l.filename, l.line, num(l.likelihood, 3), num(l.growth_mb_s, 3),
                l.sampled_allocs, l.sampled_frees
            ])).collect::<Vec<_>>(),
            "tree": mem_tree,
        });
    }
    if let Some(g) = gpu {
        let gpu_tree = tree(
            g.stacks
                .iter()
                .map(|s| (&s.frames[..], s.gpu_ms / 1e3, [0.0; 3])),
            &mut interner,
            0,
            1e6,
        );
        d["gpu"] = json!({
            "busy": num(g.gpu_s, 3),
            "peak": num(g.mem_peak_mb, 2),
            "timeline": g.timeline.iter().map(|x| json!([num(x[0], 3), num(x[1], 2), num(x[2], 2)])).collect::<Vec<_>>(),
            "devices": g.devices.iter().map(|d| json!([d.index, d.name, num(d.gpu_s, 3), num(d.mem_peak_mb, 2)])).collect::<Vec<_>>(),
            "tree": gpu_tree,
        });
    }
    if p.processes.len() > 1 {
        d["procs"] = p
            .processes
            .iter()
            .map(|q| {
                json!([
                    q.pid,
                    q.command,
                    q.python_version,
                    q.samples,
                    num(q.cpu_pct, 2),
                    q.mem_peak_mb.map(|x| num(x, 2)),
                    q.mem_alloc_mb.map(|x| num(x, 2)),
                    q.gpu_pct.map(|x| num(x, 2)),
                    q.gpu_mem_peak_mb.map(|x| num(x, 2))
                ])
            })
            .collect();
    }
    if !p.threads.is_empty() {
        d["threads"] = p
            .threads
            .iter()
            .map(|t| {
                json!([
                    t.native_id,
                    t.display_name(),
                    t.samples,
                    num(t.cpu_python_pct, 2),
                    num(t.cpu_native_pct, 2),
                    num(t.cpu_system_pct, 2)
                ])
            })
            .collect();
    }
    d["names"] = json!(interner.names);
    d["frames"] = Value::Array(interner.frames);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_text_cannot_end_the_data_element() {
        let s = script_safe(&json!({"a": "</script><b>&\u{2028}"}).to_string());
        assert!(
            !s.contains('<') && !s.contains('>') && !s.contains('&'),
            "{s}"
        );
        let back: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back["a"], "</script><b>&\u{2028}");
        assert_eq!(
            html_escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn source_text_is_embedded_once() {
        use crate::profile::{FileProfile, LineProfile, ProfileMeta};
        let mut p = crate::profile::Aggregator::new().finish(ProfileMeta::default(), &mut |_| None);
        let mut f = FileProfile::new("/a.py");
        f.lines.push(LineProfile {
            line: 3,
            source: String::new(),
            cpu_python_pct: 50.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
            memory: None,
            gpu: None,
            native_functions: Vec::new(),
        });
        let text: Vec<String> = (1..=9).map(|n| format!("line_{n}")).collect();
        f.take_source(&text);
        p.files.push(f.clone());
        let d = data(&p);
        assert_eq!(d["files"][0]["l"][0][4], "", "the line's text is in full");
        assert_eq!(d["files"][0]["full"][2], "line_3");
        assert_eq!(d["files"][0]["ctx"], json!([]));
        // Without the whole text, the line and its context carry their own.
        f.full_source.clear();
        p.files[0] = f;
        let d = data(&p);
        assert_eq!(d["files"][0]["l"][0][4], "line_3");
        assert_eq!(d["files"][0]["ctx"][0], json!([1, "line_1"]));
        assert!(d["files"][0].get("full").is_none());
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(3.0, 2).to_string(), "3");
        assert_eq!(num(1.23456, 2).to_string(), "1.23");
        assert_eq!(num(f64::NAN, 2).to_string(), "0");
    }
}
