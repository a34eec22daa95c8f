//! `zk://[user:password@]host[:port][,host[:port]…][/chroot]`: the servers, the digest credentials, the chroot.

use super::ZkError;
pub(crate) use crate::backend::url::redacted;

const SCHEME: &str = "zk://";

/// ZooKeeper's client port, when a server is named without one.
const DEFAULT_PORT: u16 = 2181;

/// What a `zk://` URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// ZooKeeper's connect string without the chroot: `host:port,host:port`.
    pub(crate) servers: String,
    /// Digest credentials, `user:password`, when the URL gives them.
    pub(crate) digest: Option<String>,
    /// The path every lock lives under, `""` for the root; never ends with `/`.
    pub(crate) chroot: String,
}

/// Parses a `zk://` URL; the user name and password may be percent-encoded.
pub(crate) fn parse_url(url: &str) -> Result<Target, ZkError> {
    let invalid = |why| ZkError::InvalidUrl {
        url: redacted(url),
        why,
    };
    let rest = url
        .strip_prefix(SCHEME)
        .ok_or_else(|| invalid("it does not start with zk://"))?;
    let (authority, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if !chroot.is_empty() {
        check_path(chroot).map_err(|_| invalid("the chroot is not a ZooKeeper path"))?;
    }
    let (digest, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => {
            let (name, password) = credentials
                .split_once(':')
                .ok_or_else(|| invalid("credentials are user:password@"))?;
            let decode = crate::backend::url::percent_decoded;
            let name = decode(name).ok_or_else(|| invalid("a bad %-escape in the user name"))?;
            let password =
                decode(password).ok_or_else(|| invalid("a bad %-escape in the password"))?;
            if name.is_empty() {
                return Err(invalid("the user name is empty"));
            }
            (Some(format!("{name}:{password}")), hosts)
        }
        None => (None, authority),
    };
    let mut servers = Vec::new();
    for host in hosts.split(',') {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) => (
                name,
                port.parse::<u16>()
                    .map_err(|_| invalid("a port is not a number from 1 to 65535"))?,
            ),
            None => (host, DEFAULT_PORT),
        };
        if name.is_empty() || port == 0 {
            return Err(invalid("a server is empty, or has port 0"));
        }
        servers.push(format!("{name}:{port}"));
    }
    Ok(Target {
        servers: servers.join(","),
        digest,
        chroot: chroot.to_owned(),
    })
}

/// Whether `path` is a ZooKeeper path leasehold may use: absolute, segments neither empty nor `.` or `..`, and none of
/// the characters ZooKeeper refuses (controls, and the ranges it reserves); the rule broken otherwise.
pub(crate) fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("a ZooKeeper path starts with /");
    };
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err("an empty segment (a leading, trailing or doubled /)");
        }
        if segment == "." || segment == ".." {
            return Err("a segment . or ..");
        }
    }
    let refused = |c: char| {
        c.is_control()
            || ('\u{e000}'..='\u{f8ff}').contains(&c)
            || ('\u{fff0}'..='\u{ffff}').contains(&c)
    };
    if path.chars().any(refused) {
        return Err(
            "a control character, or one ZooKeeper reserves (U+E000–U+F8FF, U+FFF0–U+FFFF)",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_servers_credentials_and_a_chroot() {
        let t = parse_url("zk://a:2181,b").unwrap();
        assert_eq!(
            (t.servers.as_str(), t.digest, t.chroot.as_str()),
            ("a:2181,b:2181", None, "")
        );
        let t = parse_url("zk://app:s%40cret@h:2182/apps/billing/").unwrap();
        assert_eq!(
            (t.servers.as_str(), t.digest.as_deref(), t.chroot.as_str()),
            ("h:2182", Some("app:s@cret"), "/apps/billing")
        );
        for bad in [
            "redis://h",
            "zk://",
            "zk://h:0",
            "zk://h:x",
            "zk://h,/a",
            "zk://h/a//b",
            "zk://:pw@h",
            "zk://h/a/../b",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        assert_eq!(redacted("zk://app:secret@h:1/x"), "zk://app:***@h:1/x");
    }

    #[test]
    fn paths_follow_zookeepers_rules() {
        assert!(check_path("/leasehold/orders:42").is_ok());
        assert!(check_path("/leasehold/jobs/nightly").is_ok());
        for bad in [
            "leasehold",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/\u{0}",
            "/a/\u{fff5}",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }
}
