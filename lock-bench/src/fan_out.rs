//! The servers' own cost of a fan-out: how much longer one round to N Redis
//! nodes at once takes than one round to one node, with no client library.
//!
//! Redlock's acquire latency against the single server's can be no better
//! than this ratio, to a majority's answers, on the same machine: each node
//! is a process that must be woken, run the command and answer, and when
//! the nodes outnumber the cores they take turns. Measured with raw sockets
//! in one task (a command written to every node, then the answers read as
//! they come), so that no library's tasks or queues are in it, for two
//! commands: `PING`, which costs a server next to nothing, and the acquire
//! script as Redlock sends it, on which each node spends its real share of
//! the round. Each round gives two times: when a majority had answered
//! (when Redlock's acquire can return) and when every node had.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use lock_redis_wire::KeyLayout;
use lock_redis_wire::scripts::{self, BATCH_LUA, Operation, TokenRule};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::{histogram, nanos, quantile_us};

/// One round to one node against one round to all nodes.
#[derive(Debug, Clone, Serialize)]
pub struct FanOutFloor {
    /// Nodes in the fan-out.
    pub nodes: usize,
    /// Rounds measured of each.
    pub rounds: usize,
    /// p50 of one PING round trip to the single server, µs.
    pub single_p50_us: f64,
    /// p50 of one PING to every node at once, all answers read, µs.
    pub fan_out_p50_us: f64,
    /// p50 of the same rounds until a majority had answered, µs.
    pub majority_p50_us: f64,
    /// p50 of one granted acquire (the batch script, as Redlock sends it)
    /// on the single server, µs.
    pub script_single_p50_us: f64,
    /// p50 of that acquire on every node at once, all answers read, µs.
    pub script_fan_out_p50_us: f64,
    /// p50 of the same rounds until a majority had answered, µs.
    pub script_majority_p50_us: f64,
    /// How it is measured.
    pub method: String,
}

impl FanOutFloor {
    /// `fan_out_p50_us / single_p50_us`: the floor for a command that costs
    /// the servers next to nothing.
    pub fn ratio(&self) -> f64 {
        self.fan_out_p50_us / self.single_p50_us
    }

    /// `majority_p50_us / single_p50_us`.
    pub fn majority_ratio(&self) -> f64 {
        self.majority_p50_us / self.single_p50_us
    }

    /// `script_fan_out_p50_us / script_single_p50_us`.
    pub fn script_ratio(&self) -> f64 {
        self.script_fan_out_p50_us / self.script_single_p50_us
    }

    /// `script_majority_p50_us / script_single_p50_us`: the floor for
    /// Redlock's own acquire, which returns once a majority has granted.
    pub fn script_majority_ratio(&self) -> f64 {
        self.script_majority_p50_us / self.script_single_p50_us
    }
}

/// Alternates `rounds` rounds to `single` and to all of `nodes` (host:port
/// each), of PING and of the acquire script, after a warm-up.
pub async fn floor(single: &str, nodes: &[String], rounds: usize) -> Result<FanOutFloor, String> {
    let mut one = vec![connect(single).await?];
    let mut all = Vec::with_capacity(nodes.len());
    for n in nodes {
        all.push(connect(n).await?);
    }
    let load = command(&["SCRIPT", "LOAD", BATCH_LUA]);
    // The answer is the script's SHA1 as a bulk string: two lines.
    round(&mut one, &load, 2).await?;
    round(&mut all, &load, 2).await?;
    let ping = command(&["PING"]);
    let (mut single_ns, mut fan_out_ns, mut majority_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut script_single_ns, mut script_fan_out_ns, mut script_majority_ns) =
        (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + rounds / 5 {
        // A key per round among 64, free again by the next use of it.
        let (acquire, release) = acquire_and_release(&format!("lab/fan-out/{}", i % 64));
        let a = round(&mut one, &ping, 1).await?;
        let b = round(&mut all, &ping, 1).await?;
        let c = round(&mut one, &acquire, 1).await?;
        round(&mut one, &release, 1).await?;
        let d = round(&mut all, &acquire, 1).await?;
        round(&mut all, &release, 1).await?;
        if i >= rounds / 5 {
            single_ns.push(nanos(a.all));
            fan_out_ns.push(nanos(b.all));
            majority_ns.push(nanos(b.majority));
            script_single_ns.push(nanos(c.all));
            script_fan_out_ns.push(nanos(d.all));
            script_majority_ns.push(nanos(d.majority));
        }
    }
    let p50 = |ns: Vec<u64>| quantile_us(&histogram(&ns), 0.5);
    Ok(FanOutFloor {
        nodes: nodes.len(),
        rounds,
        single_p50_us: p50(single_ns),
        fan_out_p50_us: p50(fan_out_ns),
        majority_p50_us: p50(majority_ns),
        script_single_p50_us: p50(script_single_ns),
        script_fan_out_p50_us: p50(script_fan_out_ns),
        script_majority_p50_us: p50(script_majority_ns),
        method: format!(
            "raw TCP sockets (TCP_NODELAY) in one task, no client library: a command written to every node, then the answers read as they come, timed until a majority had answered and until all had; {rounds} rounds to one node alternating with {rounds} to all {}, of `PING` and of a granted acquire (`EVALSHA` of the batch script with Redlock's arguments: counter-first tokens, 10 s TTL; released after each round, untimed)",
            nodes.len()
        ),
    })
}

/// Redlock's acquire and release of `key` (the lab's prefix), as RESP.
fn acquire_and_release(key: &str) -> (Vec<u8>, Vec<u8>) {
    const OWNER: &str = "0123456789abcdef0123456789abcdef";
    let keys = KeyLayout::default().keys(key);
    let one = |operation| {
        scripts::batch_command(&TokenRule::CounterFirst, &[(&keys, OWNER, operation)])
            .get_packed_command()
    };
    (
        one(Operation::Acquire {
            ttl_ms: 10_000,
            others_wait: false,
        }),
        one(Operation::Release { token: 0 }),
    )
}

/// A command in RESP, as clients send it.
fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

async fn connect(host: &str) -> Result<TcpStream, String> {
    let s = TcpStream::connect(host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    s.set_nodelay(true).map_err(|e| format!("{host}: {e}"))?;
    Ok(s)
}

/// How long one round took.
struct Round {
    /// Until a majority of the sockets had answered.
    majority: Duration,
    /// Until every socket had.
    all: Duration,
}

/// Writes `cmd` to every socket, then reads an answer of `lines` lines from
/// each, in the order they come; an error answer (`-NOAUTH ...`, say) is
/// returned as the error.
async fn round(socks: &mut [TcpStream], cmd: &[u8], lines: usize) -> Result<Round, String> {
    let started = Instant::now();
    for s in socks.iter_mut() {
        s.write_all(cmd).await.map_err(|e| e.to_string())?;
    }
    let majority = socks.len() / 2 + 1;
    let mut answers: FuturesUnordered<_> = socks.iter_mut().map(|s| answer(s, lines)).collect();
    let (mut answered, mut at_majority) = (0, Duration::ZERO);
    while let Some(answer) = answers.next().await {
        answer?;
        answered += 1;
        if answered == majority {
            at_majority = started.elapsed();
        }
    }
    Ok(Round {
        majority: at_majority,
        all: started.elapsed(),
    })
}

/// Reads one answer of `lines` lines from `s`.
async fn answer(s: &mut TcpStream, lines: usize) -> Result<(), String> {
    let mut buf = [0u8; 128];
    let mut got = 0;
    while buf[..got].windows(2).filter(|w| w == b"\r\n").count() < lines {
        if got == buf.len() {
            return Err("answer longer than expected".into());
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf[got..]))
            .await
            .map_err(|_| "no answer within 5 s".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        got += n;
    }
    if buf[0] == b'-' {
        return Err(String::from_utf8_lossy(&buf[..got]).trim().to_owned());
    }
    Ok(())
}
