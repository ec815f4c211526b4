//! Runs one cell: servers, proxies, resource, client processes, the fault,
//! then the checker.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

use crate::check::{Findings, check};
use crate::clock::{ms, now_ns};
use crate::deploy::{Deployment, Servers};
use crate::faults::{Action, Backend, Cell, Nodes, duration};
use crate::history;
use crate::resource::{Resource, Stats};
use crate::rng::Rng;
use crate::workload::{Hold, Workload};
use lock_testkit::Net;

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The schedule's seed.
    pub seed: u64,
    /// Client processes per cell.
    pub clients: u32,
    /// Lock TTL (etcd's minimum is 2 s, so 2 s for all).
    pub ttl: Duration,
    /// Where histories and logs go.
    pub dir: PathBuf,
}

/// The outcome of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Backend.
    pub backend: Backend,
    /// Fault id.
    pub fault: &'static str,
    /// Fault in words.
    pub what: &'static str,
    /// The lock mode the clients contended in.
    pub workload: Workload,
    /// The prediction.
    pub prediction: crate::faults::Prediction,
    /// What the checker found (absent when the cell did not run).
    pub findings: Option<Findings>,
    /// The resource's own counts.
    pub stats: Option<Stats>,
    /// The promised unavailability bound: the fault's duration plus one TTL.
    pub bound_ms: f64,
    /// What the harness did and saw, in order.
    pub notes: Vec<String>,
    /// Why the cell did not run (a missing tool), if it did not.
    pub skipped: Option<String>,
    /// A harness failure (the cell's figures cannot be trusted).
    pub error: Option<String>,
}

impl Outcome {
    /// Safety violations against the prediction (empty: as predicted).
    pub fn violations(&self) -> Vec<String> {
        let (Some(f), p) = (&self.findings, &self.prediction) else {
            return Vec::new();
        };
        let mut v = Vec::new();
        if p.mutex && f.overlaps > 0 {
            v.push(match self.workload {
                Workload::Semaphore { permits } => format!(
                    "{} grants while {permits} others held (at most {} at once; above {permits} for {:.1} ms at the longest): {}",
                    f.overlaps,
                    f.max_holders,
                    f.longest_overlap_ms,
                    f.overlap_example.as_deref().unwrap_or("")
                ),
                _ => format!(
                    "{} overlapping held intervals (longest {:.1} ms): {}",
                    f.overlaps,
                    f.longest_overlap_ms,
                    f.overlap_example.as_deref().unwrap_or("")
                ),
            });
        }
        if p.fenced && f.stale_writes_accepted > 0 {
            v.push(format!(
                "{} stale writes accepted by the fence",
                f.stale_writes_accepted
            ));
        }
        if p.fenced && f.token_regressions > 0 {
            v.push(format!(
                "{} fencing-token regressions: {}",
                f.token_regressions,
                f.regression_example.as_deref().unwrap_or("")
            ));
        }
        if p.fenced && f.fenced_lost_updates > 0 {
            v.push(format!(
                "{} lost updates on the fenced counter",
                f.fenced_lost_updates
            ));
        }
        v
    }

    /// Departures from the prediction that are not safety violations of a
    /// predicted-safe cell (reported, never failing a run).
    pub fn remarks(&self) -> Vec<String> {
        let Some(f) = &self.findings else {
            return Vec::new();
        };
        let mut r = Vec::new();
        if self.prediction.unfenced && self.prediction.mutex && f.lost_updates > 0 {
            r.push(format!(
                "{} lost updates on the unfenced counter without an overlap ({} writes completed after their holder's deadline)",
                f.lost_updates, f.late_writes
            ));
        }
        if f.unavailable_ms > self.bound_ms {
            r.push(format!(
                "unavailable {:.0} ms, over the bound of {:.0} ms",
                f.unavailable_ms, self.bound_ms
            ));
        }
        if f.grants == 0 {
            r.push("no grant at all".into());
        }
        r
    }
}

struct Clients {
    children: Vec<(u32, Child)>,
}

impl Clients {
    fn pid(&self, id: u32) -> Option<Pid> {
        self.children
            .iter()
            .find(|(c, _)| *c == id)
            .and_then(|(_, child)| child.id())
            .map(|pid| Pid::from_raw(pid as i32))
    }

    fn signal(&self, id: u32, sig: Signal) -> io::Result<()> {
        let pid = self
            .pid(id)
            .ok_or_else(|| io::Error::other(format!("client {id} is gone")))?;
        kill(pid, sig).map_err(io::Error::from)
    }

    /// Closes every client's stdin (the stop signal) and waits for them,
    /// killing any that does not finish within `grace`.
    async fn stop(mut self, grace: Duration, notes: &mut Vec<String>) {
        for (_, child) in &mut self.children {
            drop(child.stdin.take());
        }
        for (id, child) in &mut self.children {
            match timeout(grace, child.wait()).await {
                Ok(Ok(status)) if status.success() || status.code().is_none() => {}
                Ok(Ok(status)) => notes.push(format!("client {id} exited with {status}")),
                Ok(Err(e)) => notes.push(format!("client {id}: wait failed: {e}")),
                Err(_) => {
                    notes.push(format!("client {id} did not stop within {grace:?}; killed"));
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
    }
}

async fn spawn_clients(
    settings: &Settings,
    deployment: &Deployment,
    resource: &Resource,
    dir: &Path,
    key: &str,
    workload: Workload,
) -> io::Result<Clients> {
    let exe = std::env::current_exe()?;
    let ttl_ms = settings.ttl.as_millis() as u64;
    let mut children = Vec::new();
    for id in 1..=settings.clients {
        let stderr = std::fs::File::create(dir.join(format!("client-{id}.stderr")))?;
        let child = Command::new(&exe)
            .arg("client")
            .args([
                "--id",
                &id.to_string(),
                "--url",
                &deployment.url,
                "--key",
                key,
            ])
            .args([
                "--ttl-ms",
                &ttl_ms.to_string(),
                "--wait-ms",
                // The last client never waits: one attempt, a short random
                // pause, again (a try-lock user). Waiters sleep on the
                // holder's remaining TTL or a release message; a fresh
                // attempt is what finds a lock a server forgot.
                &if id == settings.clients {
                    0
                } else {
                    3 * ttl_ms
                }
                .to_string(),
            ])
            .args([
                "--work-ms",
                &(ttl_ms / 5).to_string(),
                "--think-ms",
                "20",
                "--resource",
                &resource.addr(),
            ])
            .arg("--history")
            .arg(dir.join(format!("client-{id}.jsonl")))
            .args(["--seed", &settings.seed.to_string()])
            .args(["--workload", &workload.name()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        children.push((id, child));
    }
    Ok(Clients { children })
}

/// Waits (up to `within`) for a client to be inside the resource: an
/// exclusive holder between its fenced read and its write (the resource
/// half-updated), a reader or a permit holder during its turn.
async fn holder(resource: &Resource, within: Duration) -> Option<u32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(c) = resource.client_inside() {
            return Some(c);
        }
        sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Waits (up to `within`) for a client holding `hold` to be inside the resource.
async fn writer(resource: &Resource, hold: Hold, within: Duration) -> Option<u32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(c) = resource.client_inside_as(hold) {
            return Some(c);
        }
        sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Waits (up to `within`) for a client other than `besides` to enter the
/// resource after its `since`-th entry, and returns it while it is inside.
async fn next_entrant(
    resource: &Resource,
    since: u64,
    besides: Option<u32>,
    within: Duration,
) -> Option<u32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let (entries, Some(c)) = resource.entries()
            && entries > since
            && Some(c) != besides
        {
            return Some(c);
        }
        sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Whether the cell's backend offers its mode, read from the capabilities
/// of a client connected to its servers; `Err` names the refusal.
async fn offered(
    url: &str,
    workload: Workload,
    within: Duration,
) -> io::Result<Result<(), String>> {
    let locker = timeout(within, lockkit::connect(url))
        .await
        .map_err(|_| io::Error::other(format!("no connection within {within:?}")))?
        .map_err(io::Error::other)?;
    let mode = workload.mode();
    let offer = locker.capabilities().offer(&mode);
    Ok(if offer.is_offered() {
        Ok(())
    } else {
        Err(format!("not offered ({mode}: {offer})"))
    })
}

/// Runs one cell; never panics on a server or client failure (it becomes
/// the outcome's `error`).
pub async fn run_cell(index: usize, cell: Cell, settings: &Settings) -> Outcome {
    let ttl = settings.ttl;
    let lasts = duration(cell.fault.action, ttl);
    let mut outcome = Outcome {
        backend: cell.backend,
        fault: cell.fault.id,
        what: cell.fault.what,
        workload: cell.workload,
        prediction: cell.prediction,
        findings: None,
        stats: None,
        bound_ms: (lasts + ttl).as_secs_f64() * 1e3,
        notes: Vec::new(),
        skipped: None,
        error: None,
    };
    let dir = settings.dir.join(format!(
        "{:02}-{}-{}{}",
        index,
        cell.backend.name().split(' ').next().unwrap_or("x"),
        cell.fault.id,
        match cell.workload {
            Workload::Mutex => String::new(),
            w => format!("-{w}"),
        }
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        outcome.error = Some(format!("cannot create {}: {e}", dir.display()));
        return outcome;
    }
    let (persistence, faketime) = match cell.fault.action {
        Action::ServerRestart { persistence, .. } => (persistence, false),
        Action::ClockJump { .. } => (false, true),
        _ => (false, false),
    };
    let deployment = match Deployment::start(cell.backend, persistence, faketime).await {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            outcome.skipped = Some(e.to_string());
            return outcome;
        }
        Err(e) => {
            outcome.error = Some(format!("starting the servers: {e}"));
            return outcome;
        }
    };
    if cell.workload != Workload::Mutex {
        match offered(&deployment.url, cell.workload, ttl * 5).await {
            Ok(Ok(())) => {}
            Ok(Err(refused)) => {
                outcome.skipped = Some(refused);
                return outcome;
            }
            Err(e) => {
                outcome.error = Some(format!("reading the backend's capabilities: {e}"));
                return outcome;
            }
        }
    }
    let resource = match Resource::start().await {
        Ok(r) => r,
        Err(e) => {
            outcome.error = Some(format!("starting the resource: {e}"));
            return outcome;
        }
    };
    let key = format!("faults/{}/{}", cell.fault.id, settings.seed);
    let clients =
        match spawn_clients(settings, &deployment, &resource, &dir, &key, cell.workload).await {
            Ok(c) => c,
            Err(e) => {
                outcome.error = Some(format!("spawning clients: {e}"));
                return outcome;
            }
        };
    let mut rng = Rng::new(settings.seed, index as u64);
    sleep(Duration::from_millis(1500 + rng.below(500))).await;

    let t0 = now_ns();
    let mut deaths = Vec::new();
    let (fault_at, heal_at) = match inject(
        &cell,
        &deployment,
        &resource,
        &clients,
        &mut rng,
        ttl,
        lasts,
        &mut outcome.notes,
        &mut deaths,
    )
    .await
    {
        Ok(times) => times,
        Err(e) => {
            outcome.error = Some(format!("injecting the fault: {e}"));
            (t0, now_ns())
        }
    };
    sleep(ttl * 2 + Duration::from_secs(1)).await;
    let end = now_ns();
    clients
        .stop(ttl * 3 + Duration::from_secs(10), &mut outcome.notes)
        .await;
    outcome.notes.push(format!(
        "fault at +{:.0} ms after warm-up, healed {:.0} ms later, run ended {:.0} ms after the fault",
        ms(t0, fault_at),
        ms(fault_at, heal_at),
        ms(fault_at, end)
    ));

    let mut events = Vec::new();
    for id in 1..=settings.clients {
        let path = dir.join(format!("client-{id}.jsonl"));
        match history::read(&path) {
            Ok(mut e) => events.append(&mut e),
            Err(e) => {
                outcome
                    .error
                    .get_or_insert(format!("history of client {id}: {e}"));
            }
        }
    }
    let stats = resource.stats();
    let findings = check(&events, &stats, fault_at, end, &deaths, cell.workload);
    if findings.grants == 0 {
        outcome.error.get_or_insert(
            "no grant in the whole run: the workload never ran (see client-*.stderr)".into(),
        );
    }
    outcome.findings = Some(findings);
    outcome.stats = Some(stats);
    let _ = std::fs::write(
        dir.join("outcome.json"),
        serde_json::to_vec_pretty(&outcome).unwrap_or_default(),
    );
    drop(deployment);
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    cell: &Cell,
    d: &Deployment,
    resource: &Resource,
    clients: &Clients,
    rng: &mut Rng,
    ttl: Duration,
    lasts: Duration,
    notes: &mut Vec<String>,
    deaths: &mut Vec<(u32, u64)>,
) -> io::Result<(u64, u64)> {
    // Every fault strikes while a client holds the lock mid-update; under
    // a read-write lock, a writer, whose late write is what a fence is for.
    let wanted = cell.workload.struck_hold();
    let mut caught = match wanted {
        Some(hold) => writer(resource, hold, ttl * 2).await,
        None => None,
    };
    if caught.is_none() {
        caught = holder(resource, ttl * 2).await;
    }
    match caught {
        Some(c) => notes.push(format!(
            "fault struck while client {c} was {}",
            match (cell.workload, resource.hold_of(c)) {
                (Workload::Mutex, _) => "mid read-modify-write",
                (_, Some(Hold::Exclusive)) => "inside the resource, writing",
                (_, Some(Hold::Shared)) => "inside the resource, reading",
                _ => "inside the resource",
            }
        )),
        None => {
            notes.push("no client was caught mid read-modify-write; fault injected anyway".into())
        }
    }
    let n = d.len();
    let pick = |rng: &mut Rng, nodes: Nodes| rng.choose(n, nodes.count(n));
    let at = now_ns();
    match cell.fault.action {
        Action::HolderPause | Action::HolderKill => {
            let c = caught.ok_or_else(|| io::Error::other("no holder to strike"))?;
            let pause = cell.fault.action == Action::HolderPause;
            clients.signal(
                c,
                if pause {
                    Signal::SIGSTOP
                } else {
                    Signal::SIGKILL
                },
            )?;
            let at = now_ns();
            if !pause {
                deaths.push((c, at));
                resource.died(c);
            }
            if pause {
                sleep(lasts).await;
                clients.signal(c, Signal::SIGCONT)?;
                notes.push(format!("client {c} paused {lasts:?}, then resumed"));
            } else {
                notes.push(format!("client {c} killed"));
            }
            Ok((at, now_ns()))
        }
        Action::ServerRestart { late, nodes, .. } => {
            let which = pick(rng, nodes);
            notes.push(format!(
                "servers {which:?} killed, restarted {}",
                if late { "after 1.5 TTL" } else { "at once" }
            ));
            let w = which.clone();
            d.on_servers(move |s| s.kill(&w)).await?;
            sleep(lasts).await;
            d.on_servers(move |s| s.restart(&which)).await?;
            Ok((at, now_ns()))
        }
        Action::ServerPause { nodes } => {
            let which = pick(rng, nodes);
            notes.push(format!("servers {which:?} paused {lasts:?}"));
            let w = which.clone();
            d.on_servers(move |s| s.pause(&w)).await?;
            sleep(lasts).await;
            d.on_servers(move |s| s.resume(&which)).await?;
            Ok((at, now_ns()))
        }
        Action::NetDelay | Action::NetBlackhole => {
            let net = if cell.fault.action == Action::NetDelay {
                Net {
                    delay: ttl / 4,
                    blackhole: false,
                }
            } else {
                Net {
                    delay: Duration::ZERO,
                    blackhole: true,
                }
            };
            d.set_net(net);
            sleep(lasts).await;
            d.set_net(Net::default());
            Ok((at, now_ns()))
        }
        Action::ClockJump { nodes } => {
            let which = pick(rng, nodes);
            let jump = (ttl * 5).as_secs().max(1);
            let before: Vec<u64> = {
                let w = which.clone();
                d.on_servers(move |s| w.iter().map(|&i| s.redis_time(i)).collect())
                    .await?
            };
            let at = now_ns();
            for &i in &which {
                std::fs::write(&d.clock_files[i], format!("+{jump}\n"))?;
            }
            let w = which.clone();
            let after: Vec<u64> = d
                .on_servers(move |s| w.iter().map(|&i| s.redis_time(i)).collect())
                .await?;
            for ((i, b), a) in which.iter().zip(&before).zip(&after) {
                if a < &(b + jump - 1) {
                    return Err(io::Error::other(format!(
                        "libfaketime did not move node {i}'s clock: TIME {b} before, {a} after a {jump} s jump"
                    )));
                }
            }
            notes.push(format!(
                "wall clocks of servers {which:?} jumped {jump} s forward (TIME checked)"
            ));
            Ok((at, now_ns()))
        }
        Action::Failover => failover(d, resource, clients, cell.workload, ttl, lasts, notes).await,
        Action::MemberKill { leader } => {
            let Servers::Etcd(cluster) = &*d.servers else {
                return Err(io::Error::other("member faults need etcd"));
            };
            let lead = cluster
                .leader_index()
                .ok_or_else(|| io::Error::other("no etcd leader"))?;
            let i = if leader {
                lead
            } else {
                (lead + 1 + rng.below(2) as usize) % cluster.len()
            };
            notes.push(format!(
                "etcd member {i} ({}) killed, restarted after {lasts:?}",
                if leader { "leader" } else { "follower" }
            ));
            let at = now_ns();
            d.on_servers(move |s| s.kill(&[i])).await?;
            sleep(lasts).await;
            d.on_servers(move |s| s.restart(&[i])).await?;
            Ok((at, now_ns()))
        }
    }
}

/// [`Action::Failover`]: the replica cut off, the next grant made by the
/// master alone, the master killed, the replica promoted. The holder of
/// that grant is held (SIGSTOP) until another client (under a semaphore,
/// N others) is granted by the new master or a TTL passes, as a holder with a longer critical section
/// would still be working: it holds until its deadline.
async fn failover(
    d: &Deployment,
    resource: &Resource,
    clients: &Clients,
    workload: Workload,
    ttl: Duration,
    lasts: Duration,
    notes: &mut Vec<String>,
) -> io::Result<(u64, u64)> {
    let at = now_ns();
    // Paused, the replica cannot reconnect; the closed link sends it nothing more.
    let old = d
        .on_servers(move |s| {
            let s = sentinel_of(s)?;
            let old = s.master_port()?;
            s.replica()?.pause()?;
            s.master()?.cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
            Ok(old)
        })
        .await?;
    // Holders caught before the cut were replicated: wait for the next entrant.
    let (since, _) = resource.entries();
    let unreplicated = next_entrant(resource, since, None, ttl * 4).await;
    match unreplicated {
        Some(c) => {
            clients.signal(c, Signal::SIGSTOP)?;
            notes.push(format!(
                "replica cut off; client {c} then granted by the master alone, and held (SIGSTOP)"
            ));
        }
        None => notes.push("replica cut off; no client granted since (within 2 TTL)".into()),
    }
    let new = d
        .on_servers(move |s| {
            let s = sentinel_of(s)?;
            let master = s
                .servers()
                .iter()
                .find(|m| m.port() == old)
                .expect("the old master");
            master.kill()?;
            let replica = s
                .servers()
                .iter()
                .find(|m| m.port() != old)
                .expect("the replica");
            replica.resume()?;
            // Promoted at once, as a sentinel would after its detection
            // delay (down-after-milliseconds), while the holder still holds.
            s.start_failover()?;
            s.wait_promoted(old)
        })
        .await?;
    notes.push(format!(
        "master {old} killed; the sentinels promoted {new}; the old master restarts after {lasts:?}"
    ));
    if let Some(c) = unreplicated {
        // Held until as many others are granted as the mode lets hold
        // beside nobody (a semaphore: N), or a TTL passes.
        let wanted = workload.holders_allowed().unwrap_or(1) as usize;
        let until = Instant::now() + ttl;
        let mut others: Vec<u32> = Vec::new();
        let (mut since, _) = resource.entries();
        while others.len() < wanted && Instant::now() < until {
            let Some(other) = next_entrant(resource, since, Some(c), until - Instant::now()).await
            else {
                break;
            };
            since = resource.entries().0;
            if !others.contains(&other) {
                others.push(other);
            }
        }
        clients.signal(c, Signal::SIGCONT)?;
        if others.len() >= wanted {
            notes.push(format!(
                "client {c} resumed once clients {others:?} were granted by the new master"
            ));
        } else {
            notes.push(format!(
                "client {c} resumed after a TTL; clients {others:?} granted by then (of {wanted} awaited)"
            ));
        }
    }
    sleep(lasts).await;
    d.on_servers(move |s| {
        let s = sentinel_of(s)?;
        let master = s
            .servers()
            .iter()
            .find(|m| m.port() == old)
            .expect("the old master");
        master.restart()
    })
    .await?;
    Ok((at, now_ns()))
}

fn sentinel_of(s: &Servers) -> io::Result<&lock_testkit::RedisSentinel> {
    match s {
        Servers::Sentinel(s) => Ok(s),
        _ => Err(io::Error::other(
            "the failover fault needs a Sentinel deployment",
        )),
    }
}
