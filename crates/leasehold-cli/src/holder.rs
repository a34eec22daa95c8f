//! The holder description `leasehold run` attaches to its grant, and reading it back: written and parsed here, in
//! one place, so that `status` and `list` read exactly what `run` writes.

use std::ffi::OsString;

use serde_json::{json, Value};

/// What `leasehold status` and `list` show about this holder: `host=H pid=P user=U started=T program=ARGS…`
/// (the pid is this command's; the start time is UTC, RFC 3339), cut to the library's limit, control characters
/// replaced by `?`.
pub fn description(command: &[OsString]) -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "?".to_owned());
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name);
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let program: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let text = format!(
        "host={host} pid={} user={user} started={started} program={}",
        std::process::id(),
        program.join(" ")
    );
    let mut out = String::with_capacity(leasehold::MAX_DESCRIPTION_LEN);
    for c in text.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > leasehold::MAX_DESCRIPTION_LEN {
            break;
        }
        out.push(c);
    }
    out
}

/// The fields of a description `leasehold run` wrote (`host=… pid=… user=… started=… program=…`), or `None` for
/// any other text.
pub fn fields(description: &str) -> Option<Value> {
    let mut rest = description;
    let mut fields = serde_json::Map::new();
    for key in ["host", "pid", "user", "started"] {
        let (field, tail) = rest.split_once(' ')?;
        let value = field.strip_prefix(key)?.strip_prefix('=')?;
        let value = if key == "pid" {
            json!(value.parse::<u32>().ok()?)
        } else {
            json!(value)
        };
        fields.insert(key.to_owned(), value);
        rest = tail;
    }
    fields.insert("program".to_owned(), json!(rest.strip_prefix("program=")?));
    Some(Value::Object(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_run_writes_reads_back_as_fields() {
        let command = ["sh", "-c", "echo a  b"].map(std::ffi::OsString::from);
        let description = description(&command);
        let parsed = fields(&description).unwrap();
        assert_eq!(parsed["pid"], std::process::id());
        assert_eq!(parsed["program"], "sh -c echo a  b");
        assert!(humantime::parse_rfc3339(parsed["started"].as_str().unwrap()).is_ok());
        assert_eq!(fields("nightly batch on web-1"), None);
    }

    #[test]
    fn a_long_or_odd_command_is_cut_to_a_valid_description() {
        let long = ["prog".to_owned(), "é\n".repeat(300)].map(std::ffi::OsString::from);
        let description = description(&long);
        assert!(description.len() <= leasehold::MAX_DESCRIPTION_LEN);
        assert!(!description.chars().any(char::is_control));
    }
}
