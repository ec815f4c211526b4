//! Hearing of a failover from the sentinels themselves: their
//! `+switch-master` message, sent when they name a new master. During a
//! failover the old master may still take writes for a while (until the
//! sentinels make it a replica), and a grant there is lost: the message
//! moves the backend before that.

use std::sync::Weak;

use futures_util::StreamExt;
use redis::IntoConnectionInfo;
use tokio::sync::oneshot;

use super::{RETRY_PAUSE, SentinelBackend, Shared};

/// The channel on which sentinels announce a new master:
/// `<master name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// Listens on the first sentinel that answers, moving to the next when it
/// goes, until `stop` fires or its sender is dropped (with the backend).
pub(super) async fn watch(shared: Weak<Shared>, mut stop: oneshot::Receiver<()>) {
    loop {
        let Some(options) = shared.upgrade().map(|s| s.options.clone()) else {
            return;
        };
        for server in &options.settings.servers {
            let Ok(info) = server.addr().clone().into_connection_info() else {
                continue;
            };
            let Ok(client) = options.settings.client_for(info) else {
                continue;
            };
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(SWITCH_MASTER).await?;
                redis::RedisResult::Ok(pubsub)
            };
            let timeouts = options.settings.timeouts;
            let mut pubsub = tokio::select! {
                _ = &mut stop => return,
                subscribed = tokio::time::timeout(timeouts.connect + timeouts.response, subscribed) => match subscribed {
                    Ok(Ok(pubsub)) => pubsub,
                    _ => continue,
                },
            };
            let mut messages = pubsub.on_message();
            loop {
                let message = tokio::select! {
                    _ = &mut stop => return,
                    message = messages.next() => message,
                };
                // The sentinel went: listen on the next one.
                let Some(message) = message else { break };
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(shared.master.as_str()) {
                    let backend = SentinelBackend { shared };
                    let current = backend.current().backend;
                    backend.follow(&current).await;
                }
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(RETRY_PAUSE) => {}
        }
    }
}
