//! Wake-ups: a release message from ANY node wakes a waiter of its key.
//!
//! Each release wakes ONE waiter, the one waiting longest: a release frees
//! the lock for one new holder, and waking all would have every other
//! waiter send a refused attempt to every node (a herd). A release is
//! published on every node where its grant was marked as waited for (see
//! lock-redis-wire's batch script), with the grant's fencing token as the
//! message.
//! The first node to tell of a release wakes one waiter; so does the node
//! that makes it a majority, in case the first waiter's attempt reached
//! most nodes before the release did (a waiter in another process) and was
//! refused. The other nodes' messages, and older tokens (tokens of a key
//! increase), wake nobody. A message without a token (an operator's force
//! release, a clean-up after a failed acquire) wakes one waiter.
//!
//! Subscriptions: one task per node holds that node's pub/sub connection
//! and keeps its subscriptions in line with the waiters: a channel is
//! subscribed while a waiter of this backend waits on it, and unsubscribed
//! once none does. A wait's rounds each take a wake-up of their own, and
//! the next round registers before the last one's departure is acted on
//! (a task spawned then looks again), so one acquire subscribes once per
//! node, however many rounds it waits.
//!
//! A waiter's wake-up is in place once a majority of the nodes listens on
//! its channel: a held lock is held by a majority, whose releases publish,
//! so at least one node that listens tells of its release. A node that does
//! not answer (paused, cut off) holds no waiter back; it subscribes when it
//! answers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::WakeUpFuture;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, mpsc};

/// The pause before dialling a node again after its pub/sub connection
/// failed, doubling up to [`REDIAL_MAX`] while the failures go on.
const REDIAL: Duration = Duration::from_millis(50);
const REDIAL_MAX: Duration = Duration::from_secs(2);

/// What the waiters want and what the nodes have, shared by all of them.
#[derive(Debug, Default)]
struct Shared {
    interest: Mutex<Interest>,
    /// A node's subscription to some channel changed (see [`Listening`]).
    changed: Notify,
    /// Commands sent to the nodes' tasks and not yet taken.
    queued: AtomicUsize,
}

#[derive(Debug, Default)]
struct Interest {
    channels: HashMap<String, Channel>,
}

/// A channel with waiters, or with subscriptions still to undo.
#[derive(Debug)]
struct Channel {
    waiters: usize,
    /// Wakes one waiter per release, from whichever node tells first.
    released: Arc<Notify>,
    /// The highest fencing token a release message carried...
    newest: u64,
    /// ... and the nodes that told of it, one bit each.
    told: u64,
    /// Per node, where its subscription stands.
    nodes: Vec<Listening>,
    /// The last waiter left, and a task is to look again (see [`close`]).
    closing: bool,
}

/// Where one node's subscription to a channel stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listening {
    /// Not subscribed, nor asked to be.
    Off,
    /// The node's task is on it: it subscribes or unsubscribes as the
    /// waiters then want, and is not counted on meanwhile.
    Settling,
    /// Subscribed: the node's release messages arrive.
    On,
    /// The node could not be reached; its task dials again while the
    /// channel is wanted.
    Failed,
}

impl Channel {
    fn new(nodes: usize) -> Channel {
        Channel {
            waiters: 0,
            released: Arc::new(Notify::new()),
            newest: 0,
            told: 0,
            nodes: vec![Listening::Off; nodes],
            closing: false,
        }
    }

    /// Whether no waiter and no node needs the entry any more.
    fn is_done(&self) -> bool {
        self.waiters == 0 && !self.closing && self.nodes.iter().all(|n| *n == Listening::Off)
    }

    /// Node `node` (of `nodes`) published `message` on this channel: wakes
    /// one waiter for the first and the majority-making node of a release.
    /// Returns whether it woke one.
    fn release_message(&mut self, message: &[u8], node: usize, nodes: usize) -> bool {
        let token = std::str::from_utf8(message)
            .ok()
            .and_then(|m| m.parse::<u64>().ok())
            .unwrap_or(0);
        let bit = 1u64 << (node % 64);
        let wake = match token {
            0 => true,
            t if t > self.newest => {
                (self.newest, self.told) = (t, bit);
                true
            }
            t if t == self.newest && self.told & bit == 0 => {
                self.told |= bit;
                self.told.count_ones() as usize == crate::quorum(nodes)
            }
            _ => false,
        };
        if wake {
            self.released.notify_one();
        }
        wake
    }
}

/// What a node's task is asked to do.
#[derive(Debug)]
enum Command {
    /// Bring the node's subscription to the channel in line with its waiters.
    Settle(String),
}

/// The pub/sub connections of all nodes, shared by all waiters.
#[derive(Debug, Clone)]
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    nodes: Arc<Vec<mpsc::UnboundedSender<Command>>>,
    node_timeout: Duration,
}

impl Wakeups {
    /// Starts one subscriber task per node (connecting lazily, on the first
    /// subscription). Must be called within a tokio runtime.
    pub(crate) fn start(
        clients: Vec<redis::Client>,
        node_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let count = clients.len();
        let nodes = clients
            .into_iter()
            .enumerate()
            .map(|(node, client)| {
                let (tx, rx) = mpsc::unbounded_channel();
                let task = NodeTask {
                    client,
                    node,
                    nodes: count,
                    shared: Arc::downgrade(&shared),
                    commands: rx,
                    connect_timeout,
                };
                tokio::spawn(task.run());
                tx
            })
            .collect();
        Wakeups {
            shared,
            nodes: Arc::new(nodes),
            node_timeout,
        }
    }

    /// Whether a waiter of this backend waits on `channel`: an acquire of
    /// its lock then marks its grant, so that the grant's release publishes
    /// and wakes the next waiter.
    pub(crate) fn is_waited_for(&self, channel: &str) -> bool {
        lock(&self.shared.interest)
            .channels
            .get(channel)
            .is_some_and(|c| c.waiters > 0)
    }

    /// Registers a waiter on `channel`, has every node that does not listen
    /// on it subscribe, and returns once a majority listens (or every node
    /// has answered, or the per-node timeout has passed: the subscriptions
    /// still to come count once they come).
    pub(crate) async fn on_release(&self, channel: String) -> Option<WakeUpFuture> {
        let (mut released, settle) = {
            let mut interest = lock(&self.shared.interest);
            let entry = interest
                .channels
                .entry(channel.clone())
                .or_insert_with(|| Channel::new(self.nodes.len()));
            entry.waiters += 1;
            let released = Box::pin(entry.released.clone().notified_owned());
            // The other nodes listen, or their task is on it and finds the
            // channel wanted, or it dials again on its own.
            let settle: Vec<usize> = (0..entry.nodes.len())
                .filter(|&i| entry.nodes[i] == Listening::Off)
                .collect();
            for &i in &settle {
                entry.nodes[i] = Listening::Settling;
            }
            (released, settle)
        };
        // In line from now: a release message from a node that listens counts.
        released.as_mut().enable();
        let registration = Registration {
            wakeups: self.clone(),
            channel: channel.clone(),
        };
        for i in settle {
            self.shared.queued.fetch_add(1, Ordering::Relaxed);
            let _ = self.nodes[i].send(Command::Settle(channel.clone()));
        }
        let _ = tokio::time::timeout(self.node_timeout, self.majority_listens(&channel)).await;
        Some(Box::pin(async move {
            let _registration = registration;
            released.await;
        }))
    }

    /// How many channels have an entry, and how many commands wait for the
    /// nodes' tasks.
    pub(crate) fn backlog(&self) -> (usize, usize) {
        let channels = lock(&self.shared.interest).channels.len();
        (channels, self.shared.queued.load(Ordering::Relaxed))
    }

    /// Returns once a majority of the nodes listens on `channel`, or every
    /// node has either subscribed or failed.
    async fn majority_listens(&self, channel: &str) {
        let quorum = crate::quorum(self.nodes.len());
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let interest = lock(&self.shared.interest);
                let Some(entry) = interest.channels.get(channel) else {
                    return;
                };
                let count = |state| entry.nodes.iter().filter(|n| **n == state).count();
                let on = count(Listening::On);
                if on >= quorum || on + count(Listening::Failed) == entry.nodes.len() {
                    return;
                }
            }
            changed.await;
        }
    }
}

/// Keeps a channel subscribed while its waiter's future lives.
struct Registration {
    wakeups: Wakeups,
    channel: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut interest = lock(&self.wakeups.shared.interest);
        let Some(entry) = interest.channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters > 0 || entry.closing {
            return;
        }
        entry.closing = true;
        drop(interest);
        let close = close(
            Arc::downgrade(&self.wakeups.shared),
            self.wakeups.nodes.clone(),
            self.channel.clone(),
        );
        // Spawned, not run here: a wait's next round registers first (it
        // runs on in this same poll), and the task then finds the channel
        // wanted again.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(close)),
            Err(_) => futures_util::FutureExt::now_or_never(close).unwrap_or(()),
        }
    }
}

/// After the last waiter of `channel` left: unless another waiter has come
/// since, has every node that may listen unsubscribe.
async fn close(
    shared: Weak<Shared>,
    nodes: Arc<Vec<mpsc::UnboundedSender<Command>>>,
    channel: String,
) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let settle = {
        let mut interest = lock(&shared.interest);
        let Some(entry) = interest.channels.get_mut(&channel) else {
            return;
        };
        entry.closing = false;
        if entry.waiters > 0 {
            return;
        }
        // A node already settling looks at the waiters when it gets to it.
        let mut settle = Vec::new();
        for (i, state) in entry.nodes.iter_mut().enumerate() {
            if matches!(state, Listening::On | Listening::Failed) {
                *state = Listening::Settling;
                settle.push(i);
            }
        }
        if entry.is_done() {
            interest.channels.remove(&channel);
        }
        settle
    };
    for i in settle {
        shared.queued.fetch_add(1, Ordering::Relaxed);
        let _ = nodes[i].send(Command::Settle(channel.clone()));
    }
}

fn lock(interest: &Mutex<Interest>) -> MutexGuard<'_, Interest> {
    // Every update is a single insert, remove or change of a field: a
    // panic elsewhere cannot leave the map inconsistent.
    interest.lock().unwrap_or_else(|p| p.into_inner())
}

/// One node's pub/sub connection, driven until the backend is dropped.
struct NodeTask {
    client: redis::Client,
    /// This node's index, and how many there are.
    node: usize,
    nodes: usize,
    shared: Weak<Shared>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Bounds a dial, and the answer to a SUBSCRIBE or UNSUBSCRIBE: a node
    /// that leaves one unanswered this long counts as disconnected.
    connect_timeout: Duration,
}

/// Why a connection ended.
enum Ended {
    /// It broke, or a node left a request unanswered.
    Broken,
    /// The backend is gone.
    Shutdown,
}

impl NodeTask {
    async fn run(mut self) {
        let mut redial = REDIAL;
        loop {
            // Not connected: connect only when somebody waits, so that idle
            // backends hold no pub/sub connection. A new subscription
            // connects at once; channels still wanted after a failure,
            // after a pause.
            let Some(wanted) = self.off_where_unwanted() else {
                return;
            };
            if wanted {
                tokio::select! {
                    command = self.next_command() => if command.is_none() { return },
                    () = tokio::time::sleep(redial) => {}
                }
            } else if self.next_command().await.is_none() {
                return;
            }
            // Asked to undo a subscription, which went with the connection.
            if self.off_where_unwanted() != Some(true) {
                continue;
            }
            let pubsub =
                match tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
                    .await
                {
                    Ok(Ok(pubsub)) => pubsub,
                    _ => {
                        self.failed();
                        redial = (redial * 2).min(REDIAL_MAX);
                        continue;
                    }
                };
            let (mut sink, mut messages) = pubsub.split();
            let mut on_server = HashSet::new();
            let channels: Vec<String> = match self.shared.upgrade() {
                Some(shared) => lock(&shared.interest).channels.keys().cloned().collect(),
                None => return,
            };
            let mut healthy = true;
            for channel in &channels {
                healthy = self.settle(&mut sink, &mut on_server, channel).await;
                if !healthy {
                    break;
                }
            }
            if !healthy {
                // A node that connects but does not subscribe is dialled slowly.
                self.failed();
                redial = (redial * 2).min(REDIAL_MAX);
                continue;
            }
            redial = REDIAL;
            match self.serve(&mut sink, &mut messages, &mut on_server).await {
                Ended::Shutdown => return,
                Ended::Broken => {
                    self.failed();
                    // Release messages may have been missed: every waiter
                    // tries again rather than sleep out its backoff.
                    self.wake_everyone();
                }
            }
        }
    }

    /// The next command, once one comes; `None` once the backend is gone.
    async fn next_command(&mut self) -> Option<Command> {
        let command = self.commands.recv().await;
        if let (Some(_), Some(shared)) = (&command, self.shared.upgrade()) {
            shared.queued.fetch_sub(1, Ordering::Relaxed);
        }
        command
    }

    /// Subscribes and unsubscribes as asked, and hands release messages to
    /// the waiters, until the connection breaks or the backend is gone.
    async fn serve(
        &mut self,
        sink: &mut PubSubSink,
        messages: &mut PubSubStream,
        on_server: &mut HashSet<String>,
    ) -> Ended {
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { return Ended::Broken };
                    let Some(shared) = self.shared.upgrade() else { return Ended::Shutdown };
                    if let Some(entry) = lock(&shared.interest).channels.get_mut(message.get_channel_name()) {
                        entry.release_message(message.get_payload_bytes(), self.node, self.nodes);
                    }
                }
                command = self.next_command() => match command {
                    None => return Ended::Shutdown,
                    Some(Command::Settle(channel)) => {
                        if !self.settle(sink, on_server, &channel).await {
                            return Ended::Broken;
                        }
                    }
                },
            }
        }
    }

    /// Subscribes to `channel` while it has waiters, or unsubscribes once it
    /// has none, until the server agrees with the waiters; then says so in
    /// the channel's entry. False when the connection is no good.
    async fn settle(
        &self,
        sink: &mut PubSubSink,
        on_server: &mut HashSet<String>,
        channel: &str,
    ) -> bool {
        loop {
            let Some(shared) = self.shared.upgrade() else {
                return false;
            };
            let wanted = lock(&shared.interest)
                .channels
                .get(channel)
                .is_some_and(|c| c.waiters > 0);
            let on = on_server.contains(channel);
            if wanted == on {
                let state = if on { Listening::On } else { Listening::Off };
                self.set(&shared, channel, state);
                return true;
            }
            // Not counted on while the request is on its way; a waiter that
            // comes or goes meanwhile is seen on the next turn.
            self.set(&shared, channel, Listening::Settling);
            drop(shared);
            let request = async {
                if wanted {
                    sink.subscribe(channel).await
                } else {
                    sink.unsubscribe(channel).await
                }
            };
            match tokio::time::timeout(self.connect_timeout, request).await {
                Ok(Ok(())) if wanted => on_server.insert(channel.to_owned()),
                Ok(Ok(())) => on_server.remove(channel),
                _ => return false,
            };
        }
    }

    /// Sets this node's state for `channel`, drops an entry nobody needs,
    /// and tells those waiting for subscriptions.
    fn set(&self, shared: &Shared, channel: &str, state: Listening) {
        let mut interest = lock(&shared.interest);
        if let Some(entry) = interest.channels.get_mut(channel) {
            entry.nodes[self.node] = state;
            if entry.is_done() {
                interest.channels.remove(channel);
            }
        }
        drop(interest);
        shared.changed.notify_waiters();
    }

    /// Without a connection this node listens on nothing: the channels no
    /// waiter wants are off here. Returns whether any channel is wanted;
    /// `None` once the backend is gone.
    fn off_where_unwanted(&self) -> Option<bool> {
        self.mark(|state| state)
    }

    /// The connection failed or broke: the channels with waiters fail here
    /// until the node is reached again (so that nobody waits for this
    /// node's subscription), the others are off.
    fn failed(&self) {
        self.mark(|_| Listening::Failed);
    }

    /// Sets this node's state of each channel with waiters to `wanted(its
    /// state)`, and of the others to off; returns whether any channel has
    /// waiters.
    fn mark(&self, wanted: impl Fn(Listening) -> Listening) -> Option<bool> {
        let shared = self.shared.upgrade()?;
        let mut interest = lock(&shared.interest);
        let mut any = false;
        interest.channels.retain(|_, entry| {
            let state = &mut entry.nodes[self.node];
            if entry.waiters > 0 {
                *state = wanted(*state);
                any = true;
            } else {
                *state = Listening::Off;
            }
            !entry.is_done()
        });
        drop(interest);
        shared.changed.notify_waiters();
        Some(any)
    }

    /// Wakes every waiter.
    fn wake_everyone(&self) {
        if let Some(shared) = self.shared.upgrade() {
            for entry in lock(&shared.interest).channels.values() {
                entry.released.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lock_testkit::{RedisOptions, RedisServer};
    use tokio::time::timeout;

    use super::*;

    fn subscribers(server: &RedisServer, channel: &str) -> String {
        let reply = server.cli(&["PUBSUB", "NUMSUB", channel]).unwrap();
        reply.lines().nth(1).unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_disconnection_wakes_the_waiters_and_resubscribes_what_is_still_wanted() {
        let server = RedisServer::start().expect("start redis");
        let client = redis::Client::open(server.url()).unwrap();
        let wakeups = Wakeups::start(vec![client], Duration::from_secs(5), Duration::from_secs(5));
        let first = wakeups.on_release("ch".into()).await.expect("subscribed");
        let second = wakeups.on_release("ch".into()).await.expect("subscribed");
        assert_eq!(subscribers(&server, "ch"), "1");
        assert_eq!(
            server.command_calls("subscribe").unwrap(),
            1,
            "the second waiter subscribed again a channel already subscribed"
        );

        server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
        timeout(Duration::from_secs(5), first)
            .await
            .expect("the disconnection woke no waiter");
        // `second` still waits: its channel comes back without a new subscriber.
        timeout(Duration::from_secs(5), async {
            while subscribers(&server, "ch") != "1" {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the channel was not resubscribed after the disconnection");
        drop(second);
    }

    /// The waiter is still waiting 300 ms later.
    async fn still_waits(waiter: &mut WakeUpFuture) -> bool {
        timeout(Duration::from_millis(300), waiter).await.is_err()
    }

    #[tokio::test]
    async fn a_release_wakes_one_waiter_however_many_nodes_tell_it() {
        let server = RedisServer::start().expect("start redis");
        let client = redis::Client::open(server.url()).unwrap();
        let wakeups = Wakeups::start(vec![client], Duration::from_secs(5), Duration::from_secs(5));
        let mut first = wakeups.on_release("ch".into()).await.expect("subscribed");
        let mut second = wakeups.on_release("ch".into()).await.expect("subscribed");

        // The release of the grant with token 42, as one node tells it...
        server.cli(&["PUBLISH", "ch", "42"]).unwrap();
        timeout(Duration::from_secs(5), &mut first)
            .await
            .expect("the release message woke nobody");
        assert!(
            still_waits(&mut second).await,
            "one release woke both waiters"
        );
        // ... and as another node tells it.
        server.cli(&["PUBLISH", "ch", "42"]).unwrap();
        assert!(
            still_waits(&mut second).await,
            "one release told by two nodes woke two waiters"
        );
        server.cli(&["PUBLISH", "ch", "43"]).unwrap();
        timeout(Duration::from_secs(5), &mut second)
            .await
            .expect("the next release did not wake the other waiter");

        // A message without a token (an operator's force release) wakes one.
        let third = wakeups.on_release("ch".into()).await.expect("subscribed");
        server.cli(&["PUBLISH", "ch", "released"]).unwrap();
        timeout(Duration::from_secs(5), third)
            .await
            .expect("a force release woke nobody");
    }

    /// A node that refuses every connection is dialled at the pace of the
    /// redial pause, not once per waiter: 200 waiters come and go while it
    /// refuses, far more than the pauses of the test's run allow dials.
    #[tokio::test]
    async fn a_node_refusing_connections_is_not_dialled_once_per_waiter() {
        let options = RedisOptions {
            extra_args: vec!["--maxclients".into(), "1".into()],
            ..RedisOptions::default()
        };
        let server = RedisServer::start_with(options).expect("start redis");
        let client = redis::Client::open(server.url()).unwrap();
        // The one client the server takes: it refuses the others.
        let mut only = client.get_multiplexed_async_connection().await.unwrap();
        let wakeups = Wakeups::start(vec![client], Duration::from_secs(5), Duration::from_secs(5));
        for i in 0..200 {
            drop(wakeups.on_release(format!("ch{i}")).await);
        }
        timeout(Duration::from_secs(60), async {
            while wakeups.backlog() != (0, 0) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the waiters' entries stayed");
        let stats: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut only)
            .await
            .unwrap();
        let refused: u64 = (stats.lines())
            .find_map(|l| l.strip_prefix("rejected_connections:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("rejected_connections in INFO stats");
        assert!(
            (1..=20).contains(&refused),
            "{refused} dials for 200 waiters"
        );
    }

    #[test]
    fn a_release_wakes_at_its_first_and_its_majority_making_node() {
        let mut channel = Channel::new(5);
        channel.waiters = 1;
        let mut tell = |message: &str, node| channel.release_message(message.as_bytes(), node, 5);
        let woke: Vec<bool> = [("7", 0), ("7", 1), ("7", 1), ("7", 2), ("7", 3), ("7", 4)]
            .into_iter()
            .map(|(m, node)| tell(m, node))
            .collect();
        assert_eq!(
            woke,
            [true, false, false, true, false, false],
            "token 7 from nodes 0, 1, 1 again, 2 (the third: a majority), 3, 4"
        );
        assert!(!tell("6", 0), "an older release woke a waiter");
        assert!(tell("8", 3), "the next release woke nobody");
        assert!(tell("released", 1), "a message without a token woke nobody");
    }
}
