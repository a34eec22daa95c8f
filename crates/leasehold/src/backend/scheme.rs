//! The URL schemes leasehold knows, which cargo feature each needs, and the answer to a URL whose scheme is none of
//! them: every scheme this build takes, those a feature would add, and the nearest to what was written.

use crate::error::InvalidArgument;

/// Every scheme, with the features it needs (none for Redis without TLS).
pub(crate) const SCHEMES: &[(&str, &[&str])] = &[
    ("redis", &[]),
    ("rediss", &["tls"]),
    ("unix", &[]),
    ("redis+unix", &[]),
    ("redis+cluster", &[]),
    ("rediss+cluster", &["tls"]),
    ("redis+sentinel", &[]),
    ("rediss+sentinel", &["tls"]),
    ("etcd", &["etcd"]),
    ("etcds", &["etcd", "tls"]),
    ("zk", &["zookeeper"]),
    ("postgres", &["postgres"]),
    ("postgresql", &["postgres"]),
    ("mysql", &["mysql"]),
    ("mariadb", &["mysql"]),
];

/// Schemes other programs use for these stores, and the one leasehold takes instead: `http://host:2379` is how
/// `etcdctl --endpoints` names an etcd member.
const OTHER_NAMES: &[(&str, &str)] = &[
    ("http", "etcd"),
    ("https", "etcds"),
    ("zookeeper", "zk"),
    ("pg", "postgres"),
];

/// The features a scheme may need, and whether this build has each.
const FEATURES: &[(&str, bool)] = &[
    ("tls", cfg!(feature = "tls")),
    ("etcd", cfg!(feature = "etcd")),
    ("zookeeper", cfg!(feature = "zookeeper")),
    ("postgres", cfg!(feature = "postgres")),
    ("mysql", cfg!(feature = "mysql")),
];

/// Whether this build has `feature`.
fn compiled(feature: &str) -> bool {
    FEATURES.iter().any(|(name, on)| *name == feature && *on)
}

/// An error when `url` has a scheme (`name://`) that leasehold does not know; `Ok` for a known scheme or a URL
/// without one (the Redis parser says what is wrong with it).
pub(crate) fn check(url: &str) -> Result<(), InvalidArgument> {
    let Some((scheme, _)) = url.trim().split_once("://") else {
        return Ok(());
    };
    let lower = scheme.to_ascii_lowercase();
    if SCHEMES.iter().any(|(known, _)| *known == lower) {
        return Ok(());
    }
    Err(InvalidArgument::UnknownScheme {
        scheme: scheme.chars().take(32).collect(),
        nearest: nearest(&lower),
        known: known(),
    })
}

/// The scheme nearest to `scheme`: the one other programs' name stands for, else the closest by edit distance (at
/// most 2 edits, and fewer than the scheme has letters).
fn nearest(scheme: &str) -> Option<&'static str> {
    if let Some((_, ours)) = OTHER_NAMES.iter().find(|(other, _)| *other == scheme) {
        return Some(ours);
    }
    SCHEMES
        .iter()
        .map(|(known, _)| (edit_distance(scheme, known), *known))
        .filter(|(distance, _)| *distance <= 2 && *distance < scheme.len())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// The schemes this build takes, then those a feature would add: `this build takes redis://, …; the `etcd` feature
/// adds etcd://, …`.
fn known() -> String {
    let mut taken = Vec::new();
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for (scheme, features) in SCHEMES {
        let needs: Vec<&str> = features.iter().copied().filter(|f| !compiled(f)).collect();
        if needs.is_empty() {
            taken.push(format!("{scheme}://"));
            continue;
        }
        let features = needs
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(" and ");
        match missing.iter_mut().find(|(f, _)| *f == features) {
            Some((_, schemes)) => schemes.push(scheme),
            None => missing.push((features, vec![scheme])),
        }
    }
    let mut text = format!("this build takes {}", taken.join(", "));
    for (features, schemes) in missing {
        let schemes: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        let words = if features.contains(" and ") {
            "features add"
        } else {
            "feature adds"
        };
        text.push_str(&format!(
            "; leasehold's {features} {words} {}",
            schemes.join(", ")
        ));
    }
    text
}

/// The Levenshtein distance between `a` and `b`, in bytes (schemes are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_scheme_is_answered_with_the_nearest_known_one() {
        let nearest_of = |url: &str| match check(url) {
            Err(InvalidArgument::UnknownScheme { nearest, .. }) => nearest,
            other => panic!("{url}: {other:?}"),
        };
        assert_eq!(nearest_of("postgress://app@db/x"), Some("postgres"));
        assert_eq!(nearest_of("http://127.0.0.1:2379"), Some("etcd"));
        assert_eq!(nearest_of("HTTPS://127.0.0.1:2379"), Some("etcds"));
        assert_eq!(nearest_of("msql://h/db"), Some("mysql"));
        assert_eq!(nearest_of("redis-cluster://h:1,h:2"), Some("redis+cluster"));
        assert_eq!(nearest_of("ftp://h"), None);
        for url in [
            "redis://h",
            "REDIS://h",
            "zk://h:2181",
            "mariadb://h/db",
            "localhost:6379",
        ] {
            assert!(check(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn every_scheme_is_listed_as_taken_or_with_the_feature_it_needs() {
        let text = known();
        let (taken, rest) = text.split_once(';').unwrap_or((&text, ""));
        for (scheme, features) in SCHEMES {
            let form = format!(" {scheme}://");
            let missing: Vec<&&str> = features.iter().filter(|f| !compiled(f)).collect();
            if missing.is_empty() {
                assert!(taken.contains(&form), "{scheme}: {text}");
            } else {
                assert!(
                    !taken.contains(&form) && rest.contains(&form),
                    "{scheme}: {text}"
                );
                for feature in missing {
                    assert!(rest.contains(&format!("`{feature}`")), "{scheme}: {text}");
                }
            }
        }
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("postgress", "postgres"), 1);
        assert_eq!(edit_distance("", "zk"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
