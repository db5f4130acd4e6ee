//! Bytecode offset → source line, decoded from a code object's line table.
//!
//! Owns: [`LineTable`], the decoder for every line-table encoding CPython 2.7 – 3.13 uses
//! (see [`LineTableFormat`]). It keeps the interpreter's own semantics
//! (`PyCode_Addr2Line`). The encodings:
//!
//! * `co_lnotab` (2.7 – 3.9) holds pairs of (byte increment, line increment).
//!   - The line increment belongs to the *next* range. An instruction at offset `q` has the
//!     first line plus every line increment whose pair's cumulative byte offset is `<= q`.
//!   - Increments are unsigned on 2.7 and signed bytes on 3.6+.
//!   - Large jumps are split over several pairs. A zero byte increment just moves the line.
//!   - The table has no end. Offsets past the last pair keep the last line, as in CPython.
//! * `co_linetable` (3.10) holds pairs of (byte length u8, line delta i8).
//!   - Each pair describes a range.
//!   - Delta -128 means "no line". It does NOT move the running line, so the next real
//!     delta is relative to the last real line.
//!   - Zero-length pairs only move the line.
//! * The location table (3.11+) holds variable-length entries.
//!   - The first byte has bit 7 set, a 4-bit code in bits 3–6, and the length minus one
//!     (in 2-byte code units) in bits 0–2.
//!   - Code 15 is no location (line unchanged, "no line").
//!   - Code 14 is the long form. A signed-varint line delta follows, then the end-line
//!     delta, column+1 and end-column+1 as varints.
//!   - Code 13 is no columns, with a signed-varint line delta.
//!   - Codes 10–12 are one-line forms. Their line delta is code - 10, and two column bytes
//!     follow.
//!   - Codes 0–9 are short forms, on the same line, with one column byte.
//!   - Varints are little-endian 6-bit chunks, with 0x40 meaning "more follows". A signed
//!     varint keeps the sign in its lowest bit.
//!
//! Every offset here is in BYTES into the bytecode. That holds for 3.10+ too, where CPython
//! counts 2-byte code units internally.
//!
//! Tables are read from another process's memory, so they may be torn or hostile. Decoding
//! never panics. It stops at the first malformed entry and keeps what came before.
//!
//! Must not: read memory or know about frames.

use crate::python_bindings::LineTableFormat;

/// A decoded line table: sorted, non-overlapping byte ranges of the bytecode with their line.
///
/// The ranges are contiguous from offset 0 to [`LineTable::end`]. Adjacent ranges with the
/// same line are merged, zero-length ranges are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LineTable {
    /// (start byte offset, line) sorted by start; a range ends where the next one starts,
    /// the last one at `end`.
    ranges: Vec<(u32, Option<u32>)>,
    /// Exclusive end of the last range; `u64::MAX` for `co_lnotab`, whose last line extends
    /// past any offset.
    end: u64,
}

/// Offsets are u32, so nothing may start at or beyond this.
const OFFSET_LIMIT: u64 = u32::MAX as u64 + 1;

impl LineTable {
    /// Decodes `table` (`co_lnotab` or `co_linetable`, per `format`) of a code object whose
    /// `co_firstlineno` is `firstlineno`. Never panics; stops at the first malformed entry.
    pub fn decode(format: LineTableFormat, table: &[u8], firstlineno: u32) -> LineTable {
        let mut out = LineTable::default();
        let first = i64::from(firstlineno);
        match format {
            LineTableFormat::LnotabUnsigned => out.decode_lnotab(table, first, false),
            LineTableFormat::LnotabSigned => out.decode_lnotab(table, first, true),
            LineTableFormat::Linetable310 => out.decode_310(table, first),
            LineTableFormat::Locations311 => out.decode_311(table, first),
        }
        out
    }

    /// Line of the instruction starting at `byte_offset` into the bytecode (offset in BYTES,
    /// even for 3.10+ where CPython counts 2-byte code units internally). None = "no line"
    /// (3.10+ entries without a line), or offset past the table.
    pub fn line_at(&self, byte_offset: u32) -> Option<u32> {
        if u64::from(byte_offset) >= self.end {
            return None;
        }
        let idx = self
            .ranges
            .partition_point(|&(start, _)| start <= byte_offset);
        self.ranges.get(idx.checked_sub(1)?)?.1
    }

    /// Exclusive end (in bytes) of the bytecode the table describes; `u64::MAX` for
    /// `co_lnotab` tables, which describe every offset.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// True when no offset has a range (an empty 3.10+ table).
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges as (start, exclusive end, line), in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, u64, Option<u32>)> + '_ {
        self.ranges
            .iter()
            .enumerate()
            .map(move |(i, &(start, line))| {
                let end = self
                    .ranges
                    .get(i + 1)
                    .map(|&(next, _)| u64::from(next))
                    .unwrap_or(self.end);
                (start, end, line)
            })
    }

    /// Appends a range of `len` bytes after the current end. Returns false (and appends
    /// nothing) when the range would start past the addressable offsets. Decoding then stops.
    fn push(&mut self, len: u64, line: Option<i64>) -> bool {
        if len == 0 {
            return true;
        }
        if self.end >= OFFSET_LIMIT {
            return false;
        }
        // A negative or huge running line only comes from a corrupt table, so it gets no line.
        let line = line.and_then(|l| u32::try_from(l).ok());
        let start = self.end as u32; // < OFFSET_LIMIT, checked above
        self.end = self.end.saturating_add(len);
        match self.ranges.last() {
            Some(&(_, last)) if last == line => {}
            _ => self.ranges.push((start, line)),
        }
        true
    }

    /// 2.7 – 3.9 `co_lnotab`.
    fn decode_lnotab(&mut self, table: &[u8], first: i64, signed: bool) {
        let mut line = first;
        // A trailing odd byte is ignored, as CPython does (size / 2 pairs).
        for pair in table.chunks_exact(2) {
            if !self.push(u64::from(pair[0]), Some(line)) {
                return;
            }
            let delta = if signed {
                i64::from(pair[1] as i8)
            } else {
                i64::from(pair[1])
            };
            line = line.saturating_add(delta);
        }
        // The last line covers everything after the last pair.
        if self.end < OFFSET_LIMIT {
            let rest = u64::MAX - self.end;
            self.push(rest, Some(line));
        }
    }

    /// 3.10 `co_linetable`.
    fn decode_310(&mut self, table: &[u8], first: i64) {
        let mut line = first;
        for pair in table.chunks_exact(2) {
            let this = match pair[1] as i8 {
                -128 => None,
                delta => {
                    line = line.saturating_add(i64::from(delta));
                    Some(line)
                }
            };
            if !self.push(u64::from(pair[0]), this) {
                return;
            }
        }
    }

    /// 3.11+ location table.
    fn decode_311(&mut self, table: &[u8], first: i64) {
        let mut line = first;
        let mut pos = 0usize;
        while pos < table.len() {
            let Some((entry_line, next_line, next_pos)) = parse_location_entry(table, pos, line)
            else {
                return;
            };
            let units = u64::from(table[pos] & 7) + 1;
            if !self.push(units * 2, entry_line) {
                return;
            }
            line = next_line;
            pos = next_pos;
        }
    }
}

/// Parses the location entry at `pos` given the running line. Returns (the entry's line,
/// the running line after it, the position of the next entry), or None when malformed:
/// no entry-start bit, a truncated payload, a payload byte with bit 7 set (CPython would
/// read it as the start of the next entry), or an over-long varint.
fn parse_location_entry(table: &[u8], pos: usize, line: i64) -> Option<(Option<i64>, i64, usize)> {
    let head = *table.get(pos)?;
    if head & 0x80 == 0 {
        return None;
    }
    let code = (head >> 3) & 15;
    let mut p = pos + 1;
    let (entry_line, next_line) = match code {
        15 => (None, line),
        14 => {
            let delta = read_svarint(table, &mut p)?;
            read_varint(table, &mut p)?; // end line delta
            read_varint(table, &mut p)?; // column + 1
            read_varint(table, &mut p)?; // end column + 1
            let l = line.saturating_add(delta);
            (Some(l), l)
        }
        13 => {
            let l = line.saturating_add(read_svarint(table, &mut p)?);
            (Some(l), l)
        }
        10..=12 => {
            payload(table, &mut p, 2)?; // column, end column
            let l = line + i64::from(code - 10);
            (Some(l), l)
        }
        _ => {
            payload(table, &mut p, 1)?; // packed column / end column
            (Some(line), line)
        }
    };
    Some((entry_line, next_line, p))
}

/// Skips `n` payload bytes, each of which must have bit 7 clear.
fn payload(table: &[u8], p: &mut usize, n: usize) -> Option<()> {
    let bytes = table.get(*p..p.checked_add(n)?)?;
    if bytes.iter().any(|&b| b & 0x80 != 0) {
        return None;
    }
    *p += n;
    Some(())
}

/// Unsigned varint: 6-bit chunks, least significant first, 0x40 = more follow. At most six
/// chunks (CPython's values are 32-bit), each a payload byte (bit 7 clear).
fn read_varint(table: &[u8], p: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let b = *table.get(*p)?;
        if b & 0x80 != 0 {
            return None;
        }
        *p += 1;
        value |= u64::from(b & 0x3f) << shift;
        if b & 0x40 == 0 {
            return (value <= u64::from(u32::MAX)).then_some(value);
        }
        shift += 6;
        if shift > 30 {
            return None;
        }
    }
}

/// Signed varint: the magnitude shifted left by one, the sign in bit 0.
fn read_svarint(table: &[u8], p: &mut usize) -> Option<i64> {
    let v = read_varint(table, p)?;
    let magnitude = (v >> 1) as i64;
    Some(if v & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;
    use LineTableFormat::*;

    fn lines(t: &LineTable, offsets: impl IntoIterator<Item = u32>) -> Vec<Option<u32>> {
        offsets.into_iter().map(|o| t.line_at(o)).collect()
    }

    // ---- co_lnotab (2.7, 3.6 – 3.9) ----

    #[test]
    fn lnotab_empty_is_firstlineno_everywhere() {
        for f in [LnotabUnsigned, LnotabSigned] {
            let t = LineTable::decode(f, &[], 7);
            assert_eq!(lines(&t, [0, 2, 100, u32::MAX]), vec![Some(7); 4]);
        }
    }

    #[test]
    fn lnotab_increments_apply_from_their_offset() {
        // 0..6 -> 10, 6..10 -> 11, 10.. -> 14
        let t = LineTable::decode(LnotabSigned, &[6, 1, 4, 3], 10);
        assert_eq!(
            lines(&t, [0, 4, 5, 6, 8, 9, 10, 12, 1000]),
            vec![
                Some(10),
                Some(10),
                Some(10),
                Some(11),
                Some(11),
                Some(11),
                Some(14),
                Some(14),
                Some(14)
            ]
        );
        assert_eq!(t.end(), u64::MAX);
    }

    #[test]
    fn lnotab_signed_vs_unsigned() {
        // 0xfe is -2 on 3.6+, +254 on 2.7.
        let table = [4, 5, 4, 0xfe];
        let s = LineTable::decode(LnotabSigned, &table, 100);
        assert_eq!(lines(&s, [0, 4, 8]), vec![Some(100), Some(105), Some(103)]);
        let u = LineTable::decode(LnotabUnsigned, &table, 100);
        assert_eq!(lines(&u, [0, 4, 8]), vec![Some(100), Some(105), Some(359)]);
    }

    #[test]
    fn lnotab_split_jumps() {
        // A +300 line jump at offset 2: (2, 127), (0, 127), (0, 46). A 300-byte gap:
        // (255, 0), (45, 1).
        let t = LineTable::decode(LnotabSigned, &[2, 127, 0, 127, 0, 46, 255, 0, 45, 1], 1);
        assert_eq!(t.line_at(0), Some(1));
        assert_eq!(t.line_at(2), Some(301));
        assert_eq!(t.line_at(300), Some(301));
        assert_eq!(t.line_at(301), Some(301));
        assert_eq!(t.line_at(302), Some(302));
        // Negative split: -200 as (0, -128), (0, -72).
        let t = LineTable::decode(LnotabSigned, &[4, 0, 0, 0x80, 2, 0xb8], 500);
        assert_eq!(lines(&t, [0, 4, 6]), vec![Some(500), Some(372), Some(300)]);
    }

    #[test]
    fn lnotab_odd_trailing_byte_ignored() {
        let t = LineTable::decode(LnotabUnsigned, &[3, 2, 9], 1);
        assert_eq!(
            lines(&t, [0, 3, 12, 13]),
            vec![Some(1), Some(3), Some(3), Some(3)]
        );
    }

    #[test]
    fn lnotab_negative_line_is_none() {
        let t = LineTable::decode(LnotabSigned, &[2, 0xf6, 2, 20], 5);
        assert_eq!(lines(&t, [0, 2, 4]), vec![Some(5), None, Some(15)]);
    }

    // ---- co_linetable (3.10) ----

    #[test]
    fn linetable310_basic_and_end() {
        // 0..4 line 3 (+2), 4..10 line 4, 10..12 line 2.
        let t = LineTable::decode(Linetable310, &[4, 2, 6, 1, 2, 0xfe], 1);
        assert_eq!(
            lines(&t, [0, 2, 4, 8, 10, 12, 14]),
            vec![Some(3), Some(3), Some(4), Some(4), Some(2), None, None]
        );
        assert_eq!(t.end(), 12);
    }

    #[test]
    fn linetable310_no_line_does_not_move_line() {
        // line 5 (+4), no line, then +1 relative to 5 -> 6.
        let t = LineTable::decode(Linetable310, &[2, 4, 4, 0x80, 2, 1], 1);
        assert_eq!(lines(&t, [0, 2, 4, 6]), vec![Some(5), None, None, Some(6)]);
    }

    #[test]
    fn linetable310_zero_length_entries_only_move_line() {
        // +127 then +73 at zero length, then a 300-byte range split as 254 + 46.
        let t = LineTable::decode(Linetable310, &[0, 127, 254, 73, 46, 0, 2, 1], 1);
        assert_eq!(t.line_at(0), Some(201));
        assert_eq!(t.line_at(298), Some(201));
        assert_eq!(t.line_at(300), Some(202));
        assert_eq!(t.line_at(302), None);
        assert_eq!(t.ranges().count(), 2); // merged
    }

    #[test]
    fn linetable310_empty_and_truncated() {
        let t = LineTable::decode(Linetable310, &[], 1);
        assert!(t.is_empty());
        assert_eq!(t.line_at(0), None);
        let t = LineTable::decode(Linetable310, &[2, 0, 2], 1);
        assert_eq!(lines(&t, [0, 2]), vec![Some(1), None]);
    }

    // ---- location table (3.11+) ----

    /// Builds one entry header.
    fn head(code: u8, units: u8) -> u8 {
        assert!((1..=8).contains(&units));
        0x80 | (code << 3) | (units - 1)
    }

    fn varint(mut v: u32, out: &mut Vec<u8>) {
        while v >= 64 {
            out.push(0x40 | (v & 63) as u8);
            v >>= 6;
        }
        out.push(v as u8);
    }

    fn svarint(v: i32, out: &mut Vec<u8>) {
        let u = if v < 0 {
            ((v.unsigned_abs()) << 1) | 1
        } else {
            (v as u32) << 1
        };
        varint(u, out);
    }

    #[test]
    fn locations_all_entry_kinds() {
        let mut t = Vec::new();
        // 1 unit: no columns, line delta -1 (module RESUME at line 0).
        t.push(head(13, 1));
        svarint(-1, &mut t);
        // 2 units: one-line form, +2 -> line 2.
        t.extend([head(12, 2), 4, 9]);
        // 3 units: short form (code 3), same line.
        t.extend([head(3, 3), 0x25]);
        // 1 unit: no location.
        t.push(head(15, 1));
        // 8 units: long form, +1000 relative to 2 (no-location did not move it).
        t.push(head(14, 8));
        svarint(1000, &mut t);
        varint(3, &mut t);
        varint(5, &mut t);
        varint(200, &mut t);
        // 1 unit: long form, -500.
        t.push(head(14, 1));
        svarint(-500, &mut t);
        varint(0, &mut t);
        varint(1, &mut t);
        varint(1, &mut t);
        // 1 unit: one-line form +0, one-line +1.
        t.extend([head(10, 1), 1, 2, head(11, 1), 1, 2]);
        let lt = LineTable::decode(Locations311, &t, 1);
        let want: Vec<Option<u32>> = [
            Some(0),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            None,
            Some(1002),
            Some(1002),
            Some(1002),
            Some(1002),
            Some(1002),
            Some(1002),
            Some(1002),
            Some(1002),
            Some(502),
            Some(502),
            Some(503),
            None,
        ]
        .to_vec();
        assert_eq!(lines(&lt, (0..want.len() as u32).map(|u| u * 2)), want);
        assert_eq!(lt.end(), 36);
    }

    #[test]
    fn locations_truncated_stops_at_malformed_entry() {
        let mut t = vec![head(10, 2), 0, 5, head(11, 1), 0, 5];
        t.push(head(14, 1));
        svarint(70, &mut t); // two chunks
        let full = t.clone();
        varint(0, &mut t);
        varint(1, &mut t);
        varint(1, &mut t);
        assert_eq!(LineTable::decode(Locations311, &t, 10).line_at(6), Some(81));
        // Every truncation keeps the complete entries before the cut and never panics.
        for cut in 0..t.len() {
            let lt = LineTable::decode(Locations311, &t[..cut], 10);
            let complete = if cut >= 6 {
                6
            } else if cut >= 3 {
                4
            } else {
                0
            };
            assert_eq!(lt.end(), complete as u64, "cut {cut}");
        }
        // A long-form varint cut in the middle.
        let lt = LineTable::decode(Locations311, &full[..full.len() - 1], 10);
        assert_eq!(lt.end(), 6);
    }

    #[test]
    fn locations_rejects_missing_start_bit_and_high_payload() {
        // Second entry lacks bit 7, so stop after the first.
        let lt = LineTable::decode(Locations311, &[head(13, 1), 2, 0x12, 0], 1);
        assert_eq!(lt.end(), 2);
        assert_eq!(lt.line_at(0), Some(2));
        // A short-form payload with bit 7 set is malformed.
        let lt = LineTable::decode(Locations311, &[head(0, 1), 0x90], 1);
        assert!(lt.is_empty());
        // An over-long varint (seven chunks) is malformed.
        let lt = LineTable::decode(
            Locations311,
            &[head(13, 1), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x01],
            1,
        );
        assert!(lt.is_empty());
    }

    #[test]
    fn locations_line_below_zero_is_none() {
        let mut t = vec![head(13, 1)];
        svarint(-5, &mut t);
        t.push(head(13, 1));
        svarint(10, &mut t);
        let lt = LineTable::decode(Locations311, &t, 1);
        assert_eq!(lines(&lt, [0, 2]), vec![None, Some(6)]);
    }

    #[test]
    fn hostile_input_never_panics() {
        // A cheap deterministic PRNG over many random tables, every format.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..2000 {
            let len = (next() % 64) as usize;
            let table: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let first = if round % 3 == 0 {
                u32::MAX
            } else {
                (next() % 5000) as u32
            };
            for f in [LnotabUnsigned, LnotabSigned, Linetable310, Locations311] {
                let lt = LineTable::decode(f, &table, first);
                for off in [0, 1, 2, 3, 64, 1000, u32::MAX - 1, u32::MAX] {
                    let _ = lt.line_at(off);
                }
                // Ranges are sorted, contiguous and non-empty.
                let mut prev_end = 0u64;
                for (start, end, _) in lt.ranges() {
                    assert_eq!(u64::from(start), prev_end);
                    assert!(end > u64::from(start));
                    prev_end = end;
                }
            }
        }
    }

    #[test]
    fn huge_lnotab_stays_addressable() {
        // 17M pairs of 255 bytes would pass u32::MAX; decode a prefix large enough to
        // check the limit logic without allocating that much, by pushing directly.
        let mut lt = LineTable::default();
        assert!(lt.push(u64::from(u32::MAX), Some(1)));
        assert!(lt.push(1, Some(2)));
        assert!(!lt.push(1, Some(3)));
        assert_eq!(lt.line_at(u32::MAX), Some(2));
    }
}
