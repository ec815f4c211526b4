//! One client process of the workload: acquire in the workload's mode,
//! use the protected resource (an exclusive holder or writer: a
//! read-modify-write; a reader: a fenced read; a permit holder: its turn
//! inside), release; every step recorded on the shared clock.

use lockkit::Wait;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::{sleep, timeout};

use crate::clock::{instant_ns, now_ns};
use crate::history::{Event, Kind, Op, Recorder};
use crate::rng::Rng;
use crate::workload::{Hold, Workload};

/// What one client does; passed on its command line by the harness.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Client id (also its random stream).
    #[arg(long)]
    pub id: u32,
    /// The backend's URL (through the harness's proxies).
    #[arg(long)]
    pub url: String,
    /// The one lock key all clients contend for.
    #[arg(long)]
    pub key: String,
    /// Lock TTL.
    #[arg(long)]
    pub ttl_ms: u64,
    /// How long one acquire may wait.
    #[arg(long)]
    pub wait_ms: u64,
    /// Time spent between the reads and the writes, while holding.
    #[arg(long)]
    pub work_ms: u64,
    /// Upper bound of the random pause between iterations.
    #[arg(long)]
    pub think_ms: u64,
    /// The resource server, `127.0.0.1:PORT`.
    #[arg(long)]
    pub resource: String,
    /// Where to write the history (JSON lines).
    #[arg(long)]
    pub history: PathBuf,
    /// The schedule's seed.
    #[arg(long)]
    pub seed: u64,
    /// The lock mode: `mutex`, `semaphore-N` or `read-write` (this client
    /// writes if it is the first of each three).
    #[arg(long, default_value = "mutex")]
    pub workload: Workload,
}

struct Conn {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Conn {
    async fn ask(&mut self, request: String) -> io::Result<String> {
        self.write
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        self.lines
            .next_line()
            .await?
            .ok_or_else(|| io::Error::other("the resource closed the connection"))
    }
}

/// The reply's number after `V ` (a read) or `None` for `STALE ...`.
fn value(reply: &str) -> io::Result<Option<u64>> {
    if reply.starts_with("STALE") {
        return Ok(None);
    }
    reply
        .strip_prefix("V ")
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::other(format!("unexpected resource reply {reply:?}")))
}

/// Runs until stdin closes (the harness's stop signal), then finishes the
/// iteration in progress and returns.
pub async fn run(args: ClientArgs) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        flag.store(true, Ordering::SeqCst);
    });
    let mut rec = Recorder::create(&args.history)?;
    let mut rng = Rng::new(args.seed, 1000 + u64::from(args.id));
    let stream = TcpStream::connect(&args.resource).await?;
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    let mut res = Conn {
        lines: BufReader::new(read).lines(),
        write,
    };
    let ttl = Duration::from_millis(args.ttl_ms);
    let wait = Duration::from_millis(args.wait_ms);
    let bound = wait + ttl + Duration::from_secs(5);
    let c = args.id;
    let hold = args.workload.hold_of(c);
    let mode = args.workload.mode_of(c);
    let mut n = 0u64;
    let mut next = || {
        n += 1;
        n
    };

    // Connect, retrying while the servers are unreachable.
    let locker = loop {
        match timeout(bound, lockkit::connect(&args.url)).await {
            Ok(Ok(locker)) => break locker,
            _ if stop.load(Ordering::SeqCst) => return Ok(()),
            _ => sleep(Duration::from_millis(200)).await,
        }
    };

    while !stop.load(Ordering::SeqCst) {
        let a = next();
        rec.record(&Event::new(c, a, Op::Acquire, Kind::Invoke, now_ns()))?;
        let lease = match timeout(
            bound,
            locker.acquire_in(&args.key, mode, ttl, Wait::at_most(wait)),
        )
        .await
        {
            Ok(Ok(lease)) => {
                rec.record(&Event {
                    token: Some(lease.fencing_token().get()),
                    deadline: Some(instant_ns(lease.deadline())),
                    hold: Some(hold),
                    ..Event::new(c, a, Op::Acquire, Kind::Ok, now_ns())
                })?;
                Some(lease)
            }
            Ok(Err(e)) => {
                let kind = if e.is_contended() || e.is_timed_out() || e.is_invalid_input() {
                    Kind::Fail
                } else {
                    Kind::Info
                };
                rec.record(&Event {
                    err: Some(e.to_string()),
                    ..Event::new(c, a, Op::Acquire, kind, now_ns())
                })?;
                None
            }
            Err(_) => {
                rec.record(&Event {
                    err: Some("no answer within the client's bound".into()),
                    ..Event::new(c, a, Op::Acquire, Kind::Info, now_ns())
                })?;
                None
            }
        };
        let Some(lease) = lease else {
            // Do not spin while the servers are down or refuse.
            sleep(Duration::from_millis(50)).await;
            continue;
        };
        {
            let token = lease.fencing_token().get();
            let under = |op, kind, at| Event {
                grant: Some(a),
                ..Event::new(c, 0, op, kind, at)
            };
            if lease.is_within_deadline() && hold != Hold::Exclusive {
                // A reader reads the fenced store as it enters; a permit
                // holder just takes its turn inside.
                let e = next();
                rec.record(&Event {
                    n: e,
                    token: Some(token),
                    hold: Some(hold),
                    ..under(Op::Enter, Kind::Invoke, now_ns())
                })?;
                let reply = res.ask(format!("IN {c} {token} {}", hold.letter())).await?;
                let (kind, v) = match hold {
                    Hold::Shared => match value(&reply)? {
                        Some(v) => (Kind::Ok, Some(v)),
                        None => (Kind::Fail, None),
                    },
                    _ if reply == "OK" => (Kind::Ok, None),
                    _ => return Err(io::Error::other(format!("resource answered {reply:?}"))),
                };
                rec.record(&Event {
                    n: e,
                    token: Some(token),
                    value: v,
                    err: (kind == Kind::Fail).then_some(reply),
                    ..under(Op::Enter, kind, now_ns())
                })?;
                if kind == Kind::Ok {
                    sleep(Duration::from_millis(args.work_ms)).await;
                    let l = next();
                    rec.record(&Event {
                        n: l,
                        ..under(Op::Leave, Kind::Invoke, now_ns())
                    })?;
                    res.ask(format!("OUT {c}")).await?;
                    rec.record(&Event {
                        n: l,
                        ..under(Op::Leave, Kind::Ok, now_ns())
                    })?;
                }
            } else if lease.is_within_deadline() {
                // Unfenced read.
                let r = next();
                rec.record(&Event {
                    n: r,
                    ..under(Op::Read, Kind::Invoke, now_ns())
                })?;
                let v = value(&res.ask("R".into()).await?)?.unwrap_or(0);
                rec.record(&Event {
                    n: r,
                    value: Some(v),
                    ..under(Op::Read, Kind::Ok, now_ns())
                })?;
                // Fenced read.
                let fr = next();
                rec.record(&Event {
                    n: fr,
                    token: Some(token),
                    ..under(Op::FencedRead, Kind::Invoke, now_ns())
                })?;
                let fv = value(&res.ask(format!("FR {c} {token}")).await?)?;
                let kind = if fv.is_some() { Kind::Ok } else { Kind::Fail };
                rec.record(&Event {
                    n: fr,
                    token: Some(token),
                    value: fv,
                    ..under(Op::FencedRead, kind, now_ns())
                })?;

                sleep(Duration::from_millis(args.work_ms)).await;

                let w = next();
                rec.record(&Event {
                    n: w,
                    value: Some(v + 1),
                    ..under(Op::Write, Kind::Invoke, now_ns())
                })?;
                res.ask(format!("W {}", v + 1)).await?;
                rec.record(&Event {
                    n: w,
                    value: Some(v + 1),
                    ..under(Op::Write, Kind::Ok, now_ns())
                })?;
                if let Some(fv) = fv {
                    let fw = next();
                    rec.record(&Event {
                        n: fw,
                        token: Some(token),
                        value: Some(fv + 1),
                        ..under(Op::FencedWrite, Kind::Invoke, now_ns())
                    })?;
                    let reply = res.ask(format!("FW {c} {token} {}", fv + 1)).await?;
                    let kind = if reply == "OK" { Kind::Ok } else { Kind::Fail };
                    rec.record(&Event {
                        n: fw,
                        token: Some(token),
                        value: Some(fv + 1),
                        err: (kind == Kind::Fail).then_some(reply),
                        ..under(Op::FencedWrite, kind, now_ns())
                    })?;
                }
            }
            let rl = next();
            rec.record(&Event {
                grant: Some(a),
                ..Event::new(c, rl, Op::Release, Kind::Invoke, now_ns())
            })?;
            let (kind, err) = match timeout(bound, locker.release(lease)).await {
                Ok(Ok(())) => (Kind::Ok, None),
                Ok(Err(e)) if e.is_lost() => (Kind::Fail, Some(e.to_string())),
                Ok(Err(e)) => (Kind::Info, Some(e.to_string())),
                Err(_) => (
                    Kind::Info,
                    Some("no answer within the client's bound".into()),
                ),
            };
            rec.record(&Event {
                grant: Some(a),
                err,
                ..Event::new(c, rl, Op::Release, kind, now_ns())
            })?;
        }
        if args.think_ms > 0 {
            sleep(Duration::from_millis(rng.below(args.think_ms))).await;
        }
    }
    Ok(())
}
