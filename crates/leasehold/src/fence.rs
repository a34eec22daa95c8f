//! Fencing tokens and owner tokens.

use std::fmt;

/// A fencing token: a number that strictly increases with every grant of one lock.
///
/// Hand it to the resource the lock protects and have the resource reject any write that carries a fence lower
/// than the highest it has seen: that is what keeps a paused or partitioned former holder from doing harm after
/// its lease ran out (see the [crate docs](crate#fencing)).
///
/// Fences are compared per lock name only; they are not consecutive (see the [crate docs](crate#fences-survive-restarts)).
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Fence(u64);

impl Fence {
    /// Wraps a raw value, e.g. one read back from a store.
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The fence as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Fence> for u64 {
    fn from(fence: Fence) -> u64 {
        fence.0
    }
}

/// Every value leasehold writes into a lock key starts with this, so that a key some other program wrote is
/// recognised and left alone.
pub(crate) const TOKEN_PREFIX: &str = "dl1:";

/// Length of a token without its description: the prefix and 32 hex digits.
const TOKEN_LEN: usize = TOKEN_PREFIX.len() + 32;

/// A fresh owner token: [`TOKEN_PREFIX`] and 128 bits from the OS CSPRNG in hex, then, when the holder described
/// itself, a space and the description. One per grant. The scripts compare tokens whole, so the description rides
/// along in the lock's value at no extra Redis cost and disappears with the grant.
pub(crate) fn new_token(description: Option<&str>) -> Result<String, crate::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| crate::Error::Entropy(e.to_string()))?;
    let mut token = String::with_capacity(TOKEN_LEN + description.map_or(0, |d| d.len() + 1));
    token.push_str(TOKEN_PREFIX);
    for b in bytes {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        token.push(HEX[usize::from(b >> 4)] as char);
        token.push(HEX[usize::from(b & 0xf)] as char);
    }
    if let Some(description) = description {
        token.push(' ');
        token.push_str(description);
    }
    Ok(token)
}

/// `hold` with its token's 128 random bits drawn again (its tag and description kept): a new identity for another
/// attempt of the same acquisition, whose earlier attempt's entry may still be on its way to deletion.
#[cfg(session_stores)]
pub(crate) fn redrawn(hold: &str) -> Result<String, crate::Error> {
    let start = hold.find(TOKEN_PREFIX).unwrap_or(0);
    let token = &hold[start..];
    let description = description_of(token);
    let fresh = new_token(description)?;
    Ok(format!("{}{fresh}", &hold[..start]))
}

/// The owner token inside `hold`: a hold is the token itself (a mutex) or `"<tag> <token>"` (a queued kind's entry
/// in its set of holds; tags never contain the token prefix).
pub(crate) fn token_of(hold: &str) -> &str {
    if hold.starts_with(TOKEN_PREFIX) {
        return hold; // a plain token: no search (it was a tenth of `token_id`'s cost)
    }
    hold.find(TOKEN_PREFIX).map_or(hold, |start| &hold[start..])
}

/// The 128 random bits that identify the token of `hold` (its hex digits), or `None` for a string that holds no token.
pub(crate) fn token_id(hold: &str) -> Option<u128> {
    let hex = token_of(hold)
        .strip_prefix(TOKEN_PREFIX)?
        .get(..TOKEN_LEN - TOKEN_PREFIX.len())?;
    // By hand: `u128::from_str_radix` cost 600 instructions here, on the path of every acquire.
    hex.bytes().try_fold(0u128, |id, digit| {
        let value = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            b'A'..=b'F' => digit - b'A' + 10,
            _ => return None,
        };
        Some(id << 4 | u128::from(value))
    })
}

/// Between a hold's description and the value an election's leader publishes with it (`dl1:… DESCRIPTION\x1fVALUE`):
/// a control character, which neither may contain, and not the newline that ends a token in a Redis wake-up message.
pub(crate) const VALUE_SEPARATOR: char = '\u{1f}';

/// The text after a token's 32 hex digits and its space: the description, and the value after [`VALUE_SEPARATOR`].
fn said(token: &str) -> Option<&str> {
    token
        .get(TOKEN_LEN..)
        .and_then(|rest| rest.strip_prefix(' '))
}

/// The holder's description carried by `token`, if any.
pub(crate) fn description_of(token: &str) -> Option<&str> {
    said(token)
        .map(|said| said.split_once(VALUE_SEPARATOR).map_or(said, |(d, _)| d))
        .filter(|d| !d.is_empty())
}

/// The value an election's leader published with `token` ([`crate::Election::campaign`]), if any.
pub(crate) fn value_of(token: &str) -> Option<&str> {
    published(token).map(|(value, _)| value)
}

/// The number of the term `token`'s holder leads, once its campaign counted it ([`crate::Leadership::term`]).
#[cfg(any(session_stores, test))]
pub(crate) fn term_of(token: &str) -> Option<u64> {
    published(token).and_then(|(_, term)| term)
}

/// What an election's leader published with `token`: its value, and the term's number after it (`VALUE\x1fTERM`,
/// once the campaign counted the term).
fn published(token: &str) -> Option<(&str, Option<u64>)> {
    said(token)
        .and_then(|said| said.split_once(VALUE_SEPARATOR))
        .map(|(_, published)| value_and_term(published))
}

/// `VALUE` or `VALUE\x1fTERM` split: what a hold carries after its description, and what a Redis value key carries
/// after its fence.
pub(crate) fn value_and_term(published: &str) -> (&str, Option<u64>) {
    match published.split_once(VALUE_SEPARATOR) {
        Some((value, term)) => (value, term.parse().ok()),
        None => (published, None),
    }
}

/// `value` with the number of its term after it, as a leader that counted its term publishes it.
pub(crate) fn with_term(value: &str, term: u64) -> String {
    format!("{value}{VALUE_SEPARATOR}{term}")
}

/// The longest value an election's leader may publish, in bytes.
pub const MAX_VALUE_LEN: usize = 1024;

/// Checks a value an election's leader publishes: 1 to [`MAX_VALUE_LEN`] bytes without control characters.
pub(crate) fn check_value(value: &str) -> Result<(), crate::InvalidArgument> {
    match text_rule(value, MAX_VALUE_LEN, "longer than 1024 bytes") {
        None => Ok(()),
        Some(why) => Err(crate::InvalidArgument::BadValue {
            value: value.chars().take(64).collect(),
            why,
        }),
    }
}

/// The rule a description or a value breaks, if any: at most `max` bytes (`too_long` says it), no control characters,
/// not blank.
fn text_rule(text: &str, max: usize, too_long: &'static str) -> Option<&'static str> {
    if text.len() > max {
        Some(too_long)
    } else if text.chars().any(char::is_control) {
        Some("it contains a control character (a newline, a tab, ...)")
    } else if text.trim().is_empty() {
        Some("it is empty")
    } else {
        None
    }
}

/// What a grant's token carries after its hex digits: `description`, and `value` after [`VALUE_SEPARATOR`].
pub(crate) fn hold_text(description: Option<&str>, value: &str) -> String {
    format!("{}{VALUE_SEPARATOR}{value}", description.unwrap_or(""))
}

/// `hold` (a stored hold: an optional kind tag, a token, its description and value) with `value` in place of its
/// value: the same token and description.
#[cfg(any(session_stores, test))]
pub(crate) fn with_value(hold: &str, value: &str) -> String {
    let start = hold.find(TOKEN_PREFIX).unwrap_or(0);
    let token = &hold[start..];
    let id = token.get(..TOKEN_LEN).unwrap_or(token);
    format!(
        "{}{id} {}",
        &hold[..start],
        hold_text(description_of(token), value)
    )
}

/// Checks what [`hold_text`] made: the description (when not empty) and the value, each by its own rule.
pub(crate) fn check_hold_text(text: &str) -> Result<(), crate::InvalidArgument> {
    match text.split_once(VALUE_SEPARATOR) {
        Some((description, value)) => {
            if !description.is_empty() {
                check_description(description)?;
            }
            check_value(value)
        }
        None => check_description(text),
    }
}

/// The longest holder description accepted, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 256;

/// Checks a holder description: at most [`MAX_DESCRIPTION_LEN`] bytes, no control characters (it is printed on one
/// line by `leasehold status`).
pub(crate) fn check_description(description: &str) -> Result<(), crate::InvalidArgument> {
    match text_rule(description, MAX_DESCRIPTION_LEN, "longer than 256 bytes") {
        None => Ok(()),
        Some(why) => Err(crate::InvalidArgument::BadDescription {
            description: description.chars().take(64).collect(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(session_stores)]
    #[test]
    fn a_redrawn_hold_keeps_its_tag_and_description() {
        let hold = format!("r {}", new_token(Some("host=a pid=1")).unwrap());
        let again = redrawn(&hold).unwrap();
        assert!(again.starts_with("r dl1:"));
        assert_eq!(description_of(token_of(&again)), Some("host=a pid=1"));
        assert_ne!(token_id(&again), token_id(&hold));
        let bare = new_token(None).unwrap();
        let again = redrawn(&bare).unwrap();
        assert!(again.starts_with(TOKEN_PREFIX) && again != bare);
        assert_eq!(description_of(&again), None);
    }

    #[test]
    fn tokens_are_prefixed_hex_and_distinct() {
        let a = new_token(None).unwrap();
        let b = new_token(None).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 32);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert!(a[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn a_description_rides_after_the_random_part() {
        let plain = new_token(None).unwrap();
        assert_eq!(description_of(&plain), None);
        let described = new_token(Some("host=a pid=1")).unwrap();
        assert_eq!(described.len(), TOKEN_LEN + 1 + "host=a pid=1".len());
        assert_eq!(token_id(&described), token_id(&described[..TOKEN_LEN]));
        assert!(token_id(&described).is_some());
        assert_eq!(token_id("dl1:zz"), None);
        assert_eq!(
            token_id("dl1:0123456789abcdefFEDCBA9876543210"),
            Some(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210)
        );
        assert_eq!(token_id("dl1:0123456789abcdefFEDCBA987654321g"), None);
        assert_eq!(token_id("dl1:0123456789abcdef"), None);
        assert_eq!(description_of(&described), Some("host=a pid=1"));
        assert!(check_description("nightly backup on web-1").is_ok());
        assert!(check_description("a\nb").is_err());
        assert!(check_description(" ").is_err());
        assert!(check_description(&"x".repeat(MAX_DESCRIPTION_LEN + 1)).is_err());
    }

    #[test]
    fn fences_order_by_value() {
        assert!(Fence::new(2) > Fence::new(1));
        assert_eq!(Fence::new(7).to_string(), "7");
        assert_eq!(u64::from(Fence::new(9)), 9);
    }

    #[test]
    fn an_elections_value_rides_after_the_description() {
        let token = new_token(Some(&hold_text(Some("host=a pid=1"), "10.0.0.1:80"))).unwrap();
        assert_eq!(description_of(&token), Some("host=a pid=1"));
        assert_eq!(value_of(&token), Some("10.0.0.1:80"));
        let bare = new_token(Some(&hold_text(None, "v"))).unwrap();
        assert_eq!((description_of(&bare), value_of(&bare)), (None, Some("v")));
        assert_eq!(value_of(&new_token(Some("host=a")).unwrap()), None);
        // A new value keeps the token, its kind's tag and the description.
        let tagged = format!("x {token}");
        let again = with_value(&tagged, "10.0.0.2:80");
        assert_eq!(token_id(&again), token_id(&token));
        assert!(again.starts_with("x dl1:"));
        assert_eq!(description_of(token_of(&again)), Some("host=a pid=1"));
        assert_eq!(value_of(token_of(&again)), Some("10.0.0.2:80"));
        assert_eq!(term_of(token_of(&again)), None);
        // A counted term rides after the value.
        let counted = with_value(&tagged, &with_term("10.0.0.2:80", 17));
        assert_eq!(value_of(token_of(&counted)), Some("10.0.0.2:80"));
        assert_eq!(term_of(token_of(&counted)), Some(17));
        assert_eq!(value_and_term("v\u{1f}3"), ("v", Some(3)));
        assert_eq!(value_and_term("v"), ("v", None));
        // Each part by its own rule; a bare description may not smuggle a value in.
        assert!(check_hold_text(&hold_text(None, "v")).is_ok());
        assert!(check_hold_text(&hold_text(Some("a\nb"), "v")).is_err());
        assert!(check_hold_text(&hold_text(None, "")).is_err());
        assert!(check_description(&hold_text(Some("d"), "v")).is_err());
    }
}
