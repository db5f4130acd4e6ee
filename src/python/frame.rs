//! The crate's central datum, a Python frame, as a stack walk reads it and every later
//! stage (sampler, profile, renderers) passes it on.
//!
//! Owns: [`Frame`], its names ([`Name`], interned), and the frames that stand for an
//! asyncio task ([`Frame::of_task`]) or a native function ([`Frame::of_native`]).
//! Must not: say which frame is charged for a sample (`profile` does), or read a process.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// A function's or a file's name in a frame. The text is kept once for the whole run
/// (interned), so that a frame is copied, compared and hashed by address and never touches
/// a reference count. A busy sample builds and drops a frame for every level of the stack
/// thousands of times a second. With a counted `Arc<str>` per name, the atomic increments
/// and decrements were a tenth of such a sample's time.
///
/// The texts are never freed. They are the names of the code the program ran (and of its
/// tasks and native functions), each kept once, which a profile keeps anyway for its
/// report.
#[derive(Clone, Copy)]
pub struct Name(&'static str);

/// Every name made so far.
fn names() -> &'static Mutex<HashSet<&'static str>> {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(HashSet::new()))
}

impl Name {
    /// The name for `text`: the one made before for the same text, else a new one.
    pub fn new(text: &str) -> Name {
        // A panic while the set was held leaves it whole (an insert either happened or not).
        let mut set = names().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = set.get(text) {
            return Name(known);
        }
        let kept: &'static str = Box::leak(text.to_owned().into_boxed_str());
        set.insert(kept);
        Name(kept)
    }

    /// The text.
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// Equal texts are the same name (one address), so names are compared by address.
impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.0.as_ptr() as usize).hash(state);
    }
}

/// By text (reports sort names alphabetically); the same answer as `==` for equal texts.
impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        if self == other {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(other.0)
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0, f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Name {
        Name::new(text)
    }
}

impl From<String> for Name {
    fn from(text: String) -> Name {
        Name::new(&text)
    }
}

impl From<&String> for Name {
    fn from(text: &String) -> Name {
        Name::new(text)
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Name::new(&text))
    }
}

/// One Python frame.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Frame {
    /// Qualified name on 3.11+ (`Class.method`, `outer.<locals>.inner`), `co_name` before.
    /// Shared with the code-object cache, so cloning a frame copies no text.
    pub function: Name,
    /// `co_filename`, as the interpreter has it.
    pub filename: Name,
    /// Current line; None when the instruction has no line (3.10+ artificial code), and
    /// for a native frame.
    pub line: Option<u32>,
    /// A native (C, C++, Rust) frame of a `--native` recording. `function` is its symbol
    /// (or `module+0xOFFSET`), `filename` its module (`libz.so.1`). Never charged for
    /// time or memory; the Python frame above it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub native: bool,
}

/// The file of an asyncio task's frame (`--async`). The frame is the task, named, between
/// the coroutines it runs and those of the task that awaits it.
pub(crate) const TASK_FILE: &str = "<asyncio>";

impl Frame {
    /// An asyncio task as a frame of a stack (`task NAME`), never charged for time or
    /// memory (the coroutine frames around it are).
    pub(crate) fn of_task(name: &str) -> Frame {
        Frame {
            function: format!("task {name}").into(),
            filename: TASK_FILE.into(),
            line: None,
            native: false,
        }
    }

    /// Whether this is a task's frame ([`Frame::of_task`]).
    pub(crate) fn is_task(&self) -> bool {
        self.line.is_none() && &*self.filename == TASK_FILE
    }

    /// A native frame as a stack entry of a profile (see [`Frame::native`]).
    pub(crate) fn of_native(label: String, module: Option<&str>) -> Frame {
        Frame {
            function: label.into(),
            filename: module.unwrap_or("[unknown]").into(),
            line: None,
            native: true,
        }
    }
}

/// A Python frame of function `f` at line 1 of `file`, for tests here and in `profile`.
#[cfg(test)]
pub(crate) fn test_frame(file: &str) -> Frame {
    Frame {
        function: "f".into(),
        filename: file.into(),
        line: Some(1),
        native: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(file: &str) -> Frame {
        test_frame(file)
    }

    #[test]
    fn a_name_is_one_per_text_and_sorts_by_text() {
        let text = String::from("module.<locals>.work");
        let (a, b) = (Name::new("module.<locals>.work"), Name::from(text));
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "one copy of the text");
        let hash = |n: Name| {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(n)
        };
        assert_eq!(hash(a), hash(b));
        let (z, y) = (Name::new("zeta_first_made"), Name::new("alpha_made_after"));
        assert_ne!(z, y);
        assert!(y < z && z > a, "by text, not by address or age");
        assert_eq!(y.cmp(&y), std::cmp::Ordering::Equal);
        let json = serde_json::to_string(&f("/home/me/app.py")).unwrap();
        assert_eq!(
            json,
            r#"{"function":"f","filename":"/home/me/app.py","line":1}"#
        );
        let back: Frame = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f("/home/me/app.py"));
        assert_eq!(back.filename, "/home/me/app.py");
        assert_eq!(format!("{}:{:?}", back.function, back.function), "f:\"f\"");
    }
}
