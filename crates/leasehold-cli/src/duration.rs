//! Durations on the command line: `500ms`, `10s`, `1.5s`, `2m`, `1h`.

use std::time::Duration;

/// The longest duration any option accepts: the longest lease leasehold grants (30 days). Anything longer is almost
/// certainly a unit mistake.
pub const MAX: Duration = leasehold::MAX_TTL;

/// Parses a positive duration of at most [`MAX`]: a number (integer or decimal) followed by `ms`, `s`, `m` or `h`.
///
/// # Errors
///
/// A one-line reason: empty, negative, zero, a missing or unknown unit, or above [`MAX`].
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("a duration is required, such as 500ms, 10s, 2m or 1h".to_owned());
    }
    if text.starts_with('-') {
        return Err("durations cannot be negative".to_owned());
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "" => {
            return Err(format!(
                "{text:?} has no unit; write it as {text}s or {text}ms"
            ))
        }
        _ => return Err(format!("{unit:?} is not a unit; use ms, s, m or h")),
    };
    let nanos = scaled(number, unit_nanos).ok_or_else(|| format!("{text:?} is not a number"))?;
    if nanos == 0 {
        return Err("durations must be above zero".to_owned());
    }
    match u64::try_from(nanos) {
        Ok(nanos) if Duration::from_nanos(nanos) <= MAX => Ok(Duration::from_nanos(nanos)),
        _ => Err(format!("{text} is too long; the limit is {}", show(MAX))),
    }
}

/// `number` (digits with at most one decimal point) times `unit_nanos`, rounded down to whole nanoseconds;
/// `None` when it is not such a number. Saturates far above any accepted value.
fn scaled(number: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits_ok(whole) || !digits_ok(fraction) {
        return None;
    }
    if number.ends_with('.') || number.starts_with('.') && fraction.is_empty() {
        return None;
    }
    // More than 20 digits cannot fit anything we accept; cap to keep the arithmetic in range.
    let whole: u128 = if whole.is_empty() {
        0
    } else if whole.len() > 20 {
        u128::from(u64::MAX)
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.saturating_mul(unit_nanos);
    let mut place = unit_nanos;
    for digit in fraction.bytes().take(18) {
        place /= 10;
        nanos = nanos.saturating_add(u128::from(digit - b'0') * place);
    }
    Some(nanos)
}

/// A short human form: `250ms`, `1.5s`, `2m30s`, `1h`.
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
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
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
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("720h"), Ok(MAX));
    }

    #[test]
    fn refuses_zero_negative_unitless_unknown_and_absurd() {
        for bad in [
            "",
            "0s",
            "0ms",
            "0.0s",
            "-5s",
            "5",
            "5x",
            "5d",
            "s",
            "1.2.3s",
            ".s",
            "5.s",
            "721h",
            "99999999999999999999999999h",
            "1 s",
            "1e3s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse("-5s").unwrap_err().contains("negative"));
        assert!(parse("5").unwrap_err().contains("no unit"));
        assert!(parse("721h").unwrap_err().contains("limit"));
    }

    #[test]
    fn shows_short_forms() {
        assert_eq!(show(Duration::from_millis(250)), "250ms");
        assert_eq!(show(Duration::from_millis(1500)), "1.5s");
        assert_eq!(show(Duration::from_secs(27)), "27s");
        assert_eq!(show(Duration::from_secs(150)), "2m30s");
        assert_eq!(show(Duration::from_secs(3600)), "1h");
    }
}
