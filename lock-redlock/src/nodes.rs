//! The node set: one shared, multiplexed connection per node, and the
//! fan-out that asks every node at once, each bounded by the per-node timeout.

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use lock_redis_wire::Batcher;
use redis::aio::ConnectionManager;

/// One Redis master of the set.
#[derive(Clone)]
pub(crate) struct Node {
    /// `host:port`, without credentials: safe for errors and logs.
    pub endpoint: String,
    /// Multiplexed and self-reconnecting; clones share the one connection.
    pub connection: ConnectionManager,
    /// Acquires and releases over `connection`, coalesced across callers and
    /// kept in order. Both go through it, so that a release never overtakes
    /// the acquire it cleans up after.
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
            async move {
                let asked = asked?;
                Some(match tokio::time::timeout(timeout, asked).await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(e)) => Err(lock_redis_wire::errors::describe(&e)),
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                })
            }
        }))
        .await
    }
}
