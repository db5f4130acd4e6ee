//! The table's columns: which a view has, their headings, and which fit the width.
//!
//! Owns: [`Column`], the columns of each view ([`columns_of`]) and [`fit`], which drops
//! columns that do not fit (in [`DROP_ORDER`]) instead of wrapping, then shares out the
//! room left.
//!
//! Must not: know the rows' figures (it is handed their widths) or draw.

use super::model::{SortKey, View};

/// One column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Column {
    /// `file:line` (the function's first line in the function view; the file alone in
    /// the file view).
    Location,
    Function,
    Total,
    Python,
    Native,
    System,
    /// Allocation rate, MB/s (memory).
    Alloc,
    /// Footprint peak since start, MB (memory).
    Peak,
    /// Copy rate, MB/s (memory).
    Copy,
    /// The line's top native function (`--native`).
    NativeTop,
    /// The line's asyncio task (`--async`).
    Task,
    Source,
}

/// The order columns go in when the width is short. The first goes first. Location and
/// Total always stay.
pub(crate) const DROP_ORDER: [Column; 10] = [
    Column::Source,
    Column::Function,
    Column::Task,
    Column::NativeTop,
    Column::Copy,
    Column::Peak,
    Column::Alloc,
    Column::System,
    Column::Native,
    Column::Python,
];

/// Columns are one space apart.
pub(crate) const GAP: usize = 1;

/// What the data has beyond time, which decides the optional columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Extras {
    /// Lines carry memory, and the view shows all threads (memory is not per thread).
    pub(crate) memory: bool,
    /// Lines carry native functions.
    pub(crate) native: bool,
    /// Stacks carry asyncio tasks.
    pub(crate) tasks: bool,
    /// Time could not be split into Python and native (one column holds both).
    pub(crate) unsplit: bool,
}

/// The columns of `view`, left to right, before any is dropped for width.
pub(crate) fn columns_of(view: View, x: Extras) -> Vec<Column> {
    use Column::*;
    let mut c = vec![Location];
    if view != View::Files {
        c.push(Function);
    }
    c.extend([Total, Python]);
    if !x.unsplit {
        c.push(Native);
    }
    c.push(System);
    if x.memory && view != View::Functions {
        c.push(Alloc);
        if view == View::Lines {
            c.push(Peak);
        }
        c.push(Copy);
    }
    if view == View::Lines {
        if x.native {
            c.push(NativeTop);
        }
        if x.tasks {
            c.push(Task);
        }
        c.push(Source);
    }
    c
}

impl Column {
    /// The heading, without the sort mark.
    pub(crate) fn heading(self, view: View, x: Extras) -> &'static str {
        match self {
            Column::Location if view == View::Files => "File",
            Column::Location => "File:line",
            Column::Function => "Function",
            Column::Total => "Total%",
            Column::Python if x.unsplit => "Py+nat%",
            Column::Python => "Py%",
            Column::Native => "Nat%",
            Column::System => "Sys%",
            Column::Alloc => "Alloc MB/s",
            Column::Peak => "Peak MB",
            Column::Copy => "Copy MB/s",
            Column::NativeTop => "Top native",
            Column::Task => "Task",
            Column::Source => "Source",
        }
    }

    /// Figures are right-aligned; text is left-aligned.
    pub(crate) fn is_figure(self) -> bool {
        !matches!(
            self,
            Column::Location | Column::Function | Column::NativeTop | Column::Task | Column::Source
        )
    }

    /// The sort this column's figures give.
    pub(crate) fn sort_key(self) -> Option<SortKey> {
        Some(match self {
            Column::Location => SortKey::Location,
            Column::Function => SortKey::Function,
            Column::Total => SortKey::Total,
            Column::Python => SortKey::Python,
            Column::Native => SortKey::Native,
            Column::System => SortKey::System,
            Column::Alloc => SortKey::Alloc,
            Column::Peak => SortKey::Peak,
            Column::Copy => SortKey::Copy,
            Column::NativeTop | Column::Task | Column::Source => return None,
        })
    }

    /// (fewest, most) characters a column takes. Text columns grow from the first to the
    /// second as their text asks and the room allows. A figure column holds its heading
    /// and the sort mark.
    pub(crate) fn bounds(self, view: View, x: Extras) -> (usize, usize) {
        let heading = self.heading(view, x).chars().count() + 1;
        match self {
            Column::Location => (12, 40),
            Column::Function => (10, 28),
            Column::NativeTop => (12, 28),
            Column::Task => (8, 20),
            Column::Source => (12, usize::MAX),
            _ => (heading.max(6), heading.max(6)),
        }
    }
}

/// The columns of `wanted` that fit `width`, with their widths. `natural(c)` is how wide a
/// text column's text is (its widest cell, heading included).
/// - Columns go in [`DROP_ORDER`] while the fewest characters of those left exceed the
///   width. Location and Total are never dropped (Location is cut instead).
/// - The room left goes to the text columns, left to right, up to their text's width and
///   their most. The source column takes what remains.
pub(crate) fn fit(
    wanted: &[Column],
    view: View,
    x: Extras,
    width: usize,
    natural: &dyn Fn(Column) -> usize,
) -> Vec<(Column, usize)> {
    let mut cols: Vec<Column> = wanted.to_vec();
    let need = |cols: &[Column]| -> usize {
        cols.iter().map(|c| c.bounds(view, x).0).sum::<usize>() + GAP * cols.len().saturating_sub(1)
    };
    for drop in DROP_ORDER {
        if need(&cols) <= width {
            break;
        }
        cols.retain(|&c| c != drop);
    }
    let mut spare = width.saturating_sub(need(&cols));
    let mut out: Vec<(Column, usize)> = cols.iter().map(|&c| (c, c.bounds(view, x).0)).collect();
    for (c, w) in out.iter_mut() {
        if c.is_figure() || *c == Column::Source {
            continue;
        }
        let (_, most) = c.bounds(view, x);
        let grow = natural(*c).min(most).saturating_sub(*w).min(spare);
        *w += grow;
        spare -= grow;
    }
    if let Some((_, w)) = out.iter_mut().find(|(c, _)| *c == Column::Source) {
        *w += spare;
    } else if let Some((_, w)) = out.iter_mut().find(|(c, _)| *c == Column::Location) {
        // No source, so a long path may take what is left.
        *w += spare.min(natural(Column::Location).saturating_sub(*w));
    }
    // On a terminal narrower than the two columns kept, Location shrinks to what there is.
    let used: usize = out.iter().map(|(_, w)| w).sum::<usize>() + GAP * out.len().saturating_sub(1);
    if used > width {
        if let Some((_, w)) = out.iter_mut().find(|(c, _)| *c == Column::Location) {
            *w = w.saturating_sub(used - width).max(1);
        }
    }
    out
}
