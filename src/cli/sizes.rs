//! Byte sizes on the command line (`--memory-window`, `--copy-window`).
//!
//! Owns: [`window_bytes`]. Must not: know the options that use it.

/// A window size: a positive byte count, with an optional K/M/G suffix (powers of 1024).
pub(super) fn window_bytes(s: &str) -> Result<u64, String> {
    let expected = || format!("`{s}`: expected bytes, e.g. 1048576, 512K or 4M");
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let scale: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(expected()),
    };
    let n: u64 = digits.parse().map_err(|_| expected())?;
    match n.checked_mul(scale) {
        Some(b) if b >= 4096 => Ok(b),
        Some(_) => Err(format!(
            "`{s}`: a window under 4 KiB would make every allocation an event"
        )),
        None => Err(format!("`{s}`: too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::window_bytes;

    #[test]
    fn window_sizes_take_bytes_and_binary_suffixes() {
        assert_eq!(window_bytes("1048576"), Ok(1 << 20));
        assert_eq!(window_bytes("4M"), Ok(4 << 20));
        assert_eq!(window_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(window_bytes("2g"), Ok(2 << 30));
        assert_eq!(window_bytes("64kb"), Ok(64 << 10));
        for bad in ["", "M", "1.5M", "-4M", "4Q", "3K", "4095"] {
            assert!(window_bytes(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(window_bytes("99999999999G").is_err());
    }
}
