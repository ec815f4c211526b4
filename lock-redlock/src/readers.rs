//! Read holds of read-write locks over the nodes: on each node, the read
//! hold of a single Redis server (lock-redis-wire's holds script and its
//! key layout), through the node's batcher; the write hold is the
//! exclusive lock. A read hold counts while a majority holds it.
//!
//! Why readers and writers exclude each other: on one node, the script
//! refuses a reader while a writer holds the key (or it is reserved for a
//! waiting writer), and the writer's `SET NX` finds the readers' marker. A
//! writer holds on a majority, a reader on a majority, and two majorities
//! share a node, which refused whichever came second. Readers are not
//! counted (any number may hold), so no node has to agree on how many
//! there are. The validity time is the exclusive lock's: TTL, less the
//! time the majority took, less the drift margin.
//!
//! A reader is refused on a node whose waiting line has a live head: the
//! writers waiting in Redlock's lines (stamped places, kept by this
//! crate's `line` module) stand in the same list the script looks at.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{GiveBack, Grant};
use lock_core::{DriftMargin, Error, FencingToken, LockKey, Mode, OwnerToken, Result};
use lock_redis_wire::Claim;
use lock_redis_wire::holds::{HoldAnswer, HoldOperation};
use tokio::time::Instant;

use crate::nodes::{Node, NodeResult};
use crate::quorum::{Reply, Tally, quorum, validity};
use crate::{Granted, RedlockBackend, granted_too_late, unavailable};

impl Granted for HoldAnswer {
    fn token(&self) -> Option<FencingToken> {
        match self {
            HoldAnswer::Granted(token) => Some(*token),
            _ => None,
        }
    }
}

/// Gives `claim`'s read hold back on `node`, queued behind its attempts
/// there: whether the owner held a live hold.
pub(crate) fn release(
    node: &Node,
    claim: Arc<Claim>,
) -> impl Future<Output = redis::RedisResult<bool>> + Send + use<> {
    let answer = node.batcher.hold(claim, HoldOperation::ReleaseRead);
    async move { Ok(answer.await? == HoldAnswer::Done(true)) }
}

impl RedlockBackend {
    /// One attempt at a read hold: granted on a majority within the
    /// validity time, with the top token of the majority made visible to
    /// any later majority (as an exclusive grant's); otherwise given back
    /// on every node that may hold it.
    pub(crate) async fn try_acquire_read(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Grant> {
        let claim = &Claim::new(self.keys(key), owner);
        let keys = claim.keys();
        let sent = Instant::now();
        let nodes = &self.inner.nodes;
        // Dropped before it returns, the attempt gives back whatever the
        // nodes granted it, behind its attempts on each node's batcher.
        let give_back = GiveBack::armed(|| {
            for node in nodes.nodes() {
                drop(release(node, claim.clone()));
            }
        });
        let q = quorum(nodes.len());
        let operation = HoldOperation::acquire_read(ttl);
        let (answers, late) = nodes
            .ask_all_until(
                |node| node.batcher.hold(claim.clone(), operation),
                |answers| {
                    let granted = answers
                        .iter()
                        .filter(|a| matches!(a, Some(Ok(HoldAnswer::Granted(_)))))
                        .count();
                    granted >= q
                },
            )
            .await;
        // A node that finds the key a semaphore's: the modes conflict.
        let mut semaphore = None;
        let tally = Tally::new(
            answers
                .into_iter()
                .map(|a| match a {
                    Some(Ok(HoldAnswer::Granted(token))) => Reply::Done(token),
                    Some(Ok(HoldAnswer::Busy(remaining))) => Reply::Refused { remaining },
                    Some(Ok(HoldAnswer::Semaphore(permits))) => {
                        semaphore = Some(permits);
                        Reply::Refused { remaining: None }
                    }
                    Some(Ok(other)) => Reply::Failed(format!("unexpected answer {other:?}")),
                    Some(Err(why)) => Reply::Failed(why),
                    // Not awaited, as a majority granted: it may grant yet.
                    None => Reply::Failed("no answer yet".into()),
                })
                .collect(),
        );
        // Any node that did not refuse may hold our hold, even one that
        // seemed to fail (its reply may be what got lost).
        let ours = |i: usize| !matches!(tally.replies()[i], Reply::Refused { .. });
        if tally.has_quorum() {
            let elapsed = sent.elapsed();
            let fenced = match validity(ttl, elapsed, DriftMargin::default().for_ttl(ttl)) {
                Some(_) => self.fence(keys, &tally, ttl).await,
                None => Err(granted_too_late(&self.inner.url, ttl, elapsed)),
            };
            give_back.disarm();
            return match fenced {
                Ok(token) => {
                    self.follow_late_grants(keys, late, token, ttl);
                    Ok(Grant::new(token).sent_at(sent))
                }
                Err(e) => {
                    self.release_reads_on(claim, ours).await;
                    Err(e)
                }
            };
        }
        give_back.disarm();
        if (0..tally.nodes()).any(ours) {
            self.release_reads_on(claim, ours).await;
        }
        if let Some(permits) = semaphore {
            return Err(Error::ModeConflict {
                key: key.to_string(),
                held: Some(Mode::semaphore(permits)),
                asked: Mode::Shared,
            });
        }
        if tally.refused_by_majority_of_possible() {
            tracing::debug!(error = %tally.to_error("acquire", &self.inner.endpoints), "contended");
            return Err(Error::Contended {
                key: key.to_string(),
                remaining: tally.free_in(),
            });
        }
        Err(unavailable(
            &self.inner.url,
            tally.to_error("acquire", &self.inner.endpoints),
        ))
    }

    /// Moves `claim`'s read hold's expiry to `ttl` from now on every node:
    /// per node, whether it still held one.
    pub(crate) async fn extend_read(
        &self,
        claim: &Arc<Claim>,
        ttl: Duration,
    ) -> Vec<NodeResult<bool>> {
        let operation = HoldOperation::extend_read(ttl);
        self.inner
            .nodes
            .ask_all(|node| {
                let answer = node.batcher.hold(claim.clone(), operation);
                async move { Ok(answer.await? == HoldAnswer::Done(true)) }
            })
            .await
    }

    /// Gives `claim`'s read hold back on the nodes picked by `which`.
    pub(crate) async fn release_reads_on(&self, claim: &Arc<Claim>, which: impl Fn(usize) -> bool) {
        self.inner
            .nodes
            .ask(which, |node| release(node, claim.clone()))
            .await;
    }
}
