//! The recorded history: one JSON line per invocation and one per
//! completion, written by each client process to its own file as it goes
//! (so a killed client leaves its last invocation without completion).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::workload::Hold;

/// What a client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `Locker::acquire` (waiting).
    Acquire,
    /// Read the unfenced counter.
    Read,
    /// Write the unfenced counter.
    Write,
    /// Read the fenced store, presenting the token.
    FencedRead,
    /// Write the fenced store, presenting the token.
    FencedWrite,
    /// A reader or permit holder enters the resource (a reader's read is
    /// fenced against writers).
    Enter,
    /// It leaves.
    Leave,
    /// `Locker::release`.
    Release,
}

/// The line's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The operation started.
    Invoke,
    /// It completed and took effect.
    Ok,
    /// It completed and certainly did not take effect (contended, timed
    /// out waiting, a stale token refused).
    Fail,
    /// It completed with an error after which its effect is unknown
    /// (a timeout or an unreachable server: a grant may have been made).
    Info,
}

/// One line of a history file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Client id.
    pub c: u32,
    /// Operation number within the client (invoke and completion share it).
    pub n: u64,
    /// The operation.
    pub op: Op,
    /// Invoke or completion kind.
    pub kind: Kind,
    /// Shared monotonic clock, ns.
    pub at: u64,
    /// The acquire this operation runs under (`n` of that acquire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<u64>,
    /// Fencing token (acquire completions, fenced operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The lease's deadline on the shared clock (acquire completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// How the grant holds the key (acquire completions; absent: exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Value read or written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// Error text of a failed operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err: Option<String>,
}

impl Event {
    /// A bare event; fill in the optional fields with struct update syntax.
    pub fn new(c: u32, n: u64, op: Op, kind: Kind, at: u64) -> Self {
        Event {
            c,
            n,
            op,
            kind,
            at,
            grant: None,
            token: None,
            deadline: None,
            hold: None,
            value: None,
            err: None,
        }
    }
}

/// Appends events to a file, one `write` per line, unbuffered, so that a
/// SIGKILL loses nothing already recorded.
#[derive(Debug)]
pub struct Recorder {
    file: File,
}

impl Recorder {
    /// Creates (truncates) the file.
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(Recorder {
            file: File::create(path)?,
        })
    }

    /// Writes one line.
    pub fn record(&mut self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)
    }
}

/// Reads a history file. A torn last line (the process was killed in the
/// middle of writing it) is ignored; any other malformed line is an error.
pub fn read(path: &Path) -> io::Result<Vec<Event>> {
    let lines: Vec<String> = BufReader::new(File::open(path)?)
        .lines()
        .collect::<io::Result<_>>()?;
    let last = lines.len().saturating_sub(1);
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(event) => events.push(event),
            Err(_) if i == last => {}
            Err(e) => {
                return Err(io::Error::other(format!(
                    "{}:{}: malformed history line: {e}",
                    path.display(),
                    i + 1
                )));
            }
        }
    }
    Ok(events)
}
