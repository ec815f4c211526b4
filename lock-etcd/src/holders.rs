//! Which entries of a lock's queue hold its key, for the operator's
//! listing and forced release: the head (the lowest create revision), and
//! after it, on a semaphore, the rest of its N permits, or on a read-held
//! key, the readers up to the first writer. The other entries wait.

use etcd_client::KeyValue;
use lock_core::Mode;

use crate::modes;

/// An entry as the operator's tools read it.
pub(crate) struct Listed {
    pub(crate) entry: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) lease: i64,
    pub(crate) mode: Mode,
}

impl Listed {
    pub(crate) fn of(kv: &KeyValue) -> Listed {
        Listed {
            entry: kv.key().to_vec(),
            value: kv.value().to_vec(),
            revision: kv.create_revision(),
            lease: kv.lease(),
            mode: modes::mode_of(kv.value()),
        }
    }
}

/// The holders among one queue's `entries`, sorted by create revision.
pub(crate) fn holders(entries: &[Listed]) -> impl Iterator<Item = &Listed> {
    let mode = entries.first().map(|head| head.mode);
    let count = match mode {
        Some(Mode::Semaphore { permits }) => permits as usize,
        Some(Mode::Shared) => entries
            .iter()
            .take_while(|e| e.mode == Mode::Shared)
            .count(),
        Some(_) => 1,
        None => 0,
    };
    // A permit waiter of another number is refused, not a holder.
    entries
        .iter()
        .take(count)
        .filter(move |e| Some(e.mode) == mode)
}
