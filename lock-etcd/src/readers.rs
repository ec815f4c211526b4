//! Read holds (the read side of a read-write lock), after etcd's own
//! recipe: readers and writers queue as entries of the key's queue, in the
//! order of their create revisions, and a reader's entry says it is one
//! ([`crate::modes`]). The writer is the exclusive lock: it holds once no
//! entry of any kind is ahead of its own ([`crate::waiting`]). A reader
//! holds once no writer's entry is ahead of its own, so readers share the
//! key, and a writer that waits keeps every reader that came after it
//! waiting behind it: first come, first served, across both kinds.
//!
//! A waiting reader watches only the entry it waits for, the last writer
//! ahead of it, and looks again once that entry is deleted: a writer
//! further ahead may still be there.

use std::time::Duration;

use etcd_client::{GetResponse, KeyValue, Txn, TxnResponse};
use lock_core::raw::{Grant, Waiting};
use lock_core::{LockKey, Mode, Result};
use tokio::time::{sleep, sleep_until};

use crate::errors::is_compacted;
use crate::permits::Room;
use crate::queue::Queue;
use crate::wake::{Deletion, Watched};
use crate::{Entry, EtcdBackend, backend_error, modes, reads};

/// What a look through the entries ahead, page by page in one revision,
/// found.
enum Writer {
    /// The newest writer's entry.
    Found(KeyValue),
    /// No writer: readers only.
    NoneFound,
    /// The revision was compacted before every page was read: the caller
    /// looks again, at the cluster's revision now.
    Compacted,
}

impl EtcdBackend {
    /// Room for a reader, from an attempt's look (at `revision`) at the
    /// head and the newest entries (its own among them if it put one, a
    /// reader's): no writer's entry anywhere in the queue, held or waiting.
    pub(crate) async fn room_for_reader(
        &self,
        key: &LockKey,
        resp: &TxnResponse,
        revision: i64,
    ) -> Result<Room> {
        let queue = self.queue(key);
        let (mut head, mut newest) = head_and_newest(resp)?;
        let mut revision = revision;
        loop {
            if let Some(conflict) = modes::conflict(key, head.as_ref(), Mode::Shared) {
                return Err(conflict);
            }
            match self.last_writer(&queue, newest, revision).await? {
                // The head holds, writer or reader: its expiry is the first
                // change the waiting can see.
                Writer::Found(_) => return Ok(Room::Full(head)),
                Writer::NoneFound => return Ok(Room::Free),
                Writer::Compacted => {
                    let again = Txn::new().and_then([queue.head_read(), queue.newest_read(None)]);
                    let resp = self.txn("look for writers again", again).await?;
                    revision = resp
                        .header()
                        .map(|h| h.revision())
                        .ok_or_else(|| backend_error("read hold: a reply without a revision"))?;
                    (head, newest) = head_and_newest(&resp)?;
                }
            }
        }
    }

    /// The newest writer's entry in `read` (a page of [`Queue::newest`],
    /// made at `revision`) and the pages after it, read in that revision.
    async fn last_writer(
        &self,
        queue: &Queue,
        mut read: GetResponse,
        revision: i64,
    ) -> Result<Writer> {
        loop {
            let writer = read
                .kvs()
                .iter()
                .find(|kv| modes::mode_of(kv.value()) != Mode::Shared);
            if let Some(writer) = writer {
                return Ok(Writer::Found(writer.clone()));
            }
            let Some(oldest) = read.kvs().last().filter(|_| read.more()) else {
                return Ok(Writer::NoneFound);
            };
            // The next page, older entries, in the same revision: the
            // answer is the queue's at one revision.
            let below = oldest.create_revision();
            let page = self
                .call("look for writers", |mut c| {
                    let options = queue.newest(Some(below)).with_revision(revision);
                    let prefix = queue.prefix().to_vec();
                    async move {
                        match c.get(prefix, Some(options)).await {
                            // Compacted since the first page: no longer
                            // readable, and not a failure of the cluster.
                            Err(e) if is_compacted(&e) => Ok(None),
                            other => other.map(Some),
                        }
                    }
                })
                .await?;
            match page {
                Some(page) => read = page,
                None => return Ok(Writer::Compacted),
            }
        }
    }

    /// Waits until no writer's entry is ahead of the reader's `entry`.
    /// `Ok(None)`: the entry is gone (its lease ended), and the caller
    /// queues again.
    pub(crate) async fn wait_behind_writers(
        &self,
        key: &LockKey,
        entry: Entry,
        ttl: Duration,
        wait: &Waiting,
    ) -> Result<Option<Grant>> {
        let queue = self.queue(key);
        // Keep-alives while waiting, so a wait longer than the TTL keeps its place.
        let every = ttl / 3;
        let mut refreshed = entry.sent;
        let mut tries = 0u32;
        loop {
            let resp = self
                .txn(
                    "look for writers ahead",
                    queue.readers_check(&entry.entry, entry.revision),
                )
                .await?;
            let revision = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| backend_error("read hold: a reply without a revision"))?;
            let mut reads = reads(&resp);
            let (Some(own), Some(ahead)) = (reads.next(), reads.next()) else {
                return Err(backend_error(
                    "read hold: a reply without the entries ahead",
                ));
            };
            if own.kvs().is_empty() {
                return Ok(None);
            }
            let writer = match self.last_writer(&queue, ahead, revision).await? {
                Writer::Found(writer) => writer,
                Writer::NoneFound => return self.grant_head(key, entry, refreshed, ttl).await,
                // Look again, at the cluster's revision now.
                Writer::Compacted => continue,
            };
            // Only the writer waited for is watched, from just after the
            // look: its deletion since then is reported, however late the
            // watch is set up.
            let watch = Deletion::from(
                self.client(),
                writer.key().to_vec(),
                revision + 1,
                self.inner.response_timeout,
            )
            .await;
            let delay = wait.backoff.delay(tries);
            let woken = async {
                match watch {
                    Some(watch) => match watch.wait().await {
                        Watched::Deleted(_) => 0,
                        // A broken watch: look again after a pause.
                        Watched::Broken => {
                            sleep(delay).await;
                            tries.saturating_add(1)
                        }
                    },
                    None => {
                        sleep(delay).await;
                        tries.saturating_add(1)
                    }
                }
            };
            tokio::select! {
                next = woken => tries = next,
                () = sleep_until(refreshed + every) => {
                    if !self.renew_waiter(key, entry.lease_id, &mut refreshed).await? {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// The head and the first page of the newest entries, from a look.
fn head_and_newest(resp: &TxnResponse) -> Result<(Option<KeyValue>, GetResponse)> {
    let mut reads = reads(resp);
    let (Some(head), Some(newest)) = (reads.next(), reads.next()) else {
        return Err(backend_error("read hold: a look without the queue"));
    };
    Ok((head.kvs().first().cloned(), newest))
}
