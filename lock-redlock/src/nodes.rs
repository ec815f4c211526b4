//! The node set: per node, a shared, multiplexed connection, and the
//! batcher of acquires and releases (over a connection of its own where the
//! node is reached over plain TCP); and the fan-out that asks every node at
//! once, each bounded by the per-node timeout.

use std::future::Future;
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lock_redis_wire::Batcher;
use redis::aio::ConnectionManager;

/// One Redis master of the set.
#[derive(Clone)]
pub(crate) struct Node {
    /// `host:port`, without credentials: safe for errors and logs.
    pub endpoint: String,
    /// Multiplexed and self-reconnecting; clones share the one connection.
    pub connection: ConnectionManager,
    /// Acquires and releases, coalesced across callers and kept in order:
    /// over a connection of its own (plain TCP), else over `connection`.
    /// Both go through it, so that a release never overtakes the acquire it
    /// cleans up after.
    pub batcher: Batcher,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.endpoint)
    }
}

/// All nodes, asked together.
#[derive(Clone, Debug)]
pub(crate) struct Nodes {
    nodes: Vec<Node>,
    timeout: Duration,
}

/// What one node did with one request: its answer, or why there is none.
pub(crate) type NodeResult<T> = std::result::Result<T, String>;

/// Answers still to come, each with its node's index, each bounded by the
/// per-node timeout.
pub(crate) type Pending<T> = FuturesUnordered<BoxFuture<'static, (usize, NodeResult<T>)>>;

impl Nodes {
    pub(crate) fn new(nodes: Vec<Node>, timeout: Duration) -> Self {
        Nodes { nodes, timeout }
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `request` to every node at once and waits for all answers, each
    /// for at most the per-node timeout. `answers[i]` is node `i`'s.
    pub(crate) async fn ask_all<T, F, Fut>(&self, request: F) -> Vec<NodeResult<T>>
    where
        F: Fn(&Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.ask(|_| true, request)
            .await
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err("not asked".into())))
            .collect()
    }

    /// Like [`ask_all`](Self::ask_all), but returns as soon as `enough`
    /// holds for the answers so far (or all have come). A node that has not
    /// answered by then is `None` in the answers, and its answer is still to
    /// come in the [`Pending`] returned with them.
    pub(crate) async fn ask_all_until<T, F, Fut>(
        &self,
        request: F,
        enough: impl Fn(&[Option<NodeResult<T>>]) -> bool,
    ) -> (Vec<Option<NodeResult<T>>>, Pending<T>)
    where
        F: Fn(&Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let timeout = self.timeout;
        // Every request is built (and a batcher's queued) before any is awaited.
        let mut pending: Pending<T> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let asked = request(node);
                async move { (i, answer_within(timeout, asked).await) }.boxed()
            })
            .collect();
        let mut answers: Vec<Option<NodeResult<T>>> = self.nodes.iter().map(|_| None).collect();
        while let Some((i, answer)) = pending.next().await {
            answers[i] = Some(answer);
            if enough(&answers) {
                break;
            }
        }
        (answers, pending)
    }

    /// Like [`ask_all`](Self::ask_all), for the nodes whose index passes
    /// `which`; the others' answers are `None`.
    pub(crate) async fn ask<T, F, Fut>(
        &self,
        which: impl Fn(usize) -> bool,
        request: F,
    ) -> Vec<Option<NodeResult<T>>>
    where
        F: Fn(&Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let timeout = self.timeout;
        join_all(self.nodes.iter().enumerate().map(|(i, node)| {
            // Build every request before awaiting any: all go out together,
            // and a batcher's requests are queued by the time this is first
            // polled (the give-back of a dropped acquire relies on it).
            let asked = which(i).then(|| request(node));
            async move { Some(answer_within(timeout, asked?).await) }
        }))
        .await
    }
}

/// One node's answer to `asked`, or why there is none within `timeout`.
async fn answer_within<T>(
    timeout: Duration,
    asked: impl Future<Output = redis::RedisResult<T>>,
) -> NodeResult<T> {
    match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(lock_redis_wire::errors::describe(&e)),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}
