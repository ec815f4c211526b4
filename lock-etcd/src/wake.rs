//! Wake-ups by watch: a waiter watches the deletion of the entry just ahead
//! of it, and a holder's guard watches the deletion of its own entry.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};

/// How a watch for a deletion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    /// The key was deleted at or after the start revision.
    Deleted,
    /// The watch could not be set up or broke off (member down, no leader,
    /// compacted history): the caller reads the key to learn its state.
    Broken,
}

/// Waits until `key` is deleted at revision `from` or later. Events from
/// `from` on are replayed, so a deletion between reading the key (at
/// `from - 1`) and setting up the watch is not missed.
pub(crate) async fn deletion(
    mut client: Client,
    key: Vec<u8>,
    from: i64,
    setup_timeout: Duration,
) -> Watched {
    let options = WatchOptions::new()
        .with_start_revision(from)
        .with_filters([WatchFilterType::NoPut]);
    let (_watcher, mut stream) =
        match tokio::time::timeout(setup_timeout, client.watch(key, Some(options))).await {
            Ok(Ok(watch)) => watch,
            _ => return Watched::Broken,
        };
    loop {
        match stream.message().await {
            Ok(Some(response)) => {
                if response
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Watched::Deleted;
                }
                if response.canceled() || response.compact_revision() > 0 {
                    return Watched::Broken;
                }
            }
            Ok(None) | Err(_) => return Watched::Broken,
        }
    }
}
