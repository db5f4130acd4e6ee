//! The profile as JSON: what `--json` writes and `scalene-rs view PROFILE.json` reads back.
//!
//! The schema is documented in docs/profile-json.md; its version is
//! [`PROFILE_SCHEMA_VERSION`]. Reading checks the version before anything else, so a file
//! from a newer (or older, incompatible) scalene-rs is refused with a clear message rather
//! than misread.
//!
//! Must not: read process memory or files (the caller reads the file).

use crate::profile::{Profile, PROFILE_SCHEMA_VERSION};

/// Why a profile JSON could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileJsonError {
    /// Not JSON at all.
    #[error("not a scalene-rs profile: invalid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// JSON, but not an object with a `schema_version`.
    #[error("not a scalene-rs profile: {0}")]
    NotAProfile(&'static str),
    /// A `schema_version` this build does not read.
    #[error(
        "unsupported profile schema_version {found}: this scalene-rs reads schema_version \
         {supported} (see docs/profile-json.md); use the scalene-rs that wrote the file"
    )]
    UnsupportedVersion { found: String, supported: u32 },
    /// The right version, but a field is missing or has the wrong type: what the reader
    /// said, on one line and cut to [`MESSAGE_MAX`] characters (it quotes the file's text,
    /// which may be a megabyte of anything).
    #[error("malformed scalene-rs profile (schema_version {version}): {message}")]
    Invalid { version: u32, message: String },
}

/// The most characters of the file's own text an error message quotes.
const MESSAGE_MAX: usize = 200;

/// `s` on one line (control and line-separator characters as spaces), cut to
/// [`MESSAGE_MAX`] characters with an ellipsis.
fn one_line(s: &str) -> String {
    let clean = |c: char| {
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            ' '
        } else {
            c
        }
    };
    let mut out: String = s.chars().take(MESSAGE_MAX).map(clean).collect();
    if s.chars().nth(MESSAGE_MAX).is_some() {
        out.push('…');
    }
    out
}

/// The profile as pretty JSON, fields in their declared order, ending in a newline.
///
/// Non-finite numbers (which a well-formed profile never holds) would be written as `null`,
/// which [`from_json`] then refuses.
pub fn to_json(p: &Profile) -> String {
    let mut s = serde_json::to_string_pretty(p).expect("a profile always serializes");
    s.push('\n');
    s
}

/// Reads a profile written by [`to_json`]: [`PROFILE_SCHEMA_VERSION`], or schema 1 (the
/// same without memory fields, which read as absent); any other version is refused.
pub fn from_json(text: &str) -> Result<Profile, ProfileJsonError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ProfileJsonError::Syntax)?;
    let obj = value.as_object().ok_or(ProfileJsonError::NotAProfile(
        "the top level is not a JSON object",
    ))?;
    let version = obj
        .get("schema_version")
        .ok_or(ProfileJsonError::NotAProfile(
            "it has no schema_version field",
        ))?;
    let Some(found) = version
        .as_u64()
        .filter(|v| (1..=u64::from(PROFILE_SCHEMA_VERSION)).contains(v))
    else {
        return Err(ProfileJsonError::UnsupportedVersion {
            found: one_line(&version.to_string()),
            supported: PROFILE_SCHEMA_VERSION,
        });
    };
    let mut p: Profile = serde_json::from_value(value).map_err(|e| ProfileJsonError::Invalid {
        version: found as u32,
        message: one_line(&e.to_string()),
    })?;
    p.schema_version = PROFILE_SCHEMA_VERSION;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_back_exactly_as_written() {
        // The `profile_json` fuzz target's find: 1.0807685852101563 in a profile read back
        // as 1.0807685852101565 (serde_json's default float parser is not exact), so a
        // profile written again by `view` differed from the one read.
        let text = include_str!("../../tests/golden/empty/profile.json")
            .replace("\"duration_s\": 0.5", "\"duration_s\": 1.0807685852101563");
        let p = from_json(&text).unwrap();
        assert_eq!(p.meta.duration_s, 1.0807685852101563);
        assert_eq!(to_json(&from_json(&to_json(&p)).unwrap()), to_json(&p));
        assert!(to_json(&p).contains("1.0807685852101563"));
    }
}
