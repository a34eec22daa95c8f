//! The node layout: which child a grant creates under its lock's node, and what every child says about its kind and
//! its place in the queue.

use std::num::NonZeroU32;

use crate::backend::admission::Kind;

/// Marks a node as leasehold's, in this layout's version.
const MARK: &str = "lh1-";

/// After [`MARK`]: a reader's node.
const SHARED: &str = "s-";

/// The digits ZooKeeper appends to a sequential node's name (`%010d` of a signed 32-bit counter).
const SEQUENCE_LEN: usize = 10;

/// The name a grant's node is created with; ZooKeeper appends the sequence. Every kind ends its name in `__lock__`,
/// the marker kazoo's `Lock`, `ReadLock` and `WriteLock` all wait for (kazoo reads nothing else of a name: see
/// `mod.rs`), and says its kind in the part before, which only leasehold reads:
///
/// - exclusive: `lh1-<grant>__lock__`, as kazoo's `Lock` and `WriteLock` write;
/// - shared: `lh1-s-<grant>__lock__`;
/// - one of N permits: `lh1-p<N>-<grant>__lock__`.
///
/// `<grant>` is 16 hex digits, random per acquisition: the protection that lets a create whose answer was lost find
/// its node again.
pub(crate) fn node_prefix(kind: Kind, grant: u64) -> String {
    match kind {
        Kind::Exclusive => format!("{MARK}{grant:016x}__lock__"),
        Kind::Shared => format!("{MARK}{SHARED}{grant:016x}__lock__"),
        Kind::Permits(n) => format!("{MARK}p{n}-{grant:016x}__lock__"),
    }
}

/// A child of a lock's node that takes part in its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    /// The child's name.
    pub(crate) name: String,
    /// Its place in the queue.
    pub(crate) sequence: i32,
    /// The rule it follows, as every client reads it from the name.
    pub(crate) kind: Kind,
}

/// What the child `name` is, when it takes part in the queue: a sequential node of leasehold's, kazoo's (`__lock__`,
/// `__rlock__`) or Curator's (`-lock-`, `__WRIT__`, `__READ__`) layout. Other children (a lock nested under this
/// lock's name, say) are not contenders.
pub(crate) fn contender(name: &str) -> Option<Contender> {
    let split = name.len().checked_sub(SEQUENCE_LEN)?;
    let (head, digits) = (name.get(..split)?, name.get(split..)?);
    let sequence: i32 = digits.parse().ok()?;
    let kind = if let Some(head) = head.strip_suffix("__lock__") {
        leasehold_kind(head).unwrap_or(Kind::Exclusive)
    } else if head.ends_with("-lock-") || head.ends_with("__WRIT__") {
        Kind::Exclusive
    } else if head.ends_with("__rlock__") || head.ends_with("__READ__") {
        Kind::Shared
    } else {
        return None;
    };
    Some(Contender {
        name: name.to_owned(),
        sequence,
        kind,
    })
}

/// The kind a leasehold node's name says before its marker (`lh1-s-…`, `lh1-p<N>-…`); `None` for an exclusive
/// node's, and for a name leasehold did not write.
fn leasehold_kind(head: &str) -> Option<Kind> {
    let rest = head.strip_prefix(MARK)?;
    if rest.starts_with(SHARED) {
        return Some(Kind::Shared);
    }
    rest.strip_prefix('p')
        .and_then(|r| r.split_once('-'))
        .and_then(|(n, _)| n.parse::<NonZeroU32>().ok())
        .map(Kind::Permits)
}

/// The contenders among `children`, in queue order.
pub(crate) fn queue(children: &[String]) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children.iter().filter_map(|c| contender(c)).collect();
    queue.sort_by_key(|c| c.sequence);
    queue
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(n: u32) -> Kind {
        Kind::Permits(NonZeroU32::new(n).unwrap())
    }

    #[test]
    fn each_kind_names_its_node_so_that_every_client_reads_it_back() {
        for kind in [Kind::Exclusive, Kind::Shared, permits(3)] {
            let name = format!("{}0000000042", node_prefix(kind, 0xab));
            let read = contender(&name).unwrap();
            assert_eq!((read.kind, read.sequence), (kind, 42), "{name}");
        }
        assert_eq!(
            node_prefix(Kind::Exclusive, 0xab),
            "lh1-00000000000000ab__lock__"
        );
    }

    #[test]
    fn every_kind_carries_the_marker_kazoos_locks_wait_for() {
        // kazoo's `Lock`, `ReadLock` and `WriteLock` count a child when `__lock__` is just before its sequence.
        for kind in [Kind::Exclusive, Kind::Shared, permits(1), permits(3)] {
            assert!(node_prefix(kind, 0xab).ends_with("__lock__"), "{kind:?}");
        }
        assert_eq!(
            node_prefix(Kind::Shared, 0xab),
            "lh1-s-00000000000000ab__lock__"
        );
        assert_eq!(
            node_prefix(permits(1), 0xab),
            "lh1-p1-00000000000000ab__lock__"
        );
    }

    #[test]
    fn kazoo_and_curator_nodes_take_part_and_others_do_not() {
        let read = |name: &str| contender(name).map(|c| (c.kind, c.sequence));
        // kazoo's Lock, ReadLock; Curator's mutex and read-write lock.
        assert_eq!(read("3f2a9c__lock__0000000007"), Some((Kind::Exclusive, 7)));
        assert_eq!(read("3f2a9c__rlock__0000000008"), Some((Kind::Shared, 8)));
        assert_eq!(read("_c_9b1e-lock-0000000009"), Some((Kind::Exclusive, 9)));
        assert_eq!(
            read("_c_9b1e-__WRIT__0000000010"),
            Some((Kind::Exclusive, 10))
        );
        assert_eq!(read("_c_9b1e-__READ__0000000011"), Some((Kind::Shared, 11)));
        // A kind leasehold cannot read holds others back as a writer would.
        assert_eq!(
            read("lh1-px-00000000000000ab__lock__0000000012"),
            Some((Kind::Exclusive, 12))
        );
        // A nested lock's node, a node without a sequence, a short name.
        for other in ["sub", "__lock__", "lock", "x__lock__00000000a1"] {
            assert_eq!(read(other), None, "{other}");
        }
    }

    #[test]
    fn the_queue_is_in_sequence_order() {
        let children: Vec<String> = [
            "b__lock__0000000003",
            "nested",
            "a__rlock__0000000001",
            "c__lock__0000000002",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let order: Vec<i32> = queue(&children).iter().map(|c| c.sequence).collect();
        assert_eq!(order, [1, 2, 3]);
    }
}
