//! The node set: per node, a shared, multiplexed connection, and the
//! batcher of acquires and releases (over a connection of its own where the
//! node is reached over plain TCP); and the fan-out that asks every node at
//! once, each bounded by the per-node timeout.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::{Join, Ready, join, ready};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lock_redis_wire::Batcher;
use lock_redis_wire::server::{self, Eviction};
use redis::aio::ConnectionManager;
use tokio::time::{Instant, Sleep};

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

/// What connecting learns of a node that answers.
#[derive(Debug)]
pub(crate) struct Probe {
    /// The server's `run_id` (unknown where `INFO` is refused).
    pub run_id: Option<String>,
    /// Its eviction policy, or why it could not be read.
    pub eviction: NodeResult<Eviction>,
}

impl Node {
    /// Asks the node whether it answers (`PING`), which server it is, and
    /// whether it may evict lock keys. Only an unanswered `PING` fails it:
    /// a node whose ACL refuses the rest still locks.
    pub(crate) fn probe(&self) -> impl Future<Output = redis::RedisResult<Probe>> + use<> {
        let mut c = self.connection.clone();
        async move {
            redis::cmd("PING").query_async::<String>(&mut c).await?;
            let run_id = server::run_id(&mut c).await.ok();
            let eviction = server::eviction(&mut c)
                .await
                .map_err(|e| lock_redis_wire::errors::describe(&e));
            Ok(Probe { run_id, eviction })
        }
    }
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

/// Answers still to come, each with its node's index, all bounded by the
/// per-node timeout counted from when the nodes were asked: one timer for
/// the whole fan-out rather than one per node (at high concurrency, timers
/// per node call were a measurable share of a client's CPU).
pub(crate) struct Pending<F: Future> {
    answers: FuturesUnordered<Join<Ready<usize>, F>>,
    /// Per node: asked, and not accounted for yet.
    waiting: Vec<bool>,
    /// Fires at the deadline; registered with the timer only once awaited.
    /// `None` for a timeout too long for the clock: no deadline at all.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The deadline has passed: what is not in yet will not be waited for.
    expired: bool,
    timeout: Duration,
}

impl<T, F: Future<Output = redis::RedisResult<T>>> Pending<F> {
    fn new(nodes: usize, timeout: Duration, asked: impl Iterator<Item = (usize, F)>) -> Pending<F> {
        // Counted from before any request is built: no node's answer is
        // awaited longer than the timeout.
        let deadline = Instant::now()
            .checked_add(timeout)
            .map(|at| Box::pin(tokio::time::sleep_until(at)));
        let mut waiting = vec![false; nodes];
        let answers = asked
            .map(|(i, request)| {
                waiting[i] = true;
                join(ready(i), request)
            })
            .collect();
        Pending {
            answers,
            waiting,
            deadline,
            expired: false,
            timeout,
        }
    }

    /// The next node's answer, in the order they come. Once the deadline
    /// has passed, the answers already in, then each node still silent, as
    /// "no answer within" (its request dropped). `None` when every asked
    /// node is accounted for.
    pub(crate) async fn next(&mut self) -> Option<(usize, NodeResult<T>)> {
        if !self.expired && !self.answers.is_empty() {
            let answer = match &mut self.deadline {
                Some(deadline) => tokio::select! {
                    biased;
                    answer = self.answers.next() => answer,
                    () = deadline.as_mut() => None,
                },
                None => self.answers.next().await,
            };
            if let Some(answer) = answer {
                return Some(self.answered(answer));
            }
            self.expired = true;
        }
        if let Some(Some(answer)) = self.answers.next().now_or_never() {
            return Some(self.answered(answer));
        }
        self.answers.clear();
        let i = self.waiting.iter().position(|&w| w)?;
        self.waiting[i] = false;
        Some((i, Err(format!("no answer within {:?}", self.timeout))))
    }

    /// Per node, its answer as they come, until `enough` holds for them or
    /// every asked node is accounted for; `None` for a node not asked or
    /// not accounted for yet.
    async fn answers_until(
        &mut self,
        enough: impl Fn(&[Option<NodeResult<T>>]) -> bool,
    ) -> Vec<Option<NodeResult<T>>> {
        let mut answers: Vec<Option<NodeResult<T>>> = self.waiting.iter().map(|_| None).collect();
        while let Some((i, answer)) = self.next().await {
            answers[i] = Some(answer);
            if enough(&answers) {
                break;
            }
        }
        answers
    }

    /// The answers already in, taken without waiting.
    pub(crate) fn ready(&mut self) -> Vec<(usize, NodeResult<T>)> {
        let mut ready = Vec::new();
        while let Some(Some(answer)) = self.answers.next().now_or_never() {
            ready.push(self.answered(answer));
        }
        ready
    }

    fn answered(&mut self, (i, answer): (usize, redis::RedisResult<T>)) -> (usize, NodeResult<T>) {
        self.waiting[i] = false;
        (i, answer.map_err(|e| lock_redis_wire::errors::describe(&e)))
    }

    /// Whether every asked node is accounted for.
    pub(crate) fn is_empty(&self) -> bool {
        !self.waiting.contains(&true)
    }
}

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
    ) -> (Vec<Option<NodeResult<T>>>, Pending<Fut>)
    where
        F: Fn(&Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // Every request is built (and a batcher's queued) before any is awaited.
        let asked = self.nodes.iter().map(request).enumerate();
        let mut pending = Pending::new(self.nodes.len(), self.timeout, asked);
        let answers = pending.answers_until(enough).await;
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
        // Build every request before awaiting any: all go out together, and
        // a batcher's requests are queued by the time this is first polled
        // (the give-back of a dropped acquire relies on it).
        let asked = (self.nodes.iter().enumerate())
            .filter(|&(i, _)| which(i))
            .map(|(i, node)| (i, request(node)));
        Pending::new(self.nodes.len(), self.timeout, asked)
            .answers_until(|_| false)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future::BoxFuture;

    type Asked = BoxFuture<'static, redis::RedisResult<u8>>;

    fn answers_after(ms: u64, value: u8) -> Asked {
        async move {
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Ok(value)
        }
        .boxed()
    }

    fn never_answers() -> Asked {
        std::future::pending().boxed()
    }

    #[tokio::test(start_paused = true)]
    async fn one_deadline_bounds_every_node_and_answers_come_first() {
        let timeout = Duration::from_millis(500);
        let start = Instant::now();
        let asked = [
            (0, answers_after(0, 10)),
            (1, never_answers()),
            (2, answers_after(100, 12)),
            (3, never_answers()),
        ];
        let mut pending = Pending::new(4, timeout, asked.into_iter());
        assert_eq!(pending.next().await, Some((0, Ok(10))));
        assert_eq!(pending.next().await, Some((2, Ok(12))));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert!(!pending.is_empty());
        let silent = format!("no answer within {timeout:?}");
        assert_eq!(pending.next().await, Some((1, Err(silent.clone()))));
        assert_eq!(start.elapsed(), timeout);
        assert!(!pending.is_empty(), "node 3 is not accounted for yet");
        assert_eq!(pending.next().await, Some((3, Err(silent))));
        assert!(pending.is_empty());
        assert_eq!(pending.next().await, None);
        assert_eq!(
            start.elapsed(),
            timeout,
            "no node is waited for past the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_in_before_a_late_look_are_not_lost_at_the_deadline() {
        // As the late answers of an acquire that returned at a majority:
        // looked at again only after the deadline has passed.
        let timeout = Duration::from_millis(50);
        let asked = [(0, never_answers()), (1, answers_after(0, 11))];
        let mut pending = Pending::new(2, timeout, asked.into_iter());
        tokio::time::sleep(timeout * 4).await;
        assert_eq!(pending.next().await, Some((1, Ok(11))));
        let silent = format!("no answer within {timeout:?}");
        assert_eq!(pending.next().await, Some((0, Err(silent))));
        assert!(pending.is_empty());
        assert_eq!(pending.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_too_long_for_the_clock_waits_without_a_deadline() {
        let asked = [(0, answers_after(1_000, 7))];
        let mut pending = Pending::new(1, Duration::MAX, asked.into_iter());
        assert_eq!(pending.next().await, Some((0, Ok(7))));
        assert_eq!(pending.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn ready_takes_the_answers_in_and_leaves_the_rest_to_come() {
        let asked = [
            (0, answers_after(0, 1)),
            (1, answers_after(10, 2)),
            (2, answers_after(0, 3)),
        ];
        let mut pending = Pending::new(3, Duration::from_millis(50), asked.into_iter());
        let mut ready = pending.ready();
        ready.sort_by_key(|(i, _)| *i);
        assert_eq!(ready, [(0, Ok(1)), (2, Ok(3))]);
        assert!(!pending.is_empty(), "node 1 has not answered yet");
        assert_eq!(pending.ready(), [], "nothing more is in");
        assert_eq!(pending.next().await, Some((1, Ok(2))));
        assert!(pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn ready_takes_an_answer_that_came_after_it_was_waited_for() {
        // As after a majority: the late node was polled (and not ready)
        // while the others were awaited, and answers while nobody looks.
        // Node 1 is asked first, so it is polled before node 0 answers.
        let late = tokio::time::sleep(Duration::from_millis(10));
        let asked = [
            (
                1,
                async move {
                    late.await;
                    Ok(2)
                }
                .boxed(),
            ),
            (0, answers_after(0, 1)),
        ];
        let mut pending = Pending::new(2, Duration::from_millis(50), asked.into_iter());
        assert_eq!(pending.next().await, Some((0, Ok(1))));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(pending.ready(), [(1, Ok(2))]);
        assert!(pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_not_asked_are_never_reported() {
        let asked = [(0, answers_after(5, 1)), (2, never_answers())];
        let mut pending = Pending::new(3, Duration::from_millis(50), asked.into_iter());
        let mut reported = Vec::new();
        while let Some((i, answer)) = pending.next().await {
            reported.push((i, answer.is_ok()));
        }
        assert_eq!(reported, [(0, true), (2, false)]);
    }
}
