//! The servers' own cost of a fan-out: how much longer one round to N Redis
//! nodes at once takes than one round to one node, with no client library.
//!
//! Redlock's acquire latency against the single server's can be no better
//! than this ratio on the same machine: each node is a process that must be
//! woken, run the command and answer, and when the nodes outnumber the
//! cores they take turns. Measured with raw sockets in one task (PING
//! written to every node, then every answer read), so that no library's
//! tasks or queues are in it.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::{nanos, quantile};

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
    /// How it is measured.
    pub method: String,
}

impl FanOutFloor {
    /// `fan_out_p50_us / single_p50_us`.
    pub fn ratio(&self) -> f64 {
        self.fan_out_p50_us / self.single_p50_us
    }
}

/// Alternates `rounds` PING rounds to `single` and to all of `nodes`
/// (host:port each), after a warm-up.
pub async fn floor(single: &str, nodes: &[String], rounds: usize) -> Result<FanOutFloor, String> {
    let mut one = vec![connect(single).await?];
    let mut all = Vec::with_capacity(nodes.len());
    for n in nodes {
        all.push(connect(n).await?);
    }
    let (mut single_ns, mut fan_out_ns) = (Vec::new(), Vec::new());
    for i in 0..rounds + rounds / 5 {
        let t = Instant::now();
        ping_all(&mut one).await?;
        let a = t.elapsed();
        let t = Instant::now();
        ping_all(&mut all).await?;
        let b = t.elapsed();
        if i >= rounds / 5 {
            single_ns.push(nanos(a));
            fan_out_ns.push(nanos(b));
        }
    }
    single_ns.sort_unstable();
    fan_out_ns.sort_unstable();
    Ok(FanOutFloor {
        nodes: nodes.len(),
        rounds,
        single_p50_us: quantile(&single_ns, 0.5),
        fan_out_p50_us: quantile(&fan_out_ns, 0.5),
        method: format!(
            "raw TCP sockets (TCP_NODELAY) in one task, no client library: `PING` written to every node, then every answer read; {rounds} rounds to one node alternating with {rounds} to all {}",
            nodes.len()
        ),
    })
}

async fn connect(host: &str) -> Result<TcpStream, String> {
    let s = TcpStream::connect(host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    s.set_nodelay(true).map_err(|e| format!("{host}: {e}"))?;
    Ok(s)
}

/// Writes `PING` to every socket, then reads one reply line from each.
async fn ping_all(socks: &mut [TcpStream]) -> Result<(), String> {
    for s in socks.iter_mut() {
        s.write_all(b"PING\r\n").await.map_err(|e| e.to_string())?;
    }
    let mut buf = [0u8; 128];
    for s in socks.iter_mut() {
        let mut got = 0;
        // One reply line (`+PONG`, or an error such as `-NOAUTH ...`).
        while !buf[..got].ends_with(b"\r\n") {
            if got == buf.len() {
                return Err("PING reply longer than expected".into());
            }
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf[got..]))
                .await
                .map_err(|_| "PING: no reply within 5 s".to_string())?
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            got += n;
        }
    }
    Ok(())
}
