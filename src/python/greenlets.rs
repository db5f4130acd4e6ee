//! Greenlets of a live process (gevent's, eventlet's, or plain `greenlet`'s), each with
//! the stack it is suspended in. That is what a hung gevent server's requests wait on,
//! which no thread's stack shows (a thread shows the greenlet it runs, as a rule gevent's
//! hub).
//!
//! How they are found, from the greenlet module's facts (its sources' declarations, read
//! for facts only):
//! - A greenlet is an object of type `greenlet.greenlet` or a subclass of it (gevent's
//!   `Greenlet` and `Hub` are), which the cycle collector tracks. So every one is on one
//!   of the collector's lists (`gc`: the generations, and the permanent one). The type is
//!   `greenlet` in the dict of module `greenlet._greenlet` (`sys.modules`), checked by its
//!   name and size (`PyObject_HEAD`, then `weakreflist`, `dict`, `pimpl`).
//! - `pimpl` points to greenlet's C++ implementation object (greenlet 2 and 3), whose
//!   members are, in order:
//!   - a vtable pointer;
//!   - `_self` (greenlet 3.1+: the greenlet itself, a check);
//!   - `exception_state` (a pointer and a `_PyErr_StackItem`);
//!   - `switch_args` (two pointers);
//!   - `stack_state` (`_stack_start`, `stack_stop`, `stack_copy`, `_stack_saved`,
//!     `stack_prev`);
//!   - `python_state` (`_context`, then `_top_frame`).
//!
//!   Before 3.7 the exception state is three object pointers and there is no `_context`.
//!   See [`ImplLayout`].
//! - A greenlet not started has no `stack_stop`, and one that ended has no
//!   `_stack_start`. The main greenlet of a thread has `stack_stop` all ones. A started
//!   greenlet that is not running holds its innermost frame in `_top_frame` (a frame
//!   object). The one that runs holds none, because its stack is its thread's, shown
//!   there, not again here.
//! - From the frame object the walk is a thread's (3.11+: from its `f_frame`). On 3.12+ a
//!   call of the evaluation loop from C puts an entry frame on the C stack. A suspended
//!   greenlet's part of the C stack that another one overwrote is kept in `stack_copy`
//!   (`_stack_saved` bytes from `_stack_start`). greenlet 3.0.3 and later relink the
//!   chain past those frames at every switch away ("exposing" the frames). For one that
//!   did not, the walk reads those addresses from the copy ([`SpilledStack`]), as
//!   greenlet itself does.
//!
//! Not read: free-threaded builds (no lists), greenlet 1.x (a C layout of its own), and
//! which thread a greenlet belongs to.
//!
//! Owns: [`GreenletSnapshot`] (what `dump` shows) and [`read`].
//! Must not: pause threads (the caller reads under its own pause, or says it did not), or
//! format output.
//!
//! Everything read is bounded (objects visited, time, frames per stack) and checked. A
//! torn list or a greenlet that does not read as one gives an error, never a loop.

mod gc;

use super::frame::Frame;
use super::objects::Objects;
use super::{PythonProcess, StackWalker};
use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python_bindings::{debug_offsets, object_layout, ObjectLayout};
use std::collections::HashMap;

/// Greenlets read at most (each is a stack walk).
pub(crate) const MAX_GREENLETS: usize = 10_000;
/// Subclasses followed up from a type at most, to `greenlet.greenlet`.
const MAX_BASES: usize = 64;

/// Every greenlet of the process, as `dump` shows them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GreenletSnapshot {
    /// Running first, then suspended, then not started; by address within each.
    pub(crate) greenlets: Vec<GreenletInfo>,
    /// Greenlets that ended (their objects still alive): counted, not shown.
    pub(crate) finished: usize,
    /// Objects of the collector's lists visited to find them.
    pub(crate) objects_visited: u64,
    /// The visit stopped at its bounds (objects or time), or there were more than
    /// [`MAX_GREENLETS`]. So there may be more greenlets than shown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) truncated: bool,
    /// Why no greenlet (or not every one) could be found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// One greenlet.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GreenletInfo {
    /// The greenlet object's address (`id(g)`), unique while it lives.
    pub(crate) id: u64,
    /// Its type's `tp_name` (`greenlet.greenlet`, `gevent._gevent_cgreenlet.Greenlet`, ...).
    #[serde(rename = "type")]
    pub(crate) type_name: String,
    pub(crate) state: GreenletState,
    /// A thread's main greenlet (the one its code started in).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) main: bool,
    /// Innermost first; empty when running (its thread's stack is its own) or not started.
    pub(crate) frames: Vec<Frame>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) truncated: bool,
    /// Why its stack could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GreenletState {
    /// Running in its thread now, so its stack is that thread's.
    Running,
    /// Switched away from, so its stack is its own.
    Suspended,
    /// Made but never switched to.
    Unstarted,
}

impl GreenletState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GreenletState::Running => "running",
            GreenletState::Suspended => "suspended",
            GreenletState::Unstarted => "not started",
        }
    }
}

/// Why greenlets of this build cannot be read (None: they can).
pub(crate) fn unsupported(l: &crate::python_bindings::Layout) -> Option<String> {
    let (major, minor) = l.version;
    let why = |what: &str| {
        Some(format!(
            "greenlets of Python {major}.{minor} are not read: {what}"
        ))
    };
    if l.free_threaded {
        return why("a free-threaded build keeps no lists of its objects to find them on");
    }
    let Some(o) = object_layout(major, minor, false) else {
        return why("no layout of its objects");
    };
    if o.gc_head_size.is_none() {
        return why("its collector's lists are in no table of ours");
    }
    None
}

/// Where greenlet's implementation object keeps what is read of it (bytes from its start),
/// by the declarations of its members (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImplLayout {
    /// `_self` (greenlet 3.1+).
    self_at: Option<u64>,
    /// `stack_state`: five words.
    stack_at: u64,
    /// `python_state._top_frame`.
    top_frame_at: u64,
}

impl ImplLayout {
    /// For greenlet `version` (major, minor) on a Python whose `_PyErr_StackItem` has
    /// `stack_item` bytes (3.7+; before, the exception state is three object pointers
    /// and the Python state has no `_context`); None for greenlet 1.x and older (no
    /// implementation object).
    fn of(version: (u32, u32), stack_item: Option<u64>) -> Option<ImplLayout> {
        if version.0 < 2 {
            return None;
        }
        let vtable = 8;
        let self_at = (version >= (3, 1)).then_some(vtable);
        let exception_state = vtable + if self_at.is_some() { 8 } else { 0 };
        let (exception_size, context) = match stack_item {
            Some(item) => (8 + item, 8),
            None => (24, 0),
        };
        let switch_args = exception_state + exception_size;
        let stack_at = switch_args + 16;
        let python_state = stack_at + 40;
        Some(ImplLayout {
            self_at,
            stack_at,
            top_frame_at: python_state + context,
        })
    }

    fn size(&self) -> usize {
        self.top_frame_at as usize + 8
    }
}

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// Every greenlet of the interpreters `interps` of `proc`. They are read through `mem`
/// (the snapshot's page cache: `sys.modules` and the objects it leads to), and the
/// collector's lists through `lists` (which are walked through a page cache of their
/// own). None when none of the interpreters has imported greenlet (nothing to say).
pub(crate) fn read(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    lists: &dyn ProcessMemory,
    walker: &mut StackWalker,
    interps: &[u64],
) -> Option<GreenletSnapshot> {
    let (major, minor) = proc.layout.version;
    let l = object_layout(major, minor, proc.layout.free_threaded)?;
    let o = Objects::new(l, mem, &proc.layout.string, &proc.addrs.types);
    let mut found = None;
    for &interp in interps {
        match o.module_dict(interp, "greenlet._greenlet") {
            Ok(Some(dict)) => {
                found = Some((interp, dict));
                break;
            }
            Ok(None) => {}
            Err(e) => {
                return Some(failed(format!("sys.modules is unreadable: {e}")));
            }
        }
    }
    let (interp, dict) = found?;
    if let Some(why) = unsupported(&proc.layout) {
        return Some(failed(why));
    }
    let mut r = Reader {
        l,
        mem,
        types: HashMap::new(),
        names: HashMap::new(),
        greenlet_type: 0,
        frame_type: proc.addrs.types.frame,
        layout: ImplLayout::of((3, 1), None).expect("a layout"),
    };
    if let Err(e) = r.locate(&o, interp, dict) {
        return Some(failed(format!("the greenlet module is unreadable: {e}")));
    }
    let mut places = gc::Places {
        runtime: proc.addrs.runtime,
        ..gc::Places::default()
    };
    // 3.13+ say where an interpreter's collector state is, and that wins over the headers'.
    if let Some(rt) = proc.addrs.runtime.filter(|_| l.version >= (3, 13)) {
        if let Ok(bytes) = mem.read_vec(rt, super::process::DEBUG_OFFSETS_READ) {
            places.gc_at = debug_offsets::field(&bytes, "interpreter_state.gc");
        }
    }
    if l.version < (3, 7) {
        let Some(var) = proc.addrs.gc_generation0 else {
            return Some(failed(
                "no _PyGC_generation0 symbol to find the collector's lists by (a stripped \
                 build?)"
                    .into(),
            ));
        };
        match mem.read_u64(var) {
            Ok(head) => places.first_head = Some(head),
            Err(e) => return Some(failed(format!("_PyGC_generation0 is unreadable: {e}"))),
        }
    }
    // 2.7-3.8 keep one set of lists for the process, shared by every interpreter.
    let mut heads = Vec::new();
    for &i in interps {
        // `generation0` says where the first list is (a build may place it other than its
        // headers do); unreadable, the table's place is taken (and checked by the walk).
        let first = gc::generation0_at(l, places, i).and_then(|at| mem.read_u64(at).ok());
        for h in gc::generation_heads(l, places, i, first).unwrap_or_default() {
            if !heads.contains(&h) {
                heads.push(h);
            }
        }
    }
    let mut out = GreenletSnapshot::default();
    let Some(mut tracked) = gc::Tracked::new(lists, l) else {
        return Some(failed("no layout of the collector's lists".into()));
    };
    let mut objects = Vec::new();
    for head in heads {
        let mut each = |obj: u64, ty: u64| {
            if objects.len() <= MAX_GREENLETS && r.is_greenlet_type(ty) {
                objects.push((obj, ty));
            }
        };
        if let Err(e) = tracked.walk(head, &mut each) {
            out.error = Some(format!("a list of the collector's is unreadable: {e}"));
        }
        if tracked.cut_short {
            break;
        }
    }
    out.objects_visited = tracked.visited;
    out.truncated = tracked.cut_short || objects.len() > MAX_GREENLETS;
    objects.truncate(MAX_GREENLETS);
    objects.sort_unstable();
    objects.dedup();
    let strict = std::mem::replace(&mut walker.strict, false);
    for (obj, ty) in objects {
        match r.greenlet(walker, obj, ty) {
            Some(g) => out.greenlets.push(g),
            None => out.finished += 1,
        }
    }
    walker.strict = strict;
    out.greenlets.sort_by_key(|g| (g.state, g.id));
    Some(out)
}

fn failed(why: String) -> GreenletSnapshot {
    GreenletSnapshot {
        error: Some(why),
        ..GreenletSnapshot::default()
    }
}

/// One read's types and layouts.
struct Reader<'a> {
    l: &'static ObjectLayout,
    mem: &'a dyn ProcessMemory,
    /// Type → whether it is `greenlet.greenlet` or a subclass.
    types: HashMap<u64, bool>,
    /// Type → its `tp_name`.
    names: HashMap<u64, String>,
    /// `PyFrame_Type` (by its symbol; else found at the first frame named `frame`).
    frame_type: u64,
    greenlet_type: u64,
    layout: ImplLayout,
}

impl Reader<'_> {
    fn word(&self, addr: u64, off: u64) -> Result<u64> {
        self.mem.read_u64(addr.wrapping_add(off))
    }

    fn ty(&self, obj: u64) -> Result<u64> {
        self.word(obj, self.l.ob_type as u64)
    }

    /// `tp_name` of type `ty` (a C string, at most 128 bytes of it).
    fn type_name(&mut self, ty: u64) -> Result<String> {
        if let Some(n) = self.names.get(&ty) {
            return Ok(n.clone());
        }
        let at = self.word(ty, self.l.tp_name as u64)?;
        let name = super::strings::read_c_str::<128>(self.mem, at)?;
        self.names.insert(ty, name.clone());
        Ok(name)
    }

    /// The greenlet type (module `greenlet._greenlet`'s dict is `dict`), checked, and the
    /// implementation layout of the greenlet version the `greenlet` package says.
    fn locate(&mut self, o: &Objects, interp: u64, dict: u64) -> Result<()> {
        let items = o.dict_items(dict)?;
        let ty = o
            .find_str(&items, "greenlet")
            .ok_or(bad(dict, "no `greenlet` in module greenlet._greenlet"))?;
        let size = self.word(ty, self.l.tp_basicsize as u64)?;
        let name = self.type_name(ty)?;
        if name != "greenlet.greenlet" || size != self.l.object_size as u64 + 24 {
            return Err(bad(ty, "greenlet._greenlet.greenlet is not the type known"));
        }
        self.greenlet_type = ty;
        self.types.insert(ty, true);
        let package = o
            .module_dict(interp, "greenlet")?
            .ok_or(bad(dict, "greenlet._greenlet without the greenlet package"))?;
        let items = o.dict_items(package)?;
        let version = o
            .find_str(&items, "__version__")
            .ok_or(bad(package, "the greenlet package has no __version__"))?;
        let text = o.text(version)?;
        let mut parts = text.split('.').map(|p| p.parse::<u32>());
        let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
            return Err(bad(version, "greenlet's __version__ is not X.Y..."));
        };
        let item = self.l.err_stackitem_size.map(|s| s as u64);
        self.layout = ImplLayout::of((major, minor), item)
            .ok_or(bad(version, "greenlet 1.x keeps another layout (not read)"))?;
        Ok(())
    }

    /// Whether type `ty` is `greenlet.greenlet` or derives from it.
    fn is_greenlet_type(&mut self, ty: u64) -> bool {
        if let Some(&known) = self.types.get(&ty) {
            return known;
        }
        let mut at = ty;
        let mut is = false;
        for _ in 0..MAX_BASES {
            if at == self.greenlet_type {
                is = true;
                break;
            }
            match self.word(at, self.l.tp_base as u64) {
                Ok(base) if base != 0 => at = base,
                _ => break,
            }
        }
        self.types.insert(ty, is);
        is
    }

    /// Greenlet `obj` (of type `ty`), its stack walked when it is suspended; None when it
    /// ended.
    fn greenlet(&mut self, walker: &mut StackWalker, obj: u64, ty: u64) -> Option<GreenletInfo> {
        let mut g = GreenletInfo {
            id: obj,
            type_name: self
                .type_name(ty)
                .unwrap_or_else(|_| format!("type at {ty:#x}")),
            state: GreenletState::Suspended,
            main: false,
            frames: Vec::new(),
            truncated: false,
            error: None,
        };
        match self.state(walker, obj, &mut g) {
            Ok(true) => Some(g),
            Ok(false) => None,
            Err(e) => {
                g.error = Some(e.to_string());
                Some(g)
            }
        }
    }

    /// Fills `g`'s state and stack; false when it ended.
    fn state(&mut self, walker: &mut StackWalker, obj: u64, g: &mut GreenletInfo) -> Result<bool> {
        let lay = self.layout;
        let pimpl = self.word(obj, self.l.object_size as u64 + 16)?;
        if pimpl == 0 {
            return Err(bad(obj, "a greenlet without its implementation"));
        }
        let buf = self.mem.read_vec(pimpl, lay.size())?;
        let w = |at: u64| field_u64(&buf, at as usize);
        if lay.self_at.is_some_and(|at| w(at) != obj) {
            return Err(bad(
                pimpl,
                "a greenlet's implementation names another greenlet",
            ));
        }
        let s = lay.stack_at;
        let (start, stop, copy, saved) = (w(s), w(s + 8), w(s + 16), w(s + 24));
        let top = w(lay.top_frame_at);
        g.main = stop == u64::MAX;
        if stop == 0 {
            g.state = GreenletState::Unstarted;
            return Ok(true);
        }
        if start == 0 {
            return Ok(false);
        }
        if start > stop || (saved as i64) < 0 || (saved != 0 && copy == 0) {
            return Err(bad(pimpl, "a greenlet's saved stack does not add up"));
        }
        if !g.main && saved > stop - start {
            return Err(bad(pimpl, "a greenlet saved more stack than it has"));
        }
        if top == 0 {
            g.state = GreenletState::Running;
            return Ok(true);
        }
        let fty = self.ty(top)?;
        if self.frame_type == 0 && self.type_name(fty)? == "frame" {
            self.frame_type = fty;
        }
        if fty != self.frame_type {
            return Err(bad(top, "a greenlet's top frame is no frame object"));
        }
        let first = match self.l.frame_object_iframe {
            Some(at) => self.word(top, at as u64)?,
            None => top,
        };
        let spilled = SpilledStack {
            mem: self.mem,
            start,
            saved,
            copy,
        };
        let walk = walker.walk(&spilled, first)?;
        g.frames = walk.frames;
        g.truncated = walk.truncated;
        Ok(true)
    }
}

/// A suspended greenlet's view of memory. The part of its C stack another greenlet
/// overwrote (`saved` bytes from `start`) is read from where greenlet copied it (`copy`).
struct SpilledStack<'a> {
    mem: &'a dyn ProcessMemory,
    start: u64,
    saved: u64,
    copy: u64,
}

impl ProcessMemory for SpilledStack<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let end = self.start.saturating_add(self.saved);
        let mut at = addr;
        let mut done = 0;
        while done < buf.len() {
            let left = buf.len() - done;
            let (from, n) = if at < self.start {
                (at, left.min((self.start - at) as usize))
            } else if at < end {
                (self.copy + (at - self.start), left.min((end - at) as usize))
            } else {
                (at, left)
            };
            self.mem.read(from, &mut buf[done..done + n])?;
            done += n;
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
