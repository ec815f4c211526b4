//! The operator view: which locks are held under the prefix, for how much
//! longer, and which keys under the prefix would never expire (leaks).

use std::time::Duration;

use lock_core::{FencingToken, HeldLock, LockReport, Mode, Result};
use lock_redis_wire::keys::StoredKey;
use lock_redis_wire::{KeyLayout, map_error, read_write, semaphore};
use redis::aio::ConnectionLike;

const SCAN_BATCH: usize = 500;

/// Scans one server's keys of locks named `key_prefix...` into `report`,
/// with each holder's token when `counters_per_lock` (Redis Cluster: a
/// lock's own counter holds the token of its latest grant). One server's
/// locks share one counter, which says nothing of any one holder.
pub(crate) async fn scan_into<C: ConnectionLike + Send>(
    conn: &mut C,
    layout: &KeyLayout,
    counters_per_lock: bool,
    key_prefix: &str,
    endpoint: &str,
    backend: &'static str,
    report: &mut LockReport,
) -> Result<()> {
    let pattern = layout.scan_pattern(key_prefix);
    let fail = |e| map_error(backend, endpoint, e);
    let mut cursor: u64 = 0;
    loop {
        // Names as bytes: another client may have written one that is not
        // UTF-8, which must not make the whole listing fail.
        let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_BATCH)
            .query_async(conn)
            .await
            .map_err(fail)?;
        if !names.is_empty() {
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.cmd("PTTL").arg(name);
            }
            let ttls: Vec<i64> = pipe.query_async(conn).await.map_err(fail)?;
            let mut held = Vec::new();
            for (name, ttl) in names.into_iter().zip(ttls) {
                let text = String::from_utf8(name).map_err(|e| e.into_bytes());
                match (ttl, text) {
                    (-2, _) => {} // expired between SCAN and PTTL
                    (-1, Ok(name)) => report.leaks.push(name),
                    // Shown with its bytes escaped (`\xff`), as no lock's key is.
                    (-1, Err(bytes)) => report.leaks.push(bytes.escape_ascii().to_string()),
                    (ms, Ok(name)) => {
                        if let Some(StoredKey::Lock(key)) = layout.parse(&name) {
                            held.push((key, Duration::from_millis(ms.max(0) as u64)))
                        }
                    }
                    // Not UTF-8, so not a key lockkit wrote, and it expires.
                    (_, Err(_)) => {}
                }
            }
            let held = take_semaphores(conn, layout, held, report)
                .await
                .map_err(fail)?;
            let held = take_readers(conn, layout, held, report)
                .await
                .map_err(fail)?;
            if !counters_per_lock {
                report.held.extend(
                    held.into_iter()
                        .map(|(key, remaining)| HeldLock::new(key).with_remaining(remaining)),
                );
            } else if !held.is_empty() {
                let mut pipe = redis::pipe();
                for (key, _) in &held {
                    pipe.cmd("GET").arg(layout.keys(key).counter);
                }
                let tokens: Vec<Option<u64>> = pipe.query_async(conn).await.map_err(fail)?;
                for ((key, remaining), token) in held.into_iter().zip(tokens) {
                    let lock = HeldLock::new(key).with_remaining(remaining);
                    report.held.push(match token {
                        Some(t) => lock.with_fencing_token(FencingToken::new(t)),
                        None => lock,
                    });
                }
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// Moves the semaphores among `held` into `report`, one entry per holder
/// with its own remaining TTL and the number of permits (no token: a
/// permit's is known to its holder only, and its owner token, the set's
/// member, is never shown). Returns the other, exclusive, locks.
async fn take_semaphores<C: ConnectionLike + Send>(
    conn: &mut C,
    layout: &KeyLayout,
    held: Vec<(String, Duration)>,
    report: &mut LockReport,
) -> redis::RedisResult<Vec<(String, Duration)>> {
    if held.is_empty() {
        return Ok(held);
    }
    let mut pipe = redis::pipe();
    for (key, _) in &held {
        pipe.cmd("TYPE").arg(layout.keys(key).lock);
    }
    let kinds: Vec<String> = pipe.query_async(conn).await?;
    let (semaphores, locks): (Vec<_>, Vec<_>) = held
        .into_iter()
        .zip(kinds)
        .partition(|(_, kind)| kind == "zset");
    if !semaphores.is_empty() {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for ((key, _), _) in &semaphores {
            let keys = layout.keys(key);
            pipe.cmd("ZRANGE")
                .arg(&keys.lock)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        let rest = replies.split_off(1);
        let (seconds, micros): (u64, u64) = redis::from_redis_value(replies[0].clone())?;
        let now_ms = seconds * 1000 + micros / 1000;
        for (((key, _), _), holders) in semaphores.into_iter().zip(rest) {
            let holders: Vec<(String, f64)> = redis::from_redis_value(holders)?;
            // The set's `#` member keeps the number of permits, not a holder.
            let (permits, holders): (Vec<_>, Vec<_>) = holders
                .into_iter()
                .partition(|(member, _)| member == semaphore::PERMITS_MEMBER);
            let permits = permits
                .first()
                .and_then(|(_, score)| semaphore::permits_of(*score));
            let mode = Mode::semaphore(permits.unwrap_or(0));
            for (_owner, expiry) in holders {
                let left = (expiry as u64).saturating_sub(now_ms);
                if left > 0 {
                    report.held.push(
                        HeldLock::new(key.clone())
                            .with_remaining(Duration::from_millis(left))
                            .with_mode(mode),
                    );
                }
            }
        }
    }
    Ok(locks.into_iter().map(|(held, _)| held).collect())
}

/// Moves the read-write locks held by readers among `held` into `report`,
/// one entry per reader with its own remaining TTL (no token, and never
/// the owner token, the set's member). Returns the other locks, held by
/// one holder each: an exclusive lock, or a read-write lock's writer.
async fn take_readers<C: ConnectionLike + Send>(
    conn: &mut C,
    layout: &KeyLayout,
    held: Vec<(String, Duration)>,
    report: &mut LockReport,
) -> redis::RedisResult<Vec<(String, Duration)>> {
    if held.is_empty() {
        return Ok(held);
    }
    let mut pipe = redis::pipe();
    for (key, _) in &held {
        pipe.cmd("GET").arg(layout.keys(key).lock);
    }
    let values: Vec<Option<String>> = pipe.query_async(conn).await?;
    let (read, locks): (Vec<_>, Vec<_>) = held.into_iter().zip(values).partition(|(_, value)| {
        value
            .as_deref()
            .is_some_and(|v| v.trim_end_matches('+') == read_write::READ_MARKER)
    });
    if !read.is_empty() {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for ((key, _), _) in &read {
            let readers = read_write::readers_key(&layout.keys(key));
            pipe.cmd("ZRANGE")
                .arg(readers)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        let rest = replies.split_off(1);
        let (seconds, micros): (u64, u64) = redis::from_redis_value(replies[0].clone())?;
        let now_ms = seconds * 1000 + micros / 1000;
        for (((key, _), _), readers) in read.into_iter().zip(rest) {
            let readers: Vec<(String, f64)> = redis::from_redis_value(readers)?;
            for (_owner, expiry) in readers {
                let left = (expiry as u64).saturating_sub(now_ms);
                if left > 0 {
                    report.held.push(
                        HeldLock::new(key.clone())
                            .with_remaining(Duration::from_millis(left))
                            .with_mode(Mode::Shared),
                    );
                }
            }
        }
    }
    Ok(locks.into_iter().map(|(held, _)| held).collect())
}

/// The `host:port` of every master of a Redis Cluster, from `CLUSTER NODES`.
pub(crate) fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            let host_port = address.split('@').next()?;
            let (host, port) = host_port.rsplit_once(':')?;
            Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_from_cluster_nodes() {
        let nodes = "\
07c3 127.0.0.1:30004@31004,host-a slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@31003 myself,master - 0 1426238318243 3 connected 10923-16383
6ec2 127.0.0.1:30005@31005 master,fail - 0 1426238316232 5 disconnected
";
        assert_eq!(
            cluster_masters(nodes),
            [
                ("127.0.0.1".to_owned(), 30002),
                ("127.0.0.1".to_owned(), 30003)
            ]
        );
    }
}
