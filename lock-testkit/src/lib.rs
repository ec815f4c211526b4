#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod etcd;
pub mod http;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod tls;

pub use etcd::{EtcdCluster, EtcdMember};
pub use postgres::Postgres;
pub use proxy::{Net, Proxy};
pub use redis::{RedisNodes, RedisOptions, RedisServer, RedisTls};
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::{RedisSentinel, SENTINEL_MASTER};
pub use tls::{TestCa, lock_round_trip};
