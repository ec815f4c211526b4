//! Wake-ups by watch: a waiter watches the deletion of the entry just ahead
//! of it, and a holder's guard watches the deletion of its own entry.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream, Watcher};

/// How a watch for a deletion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    /// The key was deleted at or after the start revision; the revision
    /// of the deletion.
    Deleted(i64),
    /// The watch could not be set up or broke off (member down, no leader,
    /// compacted history): the caller reads the key to learn its state.
    Broken,
}

/// A watch for the deletion of one key, set up on a member and not yet fired.
pub(crate) struct Deletion {
    first: Watch,
    /// Where to set up a second watch on the same key while waiting (see
    /// `from_now`).
    second: Option<(Client, Vec<u8>, Duration)>,
}

struct Watch {
    /// Kept so that the watch stays open; dropping it ends the watch.
    _watcher: Watcher,
    stream: WatchStream,
}

impl Watch {
    async fn start(
        mut client: Client,
        key: Vec<u8>,
        from: Option<i64>,
        setup_timeout: Duration,
    ) -> Option<Watch> {
        let mut options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        if let Some(from) = from {
            options = options.with_start_revision(from);
        }
        // The client returns once the member has confirmed the watch, which
        // it does after registering it.
        match tokio::time::timeout(setup_timeout, client.watch(key, Some(options))).await {
            Ok(Ok((watcher, stream))) => Some(Watch {
                _watcher: watcher,
                stream,
            }),
            _ => None,
        }
    }

    async fn deleted(&mut self) -> Watched {
        loop {
            match self.stream.message().await {
                Ok(Some(response)) => {
                    if let Some(deleted) = response
                        .events()
                        .iter()
                        .find(|e| e.event_type() == EventType::Delete)
                    {
                        let at = deleted.kv().map_or(0, |kv| kv.mod_revision());
                        return Watched::Deleted(at);
                    }
                    if response.canceled() || response.compact_revision() > 0 {
                        return Watched::Broken;
                    }
                }
                Ok(None) | Err(_) => return Watched::Broken,
            }
        }
    }
}

impl Deletion {
    /// Watches for the deletion of `key` at revision `from` or later: events
    /// from `from` on are replayed, so a deletion between reading the key (at
    /// `from - 1`) and setting up the watch is not missed. `None` if the
    /// watch could not be set up.
    pub(crate) async fn from(
        client: Client,
        key: Vec<u8>,
        from: i64,
        setup_timeout: Duration,
    ) -> Option<Deletion> {
        let first = Watch::start(client, key, Some(from), setup_timeout).await?;
        Some(Deletion {
            first,
            second: None,
        })
    }

    /// Watches for the deletion of `key` after the revision the member has
    /// applied when it registers the watch, which it has done when this
    /// returns: the caller reads the key afterwards (linearizably) to learn
    /// whether it was deleted before. `None` if the watch could not be set up.
    ///
    /// Why not from the revision of an earlier read: etcd serves a watch
    /// whose start revision is already past through a catch-up loop that
    /// runs every 100 ms, so a deletion meanwhile arrives up to 100 ms late.
    /// A watch from "now" is served as events are applied, unless a write
    /// lands while the member registers it (about 1 % of watches under a busy
    /// queue), which sends it down the same slow path. So a second watch is
    /// set up when the wait begins, later than the first: both are slowed
    /// only if both registrations race a write. The first alone reports the
    /// deletion too, so the second is only a shortcut: if it cannot be set
    /// up, or starts after the deletion, it simply never fires.
    pub(crate) async fn from_now(
        client: Client,
        key: Vec<u8>,
        setup_timeout: Duration,
    ) -> Option<Deletion> {
        let first = Watch::start(client.clone(), key.clone(), None, setup_timeout).await?;
        Some(Deletion {
            first,
            second: Some((client, key, setup_timeout)),
        })
    }

    /// Waits until the key is deleted, or the watch breaks.
    pub(crate) async fn wait(self) -> Watched {
        let Deletion { mut first, second } = self;
        let Some((client, key, setup_timeout)) = second else {
            return first.deleted().await;
        };
        let second = async {
            if let Some(mut second) = Watch::start(client, key, None, setup_timeout).await
                && let deleted @ Watched::Deleted(_) = second.deleted().await
            {
                return deleted;
            }
            std::future::pending().await
        };
        tokio::select! {
            watched = first.deleted() => watched,
            watched = second => watched,
        }
    }
}

/// Waits until `key` is deleted at revision `from` or later (see
/// [`Deletion::from`]).
pub(crate) async fn deletion(
    client: Client,
    key: Vec<u8>,
    from: i64,
    setup_timeout: Duration,
) -> Watched {
    match Deletion::from(client, key, from, setup_timeout).await {
        Some(watch) => watch.wait().await,
        None => Watched::Broken,
    }
}
