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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use lock_core::WakeUpFuture;
use tokio::sync::{Notify, mpsc, oneshot};

/// The waiters' side: which channels are wanted, and a way to wake them.
#[derive(Debug, Default)]
struct Interest {
    channels: HashMap<String, Channel>,
}

#[derive(Debug)]
struct Channel {
    waiters: usize,
    /// Wakes one waiter per release, from whichever node tells first.
    released: Arc<Notify>,
    /// The highest fencing token a release message carried...
    newest: u64,
    /// ... and the nodes that told of it, one bit each.
    told: u64,
    /// Every node confirmed the subscription and none disconnected since:
    /// a new waiter needs no subscribe round of its own.
    subscribed: bool,
}

impl Channel {
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

#[derive(Debug)]
enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

/// The pub/sub connections of all nodes, shared by all waiters.
#[derive(Debug, Clone)]
pub(crate) struct Wakeups {
    interest: Arc<Mutex<Interest>>,
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
        let interest = Arc::new(Mutex::new(Interest::default()));
        let count = clients.len();
        let nodes = clients
            .into_iter()
            .enumerate()
            .map(|(node, client)| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(subscriber(
                    client,
                    (node, count),
                    Arc::downgrade(&interest),
                    rx,
                    connect_timeout,
                ));
                tx
            })
            .collect();
        Wakeups {
            interest,
            nodes: Arc::new(nodes),
            node_timeout,
        }
    }

    /// Whether a waiter of this backend waits on `channel`: an acquire of
    /// its lock then marks its grant, so that the grant's release publishes
    /// and wakes the next waiter.
    pub(crate) fn is_waited_for(&self, channel: &str) -> bool {
        lock(&self.interest)
            .channels
            .get(channel)
            .is_some_and(|c| c.waiters > 0)
    }

    /// Registers a waiter on `channel` and subscribes it on every node,
    /// waiting at most the per-node timeout for each confirmation. `None`
    /// when no node confirmed (the waiter then polls).
    pub(crate) async fn on_release(&self, channel: String) -> Option<WakeUpFuture> {
        let (mut released, subscribed) = {
            let mut interest = lock(&self.interest);
            let entry = interest
                .channels
                .entry(channel.clone())
                .or_insert_with(|| Channel {
                    waiters: 0,
                    released: Arc::new(Notify::new()),
                    newest: 0,
                    told: 0,
                    subscribed: false,
                });
            entry.waiters += 1;
            let released = Box::pin(entry.released.clone().notified_owned());
            (released, entry.subscribed)
        };
        // In line from now: a message while the subscriptions are confirmed counts.
        released.as_mut().enable();
        let registration = Registration {
            wakeups: self.clone(),
            channel: channel.clone(),
        };
        if subscribed {
            // Another waiter of this backend keeps the channel subscribed
            // everywhere (each round of a wait registers anew).
            return Some(Box::pin(async move {
                let _registration = registration;
                released.await;
            }));
        }
        let confirmations = self.nodes.iter().map(|node| {
            let (ack, confirmed) = oneshot::channel();
            let sent = node.send(Command::Subscribe(channel.clone(), ack)).is_ok();
            async move {
                sent && tokio::time::timeout(self.node_timeout, confirmed)
                    .await
                    .is_ok_and(|r| r.is_ok())
            }
        });
        let confirmed = join_all(confirmations)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        if confirmed == 0 {
            return None;
        }
        if confirmed == self.nodes.len()
            && let Some(entry) = lock(&self.interest).channels.get_mut(&channel)
        {
            entry.subscribed = true;
        }
        Some(Box::pin(async move {
            let _registration = registration;
            released.await;
        }))
    }
}

/// Keeps a channel subscribed while its waiter's future lives.
struct Registration {
    wakeups: Wakeups,
    channel: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut interest = lock(&self.wakeups.interest);
        let Some(entry) = interest.channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            interest.channels.remove(&self.channel);
            for node in self.wakeups.nodes.iter() {
                let _ = node.send(Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

fn lock(interest: &Mutex<Interest>) -> MutexGuard<'_, Interest> {
    // Every update is a single insert, remove or counter change: a panic
    // elsewhere cannot leave the map inconsistent.
    interest.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wakes every waiter: after a disconnection messages may have been
/// missed, so each waiter attempts again rather than sleep out its backoff.
fn wake_everyone(interest: &std::sync::Weak<Mutex<Interest>>) {
    if let Some(interest) = interest.upgrade() {
        for entry in lock(&interest).channels.values_mut() {
            // Resubscribed on reconnection; until a waiter sees it confirmed,
            // new waiters subscribe themselves.
            entry.subscribed = false;
            entry.released.notify_waiters();
        }
    }
}

/// Drives one node's pub/sub connection until the backend is dropped.
/// `(node, nodes)`: this node's index, and how many there are.
async fn subscriber(
    client: redis::Client,
    (node, nodes): (usize, usize),
    interest: std::sync::Weak<Mutex<Interest>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    connect_timeout: Duration,
) {
    let mut retry = Duration::from_millis(50);
    loop {
        // Connect only when somebody waits: idle backends hold no pub/sub
        // connection. A new subscription connects at once; channels still
        // wanted after a disconnection or a failed connect, after `retry`.
        let wanted = match interest.upgrade() {
            Some(i) => !lock(&i).channels.is_empty(),
            None => return,
        };
        let command = if wanted {
            tokio::select! {
                command = commands.recv() => Some(command),
                () = tokio::time::sleep(retry) => None,
            }
        } else {
            Some(commands.recv().await)
        };
        let first = match command {
            Some(None) => return,
            Some(Some(Command::Unsubscribe(_))) => continue,
            Some(Some(Command::Subscribe(channel, ack))) => Some((channel, ack)),
            None => None,
        };
        let pubsub = match tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => pubsub,
            _ => {
                // Dropping the acknowledgement tells the new waiter to poll.
                drop(first);
                retry = (retry * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let (mut sink, mut messages) = pubsub.split();
        let wanted: Vec<String> = match interest.upgrade() {
            Some(i) => lock(&i).channels.keys().cloned().collect(),
            None => return,
        };
        let mut healthy = true;
        for channel in &wanted {
            healthy &= sink.subscribe(channel).await.is_ok();
        }
        // A node that connects but refuses to subscribe is retried slowly.
        retry = if healthy {
            Duration::from_millis(50)
        } else {
            (retry * 2).min(Duration::from_secs(2))
        };
        // The new waiter's channel is among those just subscribed, unless it
        // has left meanwhile.
        if let Some((channel, ack)) = first
            && healthy
            && (wanted.contains(&channel) || sink.subscribe(&channel).await.is_ok())
        {
            let _ = ack.send(());
        }
        while healthy {
            tokio::select! {
                message = messages.next() => match message {
                    None => healthy = false,
                    Some(message) => {
                        let Some(interest) = interest.upgrade() else { return };
                        if let Some(entry) = lock(&interest).channels.get_mut(message.get_channel_name()) {
                            entry.release_message(message.get_payload_bytes(), node, nodes);
                        }
                    }
                },
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(channel, ack)) => {
                        healthy = sink.subscribe(&channel).await.is_ok();
                        if healthy {
                            let _ = ack.send(());
                        }
                    }
                    Some(Command::Unsubscribe(channel)) => {
                        let Some(interest) = interest.upgrade() else { return };
                        let unused = !lock(&interest).channels.contains_key(&channel);
                        if unused {
                            healthy = sink.unsubscribe(&channel).await.is_ok();
                        }
                    }
                },
            }
        }
        wake_everyone(&interest);
    }
}

#[cfg(test)]
mod tests {
    use lock_testkit::RedisServer;
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

    #[test]
    fn a_release_wakes_at_its_first_and_its_majority_making_node() {
        let mut channel = Channel {
            waiters: 1,
            released: Arc::new(Notify::new()),
            newest: 0,
            told: 0,
            subscribed: true,
        };
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
