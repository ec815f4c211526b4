//! The servers' own bounds for the commands each backend sends, at the same
//! concurrency: `redis-benchmark` running the acquire and release scripts by
//! `EVALSHA`, `pgbench` running the same SQL, and a bare etcd client loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lock_redis_wire::scripts::{self, Operation, TokenRule};
use lock_redis_wire::{KeyLayout, Scripts};
use serde::Serialize;
use tokio::process::Command;

/// One bound at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct BoundPoint {
    /// Concurrent clients.
    pub tasks: usize,
    /// Acquire+release pairs per second, one request at a time per client.
    pub pairs_per_s: f64,
    /// The same with 16 requests pipelined per client (Redis only).
    pub pipelined_pairs_per_s: Option<f64>,
    /// Acquire p50 latency, µs, where the tool reports it.
    pub acquire_p50_us: Option<f64>,
    /// The raw rates behind `pairs_per_s`: acquire/s, release/s (pipelined: after `/`).
    pub detail: String,
}

/// The server's own handoff floor at one waiter count.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffFloor {
    /// Waiting tasks.
    pub waiters: usize,
    /// What the ring writes.
    pub writes: crate::etcd_handoff::Writes,
    /// Handoffs per second.
    pub handoffs_per_s: f64,
    /// Start of a release to the next grant.
    pub handoff: crate::stats::Latency,
    /// The distribution at the percentiles of `stats::CURVE`, µs.
    pub handoff_curve_us: Vec<f64>,
    /// How it is measured.
    pub method: String,
}

/// A baseline: how it is produced, and its points.
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    /// Its name in tables.
    pub name: String,
    /// What it runs.
    pub method: String,
    /// One point per concurrency.
    pub points: Vec<BoundPoint>,
    /// The server's own handoff floor, per waiter count (etcd only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub handoffs: Vec<HandoffFloor>,
    /// Failures.
    pub errors: Vec<String>,
}

/// 1 / (1/a + 1/r): pairs per second from separate acquire and release rates.
pub fn pairs(acquire: f64, release: f64) -> f64 {
    if acquire <= 0.0 || release <= 0.0 {
        return 0.0;
    }
    1.0 / (1.0 / acquire + 1.0 / release)
}

const OWNER: &str = "0123456789abcdef0123456789abcdef";

/// The redis-benchmark method, for the report.
pub fn redis_method() -> String {
    format!(
        "redis-benchmark -c T -n N [-P 16] -r 100000000 {} (one acquire), then {} (one release); \
         acquire runs the granted path on fresh keys, release the owner-mismatch path (GET and compare only, so the bound is on the generous side); pairs/s = 1/(1/acquire + 1/release). \
         One operation per call: the backend's coalescing of concurrent callers into one call is what lets it pass this bound",
        shown(&benchmark_command(RANDOM_KEY, ACQUIRE)),
        shown(&benchmark_command(RANDOM_KEY, RELEASE)),
    )
}

/// A command as the method shows it: the script's hash shortened, the
/// owner token named.
fn shown(command: &[String]) -> String {
    command
        .iter()
        .map(|arg| match arg.as_str() {
            OWNER => "<owner>".to_owned(),
            hash if hash == Scripts::get().batch.get_hash() => {
                format!("<batch script {}>", &hash[..8])
            }
            other => other.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Loads the batch script on the server (EVALSHA needs it cached).
pub async fn load_scripts(conn: &mut redis::aio::MultiplexedConnection) -> Result<(), String> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(lock_redis_wire::scripts::BATCH_LUA)
        .query_async::<String>(conn)
        .await
        .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
    Ok(())
}

/// One redis-benchmark run: (requests/s, p50 µs).
async fn redis_benchmark_once(
    host_port: &str,
    tasks: usize,
    requests: u64,
    pipeline: usize,
    command: &[String],
) -> Result<(f64, f64), String> {
    let (host, port) = host_port.rsplit_once(':').unwrap_or((host_port, "6379"));
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", host, "-p", port, "--csv", "-r", "100000000"])
        .args(["-c", &tasks.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(command)
        .kill_on_drop(true);
    let out = cmd
        .output()
        .await
        .map_err(|e| format!("redis-benchmark: {e} (install redis-tools / redis-server)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("\"EVALSHA"))
        .ok_or_else(|| {
            format!(
                "redis-benchmark printed no result: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
    let fields: Vec<&str> = line.split("\",\"").collect();
    let num = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|f| f.trim_matches('"').parse().ok())
            .unwrap_or(0.0)
    };
    Ok((num(1), num(4) * 1000.0))
}

/// The lock redis-benchmark draws at random for each request.
const RANDOM_KEY: &str = "bench/__rand_int__";

/// An acquire for a 10 s TTL, and a release, as the bound sends them.
const ACQUIRE: Operation = Operation::Acquire {
    ttl_ms: 10_000,
    others_wait: false,
};
const RELEASE: Operation = Operation::Release { token: 0 };

/// One operation on `key` as lock-redis sends it alone (the batch script
/// with the shared counter), as redis-benchmark's arguments.
fn benchmark_command(key: &str, operation: Operation) -> Vec<String> {
    let layout = KeyLayout::default();
    let rule = TokenRule::SharedClockFloor {
        counter: layout.shared_counter().into(),
    };
    let keys = layout.keys(key);
    scripts::batch_command(&rule, &[(&keys, OWNER, operation)])
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            // The batch command has no cursor.
            _ => "0".to_owned(),
        })
        .collect()
}

/// Runs the acquire script once with the benchmark's arguments and checks
/// that it grants (a positive fencing token), so that the bound runs the
/// script's real granted path even when the script's arguments change.
pub async fn check_acquire_args(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(), String> {
    let key = format!("bench/check-{:x}", getrandom::u64().unwrap_or(0));
    let mut cmd = redis::cmd("EVALSHA");
    for arg in &benchmark_command(&key, ACQUIRE)[1..] {
        cmd.arg(arg);
    }
    let reply: redis::Value = cmd
        .query_async(conn)
        .await
        .map_err(|e| format!("the acquire script refused the benchmark's arguments: {e}"))?;
    let _: redis::RedisResult<()> = redis::cmd("DEL")
        .arg(KeyLayout::default().keys(&key).lock)
        .query_async(conn)
        .await;
    match reply {
        redis::Value::Int(n) if n > 0 => Ok(()),
        other => Err(format!(
            "the acquire script did not grant with the benchmark's arguments ({other:?})"
        )),
    }
}

/// redis-benchmark bound at one concurrency.
pub async fn redis_point(
    host_port: &str,
    tasks: usize,
    requests: u64,
) -> Result<BoundPoint, String> {
    let acquire = benchmark_command(RANDOM_KEY, ACQUIRE);
    let release = benchmark_command(RANDOM_KEY, RELEASE);
    let (a, a_p50) = redis_benchmark_once(host_port, tasks, requests, 1, &acquire).await?;
    let (r, _) = redis_benchmark_once(host_port, tasks, requests, 1, &release).await?;
    let (ap, _) = redis_benchmark_once(host_port, tasks, requests * 4, 16, &acquire).await?;
    let (rp, _) = redis_benchmark_once(host_port, tasks, requests * 4, 16, &release).await?;
    Ok(BoundPoint {
        tasks,
        pairs_per_s: pairs(a, r),
        pipelined_pairs_per_s: Some(pairs(ap, rp)),
        acquire_p50_us: Some(a_p50),
        detail: format!("{a:.0}, {r:.0} / {ap:.0}, {rp:.0}"),
    })
}

/// The pgbench script: one uncontended try_acquire + release as lock-postgres sends it.
pub const PGBENCH_SQL: &str = include_str!("../../lock-postgres/examples/pairs.pgbench.sql");

/// The pgbench method, for the report.
pub fn pgbench_method() -> String {
    "pgbench -n -f lock-postgres/examples/pairs.pgbench.sql -c T -j min(T,2) -T S: the statements of one try_acquire + release (BEGIN, the lock statement, ROLLBACK; the token flush in one pair of 32), one transaction per pair, rows inserted beforehand".into()
}

/// Inserts the rows of pgbench clients `0..clients` (their lock keys are
/// `pgbench/{client_id}`), with psql.
pub async fn pgbench_rows(url: &str, clients: usize) -> Result<(), String> {
    let sql = format!(
        "INSERT INTO \"lockkit\".\"locks\" (name) SELECT 'pgbench/' || g FROM generate_series(0, {clients}) g ON CONFLICT (name) DO NOTHING"
    );
    let out = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", &sql])
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("psql: {e} (install postgresql-client)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "psql could not insert pgbench's rows: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
        ))
    }
}

/// pgbench bound at one concurrency.
pub async fn pgbench_point(
    url: &str,
    script: &std::path::Path,
    tasks: usize,
    secs: u64,
) -> Result<BoundPoint, String> {
    let out = Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(script)
        .args(["-c", &tasks.to_string(), "-j", &tasks.min(2).to_string()])
        .args(["-T", &secs.to_string()])
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("pgbench: {e} (install postgresql-client)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| {
            format!(
                "pgbench printed no tps: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
            )
        })?;
    let latency = text
        .lines()
        .find_map(|l| l.strip_prefix("latency average = "))
        .unwrap_or("?")
        .to_owned();
    Ok(BoundPoint {
        tasks,
        pairs_per_s: tps,
        pipelined_pairs_per_s: None,
        acquire_p50_us: None,
        detail: format!("latency average {latency}"),
    })
}

/// The etcd loop's method, for the report.
pub fn etcd_method() -> String {
    "T tasks over one etcd-client connection, each granted one lease (10 s) and looping: LeaseKeepAlive(lease) once its last renewal is 1 s old (a tenth of its TTL), Txn(if create_revision(key)=0 then Put(key, lease) and Get(prefix, limit 1)), Txn(if create_revision(key)=r then Delete(key))".into()
}

/// A bare etcd client loop: the RPCs of an uncontended pair once the
/// backend has an idle lease to reuse (its steady state): two writes, and a
/// renewal once the lease's last one is a tenth of its TTL old.
pub async fn etcd_point(
    client: &etcd_client::Client,
    prefix: &str,
    tasks: usize,
    phase: Duration,
    ops: Arc<AtomicU64>,
) -> Result<BoundPoint, String> {
    let started = Instant::now();
    let until = started + phase;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (mut c, ops) = (client.clone(), ops.clone());
            let key = format!("{prefix}/e{tasks}-{t}");
            tokio::spawn(async move {
                let mut n = 0u64;
                let lease = c.lease_grant(10, None).await?.id();
                let mut renewed = Instant::now();
                while Instant::now() < until {
                    if renewed.elapsed() >= Duration::from_secs(1) {
                        renewed = Instant::now();
                        // Returns once the first renewal is answered.
                        c.lease_keep_alive(lease).await?;
                    }
                    let put = Txn::new()
                        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                        .and_then([
                            TxnOp::put(
                                key.as_str(),
                                OWNER,
                                Some(PutOptions::new().with_lease(lease)),
                            ),
                            TxnOp::get(
                                key.as_str(),
                                Some(GetOptions::new().with_prefix().with_limit(1)),
                            ),
                        ]);
                    let rev = c.txn(put).await?.header().map_or(0, |h| h.revision());
                    let del = Txn::new()
                        .when([Compare::create_revision(
                            key.as_str(),
                            CompareOp::Equal,
                            rev,
                        )])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    c.txn(del).await?;
                    n += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                c.lease_revoke(lease).await?;
                Ok::<_, etcd_client::Error>(n)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("etcd: {e}"))?;
    }
    Ok(BoundPoint {
        tasks,
        pairs_per_s: total as f64 / started.elapsed().as_secs_f64(),
        pipelined_pairs_per_s: None,
        acquire_p50_us: None,
        detail: "2 RPCs per pair, and a renewal per second per task".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_combine_rates() {
        assert_eq!(pairs(100.0, 100.0), 50.0);
        assert_eq!(pairs(0.0, 100.0), 0.0);
    }
}
