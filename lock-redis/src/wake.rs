//! Release wake-ups: ONE subscription connection per backend, shared by
//! every waiter, subscribed to the release channels of the keys waited on.
//!
//! A waiter's future does nothing until it is first polled, which the wait
//! loop does only after a contended attempt, so uncontended acquires cost no
//! round trip. When polled it subscribes to the key's channel (once per key,
//! however many waiters), then checks that the lock key still exists: a
//! release between the contended attempt and the subscription is seen there
//! instead of being missed. Anything that fails here (no RESP3, a dropped
//! subscription connection) only leaves the waiter to lock-core's polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use lock_core::WakeUpFuture;
use lock_redis_wire::RedisSettings;
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, PushInfo, PushKind, RedisResult};
use tokio::sync::{Notify, OnceCell, mpsc};

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
    /// Waiters per channel.
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE, so that an unsubscription for
    /// the last waiter of a key never overtakes the subscription of a new one.
    changes: tokio::sync::Mutex<()>,
}

struct Channel {
    notify: Arc<Notify>,
    waiters: usize,
    subscribed: bool,
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
                redis::Client::open(info.clone().set_redis_settings(redis)).ok()
            })
            .collect();
        let shared = Shared {
            clients,
            settings: settings.clone(),
            connection: OnceCell::new(),
            channels: Mutex::new(HashMap::new()),
            changes: tokio::sync::Mutex::new(()),
        };
        Wakeups {
            shared: Arc::new(shared),
        }
    }

    /// A future that completes when `lock_key` is released (published on
    /// `channel`) or found gone. `conn` checks the key after subscribing.
    pub(crate) fn on_release(
        &self,
        channel: String,
        lock_key: String,
        mut conn: Conn,
    ) -> WakeUpFuture {
        let shared = self.shared.clone();
        Box::pin(async move {
            let waiter = Waiter::register(&shared, channel);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Err(e) = shared.subscribe(&waiter.channel).await {
                tracing::debug!(error = %e, "release subscription failed; waiting by polling");
                return std::future::pending().await;
            }
            match redis::cmd("EXISTS")
                .arg(&lock_key)
                .query_async::<i64>(&mut conn)
                .await
            {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "checking the lock after subscribing failed"),
            }
            notified.await;
        })
    }
}

impl Shared {
    async fn subscribe(self: &Arc<Self>, channel: &str) -> RedisResult<()> {
        let _change = self.changes.lock().await;
        if lock(&self.channels)
            .get(channel)
            .is_some_and(|c| c.subscribed)
        {
            return Ok(());
        }
        let mut conn = self
            .connection
            .get_or_try_init(|| self.open())
            .await?
            .clone();
        conn.subscribe(channel).await?;
        let still_waited = match lock(&self.channels).get_mut(channel) {
            Some(c) => {
                c.subscribed = true;
                true
            }
            None => false,
        };
        if !still_waited {
            // Every waiter left while the subscription was on its way.
            conn.unsubscribe(channel).await?;
        }
        Ok(())
    }

    async fn unsubscribe(self: Arc<Self>, channel: String) {
        let _change = self.changes.lock().await;
        // A new waiter may have come for the same key meanwhile: keep it then.
        if lock(&self.channels).contains_key(&channel) {
            return;
        }
        if let Some(conn) = self.connection.get()
            && let Err(e) = conn.clone().unsubscribe(&channel).await
        {
            tracing::debug!(error = %e, "unsubscribing from a release channel failed");
        }
    }

    /// Opens the subscription connection on the first server that answers,
    /// and starts the task that hands release messages to waiters.
    async fn open(self: &Arc<Self>) -> RedisResult<ConnectionManager> {
        let (tx, rx) = mpsc::unbounded_channel();
        let config = manager_config(&self.settings)
            .set_push_sender(tx)
            .set_automatic_resubscription();
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

/// Wakes the waiters of each release message; wakes everyone when the
/// subscription connection drops, since messages may have been missed.
async fn dispatch(shared: Weak<Shared>, mut rx: mpsc::UnboundedReceiver<PushInfo>) {
    while let Some(push) = rx.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let channels = lock(&shared.channels);
        match push.kind {
            PushKind::Message => {
                let channel = push
                    .data
                    .first()
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
                if let Some(c) = channel.and_then(|name| channels.get(&name)) {
                    c.notify.notify_waiters();
                }
            }
            PushKind::Disconnection => channels.values().for_each(|c| c.notify.notify_waiters()),
            _ => {}
        }
    }
}

/// One waiter's registration; unregisters (and unsubscribes the last) on drop.
struct Waiter {
    shared: Arc<Shared>,
    channel: String,
    notify: Arc<Notify>,
}

impl Waiter {
    fn register(shared: &Arc<Shared>, channel: String) -> Waiter {
        let mut channels = lock(&shared.channels);
        let entry = channels.entry(channel.clone()).or_insert_with(|| Channel {
            notify: Arc::new(Notify::new()),
            waiters: 0,
            subscribed: false,
        });
        entry.waiters += 1;
        let notify = entry.notify.clone();
        Waiter {
            shared: shared.clone(),
            channel,
            notify,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut channels = lock(&self.shared.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters > 0 {
            return;
        }
        let was_subscribed = entry.subscribed;
        channels.remove(&self.channel);
        drop(channels);
        if was_subscribed && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let channel = std::mem::take(&mut self.channel);
            runtime.spawn(self.shared.clone().unsubscribe(channel));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
