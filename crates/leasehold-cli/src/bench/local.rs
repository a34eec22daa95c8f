//! A server on this machine, for the stores that report no CPU time of their own (ZooKeeper, PostgreSQL, MySQL and
//! MariaDB): the process that listens on the URL's port, and its CPU time, both read from `/proc`. A server elsewhere,
//! or one this user may not look into, shows none.

use std::collections::BTreeMap;

use anyhow::{bail, Context as _};

/// How a server's CPU time is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processes {
    /// The listening process alone, all its threads (ZooKeeper's JVM, `mariadbd`).
    One,
    /// The listening process and its children (PostgreSQL serves each connection in a process of its own, forked
    /// by the one that listens).
    WithChildren,
}

/// The CPU time so far (user + system) of the process on this machine that listens on each of `servers`
/// (`host:port`), by server; an error when one has none here (a server elsewhere, or no permission to see it).
pub fn cpu_seconds(servers: &[String], count: Processes) -> anyhow::Result<BTreeMap<String, f64>> {
    if servers.is_empty() {
        bail!("no TCP server to read the CPU time of (a Unix socket names no port)");
    }
    let mut seconds = BTreeMap::new();
    for server in servers {
        let pid = listener(server)
            .with_context(|| format!("no process of this machine listens on {server}"))?;
        let ticks = match count {
            Processes::One => own_ticks(&stat(pid)?),
            Processes::WithChildren => tree_ticks(pid)?,
        };
        seconds.insert(server.clone(), ticks as f64 / TICKS_PER_SECOND);
    }
    Ok(seconds)
}

/// The unit of the CPU times in `/proc/PID/stat`: Linux reports them in `USER_HZ`, which is 100 on every
/// architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// The process of this machine that listens on the TCP port of `server` (`host:port`, the host on loopback), from
/// `/proc/net/tcp` and `/proc/net/tcp6` and the processes' open files.
pub fn listener(server: &str) -> Option<u32> {
    let (host, port) = server.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    // A listening socket's line: `sl local_address rem_address st … inode`, the address as HEX_IP:HEX_PORT and the
    // state 0A for LISTEN.
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *fields.get(3)? == "0A")
                .then(|| fields.get(9).map(|i| i.to_string()))?
        })?;
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
            fds.flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == socket.as_str())
                })
                .then_some(pid)
        })
}

/// The fields of `/proc/PID/stat` that follow the command name, which is in parentheses and may hold spaces: the
/// state first (field 3 of proc(5)), the parent's PID second.
fn stat(pid: u32) -> anyhow::Result<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let Some((_, rest)) = text.rsplit_once(')') else {
        bail!("/proc/{pid}/stat has no command name");
    };
    // The state is a letter: it reads as 0, which nothing uses.
    Ok(rest
        .split_whitespace()
        .map(|field| field.parse().unwrap_or(0))
        .collect())
}

/// The parent's PID, from the fields of [`stat`].
fn parent(fields: &[u64]) -> Option<u64> {
    fields.get(1).copied()
}

/// User plus system time of the process itself, in ticks, from the fields of [`stat`] (`utime` and `stime`, fields
/// 14 and 15 of proc(5)).
fn own_ticks(fields: &[u64]) -> u64 {
    fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)
}

/// The ticks of the children that ended and were waited for (`cutime` and `cstime`, fields 16 and 17), from the
/// fields of [`stat`].
fn ended_children_ticks(fields: &[u64]) -> u64 {
    fields.get(13).copied().unwrap_or(0) + fields.get(14).copied().unwrap_or(0)
}

/// The CPU time of process `pid` and of its children, in ticks: its own, its ended children's (which the kernel
/// adds to it when it waits for them), and each running child's (an ended one not yet waited for included).
///
/// A child waited for while the children are read would count in neither sum: the parent's ended children are
/// read before and after the children, and the whole is read again when they differ (a backend ends at every
/// disconnection, and the bench's worker processes disconnect just when the measured window ends).
fn tree_ticks(pid: u32) -> anyhow::Result<u64> {
    for _ in 0..10 {
        let before = stat(pid)?;
        let mut children = 0;
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // A process that has ended and been waited for since the listing counts in the parent's figures.
            if let Ok(fields) = stat(child) {
                if parent(&fields) == Some(u64::from(pid)) {
                    children += own_ticks(&fields) + ended_children_ticks(&fields);
                }
            }
        }
        let after = stat(pid)?;
        if ended_children_ticks(&after) == ended_children_ticks(&before) {
            return Ok(own_ticks(&after) + ended_children_ticks(&after) + children);
        }
    }
    bail!("the children of process {pid} kept ending while their CPU time was read")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_elsewhere_has_no_local_process() {
        assert_eq!(listener("10.0.0.1:2181"), None);
        assert_eq!(listener("no-port"), None);
    }

    #[test]
    fn this_process_has_cpu_time_and_a_parent() {
        let fields = stat(std::process::id()).unwrap();
        assert_eq!(
            parent(&fields),
            Some(u64::from(std::os::unix::process::parent_id()))
        );
        assert!(tree_ticks(std::process::id()).unwrap() >= own_ticks(&fields));
    }

    #[test]
    fn a_listening_socket_is_found_with_its_process() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = socket.local_addr().unwrap().to_string();
        assert_eq!(listener(&server), Some(std::process::id()));
        let seconds = cpu_seconds(std::slice::from_ref(&server), Processes::One).unwrap();
        assert!(seconds[&server] >= 0.0);
    }
}
