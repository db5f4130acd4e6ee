//! CPython versions: parsing, and where a version came from.

use std::fmt;

/// A CPython version such as 3.12.1 or 3.13.0rc1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    /// None when only "X.Y" is known (e.g. from a file name).
    pub(crate) micro: Option<u32>,
    /// "", "a1", "b2", "rc1", "+" ...
    pub(crate) suffix: String,
}

/// How the version was found; shown to the user so a fallback is never silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum VersionSource {
    /// The `Py_Version` symbol (3.11+), read from the process.
    PyVersionSymbol,
    /// The libpython / executable file name, completed by a version string in its data.
    FileName,
    /// Only a version string found in the binary's read-only data.
    VersionString,
    /// `--python-version` on the command line.
    Override,
}

impl VersionSource {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            VersionSource::PyVersionSymbol => "the Py_Version symbol",
            VersionSource::FileName => "the interpreter's file name",
            VersionSource::VersionString => "a version string in the binary",
            VersionSource::Override => "--python-version",
        }
    }
}

impl Version {
    /// Parses "3.9.18", "2.7.18+", "3.13.0rc1", "3.12" (micro unknown).
    pub(crate) fn parse(s: &str) -> Option<Version> {
        let mut parts = s.splitn(3, '.');
        let major: u32 = parts.next()?.parse().ok()?;
        let minor_str = parts.next()?;
        if !(2..=3).contains(&major) {
            return None;
        }
        let (minor, micro, suffix) = match parts.next() {
            None => (minor_str.parse().ok()?, None, String::new()),
            Some(rest) => {
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                if digits == 0 {
                    return None;
                }
                let suffix = &rest[digits..];
                let ok_suffix = suffix.is_empty()
                    || suffix == "+"
                    || ["a", "b", "rc"].iter().any(|p| {
                        suffix
                            .strip_prefix(p)
                            .map(|n| {
                                let n = n.trim_end_matches('+');
                                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                            })
                            .unwrap_or(false)
                    });
                if !ok_suffix {
                    return None;
                }
                (
                    minor_str.parse().ok()?,
                    Some(rest[..digits].parse().ok()?),
                    suffix.to_string(),
                )
            }
        };
        if minor > 99 {
            return None;
        }
        Some(Version {
            major,
            minor,
            micro,
            suffix,
        })
    }

    /// Decodes `PY_VERSION_HEX` (the value of `Py_Version`).
    pub(crate) fn from_hex(hex: u64) -> Option<Version> {
        let major = ((hex >> 24) & 0xff) as u32;
        let minor = ((hex >> 16) & 0xff) as u32;
        let micro = ((hex >> 8) & 0xff) as u32;
        let level = ((hex >> 4) & 0xf) as u32;
        let serial = (hex & 0xf) as u32;
        if major != 3 || hex >> 32 != 0 {
            return None;
        }
        let suffix = match level {
            0xa => format!("a{serial}"),
            0xb => format!("b{serial}"),
            0xc => format!("rc{serial}"),
            0xf => String::new(),
            _ => return None,
        };
        Some(Version {
            major,
            minor,
            micro: Some(micro),
            suffix,
        })
    }

    /// Parses the version out of an interpreter file name: "libpython3.9.so.1.0",
    /// "libpython3.6m.so", "libpython3.13t.so", "python3.11", "python2.7".
    pub(crate) fn from_file_name(name: &str) -> Option<Version> {
        let rest = name
            .strip_prefix("libpython")
            .or_else(|| name.strip_prefix("python"))?;
        let major: u32 = rest.get(..1)?.parse().ok()?;
        let rest = rest.get(1..)?.strip_prefix('.')?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let minor: u32 = rest.get(..digits)?.parse().ok()?;
        let tail = &rest[digits..];
        // Allowed after X.Y: ABI flags (d, m, u, t) then nothing or ".so...".
        let flags = tail.bytes().take_while(|b| b"dmut".contains(b)).count();
        let after = &tail[flags..];
        if !(after.is_empty() || after.starts_with(".so")) || !(2..=3).contains(&major) {
            return None;
        }
        Some(Version {
            major,
            minor,
            micro: None,
            suffix: String::new(),
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.micro {
            Some(m) => write!(f, "{}.{}.{}{}", self.major, self.minor, m, self.suffix),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_strings() {
        assert_eq!(Version::parse("3.9.18").unwrap().to_string(), "3.9.18");
        assert_eq!(Version::parse("2.7.18+").unwrap().suffix, "+");
        assert_eq!(Version::parse("3.13.0rc1").unwrap().suffix, "rc1");
        assert_eq!(Version::parse("3.12").unwrap().micro, None);
        for bad in ["3.9.x", "1.2.3", "3.9.1-foo", "3..1", "4.0.0", "3.9.18abc"] {
            assert!(Version::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn decodes_hex() {
        assert_eq!(Version::from_hex(0x030c01f0).unwrap().to_string(), "3.12.1");
        assert_eq!(
            Version::from_hex(0x030d00c1).unwrap().to_string(),
            "3.13.0rc1"
        );
        assert!(Version::from_hex(0x0).is_none());
        assert!(Version::from_hex(0xdead_beef_0000).is_none());
    }

    #[test]
    fn file_names() {
        let v = |s| Version::from_file_name(s).map(|v| (v.major, v.minor));
        assert_eq!(v("libpython3.9.so.1.0"), Some((3, 9)));
        assert_eq!(v("libpython3.6m.so.1.0"), Some((3, 6)));
        assert_eq!(v("libpython3.13t.so"), Some((3, 13)));
        assert_eq!(v("libpython2.7.so.1.0"), Some((2, 7)));
        assert_eq!(v("python3.11"), Some((3, 11)));
        assert_eq!(v("python3"), None);
        assert_eq!(v("libpython3.so"), None);
        assert_eq!(v("python3.11-config"), None);
    }
}
