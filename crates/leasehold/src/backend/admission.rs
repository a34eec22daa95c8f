//! The kinds as admission rules over one queue, for the stores that keep a queue of their own (etcd's keys ordered by
//! create revision, ZooKeeper's sequential nodes): every grant is an entry, and whether it holds the lock depends
//! only on its kind and the kinds of the entries ahead of it. Each store reads the kinds from its entries' names and
//! watches what the rule names; the rule itself is here, once.

use std::num::NonZeroU32;

/// What a grant admits, as a rule over the entries ahead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
// Public for the etcd recipe's own tests (`leasehold::__etcd`).
#[cfg_attr(not(feature = "etcd"), allow(unreachable_pub))]
pub enum Kind {
    /// A mutex, or a writer: admitted when no entry is ahead.
    Exclusive,
    /// A reader: admitted when every entry ahead is a reader.
    Shared,
    /// One of `n` permits: admitted when every entry ahead is a permit and fewer than `n` are.
    Permits(NonZeroU32),
}

/// The answer of the admission rule.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted.
    Granted,
    /// Not yet: wait until the entry ahead at this index is gone, then look again.
    WaitFor(usize),
    /// Not yet: wait until any entry ahead is gone, then look again.
    WaitForAny,
    /// Never, as asked: a permit request whose count differs from the count of a permit entry ahead (this one's).
    /// The request is refused, as Redis refuses it ([`Error::WrongPermits`](crate::Error::WrongPermits)).
    WrongPermits(NonZeroU32),
}

/// Applies `kind`'s rule to the kinds of the entries ahead of a waiter (`ahead`, oldest first).
///
/// Exclusive and shared waiters name one entry to watch (the one just ahead, the last writer ahead), so a release
/// wakes one waiter, or the readers behind one writer, and never a herd. A permit waiter watches them all: which of
/// the entries ahead goes first is unknown, and any one of them going may admit it.
///
/// A semaphore's count is the same for everyone, as on Redis: a permit request behind a permit entry of another count
/// is refused ([`Admission::WrongPermits`], with the oldest such count). Entries ahead only ever leave, so a waiter
/// that passed this on its first check never meets it later; and two requests that disagree are ordered by the queue,
/// so the later one is refused whatever their timing (tested by `conformance`
/// `kinds::a_semaphore_refuses_a_count_that_disagrees_with_its_holders`).
pub(crate) fn admit(kind: Kind, ahead: &[Kind]) -> Admission {
    match kind {
        Kind::Exclusive => match ahead.len() {
            0 => Admission::Granted,
            len => Admission::WaitFor(len - 1),
        },
        Kind::Shared => match ahead.iter().rposition(|k| *k != Kind::Shared) {
            None => Admission::Granted,
            Some(writer) => Admission::WaitFor(writer),
        },
        Kind::Permits(n) => {
            let other = ahead.iter().find_map(|k| match k {
                Kind::Permits(m) if *m != n => Some(*m),
                _ => None,
            });
            if let Some(stored) = other {
                return Admission::WrongPermits(stored);
            }
            let all_permits = ahead.iter().all(|k| matches!(k, Kind::Permits(_)));
            let fewer = u32::try_from(ahead.len()).is_ok_and(|len| len < n.get());
            if all_permits && fewer {
                Admission::Granted
            } else {
                Admission::WaitForAny
            }
        }
    }
}

/// Whether `kind` is admitted behind the entries `ahead` (oldest first, each with its kind and what its store keeps
/// of it): an enqueue that read the entries ahead in its own round trip answers
/// [`Enqueued::first`](crate::backend::session::Enqueued) with it, so the grant takes no other.
pub(crate) fn admitted<A>(kind: Kind, ahead: &[(Kind, A)]) -> bool {
    let kinds: Vec<Kind> = ahead.iter().map(|(kind, _)| *kind).collect();
    admit(kind, &kinds) == Admission::Granted
}

/// The crate's error for a request of lock `name` as `kind` refused with [`Admission::WrongPermits`]`(stored)`.
pub(crate) fn wrong_permits(name: &str, kind: Kind, stored: u32) -> crate::Error {
    crate::Error::WrongPermits {
        name: name.to_owned(),
        asked: match kind {
            Kind::Permits(n) => u64::from(n.get()),
            Kind::Exclusive | Kind::Shared => 1,
        },
        stored: u64::from(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(n: u32) -> Kind {
        Kind::Permits(NonZeroU32::new(n).unwrap())
    }

    #[test]
    fn exclusive_waits_for_the_entry_just_ahead() {
        assert_eq!(admit(Kind::Exclusive, &[]), Admission::Granted);
        assert_eq!(
            admit(Kind::Exclusive, &[Kind::Shared, Kind::Shared]),
            Admission::WaitFor(1)
        );
    }

    #[test]
    fn readers_wait_only_for_the_last_writer_ahead() {
        assert_eq!(
            admit(Kind::Shared, &[Kind::Shared, Kind::Shared]),
            Admission::Granted
        );
        let mixed = [Kind::Exclusive, Kind::Exclusive, Kind::Shared];
        assert_eq!(admit(Kind::Shared, &mixed), Admission::WaitFor(1));
    }

    #[test]
    fn permits_admit_fewer_than_n_ahead_and_only_permits() {
        assert_eq!(admit(permits(2), &[permits(2)]), Admission::Granted);
        assert_eq!(
            admit(permits(2), &[permits(2), permits(2)]),
            Admission::WaitForAny
        );
        assert_eq!(admit(permits(2), &[Kind::Exclusive]), Admission::WaitForAny);
    }

    #[test]
    fn permits_behind_another_count_are_refused() {
        let two = NonZeroU32::new(2).unwrap();
        assert_eq!(
            admit(permits(3), &[permits(2), permits(2)]),
            Admission::WrongPermits(two)
        );
        assert_eq!(
            admit(permits(1), &[Kind::Exclusive, permits(2)]),
            Admission::WrongPermits(two)
        );
    }
}
