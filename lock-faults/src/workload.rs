//! What the clients of a cell do with the key: the plain lock, a semaphore,
//! or a read-write lock, and how many may hold it at once in each.

use std::fmt;
use std::str::FromStr;

use lockkit::Mode;
use serde::{Deserialize, Serialize};

/// The semaphore workload's permits: fewer than the clients, so that they
/// contend, and more than one, so that holders overlap by design.
pub const PERMITS: u32 = 2;

/// Every this-many clients, one is a writer of the read-write workload (the
/// first of each group); the others read.
pub const ONE_WRITER_IN: u32 = 3;

/// The lock mode a cell's clients contend in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Workload {
    /// Every client takes the exclusive lock.
    Mutex,
    /// Every client takes one permit of a semaphore of `permits`.
    Semaphore {
        /// Holders allowed at once.
        permits: u32,
    },
    /// One client in [`ONE_WRITER_IN`] takes the exclusive (write) lock,
    /// the others read holds ([`Mode::Shared`]).
    ReadWrite,
}

/// How one grant holds the key, as the history and the resource record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// The exclusive lock (a mutex holder, or a writer).
    Exclusive,
    /// One permit of a semaphore.
    Permit,
    /// A read hold.
    Shared,
}

impl Hold {
    /// One letter, for the resource's text protocol.
    pub fn letter(self) -> &'static str {
        match self {
            Hold::Exclusive => "x",
            Hold::Permit => "p",
            Hold::Shared => "r",
        }
    }

    /// The hold a letter names.
    pub fn from_letter(letter: &str) -> Option<Hold> {
        match letter {
            "x" => Some(Hold::Exclusive),
            "p" => Some(Hold::Permit),
            "r" => Some(Hold::Shared),
            _ => None,
        }
    }
}

impl Workload {
    /// The modes a cell runs beside the plain lock, where a backend offers them.
    pub const MODES: [Workload; 2] = [
        Workload::Semaphore { permits: PERMITS },
        Workload::ReadWrite,
    ];

    /// The mode a backend must offer for this workload to run
    /// (`capabilities().offer(..)`); the exclusive lock is offered everywhere.
    pub fn mode(self) -> Mode {
        match self {
            Workload::Mutex => Mode::Exclusive,
            Workload::Semaphore { permits } => Mode::semaphore(permits),
            Workload::ReadWrite => Mode::Shared,
        }
    }

    /// How client `id` (from 1) holds the key.
    pub fn hold_of(self, id: u32) -> Hold {
        match self {
            Workload::Mutex => Hold::Exclusive,
            Workload::Semaphore { .. } => Hold::Permit,
            Workload::ReadWrite if id.saturating_sub(1).is_multiple_of(ONE_WRITER_IN) => {
                Hold::Exclusive
            }
            Workload::ReadWrite => Hold::Shared,
        }
    }

    /// The mode client `id` asks for.
    pub fn mode_of(self, id: u32) -> Mode {
        match self.hold_of(id) {
            Hold::Exclusive => Mode::Exclusive,
            Hold::Permit => self.mode(),
            Hold::Shared => Mode::Shared,
        }
    }

    /// Most holders at once that the mode allows (any number of readers
    /// for a read-write lock: its limit is on writers, see [`Self::conflict`]).
    pub fn holders_allowed(self) -> Option<u64> {
        match self {
            Workload::Mutex => Some(1),
            Workload::Semaphore { permits } => Some(u64::from(permits)),
            Workload::ReadWrite => None,
        }
    }

    /// Whether two holds of different clients may not overlap under this
    /// mode: any two under a mutex, and a writer with anyone. A semaphore's
    /// permits may overlap pairwise; its limit is on their number.
    pub fn conflict(self, a: Hold, b: Hold) -> bool {
        match self {
            Workload::Mutex => true,
            Workload::Semaphore { .. } => false,
            Workload::ReadWrite => a == Hold::Exclusive || b == Hold::Exclusive,
        }
    }

    /// A fenced store refuses a stale holder of this mode: the exclusive
    /// lock's and a writer's tokens order every grant of the key, so a
    /// single highest token tells stale from current. A permit's does not:
    /// of N current permits all but the newest have lower tokens, so no
    /// single highest token can keep out a stale one alone.
    pub fn fence_protects(self) -> bool {
        !matches!(self, Workload::Semaphore { .. })
    }

    /// The hold a holder fault strikes, when it matters which: a writer of
    /// a read-write lock, whose late write a fence must refuse (a paused
    /// reader has already read). `None`: whoever is inside.
    pub fn struck_hold(self) -> Option<Hold> {
        match self {
            Workload::ReadWrite => Some(Hold::Exclusive),
            Workload::Mutex | Workload::Semaphore { .. } => None,
        }
    }

    /// Short name (the `--workload` argument, and the cell's name suffix).
    pub fn name(self) -> String {
        match self {
            Workload::Mutex => "mutex".into(),
            Workload::Semaphore { permits } => format!("semaphore-{permits}"),
            Workload::ReadWrite => "read-write".into(),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mutex" => Ok(Workload::Mutex),
            "read-write" => Ok(Workload::ReadWrite),
            _ => s
                .strip_prefix("semaphore-")
                .and_then(|n| n.parse().ok())
                .filter(|&permits| permits > 0)
                .map(|permits| Workload::Semaphore { permits })
                .ok_or_else(|| {
                    format!("workload {s:?}: expected mutex, semaphore-N (N > 0) or read-write")
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_bad_ones_are_refused() {
        for w in [
            Workload::Mutex,
            Workload::ReadWrite,
            Workload::Semaphore { permits: 2 },
        ] {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
        }
        assert!("semaphore-0".parse::<Workload>().is_err());
        assert!("rw".parse::<Workload>().unwrap_err().contains("rw"));
    }

    #[test]
    fn one_client_in_three_writes() {
        let holds: Vec<Hold> = (1..=6).map(|id| Workload::ReadWrite.hold_of(id)).collect();
        assert_eq!(holds.iter().filter(|h| **h == Hold::Exclusive).count(), 2);
        assert_eq!(Workload::ReadWrite.mode_of(2), Mode::Shared);
        assert_eq!(Workload::ReadWrite.mode_of(1), Mode::Exclusive);
        assert_eq!(
            Workload::Semaphore { permits: 2 }.mode_of(3),
            Mode::semaphore(2)
        );
    }

    #[test]
    fn readers_share_and_writers_conflict() {
        let rw = Workload::ReadWrite;
        assert!(!rw.conflict(Hold::Shared, Hold::Shared));
        assert!(rw.conflict(Hold::Shared, Hold::Exclusive));
        assert!(rw.conflict(Hold::Exclusive, Hold::Exclusive));
        assert!(!Workload::Semaphore { permits: 2 }.conflict(Hold::Permit, Hold::Permit));
        assert!(Workload::Mutex.conflict(Hold::Exclusive, Hold::Exclusive));
    }
}
