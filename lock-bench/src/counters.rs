//! Server-side counters: operations a server executed, and its memory.
//!
//! - Redis: `INFO commandstats` call deltas, summed over the nodes (commands
//!   run inside scripts count too; `info` itself is left out), and
//!   `INFO memory` `used_memory`.
//! - PostgreSQL: `pg_stat_database` transaction deltas (`xact_commit +
//!   xact_rollback`) of the lab's own database (`pg_stat_statements` is not
//!   loaded by default), read after the server's 1 s statistics flush; memory:
//!   the private memory of the server processes of the sessions that hold
//!   locks (`/proc/PID/smaps_rollup`, the servers run on this machine).
//! - etcd: the members' `grpc_server_msg_received_total` (every unary request
//!   and every stream message), summed over the members, from their metrics
//!   endpoints; memory: the members' `process_resident_memory_bytes`, summed.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// Where a backend's server-side figures come from.
pub enum Counter {
    /// Redis nodes.
    Redis(Vec<MultiplexedConnection>),
    /// A PostgreSQL database.
    Postgres(sqlx::PgPool),
    /// etcd members' client `host:port`s.
    Etcd(Vec<String>),
    /// Nothing to count (the in-process backend, the peer).
    None,
}

impl Counter {
    /// Whether this counter counts operations at all.
    pub fn counts(&self) -> bool {
        !matches!(self, Counter::None)
    }

    /// What the operation count is.
    pub fn how(&self) -> &'static str {
        match self {
            Counter::Redis(_) => {
                "Redis commands (INFO commandstats deltas, incl. commands inside scripts), summed over nodes"
            }
            Counter::Postgres(_) => {
                "PostgreSQL transactions (pg_stat_database xact_commit+xact_rollback deltas)"
            }
            Counter::Etcd(_) => {
                "etcd gRPC messages received (grpc_server_msg_received_total deltas), summed over members"
            }
            Counter::None => "not counted",
        }
    }

    /// What the memory figure is.
    pub fn memory_how(&self) -> &'static str {
        match self {
            Counter::Redis(_) => "INFO memory used_memory delta, summed over nodes",
            Counter::Postgres(_) => {
                "private memory (smaps_rollup) of the server processes of the sessions holding locks"
            }
            Counter::Etcd(_) => "process_resident_memory_bytes delta, summed over members",
            Counter::None => "no server",
        }
    }

    /// Counts by operation name; empty when unavailable.
    pub async fn snapshot(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        match self {
            Counter::Redis(nodes) => out = redis_command_calls(nodes).await,
            Counter::Postgres(pool) => {
                // Sessions report their statistics at most once a second, when idle.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                if let Ok(n) = sqlx::query_scalar::<_, i64>(
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
                )
                .fetch_one(pool)
                .await
                {
                    out.insert("transactions".into(), n as u64);
                }
            }
            Counter::Etcd(members) => {
                for m in members {
                    let Some(text) = http_get(m, "/metrics").await else {
                        continue;
                    };
                    for line in text.lines() {
                        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{")
                        else {
                            continue;
                        };
                        let method = rest
                            .split("grpc_method=\"")
                            .nth(1)
                            .and_then(|r| r.split('"').next())
                            .unwrap_or("?");
                        let value = rest
                            .rsplit(' ')
                            .next()
                            .and_then(|v| v.parse::<f64>().ok())
                            .unwrap_or(0.0);
                        *out.entry(method.to_owned()).or_default() += value as u64;
                    }
                }
            }
            Counter::None => {}
        }
        out
    }

    /// `after - before`, by operation, leaving out zeros.
    pub fn delta(
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, u64> {
        after
            .iter()
            .filter_map(|(k, &a)| {
                let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
                (d > 0).then(|| (k.clone(), d))
            })
            .collect()
    }

    /// Lets the server reclaim keys that have expired but were never touched
    /// again (the bound's millions of benchmark keys, say), so that their
    /// reclaiming does not show as negative memory in a later delta: a
    /// `SCAN` over every key deletes the expired ones it meets, as any read
    /// of them would.
    pub async fn settle(&self) {
        if let Counter::Redis(nodes) = self {
            for node in nodes {
                let mut c = node.clone();
                let mut cursor: u64 = 0;
                loop {
                    let step: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(10_000)
                        .query_async(&mut c)
                        .await;
                    match step {
                        Ok((0, _)) | Err(_) => break,
                        Ok((next, _)) => cursor = next,
                    }
                }
            }
        }
    }

    /// Server memory, bytes.
    pub async fn memory(&self) -> Option<u64> {
        match self {
            Counter::Redis(nodes) => {
                let mut total = 0;
                for node in nodes {
                    let mut c = node.clone();
                    let text: String = redis::cmd("INFO")
                        .arg("memory")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    total += field(&text, "used_memory:")?;
                }
                Some(total)
            }
            Counter::Postgres(pool) => {
                let pids: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
                )
                .fetch_all(pool)
                .await
                .ok()?;
                let mut total = 0;
                for pid in pids {
                    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
                    let kib = field(&text, "Private_Clean:").unwrap_or(0)
                        + field(&text, "Private_Dirty:").unwrap_or(0);
                    total += kib * 1024;
                }
                Some(total)
            }
            Counter::Etcd(members) => {
                let mut total = 0.0;
                for m in members {
                    let text = http_get(m, "/metrics").await?;
                    let line = text
                        .lines()
                        .find(|l| l.starts_with("process_resident_memory_bytes "))?;
                    total += line.rsplit(' ').next()?.parse::<f64>().ok()?;
                }
                Some(total as u64)
            }
            Counter::None => None,
        }
    }
}

/// The number after `name` on its line of an INFO-like text.
fn field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.trim_start().starts_with(name))?;
    line.trim_start()[name.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A plain HTTP GET on loopback (etcd's metrics and version endpoints);
/// `None` when the server does not answer (within 5 s) or refuses.
pub async fn http_get(host_port: &str, path: &str) -> Option<String> {
    lock_testkit::http::get(host_port, path).await.ok()
}

/// The `host:port` list of a multi-host URL (`scheme://[user@]h1:p1,h2:p2/...`).
pub fn hosts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['/', '?']).next().unwrap_or("");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Connections to each Redis node of a URL.
pub async fn redis_nodes(url: &str) -> Result<Vec<MultiplexedConnection>, String> {
    let mut out = Vec::new();
    for h in hosts(url) {
        let client = redis::Client::open(format!("redis://{h}")).map_err(|e| e.to_string())?;
        out.push(
            client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("{h}: {e}"))?,
        );
    }
    Ok(out)
}

/// Calls per Redis command (`INFO commandstats`, which counts commands run
/// inside scripts too), summed over `nodes`; `INFO` itself left out. A node
/// that does not answer adds nothing.
pub async fn redis_command_calls(nodes: &[MultiplexedConnection]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for node in nodes {
        let Ok(text) = redis::cmd("INFO")
            .arg("commandstats")
            .query_async::<String>(&mut node.clone())
            .await
        else {
            continue;
        };
        for line in text.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if name == "info" {
                continue;
            }
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            *out.entry(name.to_owned()).or_default() += calls;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_multi_host_urls() {
        assert_eq!(
            hosts("redlock://127.0.0.1:16381,127.0.0.1:16382"),
            ["127.0.0.1:16381", "127.0.0.1:16382"]
        );
        assert_eq!(hosts("postgres://u@h:5/db?x=1"), ["h:5"]);
        assert_eq!(
            field("a:1\r\nused_memory:123\r\n", "used_memory:"),
            Some(123)
        );
        assert_eq!(
            field("Private_Dirty:     42 kB\n", "Private_Dirty:"),
            Some(42)
        );
    }
}
