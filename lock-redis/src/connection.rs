//! Opening the backend's connections: one multiplexed, reconnecting
//! connection (to one server, or to a Redis Cluster by its seed nodes).

use lock_core::Result;
use lock_redis_wire::errors::{map_error, timed_out};
use lock_redis_wire::socket::Dial;
use lock_redis_wire::{Batcher, Handout, RedisSettings, TokenRule};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Reconnection attempts after a connection breaks, before a request fails.
/// Kept low: a waiter retries on its own, and errors must arrive within the timeouts.
const RECONNECT_RETRIES: usize = 1;

/// The shared command connection. Clones share one socket per server.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn open(
        backend: &'static str,
        settings: &RedisSettings,
        cluster: bool,
    ) -> Result<Conn> {
        let timeouts = settings.timeouts;
        let endpoint = if cluster {
            &settings.url
        } else {
            &settings.endpoints[0]
        };
        let connecting = async {
            if cluster {
                let mut builder = ClusterClient::builder(settings.servers.clone())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.response)
                    .retries(2);
                #[cfg(feature = "tls")]
                if let Some(certs) = settings.tls_certificates() {
                    builder = builder.certs(certs);
                }
                if let Some(first) = settings.servers.first() {
                    let redis = first.redis_settings();
                    if let Some(user) = redis.username() {
                        builder = builder.username(user);
                    }
                    if let Some(password) = redis.password() {
                        builder = builder.password(password);
                    }
                }
                let client = builder.build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            } else {
                let client = settings.client_for(settings.servers[0].clone())?;
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, manager_config(settings)).await?,
                ))
            }
        };
        // The client retries a refused connection; the caller's timeout bounds it all.
        match tokio::time::timeout(timeouts.connect, connecting).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(map_error(backend, endpoint, e)),
            Err(_) => Err(timed_out(backend, endpoint, "connection", timeouts.connect)),
        }
    }
}

/// The batcher of a single server's acquires and releases. Over plain TCP
/// it has a socket of its own (see [`lock_redis_wire::socket`] for why);
/// over TLS or a Unix socket it shares `conn`. One counter for every lock:
/// a call touches it once or twice, however many locks it grants.
pub(crate) async fn open_batcher(
    backend: &'static str,
    endpoint: &str,
    settings: &RedisSettings,
    conn: &ConnectionManager,
) -> Result<Batcher> {
    let rule = TokenRule::SharedClockFloor {
        counter: settings.layout.shared_counter().into(),
    };
    let timeouts = settings.timeouts;
    match Dial::plain_tcp(&settings.servers[0], timeouts) {
        Some(dial) => Batcher::connect(dial, rule, Handout::InRounds)
            .await
            .map_err(|e| map_error(backend, endpoint, e)),
        None => Ok(Batcher::start(conn.clone(), rule, Handout::InRounds)),
    }
}

/// Timeouts from the URL, few reconnection retries.
pub(crate) fn manager_config(settings: &RedisSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.timeouts.connect))
        .set_response_timeout(Some(settings.timeouts.response))
        .set_number_of_retries(RECONNECT_RETRIES)
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
