//! Durations, sizes, digests and bounded text as the command line, the chart and `Plugin` resources write
//! them. A leaf: it imports nothing of the crate.

use std::time::Duration;

/// A duration or a size that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not a number followed by a unit.
    #[error("`{0}` is not a duration such as 500ms, 2s or 1m")]
    NotADuration(String),
    /// A duration in a unit other than ms, s or m.
    #[error("`{0}`: unit must be ms, s or m")]
    DurationUnit(String),
    /// A duration no `Duration` holds (negative, or too long).
    #[error("`{text}`: {reason}")]
    OutOfRange {
        text: String,
        /// Why it is out of range.
        reason: String,
    },
    /// Not a number followed by a unit.
    #[error("`{0}` is not a size such as 64Mi")]
    NotASize(String),
    /// A size in a unit other than Ki, Mi or Gi.
    #[error("`{0}`: unit must be Ki, Mi or Gi")]
    SizeUnit(String),
    /// A size of more bytes than this machine counts.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses `500ms`, `2s`, `1m` or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    let s = s.trim();
    let (number, unit) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len()),
    );
    let n: f64 = number
        .parse()
        .map_err(|_| Error::NotADuration(s.to_owned()))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(Error::DurationUnit(s.to_owned())),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| Error::OutOfRange {
        text: s.to_owned(),
        reason: e.to_string(),
    })
}

/// Parses `64Mi`, `1Gi`, `512Ki`, `4MiB` or a number of bytes.
pub fn parse_bytes(s: &str) -> Result<usize, Error> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = number.parse().map_err(|_| Error::NotASize(s.to_owned()))?;
    let shift = match unit.trim_end_matches('B') {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(Error::SizeUnit(s.to_owned())),
    };
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| Error::TooLarge(s.to_owned()))
}

/// `bytes` in MiB, as `--render-memory` and the chart write them (`64Mi`), or in bytes when
/// not a whole number of MiB.
pub fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// `bytes` in lowercase hex, as a sha256 digest is written.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The sha256 of `bytes`, in lowercase hex (what the compile cache knows a component by; an
/// OCI digest is this after `sha256:`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(bytes))
}

/// `text` cut to its first `max` bytes (at a character boundary) and a note saying how much was
/// left out, so that a guest cannot put megabytes into a status condition or a log line.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("… ({} more bytes)", total - end));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse_as_the_flags_write_them() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("soon").unwrap_err(),
            Error::NotADuration("soon".into())
        );
        assert_eq!(
            parse_duration("2h").unwrap_err(),
            Error::DurationUnit("2h".into())
        );
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert_eq!(
            parse_bytes("1Pi").unwrap_err(),
            Error::SizeUnit("1Pi".into())
        );
        assert!(matches!(
            parse_bytes(&format!("{}Gi", usize::MAX)),
            Err(Error::TooLarge(_))
        ));
    }

    #[test]
    fn sizes_are_written_in_mib_when_whole() {
        assert_eq!(mib(160 << 20), "160Mi");
        assert_eq!(mib(1000), "1000 bytes");
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }

    #[test]
    fn a_short_text_is_kept_whole() {
        assert_eq!(bounded("short".to_owned(), 5), "short");
        assert_eq!(bounded(String::new(), 0), "");
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary_with_a_note() {
        assert_eq!(bounded("abcdef".to_owned(), 4), "abcd… (2 more bytes)");
        // `é` is two bytes: a cut through it keeps the whole characters before it.
        assert_eq!(bounded("aéb".to_owned(), 2), "a… (3 more bytes)");
        let cut = bounded("x".repeat(1 << 20), crate::error::MAX_ERROR_MESSAGE);
        assert!(cut.starts_with(&"x".repeat(crate::error::MAX_ERROR_MESSAGE)));
        assert!(cut.ends_with(&format!(
            "… ({} more bytes)",
            (1 << 20) - crate::error::MAX_ERROR_MESSAGE
        )));
        assert!(cut.len() < crate::error::MAX_ERROR_MESSAGE + 32);
    }
}
