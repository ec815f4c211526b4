//! At connect: whether the server, or any master of a cluster, may evict
//! lock keys (see [`lock_redis_wire::server`]).

use lock_redis_wire::RedisSettings;
use lock_redis_wire::server::{self, Eviction};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, RedisResult, Value};

use crate::connection::Conn;

/// The servers that may evict lock keys, with their policy, each warned
/// of, and those whose policy could not be read; `None` when there are none.
pub(crate) async fn lock_key_eviction(
    conn: &Conn,
    settings: &RedisSettings,
    endpoint: &str,
) -> Option<String> {
    let found = match conn {
        Conn::Single(c) => vec![(endpoint.to_owned(), server::eviction(&mut c.clone()).await)],
        Conn::Cluster(c) => {
            let scheme = if settings.tls {
                "rediss+cluster"
            } else {
                "redis+cluster"
            };
            masters(c.clone(), scheme, endpoint).await
        }
    };
    let mut evicting = Vec::new();
    for (server, eviction) in found {
        match eviction {
            Ok(eviction) if eviction.warn_if_evicting(&server) => {
                evicting.push(eviction.on(&server))
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(
                    %server,
                    error = %lock_redis_wire::errors::describe(&e),
                    "could not read whether the server may evict lock keys (neither `CONFIG GET maxmemory*` nor `INFO memory` answered)"
                );
                // Unknown counts as may-evict: a requirement that no server
                // evicts is not met by a server nobody could ask.
                evicting.push(format!("{} on {server}", server::UNREADABLE_POLICY));
            }
        }
    }
    (!evicting.is_empty()).then(|| evicting.join("; "))
}

/// The policy of every master of the cluster, each named as
/// `scheme://host:port`: the masters hold the locks.
async fn masters(
    mut c: ClusterConnection,
    scheme: &str,
    cluster: &str,
) -> Vec<(String, RedisResult<Eviction>)> {
    let all_masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    // Without a response policy, the answers come per master, an error
    // among them as that master's answer.
    let configs = match c.route_command(server::config_command(), all_masters).await {
        Ok(Value::Map(per_master)) => per_master,
        Ok(_) => return vec![(cluster.to_owned(), Err(unexpected()))],
        Err(e) => return vec![(cluster.to_owned(), Err(e))],
    };
    let mut found = Vec::with_capacity(configs.len());
    for (address, config) in configs {
        let Ok(address) = redis::from_redis_value::<String>(address) else {
            continue;
        };
        let eviction = match Eviction::from_config(&config) {
            Some(eviction) => Ok(eviction),
            None => info_of(&mut c, &address).await,
        };
        found.push((format!("{scheme}://{address}"), eviction));
    }
    found
}

/// `INFO memory` of the master at `address` (`host:port`), where CONFIG is
/// refused or renamed.
async fn info_of(c: &mut ClusterConnection, address: &str) -> RedisResult<Eviction> {
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
        .ok_or_else(unexpected)?;
    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
    let info: String =
        redis::from_redis_value(c.route_command(server::info_command(), node).await?)?;
    Eviction::from_info(&info).ok_or_else(unexpected)
}

fn unexpected() -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "the cluster's answer to CONFIG GET or INFO memory is not one per master",
    ))
}
