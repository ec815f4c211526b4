//! Profiles against a Redis that may evict lock keys: refused by every
//! requirement set above deduplication, naming the policy and the fix.

#![cfg(feature = "redis")]

use lock_testkit::{RedisOptions, RedisServer};
use lockkit::config::Config;

fn server(policy: &str) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        extra_args: ["--maxmemory", "2mb", "--maxmemory-policy", policy]
            .map(String::from)
            .to_vec(),
        ..RedisOptions::default()
    })
    .expect("start redis")
}

fn config(url: &str) -> Config {
    let text = format!(
        r#"
        [profiles.mutex]
        url = "{url}"
        use = "general-mutex"

        [profiles.dedup]
        url = "{url}"
        use = "idempotent-deduplication"

        [profiles.own]
        url = "{url}"
        [profiles.own.require]
        no_eviction = true
        "#
    );
    Config::parse(&text, "lockkit.toml").expect("config")
}

#[tokio::test]
async fn a_general_mutex_profile_refuses_an_evicting_server_naming_the_policy_and_the_fix() {
    let server = server("allkeys-lru");
    let url = server.url().replace("redis://", "redis://:pw-9e1b@");
    server
        .cli(&["CONFIG", "SET", "requirepass", "pw-9e1b"])
        .expect("requirepass");
    let config = config(&url);
    for name in ["mutex", "own"] {
        let err = config
            .profile(name)
            .unwrap()
            .connect()
            .await
            .expect_err("an evicting server was accepted");
        assert!(err.is_invalid_input(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("profile `{name}`"))
                && text.contains("`allkeys-lru` (maxmemory 2097152 bytes)")
                && text.contains("maxmemory-policy noeviction"),
            "{text}"
        );
        assert!(!text.contains("pw-9e1b"), "{text}");
    }
    config
        .profile("dedup")
        .unwrap()
        .connect()
        .await
        .expect("deduplication tolerates a rare double grant");
}

#[tokio::test]
async fn a_server_that_evicts_nothing_is_accepted() {
    let server = server("noeviction");
    let config = config(&server.url());
    for name in ["mutex", "own", "dedup"] {
        config
            .profile(name)
            .unwrap()
            .connect()
            .await
            .expect("a noeviction server");
    }
}

/// A server that answers neither `CONFIG GET` nor `INFO` cannot show that
/// it keeps every lock key: profiles that require it refuse the server,
/// saying why and what to allow.
#[tokio::test]
async fn a_server_whose_policy_cannot_be_read_is_refused_saying_why() {
    let server = RedisServer::start_with(RedisOptions {
        extra_args: [
            "--rename-command",
            "CONFIG",
            "",
            "--rename-command",
            "INFO",
            "",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisOptions::default()
    })
    .expect("start redis");
    let config = config(&server.url());
    for name in ["mutex", "own"] {
        let text = config
            .profile(name)
            .unwrap()
            .connect()
            .await
            .expect_err("a server of unknown policy was accepted")
            .to_string();
        assert!(
            text.contains("could not be read") && text.contains("INFO memory"),
            "{text}"
        );
    }
    config
        .profile("dedup")
        .unwrap()
        .connect()
        .await
        .expect("deduplication asks nothing of eviction");
}
