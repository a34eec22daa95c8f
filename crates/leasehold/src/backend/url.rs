//! What the URLs of the stores other than Redis share: credentials that may be percent-encoded, and a password that
//! messages never show.

/// `url` with its password replaced by `***`, for messages and logs; a user name is shown (`postgres://app@db`).
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((credentials, hosts)) => match credentials.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{hosts}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `text` with its `%XX` escapes decoded; `None` for a malformed escape or a result that is not UTF-8.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn percent_decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_password_is_hidden() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/locks"),
            "postgres://app:***@db:5432/locks"
        );
        assert_eq!(redacted("mysql://app@db/locks"), "mysql://app@db/locks");
        assert_eq!(redacted("zk://:s3cret@h:2181"), "zk://:***@h:2181");
        assert_eq!(redacted("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
    }
}
