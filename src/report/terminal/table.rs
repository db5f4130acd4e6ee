//! Every table's columns, each a width and an alignment, defined once.
//!
//! Must not: know what a column holds; the renderers fill the cells.

/// A table's columns before its free text (source, name): each a width and an alignment,
/// written `cell │ ` one after the other. Every table's widths are defined here, once.
pub(super) struct Table(&'static [(usize, Align)]);

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Right,
    Left,
}

/// `Line │ Time Python │ native │ system │`.
pub(super) const LINES: Table = Table(&[
    (6, Align::Right),
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);
/// `Memory Python │ peak │ timeline │ Copy MB/s │`, after [`LINES`].
pub(super) const MEMORY: Table = Table(&[
    (13, Align::Right),
    (6, Align::Right),
    (TIMELINE_WIDTH, Align::Left),
    (9, Align::Right),
]);
/// `GPU │ GPU mem │`, after [`LINES`] (and [`MEMORY`]) when a GPU was used.
pub(super) const GPU: Table = Table(&[(5, Align::Right), (7, Align::Right)]);
/// `Time Python │ native │ system │ total │`.
pub(super) const FUNCTIONS: Table = Table(&[
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);
/// `TID │ samples │ Time Python │ native │ system │ total │`.
pub(super) const THREADS: Table = Table(&[
    (8, Align::Right),
    (8, Align::Right),
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);

impl Table {
    /// Columns the cells take, separators and the space before the text included.
    pub(super) const fn width(&self) -> usize {
        let mut sum = 0;
        let mut i = 0;
        while i < self.0.len() {
            sum += self.0[i].0 + 3;
            i += 1;
        }
        sum
    }

    /// `s` padded to column `i`'s width (by characters: a cell holds no escape codes).
    pub(super) fn pad(&self, i: usize, s: &str) -> String {
        let (w, align) = self.0[i];
        let fill = " ".repeat(w.saturating_sub(s.chars().count()));
        match align {
            Align::Right => format!("{fill}{s}"),
            Align::Left => format!("{s}{fill}"),
        }
    }

    /// The cells, padded, as `a │ b │ … │`.
    pub(super) fn row<S: AsRef<str>>(&self, cells: &[S]) -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| self.pad(i, c.as_ref()))
            .collect();
        Table::join(&padded)
    }

    /// Cells already padded (and painted), as `a │ b │ … │`.
    pub(super) fn join(cells: &[String]) -> String {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(c);
            out.push_str(" │");
        }
        out
    }

    /// The widths of the rule's segments under the columns (each up to its `┼`).
    pub(super) fn rule_cells(&self, first: bool) -> Vec<usize> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, &(w, _))| if i == 0 && first { w + 1 } else { w + 2 })
            .collect()
    }
}

/// Width of the `Line │ Time Python │ native │ system │ ` prefix, in columns.
pub(super) const PREFIX: usize = LINES.width();
/// Narrowest space left for source text or a function's name.
pub(super) const MIN_TEXT: usize = 16;

/// Width of the memory columns `Memory Python │ peak │ timeline │ Copy MB/s │ `.
pub(super) const MEM_PREFIX: usize = MEMORY.width();
pub(super) const TIMELINE_WIDTH: usize = 10;
