//! Fencing tokens and owner tokens.

use std::fmt;

/// A fencing token: a number that strictly increases with every grant of one lock.
///
/// Hand it to the resource the lock protects and have the resource reject any write that carries a fence lower
/// than the highest it has seen: that is what keeps a paused or partitioned former holder from doing harm after
/// its lease ran out (see the [crate docs](crate#fencing)).
///
/// Fences are compared per lock name only; they are not consecutive (see the [crate docs](crate#fences-survive-restarts)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// The value a release leaves in the lock key, followed by a client id, while the lock is kept for the waiting
/// client it woke.
pub(crate) const RESERVED_PREFIX: &str = "dl1:rsv:";

/// A fresh owner token: [`TOKEN_PREFIX`] and 128 bits from the OS CSPRNG in hex. One per grant.
pub(crate) fn new_token() -> Result<String, crate::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| crate::Error::Entropy(e.to_string()))?;
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 32);
    token.push_str(TOKEN_PREFIX);
    for b in bytes {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        token.push(HEX[usize::from(b >> 4)] as char);
        token.push(HEX[usize::from(b & 0xf)] as char);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_hex_and_distinct() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 32);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert!(a[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn fences_order_by_value() {
        assert!(Fence::new(2) > Fence::new(1));
        assert_eq!(Fence::new(7).to_string(), "7");
        assert_eq!(u64::from(Fence::new(9)), 9);
    }
}
