//! Hashing for maps keyed by numbers leasehold chose itself: the random bits of an owner token (wake-up routes) and
//! sequential lease ids (the keeper). The standard SipHash guards a map against keys an attacker picks; these keys
//! are never picked by anyone else, and SipHash cost about 900 instructions per acquire-release cycle on these maps
//! (`scripts/profile-client.sh`), against a multiplication here.

use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by such numbers.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of the key's bits: spreads sequential ids over the whole hash, whose top bits the map uses too.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for integer keys; correct for anything else.
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(SPREAD);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::IdMap;

    #[test]
    fn sequential_and_random_ids_are_found_again() {
        let mut leases: IdMap<u64, u64> = IdMap::default();
        for id in 0..10_000u64 {
            leases.insert(id, id * 2);
        }
        assert!((0..10_000u64).all(|id| leases.get(&id) == Some(&(id * 2))));
        assert_eq!(leases.get(&10_000), None);
        let mut routes: IdMap<u128, usize> = IdMap::default();
        let ids: Vec<u128> = (0..1000u128).map(|i| i << 64 | (i * 7919)).collect();
        for (i, id) in ids.iter().enumerate() {
            routes.insert(*id, i);
        }
        assert!(ids
            .iter()
            .enumerate()
            .all(|(i, id)| routes.get(id) == Some(&i)));
    }
}
