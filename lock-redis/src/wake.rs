//! Release wake-ups: ONE subscription connection per backend, shared by
//! every waiter, subscribed to the release channels of the keys waited on.
//!
//! A waiter registers when the wait loop asks for its future, but subscribes
//! only when the future is first polled, which the loop does only after a
//! contended attempt, so uncontended acquires cost no round trip. Once
//! subscribed it checks that the lock is still held: a release between the
//! contended attempt and the subscription is seen there instead of being
//! missed. The check also marks the grant it finds as waited for, so that
//! its release publishes: a client that knew of no waiter may have taken
//! the lock meanwhile, and its grant would otherwise be released silently.
//! Anything that fails here (no RESP3, a dropped subscription connection)
//! only leaves the waiter to lock-core's polling.
//!
//! SUBSCRIBE and UNSUBSCRIBE are sent by a task of their own per channel,
//! never by a waiter's future: the wait loop drops that future when its sleep
//! ends, often before the server answers, and a subscription sent from it
//! would then go unrecorded and never be undone. The task keeps the server's
//! subscription in line with the waiters: on while any waits, off once none
//! does. A waiter's next round registers before the task gets to run, so one
//! acquire keeps its subscription across rounds.
//!
//! A waiter in the lock's waiting line registers with its place: a release
//! that hands it the turn publishes that place, and wakes it alone, in
//! whichever process it waits. A place of another process's waiter wakes
//! no one here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::raw::WakeUpFuture;
use lock_redis_wire::{RedisSettings, scripts};
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, PushInfo, PushKind, RedisResult};
use tokio::sync::{Notify, OnceCell, mpsc, watch};

use crate::connection::{Conn, manager_config};

/// The wake-up service of one backend. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

struct Shared {
    /// Servers to subscribe on, in order of preference. On Redis Cluster any
    /// node will do: `PUBLISH` reaches every node's subscribers.
    clients: Vec<redis::Client>,
    settings: RedisSettings,
    /// The subscription connection, opened by the first waiter.
    connection: OnceCell<ConnectionManager>,
    /// Channels with waiters, or with a subscription still to undo.
    channels: Mutex<HashMap<String, Channel>>,
    /// How often the subscription connection dropped (changed under the
    /// `channels` lock): a SUBSCRIBE answered across a drop may have been
    /// the old connection's.
    drops: AtomicU64,
}

struct Channel {
    /// Wakes one waiter per release message on the channel that names no
    /// place in line.
    notify: Arc<Notify>,
    /// Per place in line of a waiter of ours, what wakes it on its turn.
    turns: HashMap<String, Arc<Notify>>,
    waiters: usize,
    /// The server may hold a subscription: set before SUBSCRIBE goes out,
    /// cleared only once UNSUBSCRIBE is answered.
    on_server: bool,
    /// What waiters may rely on; they wait here for a subscription's answer.
    state: watch::Sender<Subscription>,
    /// The channel's task runs; it looks at the waiters again before it ends.
    syncing: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscription {
    /// Not subscribed, or the answer is still to come.
    Unconfirmed,
    /// SUBSCRIBE answered: release messages arrive.
    Confirmed,
    /// SUBSCRIBE failed; the next waiter to be polled tries again.
    Failed,
}

impl Wakeups {
    pub(crate) fn new(settings: &RedisSettings) -> Self {
        let clients = settings
            .servers
            .iter()
            .filter_map(|info| {
                let redis = info
                    .redis_settings()
                    .clone()
                    .set_protocol(ProtocolVersion::RESP3);
                settings
                    .client_for(info.clone().set_redis_settings(redis))
                    .ok()
            })
            .collect();
        let shared = Shared {
            clients,
            settings: settings.clone(),
            connection: OnceCell::new(),
            channels: Mutex::new(HashMap::new()),
            drops: AtomicU64::new(0),
        };
        Wakeups {
            shared: Arc::new(shared),
        }
    }

    /// Whether a waiter of this backend waits on `channel`: an acquire of
    /// its lock then marks its grant, so that the grant's release publishes
    /// and wakes the next waiter.
    pub(crate) fn is_waited_for(&self, channel: &str) -> bool {
        lock(&self.shared.channels)
            .get(channel)
            .is_some_and(|c| c.waiters > 0)
    }

    /// A future that completes when `lock_key` is released (published on
    /// `channel`) or found gone. `conn` checks the key after subscribing,
    /// marking the grant it finds as waited for.
    pub(crate) fn on_release(
        &self,
        channel: String,
        lock_key: String,
        mut conn: Conn,
    ) -> WakeUpFuture {
        let waiter = Waiter::register(&self.shared, channel, None);
        Box::pin(async move {
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !waiter.subscribed().await {
                // Out of line before waiting for nothing: a release message
                // handed to this waiter would sit here until its poll.
                notified.set(waiter.notify.notified());
                return std::future::pending().await;
            }
            match scripts::mark_waited_for(&mut conn, &lock_key).await {
                Ok(false) => return,
                Ok(true) => {}
                Err(e) => tracing::debug!(error = %e, "checking the lock after subscribing failed"),
            }
            notified.await;
        })
    }
}

impl Wakeups {
    /// A future that completes when it is the turn of the waiter at `place`
    /// in the line of `lock_key` (a release published its place), or on a
    /// release message that names no place (a force release, a release
    /// that found no line), or when the lock is found free or reserved for
    /// `place` once subscribed.
    pub(crate) fn on_turn(
        &self,
        channel: String,
        lock_key: String,
        place: String,
        mut conn: Conn,
    ) -> WakeUpFuture {
        let waiter = Waiter::register(&self.shared, channel, Some(place.clone()));
        Box::pin(async move {
            let Some(turn) = waiter.turn.as_ref() else {
                return;
            };
            let notified = waiter.notify.notified();
            let my_turn = turn.notified();
            tokio::pin!(notified, my_turn);
            notified.as_mut().enable();
            my_turn.as_mut().enable();
            if !waiter.subscribed().await {
                // As in `on_release`: a message handed to this waiter is
                // passed on rather than kept until its poll.
                notified.set(waiter.notify.notified());
                return std::future::pending().await;
            }
            match scripts::mark_waited_for_place(&mut conn, &lock_key, &place).await {
                Ok(false) => return,
                Ok(true) => {}
                Err(e) => tracing::debug!(error = %e, "checking the lock after subscribing failed"),
            }
            tokio::select! {
                _ = notified => {}
                _ = my_turn => {}
            }
        })
    }
}

/// Whether a release message names a place in line (a client's session
/// and a place, 64 hex digits) rather than a fencing token (decimal, at
/// most 16 digits) or a force release.
fn names_a_place(message: &str) -> bool {
    message.len() == 64
}

/// The first delay before retrying a failed UNSUBSCRIBE (doubling up to
/// [`UNSUBSCRIBE_RETRY_MAX`]): the connection reconnects meanwhile.
const UNSUBSCRIBE_RETRY: Duration = Duration::from_millis(50);
const UNSUBSCRIBE_RETRY_MAX: Duration = Duration::from_secs(5);

/// A channel task's next move.
enum Step {
    Subscribe,
    Unsubscribe,
}

/// The task of one channel: subscribes while it has waiters, unsubscribes
/// once it has none, until the server agrees with the waiters. Runs only
/// while the channel's `syncing` is set, so one per channel at a time.
async fn sync(shared: Weak<Shared>, channel: String) {
    let mut retry = UNSUBSCRIBE_RETRY;
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let step = {
            let mut channels = lock(&shared.channels);
            // A syncing channel stays in the map until this task removes it.
            let Some(c) = channels.get_mut(&channel) else {
                return;
            };
            let state = *c.state.borrow();
            if c.waiters > 0 {
                if state != Subscription::Unconfirmed {
                    c.syncing = false;
                    return;
                }
                // Recorded before it is sent: from here it is undone one day.
                c.on_server = true;
                Step::Subscribe
            } else if c.on_server {
                // Waiters arriving now wait for the next SUBSCRIBE.
                c.state.send_replace(Subscription::Unconfirmed);
                Step::Unsubscribe
            } else {
                channels.remove(&channel);
                return;
            }
        };
        match step {
            Step::Subscribe => {
                let drops = shared.drops.load(Ordering::Relaxed);
                let outcome = match shared.subscribe(&channel).await {
                    Ok(()) => Subscription::Confirmed,
                    Err(e) => {
                        tracing::debug!(error = %e, "release subscription failed; waiting by polling");
                        Subscription::Failed
                    }
                };
                let mut channels = lock(&shared.channels);
                // Dropped since: subscribe again (the loop sees it unconfirmed).
                let outcome = if shared.drops.load(Ordering::Relaxed) == drops {
                    outcome
                } else {
                    Subscription::Unconfirmed
                };
                if let Some(c) = channels.get_mut(&channel) {
                    c.state.send_replace(outcome);
                }
            }
            Step::Unsubscribe => {
                // No connection: nothing was ever sent, so nothing to undo.
                let outcome = match shared.connection.get() {
                    Some(conn) => conn.clone().unsubscribe(&channel).await,
                    None => Ok(()),
                };
                match outcome {
                    Ok(()) => {
                        if let Some(c) = lock(&shared.channels).get_mut(&channel) {
                            c.on_server = false;
                        }
                        retry = UNSUBSCRIBE_RETRY;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "unsubscribing from a release channel failed; retrying");
                        drop(shared);
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(UNSUBSCRIBE_RETRY_MAX);
                    }
                }
            }
        }
    }
}

impl Shared {
    async fn subscribe(self: &Arc<Self>, channel: &str) -> RedisResult<()> {
        let mut conn = self
            .connection
            .get_or_try_init(|| self.open())
            .await?
            .clone();
        match conn.subscribe(channel).await {
            // A connection lost in an outage may answer with the error of its
            // last failed reconnection, and only then reconnect: ask again.
            Err(e) if e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped() => {
                conn.subscribe(channel).await
            }
            other => other,
        }
    }

    /// Opens the subscription connection on the first server that answers,
    /// and starts the task that hands release messages to waiters.
    async fn open(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let (tx, rx) = mpsc::unbounded_channel();
        // No automatic resubscription: after a drop, the channels' next
        // waiters subscribe again themselves (see `dispatch`).
        let config = manager_config(&self.settings).set_push_sender(tx);
        let mut last_error = None;
        for client in &self.clients {
            match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                Ok(conn) => {
                    tokio::spawn(dispatch(Arc::downgrade(self), rx));
                    return Ok(conn);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error
            .unwrap_or_else(|| (redis::ErrorKind::Client, "no server to subscribe on").into()))
    }
}

/// Wakes ONE waiter of the key per release message, the one waiting
/// longest: one release frees the lock for one new holder, and waking all
/// would have every other waiter send a refused attempt (a herd). The
/// others stay subscribed for the next release. A waiter woken but gone
/// before it looked passes the wake-up on to the next one (tokio's
/// `Notify`); one gone after it looked costs the others latency until
/// their next poll, never liveness. Wakes everyone when the subscription
/// connection drops, since messages may have been missed, and marks every
/// channel unsubscribed, so that waiters subscribe again.
async fn dispatch(shared: Weak<Shared>, mut rx: mpsc::UnboundedReceiver<PushInfo>) {
    while let Some(push) = rx.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let channels = lock(&shared.channels);
        match push.kind {
            PushKind::Message => {
                let text = |i: usize| {
                    push.data
                        .get(i)
                        .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                };
                if let Some(c) = text(0).and_then(|name| channels.get(&name)) {
                    match text(1) {
                        // The turn of a waiter in line: it alone is woken,
                        // and only in the process where it waits.
                        Some(place) if names_a_place(&place) => {
                            if let Some(turn) = c.turns.get(&place) {
                                turn.notify_one();
                            }
                        }
                        _ => c.notify.notify_one(),
                    }
                }
            }
            PushKind::Disconnection => {
                // The server dropped every subscription with the connection
                // (and the client may not reconnect until asked): the next
                // waiter of each channel subscribes again.
                shared.drops.fetch_add(1, Ordering::Relaxed);
                for c in channels.values() {
                    c.state.send_replace(Subscription::Unconfirmed);
                    c.notify.notify_waiters();
                }
            }
            _ => {}
        }
    }
}

/// One waiter's registration; the last to leave a channel has its
/// subscription undone.
struct Waiter {
    shared: Arc<Shared>,
    channel: String,
    notify: Arc<Notify>,
    /// The waiter's place in line, and what wakes it on its turn.
    place: Option<String>,
    turn: Option<Arc<Notify>>,
}

impl Waiter {
    fn register(shared: &Arc<Shared>, channel: String, place: Option<String>) -> Waiter {
        let mut channels = lock(&shared.channels);
        let entry = channels.entry(channel.clone()).or_insert_with(|| Channel {
            turns: HashMap::new(),
            notify: Arc::new(Notify::new()),
            waiters: 0,
            on_server: false,
            state: watch::channel(Subscription::Unconfirmed).0,
            syncing: false,
        });
        entry.waiters += 1;
        let notify = entry.notify.clone();
        let turn = place.as_ref().map(|place| {
            entry
                .turns
                .entry(place.clone())
                .or_insert_with(|| Arc::new(Notify::new()))
                .clone()
        });
        Waiter {
            shared: shared.clone(),
            channel,
            notify,
            place,
            turn,
        }
    }

    /// Whether release messages for the channel arrive, subscribing first if
    /// needed (once, however many waiters).
    async fn subscribed(&self) -> bool {
        let mut state = {
            let mut channels = lock(&self.shared.channels);
            let Some(c) = channels.get_mut(&self.channel) else {
                return false;
            };
            let now = *c.state.borrow();
            match now {
                Subscription::Confirmed => return true,
                Subscription::Failed => {
                    c.state.send_replace(Subscription::Unconfirmed);
                }
                Subscription::Unconfirmed => {}
            }
            if !c.syncing {
                c.syncing = true;
                tokio::spawn(sync(Arc::downgrade(&self.shared), self.channel.clone()));
            }
            c.state.subscribe()
        };
        matches!(
            state
                .wait_for(|s| *s != Subscription::Unconfirmed)
                .await
                .map(|s| *s),
            Ok(Subscription::Confirmed)
        )
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut channels = lock(&self.shared.channels);
        let Some(c) = channels.get_mut(&self.channel) else {
            return;
        };
        c.waiters -= 1;
        if let Some(place) = &self.place {
            // The wait loop registers its next round before this one is
            // dropped: the place's entry goes only with its last round.
            if self
                .turn
                .as_ref()
                .is_some_and(|t| Arc::strong_count(t) <= 2)
            {
                c.turns.remove(place);
            }
        }
        if c.waiters > 0 || c.syncing {
            return;
        }
        if !c.on_server {
            channels.remove(&self.channel);
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Spawned, not run here: the wait loop's next round registers
            // first, and the task then finds the subscription still wanted.
            c.syncing = true;
            runtime.spawn(sync(Arc::downgrade(&self.shared), self.channel.clone()));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
