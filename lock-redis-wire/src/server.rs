//! What a backend reads of a server when it connects: which server it is
//! (`run_id`), and whether it may evict lock keys.
//!
//! A lock is a key with a TTL. A server with a `maxmemory` and any policy
//! but `noeviction` deletes keys once it is full: under `allkeys-*` any
//! key, under every `volatile-*` policy any key with a TTL, so a held
//! lock's too. The next contender is then granted while the holder still
//! holds the lock. The backends read the policy once, at connect, warn,
//! and say so in their capabilities; a policy set later (`CONFIG SET`) is
//! not seen.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Value};

/// A server's memory limit and eviction policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// `maxmemory-policy`: `noeviction`, `allkeys-lru`, `volatile-ttl`, ...
    pub policy: String,
    /// `maxmemory`, in bytes; 0 for none.
    pub maxmemory: u64,
}

/// The policy under which a full server refuses writes instead of deleting keys.
pub const NO_EVICTION: &str = "noeviction";

/// How a server whose eviction policy could not be read is named among
/// those that may evict: neither `CONFIG GET maxmemory*` nor `INFO memory`
/// answered, so nothing shows that it keeps every lock key.
pub const UNREADABLE_POLICY: &str = "an eviction policy that could not be read (allow `CONFIG GET maxmemory*` or `INFO memory` to this client)";

impl Eviction {
    /// Whether the server may delete a held lock's key to free memory: with
    /// a `maxmemory`, under any policy but `noeviction` (a policy this
    /// crate does not know counts as evicting).
    pub fn evicts_lock_keys(&self) -> bool {
        self.maxmemory > 0 && self.policy != NO_EVICTION
    }

    /// The policy and where it runs, for capabilities and errors:
    /// "`allkeys-lru` (maxmemory 2097152 bytes) on `server`".
    pub fn on(&self, server: &str) -> String {
        format!(
            "`{}` (maxmemory {} bytes) on {server}",
            self.policy, self.maxmemory
        )
    }

    /// From the reply to `CONFIG GET maxmemory*`: pairs of name and value,
    /// as an array (RESP2) or a map (RESP3). `None` without both settings.
    pub fn from_config(reply: &Value) -> Option<Eviction> {
        let items: Vec<(&Value, &Value)> = match reply {
            Value::Array(items) => items
                .chunks_exact(2)
                .map(|pair| (&pair[0], &pair[1]))
                .collect(),
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            _ => return None,
        };
        let setting = |name: &str| {
            items.iter().find_map(|(k, v)| {
                let k: String = redis::from_redis_value_ref(k).ok()?;
                (k == name)
                    .then(|| redis::from_redis_value_ref::<String>(v).ok())
                    .flatten()
            })
        };
        Some(Eviction {
            policy: setting("maxmemory-policy")?,
            maxmemory: setting("maxmemory")?.parse().ok()?,
        })
    }

    /// From the text of `INFO memory`. `None` without both fields.
    pub fn from_info(info: &str) -> Option<Eviction> {
        Some(Eviction {
            policy: info_field(info, "maxmemory_policy")?.to_owned(),
            maxmemory: info_field(info, "maxmemory")?.parse().ok()?,
        })
    }

    /// Logs a warning when the server may evict lock keys; returns whether it may.
    pub fn warn_if_evicting(&self, server: &str) -> bool {
        let evicts = self.evicts_lock_keys();
        if evicts {
            tracing::warn!(
                %server,
                policy = %self.policy,
                maxmemory = self.maxmemory,
                "the server may evict lock keys when it is full, and a lock whose key it evicts is granted to the next contender while its holder still holds it; set `maxmemory-policy noeviction` there"
            );
        }
        evicts
    }
}

/// The commands that read a server's eviction policy: `CONFIG GET
/// maxmemory*` (every Redis version takes the pattern), then, where CONFIG
/// is refused or renamed (managed services, ACLs), `INFO memory`.
pub fn config_command() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory*");
    cmd
}

/// See [`config_command`].
pub fn info_command() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    cmd
}

/// Reads the eviction policy of the server behind `conn` (see [`config_command`]).
pub async fn eviction<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<Eviction> {
    if let Ok(reply) = config_command().query_async::<Value>(conn).await
        && let Some(eviction) = Eviction::from_config(&reply)
    {
        return Ok(eviction);
    }
    let info: String = info_command().query_async(conn).await?;
    Eviction::from_info(&info).ok_or_else(|| missing("INFO memory", "maxmemory_policy"))
}

/// The `run_id` of the server behind `conn`, from `INFO server`: random
/// per server process, so two connections that read one reach one server.
pub async fn run_id<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<String> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    info_field(&info, "run_id")
        .map(str::to_owned)
        .ok_or_else(|| missing("INFO server", "run_id"))
}

/// The value of `name` in the text of `INFO` (`name:value` lines).
pub fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == name).then_some(value)
    })
}

fn missing(command: &str, field: &str) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "a server's reply lacks a field",
        format!("`{command}` has no `{field}`"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn the_policy_is_read_from_config_in_either_protocol() {
        let settings = [
            ("maxmemory", "2097152"),
            ("maxmemory-clients", "0"),
            ("maxmemory-policy", "allkeys-lru"),
            ("maxmemory-samples", "5"),
        ];
        let resp2 = Value::Array(
            settings
                .iter()
                .flat_map(|(k, v)| [bulk(k), bulk(v)])
                .collect(),
        );
        let resp3 = Value::Map(settings.iter().map(|(k, v)| (bulk(k), bulk(v))).collect());
        let expected = Eviction {
            policy: "allkeys-lru".into(),
            maxmemory: 2_097_152,
        };
        assert_eq!(Eviction::from_config(&resp2), Some(expected.clone()));
        assert_eq!(Eviction::from_config(&resp3), Some(expected));
        assert_eq!(Eviction::from_config(&Value::Array(vec![])), None);
        assert_eq!(Eviction::from_config(&Value::Nil), None);
    }

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info = "# Memory\r\nused_memory:1040000\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\nmaxmemory_policy:volatile-ttl\r\n";
        assert_eq!(
            Eviction::from_info(info),
            Some(Eviction {
                policy: "volatile-ttl".into(),
                maxmemory: 0
            })
        );
        assert_eq!(Eviction::from_info("# Memory\r\nused_memory:1\r\n"), None);
        assert_eq!(
            info_field("# Server\r\nrun_id:ab12\r\n", "run_id"),
            Some("ab12")
        );
    }

    #[test]
    fn only_a_limit_with_an_evicting_policy_evicts() {
        let eviction = |policy: &str, maxmemory| Eviction {
            policy: policy.into(),
            maxmemory,
        };
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "a-policy-of-a-later-version",
        ] {
            assert!(eviction(policy, 1 << 20).evicts_lock_keys(), "{policy}");
            assert!(
                !eviction(policy, 0).evicts_lock_keys(),
                "{policy} without maxmemory"
            );
        }
        assert!(!eviction("noeviction", 1 << 20).evicts_lock_keys());
        assert_eq!(
            eviction("allkeys-lru", 2_097_152).on("node #2 (10.0.0.2:6379)"),
            "`allkeys-lru` (maxmemory 2097152 bytes) on node #2 (10.0.0.2:6379)"
        );
    }
}
