//! etcd's errors and lock holders as the rest of the command shows them. What the options mean on etcd, and what it
//! refuses before connecting, is in [`crate::stores`].

use leasehold::__etcd::rpc;

/// The text of an error of etcd's client, on one line: a gRPC status as its message and the innermost cause under it
/// (`tcp connect error: Connection refused (os error 111)`), never the `Debug` dump its own text carries.
pub fn client_error_line(err: &rpc::Error) -> String {
    let rpc::Error::GRpcStatus(status) = err else {
        return err.to_string();
    };
    let mut text = match status.message() {
        "" => status.code().description().to_owned(),
        message => message.to_owned(),
    };
    let innermost = std::iter::successors(std::error::Error::source(status), |e| e.source()).last();
    if let Some(cause) = innermost {
        text.push_str(": ");
        text.push_str(&cause.to_string());
    }
    text
}

/// `info` with every holder's token and description as Redis gives them: etcd reports the token of a tagged hold
/// (a reader, a fair mutex's or a semaphore's holder) with its tag in front (`r dl1:…`), and so no description. A
/// no-op once the library reports them as on Redis.
pub fn holders_as_on_redis(mut info: leasehold::LockInfo) -> leasehold::LockInfo {
    for holder in info.holders.iter_mut().chain(info.holder.as_mut()) {
        if let Some((token, description)) = untagged(&holder.token) {
            if holder.description.is_none() {
                holder.description = description.map(str::to_owned);
            }
            holder.token = token.to_owned();
        }
    }
    info
}

/// A hold as `force_release` returns it, as its token (see [`holders_as_on_redis`]).
pub fn token_as_on_redis(hold: &str) -> &str {
    untagged(hold).map_or(hold, |(token, _)| token)
}

/// The token of a tagged hold (`r dl1:… description`) without its tag, and the description after it; `None` for an
/// untagged token.
fn untagged(hold: &str) -> Option<(&str, Option<&str>)> {
    if hold.starts_with(TOKEN_PREFIX) {
        return None;
    }
    let token = &hold[hold.find(&format!(" {TOKEN_PREFIX}"))? + 1..];
    let description = token
        .split_once(' ')
        .map(|(_, d)| d)
        .filter(|d| !d.is_empty());
    Some((token, description))
}

/// How every owner token starts.
const TOKEN_PREFIX: &str = "dl1:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_holds_read_as_on_redis() {
        let token = "dl1:0123456789abcdef0123456789abcdef host=h pid=1";
        assert_eq!(untagged(token), None);
        assert_eq!(
            untagged(&format!("r {token}")),
            Some((token, Some("host=h pid=1")))
        );
        assert_eq!(
            untagged("s1 dl1:0123456789abcdef0123456789abcdef"),
            Some(("dl1:0123456789abcdef0123456789abcdef", None))
        );
        assert_eq!(untagged("leasehold/jobs/694d7a1b2c"), None);
    }
}
