//! The fault catalogue, what the literature predicts for each backend, and
//! the smoke and full schedules.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::workload::Workload;

/// The backends under test (each on private servers of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// One Redis server.
    Redis,
    /// Redlock over five Redis masters.
    Redlock,
    /// A three-member etcd cluster.
    Etcd,
    /// One PostgreSQL server.
    Postgres,
    /// Redis Sentinel: a master, a replica, three sentinels.
    RedisSentinel,
    /// The same, with `min_replicas=1` (each grant waits for `WAIT 1`).
    RedisSentinelWait,
}

impl Backend {
    /// All of them, in matrix column order.
    pub const ALL: [Backend; 6] = [
        Backend::Redis,
        Backend::Redlock,
        Backend::Etcd,
        Backend::Postgres,
        Backend::RedisSentinel,
        Backend::RedisSentinelWait,
    ];

    /// Column title.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Redlock => "redlock (5)",
            Backend::Etcd => "etcd (3)",
            Backend::Postgres => "postgres",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisSentinelWait => "redis-sentinel-wait (min_replicas=1)",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which servers of a deployment a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Nodes {
    /// One server (the only one, for single-server backends).
    One,
    /// A minority: 2 of Redlock's 5.
    Minority,
    /// A majority: 3 of Redlock's 5.
    Majority,
}

impl Nodes {
    /// How many of `n` servers.
    pub fn count(self, n: usize) -> usize {
        match self {
            Nodes::One => 1,
            Nodes::Minority => (n - 1) / 2,
            Nodes::Majority => n / 2 + 1,
        }
        .min(n)
    }
}

/// What the harness does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    /// SIGSTOP a client in the middle of its read-modify-write for
    /// `ttls` TTLs, then SIGCONT: it resumes and writes.
    HolderPause,
    /// SIGKILL a client in the middle of its read-modify-write.
    HolderKill,
    /// SIGKILL servers, wait, start them again (same port and directory).
    ServerRestart {
        /// Servers run with persistence (Redis: AOF, fsync always).
        persistence: bool,
        /// Down for longer than the TTL before the restart.
        late: bool,
        /// Which servers.
        nodes: Nodes,
    },
    /// SIGSTOP servers for 1.5 TTL, then SIGCONT.
    ServerPause {
        /// Which servers.
        nodes: Nodes,
    },
    /// Every byte between clients and servers delayed by TTL/4, for 2 TTLs.
    NetDelay,
    /// Nothing passes between clients and servers for 1.5 TTL.
    NetBlackhole,
    /// The servers' wall clock jumps forward by 5 TTLs (libfaketime).
    ClockJump {
        /// Which servers.
        nodes: Nodes,
    },
    /// SIGKILL one etcd member (the leader, or a follower), restart it
    /// after 1.5 TTL.
    MemberKill {
        /// The leader, or a follower.
        leader: bool,
    },
    /// Redis Sentinel: cut the replica off (SIGSTOP, and the master closes
    /// its link), let the next holder be granted by the master alone,
    /// SIGKILL the master; the sentinels promote the replica
    /// (`SENTINEL FAILOVER` at once, rather than after their detection
    /// delay, so that it happens within the holder's TTL). That holder is
    /// held (SIGSTOP) meanwhile: the workload's critical section (TTL/5)
    /// is shorter than a failover. The old
    /// master starts again 1.5 TTL later (the sentinels make it a replica).
    Failover,
}

/// A fault of the catalogue.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fault {
    /// Short id (matrix row).
    pub id: &'static str,
    /// What happens, in words.
    pub what: &'static str,
    /// What the harness does.
    pub action: Action,
}

/// What the literature predicts for a backend under a fault.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Prediction {
    /// No two "definitely held" intervals overlap.
    pub mutex: bool,
    /// The unfenced counter loses no update (false when a holder may write
    /// after its deadline, or mutual exclusion may break).
    pub unfenced: bool,
    /// The fenced store accepts no stale write, tokens never regress and the
    /// fenced counter loses no update.
    pub fenced: bool,
    /// Why, in a few words.
    pub why: &'static str,
}

impl Prediction {
    /// The literature's verdict for `workload`, as the matrix marks it. A
    /// mode's prediction is the exclusive lock's on the same backend and
    /// fault: each mode's grants are made, expire and are lost as the
    /// exclusive lock's are, so its limit rests on the same things.
    pub fn label(&self, workload: Workload) -> &'static str {
        verdict(workload, self.mutex && self.unfenced, self.fenced)
    }
}

/// A verdict in the matrix's words: whether the mode's limit held at the
/// resource (and no update was lost), and whether the fenced store and the
/// tokens stayed clean.
pub fn verdict(workload: Workload, limit_held: bool, fence_clean: bool) -> &'static str {
    match (limit_held, fence_clean) {
        (true, true) => "safe",
        (false, true) if workload.fence_protects() => "unsafe without fencing, safe with it",
        // One highest token cannot tell a stale permit from N current ones.
        (false, true) => {
            "unsafe: more than N at once (no fence refuses a stale permit); tokens still increase"
        }
        (_, false) => "unsafe",
    }
}

const fn safe(why: &'static str) -> Prediction {
    Prediction {
        mutex: true,
        unfenced: true,
        fenced: true,
        why,
    }
}

const fn needs_fencing(mutex: bool, why: &'static str) -> Prediction {
    Prediction {
        mutex,
        unfenced: false,
        fenced: true,
        why,
    }
}

/// The faults, in matrix row order.
pub const FAULTS: &[Fault] = &[
    Fault {
        id: "holder-pause",
        what: "holder SIGSTOPped mid read-modify-write for 2.5 TTL, then resumed (it writes)",
        action: Action::HolderPause,
    },
    Fault {
        id: "holder-kill",
        what: "holder SIGKILLed mid read-modify-write",
        action: Action::HolderKill,
    },
    Fault {
        id: "restart-now",
        what: "server(s) SIGKILLed and restarted at once, no persistence",
        action: Action::ServerRestart {
            persistence: false,
            late: false,
            nodes: Nodes::One,
        },
    },
    Fault {
        id: "restart-now-persistent",
        what: "server SIGKILLed and restarted at once, with persistence (Redis AOF fsync always; PostgreSQL always)",
        action: Action::ServerRestart {
            persistence: true,
            late: false,
            nodes: Nodes::One,
        },
    },
    Fault {
        id: "restart-late",
        what: "server(s) SIGKILLed, restarted after 1.5 TTL, no persistence",
        action: Action::ServerRestart {
            persistence: false,
            late: true,
            nodes: Nodes::One,
        },
    },
    Fault {
        id: "restart-majority-now",
        what: "3 of 5 nodes SIGKILLed and restarted at once, no persistence",
        action: Action::ServerRestart {
            persistence: false,
            late: false,
            nodes: Nodes::Majority,
        },
    },
    Fault {
        id: "server-pause",
        what: "server SIGSTOPped for 1.5 TTL",
        action: Action::ServerPause { nodes: Nodes::One },
    },
    Fault {
        id: "pause-minority",
        what: "2 of 5 nodes SIGSTOPped for 1.5 TTL",
        action: Action::ServerPause {
            nodes: Nodes::Minority,
        },
    },
    Fault {
        id: "pause-majority",
        what: "3 of 5 nodes SIGSTOPped for 1.5 TTL",
        action: Action::ServerPause {
            nodes: Nodes::Majority,
        },
    },
    Fault {
        id: "member-kill",
        what: "an etcd follower SIGKILLed, restarted after 1.5 TTL",
        action: Action::MemberKill { leader: false },
    },
    Fault {
        id: "leader-kill",
        what: "the etcd leader SIGKILLed, restarted after 1.5 TTL",
        action: Action::MemberKill { leader: true },
    },
    Fault {
        id: "net-delay",
        what: "proxy delays every byte by TTL/4 each way, for 2 TTL",
        action: Action::NetDelay,
    },
    Fault {
        id: "net-blackhole",
        what: "proxy passes nothing for 1.5 TTL",
        action: Action::NetBlackhole,
    },
    Fault {
        id: "failover-unreplicated",
        what: "replica cut off (SIGSTOPped, its link closed), the next grant made by the master alone, the master SIGKILLed: the sentinels promote the replica (SENTINEL FAILOVER at once); that grant's holder is held (SIGSTOP) until another client (under a semaphore of N, N others) is granted or a TTL passes, as a longer critical section would be",
        action: Action::Failover,
    },
    Fault {
        id: "clock-jump",
        what: "server wall clock jumps 5 TTL forward (libfaketime)",
        action: Action::ClockJump { nodes: Nodes::One },
    },
    Fault {
        id: "clock-jump-majority",
        what: "wall clocks of 3 of 5 nodes jump 5 TTL forward (libfaketime)",
        action: Action::ClockJump {
            nodes: Nodes::Majority,
        },
    },
];

/// The prediction for `backend` under `fault`, or `None` when the fault
/// does not apply to the backend.
pub fn predict(backend: Backend, fault: &Fault) -> Option<Prediction> {
    use Action::*;
    use Backend::*;
    Some(match (fault.action, backend) {
        // A Sentinel deployment is here for its failover: its clients reach
        // the servers with no proxy between, and its servers take no other fault.
        (Failover, RedisSentinel) => needs_fencing(
            false,
            "replication is asynchronous: the promoted replica never got the grant, and grants the key again; tokens re-seed from its clock",
        ),
        (Failover, RedisSentinelWait) => safe(
            "a grant counts only once WAIT says the replica has it: the cut-off replica acknowledges none, so none is counted",
        ),
        (_, RedisSentinel | RedisSentinelWait) | (Failover, _) => return None,
        (HolderPause, _) => needs_fencing(
            true,
            "a paused holder outlives its lease and writes late (Kleppmann): only a fenced resource refuses it",
        ),
        (HolderKill, Postgres) => {
            safe("the dead connection ends the transaction: the row is free at once")
        }
        (HolderKill, _) => safe("the grant expires after its TTL"),
        (
            ServerRestart {
                persistence: false,
                late: false,
                nodes: Nodes::One,
            },
            Redis,
        ) => needs_fencing(
            false,
            "the restarted server forgot the grant; tokens are re-seeded from its clock, so they still increase",
        ),
        (
            ServerRestart {
                persistence: false,
                late: false,
                nodes: Nodes::One,
            },
            Redlock,
        ) => needs_fencing(
            false,
            "a node restarted empty can join a second majority (Redlock asks for delayed restarts); counters re-seed from the clock",
        ),
        (
            ServerRestart {
                persistence: true,
                late: false,
                nodes: Nodes::One,
            },
            Redis,
        ) => safe("AOF with fsync always keeps the grant and the counter"),
        (
            ServerRestart {
                persistence: true,
                late: false,
                nodes: Nodes::One,
            },
            Postgres,
        ) => needs_fencing(
            false,
            "the crash ends every lock transaction while holders' deadlines still run; the sequence survives (WAL)",
        ),
        (
            ServerRestart {
                persistence: false,
                late: true,
                nodes: Nodes::One,
            },
            Redis | Redlock,
        ) => safe("every grant had expired before the restart (a delayed restart)"),
        (
            ServerRestart {
                persistence: false,
                late: false,
                nodes: Nodes::Majority,
            },
            Redlock,
        ) => needs_fencing(
            false,
            "a majority restarted empty forgets the grant; counters re-seed from node clocks",
        ),
        (ServerPause { nodes: Nodes::One }, Redis | Postgres) => {
            safe("nothing is granted while paused; the holder's deadline passes first")
        }
        (
            ServerPause {
                nodes: Nodes::Minority,
            },
            Redlock,
        ) => safe("a majority still answers"),
        (
            ServerPause {
                nodes: Nodes::Majority,
            },
            Redlock,
        ) => safe("no majority: unavailable, never doubly granted"),
        (MemberKill { .. }, Etcd) => safe("Raft: the lease and the grant survive on the majority"),
        (NetDelay | NetBlackhole, _) => {
            safe("deadlines count from the send time; slow replies only shorten the validity")
        }
        (ClockJump { nodes: Nodes::One }, Redis) => needs_fencing(
            false,
            "the grant expires early on the server's clock; tokens follow the clock forward",
        ),
        (ClockJump { nodes: Nodes::One }, Redlock) => {
            safe("one node of five: the others keep the majority")
        }
        (
            ClockJump {
                nodes: Nodes::Majority,
            },
            Redlock,
        ) => needs_fencing(
            false,
            "a majority of nodes expires the grant early (bounded drift violated)",
        ),
        _ => return None,
    })
}

/// How long the fault lasts (until healed) for a TTL.
pub fn duration(action: Action, ttl: Duration) -> Duration {
    match action {
        Action::HolderPause => ttl * 5 / 2,
        Action::HolderKill | Action::ClockJump { .. } => Duration::ZERO,
        Action::ServerRestart { late: true, .. } => ttl * 3 / 2,
        Action::ServerRestart { late: false, .. } => Duration::ZERO,
        Action::ServerPause { .. }
        | Action::NetBlackhole
        | Action::MemberKill { .. }
        | Action::Failover => ttl * 3 / 2,
        Action::NetDelay => ttl * 2,
    }
}

/// A scheduled cell: one backend under one fault.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    /// Backend.
    pub backend: Backend,
    /// Fault.
    pub fault: &'static Fault,
    /// Prediction.
    pub prediction: Prediction,
    /// The lock mode the clients contend in.
    pub workload: Workload,
}

impl Cell {
    /// `backend/fault/workload`, as `--only` matches it.
    pub fn name(&self) -> String {
        format!(
            "{}/{}/{}",
            self.backend.name(),
            self.fault.id,
            self.workload
        )
    }
}

/// The cells of each mode (semaphore, read-write): on each backend, a
/// holder paused past its TTL and the server-side fault the exclusive lock
/// is most sensitive to. Listed for every backend: a cell runs where the
/// backend's `capabilities().offer(..)` offers the mode, and is marked
/// "not offered" elsewhere.
const MODE_FAULTS: &[(&str, Backend)] = &[
    ("holder-pause", Backend::Redis),
    ("restart-now", Backend::Redis),
    ("holder-pause", Backend::Redlock),
    ("restart-majority-now", Backend::Redlock),
    ("holder-pause", Backend::Etcd),
    ("leader-kill", Backend::Etcd),
    ("holder-pause", Backend::Postgres),
    ("restart-now-persistent", Backend::Postgres),
    ("failover-unreplicated", Backend::RedisSentinel),
    ("failover-unreplicated", Backend::RedisSentinelWait),
];

/// The mode cells of the smoke schedule (CI time is short: two cells).
const MODE_SMOKE: &[(&str, Backend, Workload)] = &[
    (
        "holder-pause",
        Backend::Redis,
        Workload::Semaphore {
            permits: crate::workload::PERMITS,
        },
    ),
    ("restart-now", Backend::Redis, Workload::ReadWrite),
];

/// Every applicable (backend, fault) pair with the plain lock, then the
/// mode cells; or the smoke subset.
pub fn schedule(smoke: bool) -> Vec<Cell> {
    const SMOKE: &[(&str, Backend)] = &[
        ("holder-pause", Backend::Redis),
        ("restart-now", Backend::Redis),
        ("clock-jump", Backend::Redis),
        ("pause-majority", Backend::Redlock),
        ("holder-pause", Backend::Etcd),
        ("leader-kill", Backend::Etcd),
        ("holder-kill", Backend::Postgres),
        ("net-blackhole", Backend::Postgres),
        ("failover-unreplicated", Backend::RedisSentinel),
    ];
    let mut cells = Vec::new();
    for fault in FAULTS {
        for backend in Backend::ALL {
            if smoke && !SMOKE.contains(&(fault.id, backend)) {
                continue;
            }
            if let Some(prediction) = predict(backend, fault) {
                cells.push(Cell {
                    backend,
                    fault,
                    prediction,
                    workload: Workload::Mutex,
                });
            }
        }
    }
    for workload in Workload::MODES {
        for fault in FAULTS {
            for backend in Backend::ALL {
                let chosen = if smoke {
                    MODE_SMOKE.contains(&(fault.id, backend, workload))
                } else {
                    MODE_FAULTS.contains(&(fault.id, backend))
                };
                if let Some(prediction) = predict(backend, fault).filter(|_| chosen) {
                    cells.push(Cell {
                        backend,
                        fault,
                        prediction,
                        workload,
                    });
                }
            }
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_deployment_takes_only_the_failover_and_smoke_one_cell_of_it() {
        let sentinel = |b| matches!(b, Backend::RedisSentinel | Backend::RedisSentinelWait);
        let full: Vec<Cell> = schedule(false)
            .into_iter()
            .filter(|c| c.workload == Workload::Mutex)
            .collect();
        for cell in &full {
            assert_eq!(
                sentinel(cell.backend),
                cell.fault.action == Action::Failover,
                "{} × {}",
                cell.backend,
                cell.fault.id
            );
        }
        assert_eq!(full.iter().filter(|c| sentinel(c.backend)).count(), 2);
        let smoke = schedule(true);
        assert_eq!(smoke.iter().filter(|c| sentinel(c.backend)).count(), 1);
    }

    #[test]
    fn every_mode_cell_exists_as_a_plain_lock_cell_and_smoke_adds_two() {
        let full = schedule(false);
        let modes: Vec<&Cell> = full
            .iter()
            .filter(|c| c.workload != Workload::Mutex)
            .collect();
        assert_eq!(modes.len(), MODE_FAULTS.len() * Workload::MODES.len());
        for m in &modes {
            assert!(full.iter().any(|c| c.workload == Workload::Mutex
                && c.backend == m.backend
                && c.fault.id == m.fault.id));
        }
        let smoke = schedule(true);
        let plain = smoke
            .iter()
            .filter(|c| c.workload == Workload::Mutex)
            .count();
        assert_eq!((plain, smoke.len() - plain), (9, 2));
    }

    #[test]
    fn a_permit_is_not_promised_the_fence_a_writer_is() {
        let pause = FAULTS.iter().find(|f| f.id == "holder-pause").unwrap();
        let p = predict(Backend::Redis, pause).unwrap();
        assert_eq!(p.label(Workload::ReadWrite), p.label(Workload::Mutex));
        assert!(
            p.label(Workload::Semaphore { permits: 2 })
                .contains("more than N")
        );
    }
}
