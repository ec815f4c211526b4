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
//! node, however many rounds it waits. Waiters mark the channels a node's
//! task is to look at, in a set: however many come and go, the task has at
//! most one look per channel to take.
//!
//! A waiter's wake-up is in place once a majority of the nodes listens on
//! its channel: a held lock is held by a majority, whose releases publish,
//! so a node that listens tells of its release. Usually in time, not
//! always: when fewer than a majority of the nodes both listen and hold
//! the lock, the first message may wake the waiter before the other holders
//! have deleted the grant; its attempt is refused there, no majority-making
//! message follows, and the wait sleeps out its backoff. Latency rests on
//! the wake-ups; liveness on the polling.
//!
//! A node that does not answer (paused, cut off) holds no waiter back; it
//! subscribes when it answers. A dial, and the answer to a SUBSCRIBE, wait
//! at most the connect timeout and never more than [`PATIENCE_MAX`]; a node
//! that has not answered by then is down: new waiters do not count on it
//! (so their entries go with them), and it is dialled again after a pause
//! that no waiter shortens.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::raw::WakeUpFuture;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The pause before dialling a node again after its pub/sub connection
/// failed, doubling up to [`REDIAL_MAX`] while the failures go on.
const REDIAL: Duration = Duration::from_millis(50);
const REDIAL_MAX: Duration = Duration::from_secs(2);

/// The longest a dial or a SUBSCRIBE may go unanswered, whatever the
/// connect timeout: until then a hung node keeps its channels' entries.
const PATIENCE_MAX: Duration = Duration::from_secs(5);

/// What the waiters want and what the nodes have, shared by all of them.
#[derive(Debug)]
struct Shared {
    interest: Mutex<Interest>,
    /// A node's subscription to some channel changed (see [`Listening`]).
    changed: Notify,
    /// Per node, tells its task to look: at its marked channels, or at
    /// whether the backend is gone.
    signals: Vec<Arc<Notify>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The tasks hold no strong reference, and may be waiting for a signal.
        for signal in &self.signals {
            signal.notify_one();
        }
    }
}

#[derive(Debug)]
struct Interest {
    channels: HashMap<String, Channel>,
    /// Per node, its task's connection.
    links: Vec<Link>,
}

/// One node's pub/sub connection, as the waiters see it.
#[derive(Debug, Default)]
struct Link {
    state: LinkState,
    /// While up: the channels its task is to bring in line with their waiters.
    marked: HashSet<String>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    /// Not connected yet: the task dials as soon as a channel is wanted.
    #[default]
    Idle,
    /// Connected: the task subscribes as the waiters want.
    Up,
    /// The last dial or connection failed: the task dials again after a
    /// pause while channels are wanted.
    Down,
}

impl Link {
    /// A waiter came to `channel`, where this node does not listen: where
    /// its subscription stands meanwhile.
    fn subscribe(&mut self, channel: &str) -> Listening {
        match self.state {
            LinkState::Up => {
                self.marked.insert(channel.to_owned());
                Listening::Settling
            }
            // Subscribed once connected, within a dial's patience.
            LinkState::Idle => Listening::Settling,
            // Not counted on, so a node that stays down keeps no entry.
            LinkState::Down => Listening::Failed,
        }
    }

    /// The last waiter of `channel` left, whose subscription here stood at
    /// `state`: where it stands now.
    fn unsubscribe(&mut self, channel: &str, state: Listening) -> Listening {
        match (state, self.state) {
            (Listening::On | Listening::Failed, LinkState::Up) => {
                self.marked.insert(channel.to_owned());
                Listening::Settling
            }
            // Without a connection nothing is subscribed.
            (Listening::On | Listening::Failed, _) => Listening::Off,
            // A node already settling looks at the waiters when it gets to it.
            (state, _) => state,
        }
    }
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
    /// The waiters of this client in the lock's line, by their place as
    /// the nodes hold it: a release that hands the turn publishes the
    /// place, which wakes its waiter alone.
    turns: HashMap<String, Arc<Notify>>,
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
    /// The node is down; its task dials again while the channel is wanted.
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
            turns: HashMap::new(),
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
        // A turn handed to a place in line wakes that place's waiter, if it
        // is one of ours, and nobody else. Each node hands it: the waiter
        // woken by the first may find the others not there yet, and is
        // woken again by the next.
        if message.len() == crate::line::PLACE_LEN {
            let turn = std::str::from_utf8(message)
                .ok()
                .and_then(|place| self.turns.get(place));
            if let Some(turn) = turn {
                turn.notify_one();
            }
            return turn.is_some();
        }
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

/// The pub/sub connections of all nodes, shared by all waiters.
#[derive(Debug, Clone)]
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
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
        let count = clients.len();
        let signals: Vec<Arc<Notify>> = (0..count).map(|_| Arc::new(Notify::new())).collect();
        let shared = Arc::new(Shared {
            interest: Mutex::new(Interest {
                channels: HashMap::new(),
                links: (0..count).map(|_| Link::default()).collect(),
            }),
            changed: Notify::new(),
            signals: signals.clone(),
        });
        for (node, (client, signal)) in clients.into_iter().zip(signals).enumerate() {
            let task = NodeTask {
                client,
                node,
                nodes: count,
                shared: Arc::downgrade(&shared),
                signal,
                patience: connect_timeout.min(PATIENCE_MAX),
            };
            tokio::spawn(task.run());
        }
        Wakeups {
            shared,
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
        self.register(channel, None).await
    }

    /// Like [`on_release`](Self::on_release), for the waiter at `place`
    /// in the lock's line: woken when a node hands it the turn (or a
    /// node's connection fails), not by other releases.
    pub(crate) async fn on_turn(&self, channel: String, place: String) -> Option<WakeUpFuture> {
        self.register(channel, Some(place)).await
    }

    async fn register(&self, channel: String, place: Option<String>) -> Option<WakeUpFuture> {
        let mut released = {
            let mut interest = lock(&self.shared.interest);
            let Interest { channels, links } = &mut *interest;
            let entry = channels
                .entry(channel.clone())
                .or_insert_with(|| Channel::new(links.len()));
            entry.waiters += 1;
            let wakes = match &place {
                Some(place) => entry
                    .turns
                    .entry(place.clone())
                    .or_insert_with(|| Arc::new(Notify::new()))
                    .clone(),
                None => entry.released.clone(),
            };
            let released = Box::pin(wakes.notified_owned());
            // The other nodes listen, or their task is on it and finds the
            // channel wanted, or it dials again on its own.
            for (i, link) in links.iter_mut().enumerate() {
                if entry.nodes[i] == Listening::Off {
                    entry.nodes[i] = link.subscribe(&channel);
                    self.shared.signals[i].notify_one();
                }
            }
            released
        };
        // In line from now: a release message from a node that listens counts.
        released.as_mut().enable();
        let registration = Registration {
            wakeups: self.clone(),
            channel: channel.clone(),
            place,
        };
        let _ = tokio::time::timeout(self.node_timeout, self.majority_listens(&channel)).await;
        Some(Box::pin(async move {
            let _registration = registration;
            released.await;
        }))
    }

    /// How many channels have an entry, and how many looks the nodes'
    /// tasks have still to take at them.
    pub(crate) fn backlog(&self) -> (usize, usize) {
        let interest = lock(&self.shared.interest);
        let marked = interest.links.iter().map(|l| l.marked.len()).sum();
        (interest.channels.len(), marked)
    }

    /// Returns once a majority of the nodes listens on `channel`, or every
    /// node has either subscribed or failed.
    async fn majority_listens(&self, channel: &str) {
        let quorum = crate::quorum(self.shared.signals.len());
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
    place: Option<String>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut interest = lock(&self.wakeups.shared.interest);
        let Some(entry) = interest.channels.get_mut(&self.channel) else {
            return;
        };
        if let Some(place) = &self.place {
            entry.turns.remove(place);
        }
        entry.waiters -= 1;
        if entry.waiters > 0 || entry.closing {
            return;
        }
        entry.closing = true;
        drop(interest);
        let close = close(Arc::downgrade(&self.wakeups.shared), self.channel.clone());
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
async fn close(shared: Weak<Shared>, channel: String) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let mut interest = lock(&shared.interest);
    let Interest { channels, links } = &mut *interest;
    let Some(entry) = channels.get_mut(&channel) else {
        return;
    };
    entry.closing = false;
    if entry.waiters > 0 {
        return;
    }
    for (i, link) in links.iter_mut().enumerate() {
        let state = link.unsubscribe(&channel, entry.nodes[i]);
        if state != entry.nodes[i] && state == Listening::Settling {
            shared.signals[i].notify_one();
        }
        entry.nodes[i] = state;
    }
    if entry.is_done() {
        channels.remove(&channel);
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
    /// This node's signal in [`Shared::signals`].
    signal: Arc<Notify>,
    /// Bounds a dial, and the answer to a SUBSCRIBE or UNSUBSCRIBE: a node
    /// that leaves one unanswered this long counts as down.
    patience: Duration,
}

/// Why a connection ended.
enum Ended {
    /// It broke, or a node left a request unanswered.
    Broken,
    /// The backend is gone.
    Shutdown,
}

impl NodeTask {
    async fn run(self) {
        let mut redial = REDIAL;
        // No dial before then, however many waiters come: a node that
        // refuses connections is not dialled once per waiter.
        let mut next_dial = Instant::now();
        loop {
            // Not connected: connect only when somebody waits, so that idle
            // backends hold no pub/sub connection.
            match self.disconnected() {
                None => return,
                Some(false) => {
                    self.signal.notified().await;
                    continue;
                }
                Some(true) => {}
            }
            if Instant::now() < next_dial {
                if !self.pause_until(next_dial).await {
                    return;
                }
                // The waiters may have left meanwhile.
                continue;
            }
            let ended =
                match tokio::time::timeout(self.patience, self.client.get_async_pubsub()).await {
                    Ok(Ok(pubsub)) => {
                        let (mut sink, mut messages) = pubsub.split();
                        self.serve(&mut sink, &mut messages, &mut redial).await
                    }
                    _ => Ended::Broken,
                };
            match ended {
                Ended::Shutdown => return,
                Ended::Broken => {
                    self.failed();
                    next_dial = Instant::now() + redial;
                    redial = (redial * 2).min(REDIAL_MAX);
                }
            }
        }
    }

    /// Sleeps until `until`, whatever the signal says meanwhile; false once
    /// the backend is gone.
    async fn pause_until(&self, until: Instant) -> bool {
        let pause = tokio::time::sleep_until(until);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => return self.shared.strong_count() > 0,
                () = self.signal.notified() => if self.shared.strong_count() == 0 {
                    return false;
                },
            }
        }
    }

    /// Subscribes as the waiters want, and hands release messages to them,
    /// until the connection breaks or the backend is gone. Resets `redial`
    /// once the node answers.
    async fn serve(
        &self,
        sink: &mut PubSubSink,
        messages: &mut PubSubStream,
        redial: &mut Duration,
    ) -> Ended {
        if self.connected().is_none() {
            return Ended::Shutdown;
        }
        let mut on_server = HashSet::new();
        loop {
            let Some(marked) = self.take_marked() else {
                return Ended::Shutdown;
            };
            for channel in marked {
                if !self.settle(sink, &mut on_server, &channel).await {
                    return Ended::Broken;
                }
                *redial = REDIAL;
            }
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { return Ended::Broken };
                    let Some(shared) = self.shared.upgrade() else { return Ended::Shutdown };
                    if let Some(entry) = lock(&shared.interest).channels.get_mut(message.get_channel_name()) {
                        entry.release_message(message.get_payload_bytes(), self.node, self.nodes);
                    }
                }
                () = self.signal.notified() => {}
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
            match tokio::time::timeout(self.patience, request).await {
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

    /// The channels marked for this node since the last look, each once;
    /// `None` once the backend is gone.
    fn take_marked(&self) -> Option<HashSet<String>> {
        let shared = self.shared.upgrade()?;
        let mut interest = lock(&shared.interest);
        Some(std::mem::take(&mut interest.links[self.node].marked))
    }

    /// Without a connection this node listens on nothing: the channels no
    /// waiter wants are off here. Returns whether any channel is wanted;
    /// `None` once the backend is gone.
    fn disconnected(&self) -> Option<bool> {
        self.update(|interest| self.mark(&mut interest.channels, |_, state| state))
    }

    /// Connected, with nothing subscribed yet: every channel with waiters
    /// is marked for this node's task to subscribe.
    fn connected(&self) -> Option<bool> {
        self.update(|interest| {
            let link = &mut interest.links[self.node];
            link.state = LinkState::Up;
            let marked = &mut link.marked;
            self.mark(&mut interest.channels, |channel, _| {
                marked.insert(channel.to_owned());
                Listening::Settling
            })
        })
    }

    /// The dial failed or the connection broke: the channels with waiters
    /// fail here until the node is reached again (so that nobody waits for
    /// this node's subscription), the others are off. Waiters of a channel
    /// that listened here are woken: release messages may have been missed,
    /// and they try again rather than sleep out their backoff.
    fn failed(&self) {
        self.update(|interest| {
            let link = &mut interest.links[self.node];
            link.state = LinkState::Down;
            link.marked.clear();
            for entry in interest.channels.values() {
                if entry.nodes[self.node] == Listening::On {
                    entry.released.notify_waiters();
                    for turn in entry.turns.values() {
                        turn.notify_one();
                    }
                }
            }
            self.mark(&mut interest.channels, |_, _| Listening::Failed);
        });
    }

    /// Runs `update` on what the waiters want, then tells those waiting for
    /// subscriptions; `None` once the backend is gone.
    fn update<T>(&self, update: impl FnOnce(&mut Interest) -> T) -> Option<T> {
        let shared = self.shared.upgrade()?;
        let out = update(&mut lock(&shared.interest));
        shared.changed.notify_waiters();
        Some(out)
    }

    /// Sets this node's state of each channel with waiters to `wanted(the
    /// channel, its state)`, and of the others to off, dropping the entries
    /// nobody needs; returns whether any channel has waiters.
    fn mark(
        &self,
        channels: &mut HashMap<String, Channel>,
        mut wanted: impl FnMut(&str, Listening) -> Listening,
    ) -> bool {
        let mut any = false;
        channels.retain(|channel, entry| {
            let state = &mut entry.nodes[self.node];
            if entry.waiters > 0 {
                *state = wanted(channel, *state);
                any = true;
            } else {
                *state = Listening::Off;
            }
            !entry.is_done()
        });
        any
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
    /// redial pause, not once per waiter: 200 waiters come and go in far
    /// less time than 20 pauses take.
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
