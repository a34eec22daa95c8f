//! Durations on the command line: `500ms`, `10s`, `1.5s`, `2m30s`, `1h30m`, `1d`, read by `humantime`, with our
//! own rules on top (no negatives, no zero, a unit always except for `--wait`'s seconds, at most [`MAX`]) and our own
//! one-line errors.

use std::time::Duration;

/// The longest duration any option accepts: the longest lease leasehold grants (30 days). Anything longer is almost
/// certainly a unit mistake.
pub const MAX: Duration = leasehold::MAX_TTL;

/// The forms shown in errors.
const EXAMPLES: &str = "500ms, 1.5s, 2m30s, 1h30m or 1d";

/// Parses a positive duration of at most [`MAX`]: one or more numbers (integer or decimal), each followed by a unit
/// (`ms`, `s`, `m`, `h`, `d`, and the other units of `humantime`, such as `us`, `min`, `w`).
///
/// # Errors
///
/// A one-line reason: empty, negative, zero, a missing or unknown unit, not a duration, or above [`MAX`].
pub fn parse(text: &str) -> Result<Duration, String> {
    let duration = read(text)?;
    if duration.is_zero() {
        return Err("durations must be above zero".to_owned());
    }
    Ok(duration)
}

/// As [`parse`], but zero is accepted, also as a bare `0` (`0`, `0s`, `0ms`): `--wait 0` tries once, as
/// `flock -w 0` does.
///
/// # Errors
///
/// As [`parse`], zero excepted.
pub fn parse_or_zero(text: &str) -> Result<Duration, String> {
    let number = text.trim();
    if is_bare_number(number) && number.bytes().all(|b| b == b'0' || b == b'.') {
        return Ok(Duration::ZERO);
    }
    read(text)
}

/// `--wait`: as [`parse_or_zero`], and a bare number is seconds (`5`, `0.5`), as `flock -w` and `timeout` read it.
/// The other options keep refusing bare numbers: a lease or a grace period in the wrong unit costs more than a wait.
///
/// # Errors
///
/// As [`parse_or_zero`], a bare number excepted.
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    let number = text.trim();
    if !is_bare_number(number) {
        return parse_or_zero(text);
    }
    let seconds: f64 = format!("0{number}")
        .parse()
        .map_err(|_| format!("{number:?} is not a number of seconds"))?;
    match Duration::try_from_secs_f64(seconds) {
        Ok(wait) if wait <= MAX => Ok(wait),
        _ => Err(format!(
            "{number} seconds is too long; the limit is {}",
            show(MAX)
        )),
    }
}

/// Any duration from zero to [`MAX`], written with units.
fn read(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("a duration is required, such as {EXAMPLES}"));
    }
    if text.starts_with('-') {
        return Err("durations cannot be negative".to_owned());
    }
    if is_bare_number(text) {
        return Err(format!(
            "{text:?} has no unit; write it as {text}s or {text}ms"
        ));
    }
    // humantime wants a digit first; `.5s` was accepted before it read our durations.
    let padded;
    let readable = if text.starts_with('.') {
        padded = format!("0{text}");
        padded.as_str()
    } else {
        text
    };
    let too_long = || format!("{text} is too long; the limit is {}", show(MAX));
    match humantime::parse_duration(readable) {
        Ok(duration) if duration <= MAX => Ok(duration),
        Ok(_) => Err(too_long()),
        // Also a fraction finer than a nanosecond (`1.5ns`), which no option needs.
        Err(humantime::DurationError::NumberOverflow) if text.contains('.') => Err(format!(
            "{text} is out of range; durations go from 1ns to {}",
            show(MAX)
        )),
        Err(humantime::DurationError::NumberOverflow) => Err(too_long()),
        Err(humantime::DurationError::UnknownUnit { unit, .. }) => Err(format!(
            "{unit:?} is not a unit; use ms, s, m, h or d (as in {EXAMPLES})"
        )),
        Err(_) => Err(format!(
            "{text:?} is not a duration; write it as {EXAMPLES}"
        )),
    }
}

/// Digits with at most one decimal point, and at least one digit: a number that lacks its unit.
fn is_bare_number(text: &str) -> bool {
    text.bytes().any(|b| b.is_ascii_digit())
        && text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && text.bytes().filter(|&b| b == b'.').count() <= 1
}

/// A short human form that [`parse`] reads back: `250ms`, `1.5s`, `2m30s`, `1h`, `1d12h`.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let tenths = (ms + 50) / 100;
        return if tenths.is_multiple_of(10) {
            format!("{}s", tenths / 10)
        } else {
            format!("{}.{}s", tenths / 10, tenths % 10)
        };
    }
    let secs = d.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0.25s"), Ok(Duration::from_millis(250)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("720h"), Ok(MAX));
        assert_eq!(parse(" 10s "), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn accepts_days_and_compound_forms() {
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("30d"), Ok(MAX));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("2m30s"), Ok(Duration::from_secs(150)));
        assert_eq!(parse("1m0.5s"), Ok(Duration::from_millis(60_500)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("1d12h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
    }

    #[test]
    fn refuses_zero_negative_unitless_unknown_and_absurd() {
        for bad in [
            "",
            "   ",
            "0",
            "0s",
            "0ms",
            "0.0s",
            "0h0m",
            "-5s",
            "-1h30m",
            "5",
            "1.5",
            "5x",
            "5S",
            "s",
            "1.2.3s",
            ".s",
            "5.s",
            "1h-5m",
            "+5s",
            "721h",
            "31d",
            "1M",
            "99999999999999999999999999h",
            "1.5ns",
            "1e3s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(parse("0h0m").unwrap_err(), "durations must be above zero");
        assert_eq!(parse("-5s").unwrap_err(), "durations cannot be negative");
        assert_eq!(
            parse("5").unwrap_err(),
            "\"5\" has no unit; write it as 5s or 5ms"
        );
        assert!(parse("1.5").unwrap_err().contains("no unit"));
        assert!(parse("5x").unwrap_err().starts_with("\"x\" is not a unit"));
        assert!(parse("1h5fortnights")
            .unwrap_err()
            .starts_with("\"fortnights\" is not a unit"));
        assert!(parse("soon").unwrap_err().contains("is not a duration"));
        assert!(parse("1h-5m").unwrap_err().contains("is not a duration"));
        assert_eq!(
            parse("721h").unwrap_err(),
            "721h is too long; the limit is 30d"
        );
        assert_eq!(
            parse("31d").unwrap_err(),
            "31d is too long; the limit is 30d"
        );
        assert!(parse("99999999999999999999999999h")
            .unwrap_err()
            .contains("the limit is 30d"));
        assert!(parse("1.5ns").unwrap_err().contains("out of range"));
        for bad in ["", "-5s", "5", "5x", "soon", "721h", "1.5ns"] {
            assert!(!parse(bad).unwrap_err().contains('\n'), "{bad:?}");
        }
    }

    #[test]
    fn zero_is_accepted_only_where_asked_for() {
        for zero in ["0", "0.0", "0s", "0ms", "0.0s", " 0 ", "0h0m"] {
            assert_eq!(parse_or_zero(zero), Ok(Duration::ZERO), "{zero:?}");
        }
        assert_eq!(parse_or_zero("1m30s"), Ok(Duration::from_secs(90)));
        for bad in ["", "5", "-0s", "-1s", "31d", "x"] {
            assert!(parse_or_zero(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn wait_reads_a_bare_number_as_seconds() {
        assert_eq!(parse_wait("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_wait("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_wait(".5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_wait("5."), Ok(Duration::from_secs(5)));
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_wait("2592000"), Ok(MAX));
        for bad in ["", "-5", "2592001", "1.2.3", "5x", "1e3"] {
            assert!(parse_wait(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(
            parse_or_zero("5").is_err(),
            "only --wait reads bare numbers"
        );
    }

    #[test]
    fn shows_short_forms_that_parse_reads_back() {
        assert_eq!(show(Duration::from_millis(250)), "250ms");
        assert_eq!(show(Duration::from_millis(1500)), "1.5s");
        assert_eq!(show(Duration::from_secs(27)), "27s");
        assert_eq!(show(Duration::from_secs(150)), "2m30s");
        assert_eq!(show(Duration::from_secs(3600)), "1h");
        assert_eq!(show(Duration::from_secs(5_400)), "1h30m");
        assert_eq!(show(Duration::from_secs(86_400)), "1d");
        assert_eq!(show(Duration::from_secs(129_601)), "1d12h1s");
        assert_eq!(show(MAX), "30d");
        for secs in [1, 59, 61, 3_599, 3_601, 86_399, 90_061, MAX.as_secs()] {
            let d = Duration::from_secs(secs);
            assert_eq!(parse(&show(d)), Ok(d), "{secs}");
        }
    }
}
