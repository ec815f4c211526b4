//! The Redis server's instructions per acquire and release, counted by
//! callgrind: a figure that moves far less with the host's load than CPU
//! seconds on a shared host do (only the server's timer work, which grows
//! with the elapsed time, goes with it).
//!
//! A private `redis-server` runs under `valgrind --tool=callgrind`. One
//! client drives it at a time, with the same number of operations per round
//! trip for all: lockkit's batch script carrying N acquires, then N
//! releases, as the single-server backend and a Redlock node send them; and
//! rslock's commands pipelined N deep (N `SET NX PX`, then N `EVALSHA` of its
//! release script). Between the counter's reset and its dump only the
//! measured rounds run; user-space instructions only (the kernel's share of
//! each system call is not counted).

use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_testkit::{RedisOptions, RedisServer};

use lock_redis_wire::scripts::{self, Operation, TokenRule};
use lock_redis_wire::{KeyLayout, LockKeys};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::process::Command;

/// rslock 0.10's release script, as it sends it.
const RSLOCK_RELEASE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
else
  return 0
end
"#;

const TTL: Duration = Duration::from_secs(10);

/// The dump files' names, before the PID and the dump's number.
const DUMP_PREFIX: &str = "callgrind.out.";

/// Where vgdb's pipes go, relative to the server's directory.
const VGDB_PREFIX: &str = "vgdb";

/// The clients counted, in the report's words.
pub const CLIENTS: [&str; 3] = ["redis (one server)", "a Redlock node", "rslock"];

/// Instructions per acquire and release, at one number of operations per
/// round trip.
#[derive(Debug, Clone, Serialize)]
pub struct InstructionPoint {
    /// Acquires (and then releases) per round trip.
    pub per_round_trip: usize,
    /// Instructions per pair of each client, in this order: the single-server
    /// backend, a Redlock node, rslock.
    pub per_pair: Vec<f64>,
}

/// What the count found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerInstructions {
    /// Pairs counted per client and point.
    pub pairs: usize,
    /// One point per number of operations per round trip.
    pub points: Vec<InstructionPoint>,
    /// Why there are no figures (valgrind missing, say).
    pub error: Option<String>,
}

/// Counts `pairs` acquire+release pairs per client at each of `depths`.
pub async fn measure(pairs: usize, depths: &[usize]) -> ServerInstructions {
    match count(pairs, depths).await {
        Ok(points) => ServerInstructions {
            pairs,
            points,
            error: None,
        },
        Err(e) => ServerInstructions {
            pairs,
            points: Vec::new(),
            error: Some(e),
        },
    }
}

/// The method, for the report.
pub fn method() -> String {
    "a private redis-server under valgrind --tool=callgrind, one client at a time, N acquires then N releases per round trip: lockkit's batch script as the single-server backend sends it (shared counter) and as a Redlock node gets it (a counter per lock); rslock's SET NX PX and release script pipelined N deep; user-space instructions between callgrind_control -z and -d, divided by the pairs".into()
}

async fn count(pairs: usize, depths: &[usize]) -> Result<Vec<InstructionPoint>, String> {
    // The dumps and vgdb's pipes land in the server's own directory,
    // removed with it (by default the pipes would outlive it in /tmp).
    let options = RedisOptions {
        wrapper: vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={DUMP_PREFIX}%p"),
            format!("--vgdb-prefix={VGDB_PREFIX}"),
        ],
        ..RedisOptions::default()
    };
    let server = tokio::task::spawn_blocking(move || RedisServer::start_with(options))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("redis-server under valgrind: {e} (install valgrind)"))?;
    let pid = server.pid().ok_or("redis-server under valgrind exited")?;
    // No response timeout: under callgrind a call runs tens of times slower.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = redis::Client::open(server.url())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    let rslock_release: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RSLOCK_RELEASE)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut points = Vec::new();
    for &depth in depths {
        let mut per_pair = Vec::new();
        for client in 0..CLIENTS.len() {
            let rounds = pairs.div_ceil(depth);
            let round = Round::new(client, depth, &rslock_release);
            for _ in 0..5 {
                round.run(&mut conn).await?;
            }
            control(pid, server.dir(), "-z").await?;
            for _ in 0..rounds {
                round.run(&mut conn).await?;
            }
            let total = dumped_total(pid, server.dir()).await?;
            per_pair.push(total as f64 / (rounds * depth) as f64);
        }
        points.push(InstructionPoint {
            per_round_trip: depth,
            per_pair,
        });
    }
    Ok(points)
}

/// One client's round trip of `depth` acquires, then its `depth` releases.
struct Round {
    client: usize,
    keys: Vec<LockKeys>,
    owner: String,
    rule: TokenRule,
    rslock_release: String,
}

impl Round {
    fn new(client: usize, depth: usize, rslock_release: &str) -> Round {
        let layout = KeyLayout::default();
        let rule = match client {
            0 => TokenRule::SharedClockFloor {
                counter: layout.shared_counter().into(),
            },
            _ => TokenRule::CounterFirst,
        };
        Round {
            client,
            keys: (0..depth)
                .map(|i| layout.keys(&format!("count/{client}/{i}")))
                .collect(),
            owner: format!("{:016x}{:016x}", getrandom::u64().unwrap_or(1), client),
            rule,
            rslock_release: rslock_release.to_owned(),
        }
    }

    async fn run(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        if self.client == 2 {
            return self.run_rslock(conn).await;
        }
        let acquires: Vec<_> = self
            .keys
            .iter()
            .map(|k| (k, self.owner.as_str(), Operation::acquire(TTL, false)))
            .collect();
        let tokens = scripts::run_batch(conn, &self.rule, &acquires)
            .await
            .map_err(|e| e.to_string())?;
        let mut releases = Vec::new();
        for (k, token) in self.keys.iter().zip(tokens) {
            let token = token.map_err(|e| e.to_string())?;
            if token < 1 {
                return Err(format!("{}: not granted ({token})", k.lock));
            }
            let token = token as u64;
            releases.push((k, self.owner.as_str(), Operation::Release { token }));
        }
        for released in scripts::run_batch(conn, &self.rule, &releases)
            .await
            .map_err(|e| e.to_string())?
        {
            if released.map_err(|e| e.to_string())? != 1 {
                return Err("a release found no grant".into());
            }
        }
        Ok(())
    }

    async fn run_rslock(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let mut acquire = redis::pipe();
        for k in &self.keys {
            acquire
                .cmd("SET")
                .arg(&k.lock)
                .arg(&self.owner)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64);
        }
        let granted: Vec<Option<String>> =
            acquire.query_async(conn).await.map_err(|e| e.to_string())?;
        if granted.iter().any(Option::is_none) {
            return Err("rslock's SET NX was refused".into());
        }
        let mut release = redis::pipe();
        for k in &self.keys {
            release
                .cmd("EVALSHA")
                .arg(&self.rslock_release)
                .arg(1)
                .arg(&k.lock)
                .arg(&self.owner);
        }
        let released: Vec<i64> = release.query_async(conn).await.map_err(|e| e.to_string())?;
        if released.iter().any(|r| *r != 1) {
            return Err("rslock's release found no grant".into());
        }
        Ok(())
    }
}

/// `callgrind_control <what> <pid>`: `-z` zeroes the counts, `-d` dumps them.
async fn control(pid: u32, dir: &Path, what: &str) -> Result<(), String> {
    let prefix = format!("--vgdb-prefix={}", dir.join(VGDB_PREFIX).display());
    let out = Command::new("callgrind_control")
        .args([&prefix, what, &pid.to_string()])
        .output()
        .await
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Dumps the counts and reads the total of the newest dump.
async fn dumped_total(pid: u32, dir: &Path) -> Result<u64, String> {
    control(pid, dir, "-d").await?;
    let prefix = format!("{DUMP_PREFIX}{pid}.");
    let newest: Option<(u32, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| {
            let path = e.ok()?.path();
            let n = path
                .file_name()?
                .to_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            Some((n, path))
        })
        .max_by_key(|(n, _)| *n);
    let (_, path) = newest.ok_or("callgrind wrote no dump")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("{}: no totals line", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs valgrind and redis-server (`scripts/servers.sh install`);
    /// skipped without valgrind unless `LOCKKIT_REQUIRE_SERVERS=1`.
    #[tokio::test]
    async fn a_call_carrying_many_operations_costs_the_server_less_per_pair() {
        let has_valgrind = std::process::Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success());
        if !has_valgrind && std::env::var("LOCKKIT_REQUIRE_SERVERS").as_deref() != Ok("1") {
            eprintln!("skipped: valgrind is not installed (`scripts/servers.sh install`)");
            return;
        }
        let count = measure(64, &[1, 16]).await;
        assert_eq!(count.error, None);
        let [one, sixteen] = count.points.as_slice() else {
            panic!("two points expected: {count:?}");
        };
        for p in [one, sixteen] {
            assert_eq!(p.per_pair.len(), CLIENTS.len());
            assert!(p.per_pair.iter().all(|n| *n > 1_000.0), "{p:?}");
        }
        // The batch script's cost per call is shared among its operations.
        assert!(sixteen.per_pair[0] < one.per_pair[0], "{count:?}");
        assert!(sixteen.per_pair[1] < one.per_pair[1], "{count:?}");
    }
}
