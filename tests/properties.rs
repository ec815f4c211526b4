//! Property tests of the facade: arbitrary URLs, URL options, durations
//! and TOML profiles thrown at every parser, and arbitrary option values
//! at a real connect of every backend whose server is configured. Nothing
//! panics (in the caller or in any task the backend runs), and what is
//! refused is an `InvalidInput` naming the field.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockkit::config::{Config, parse_duration};
use lockkit::{Error, check_url};
use proptest::prelude::*;

/// Every panic in this test binary, in any thread: a backend's task that
/// panics is caught by its runtime, so the caller alone would not see it.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// The schemes of this build, with the options each one reads.
fn schemes() -> Vec<(&'static str, &'static [&'static str])> {
    #[allow(unused_mut)]
    let mut all: Vec<(&str, &[&str])> = vec![("memory", &[])];
    #[cfg(feature = "redis")]
    {
        let redis: &[&str] = &[
            "timeout_ms",
            "connect_timeout_ms",
            "response_timeout_ms",
            "prefix",
        ];
        all.extend([("redis", redis), ("redis+cluster", redis)]);
    }
    #[cfg(feature = "redlock")]
    all.push((
        "redlock",
        &[
            "node_timeout_ms",
            "connect_timeout_ms",
            "response_timeout_ms",
            "prefix",
            "tls",
        ],
    ));
    #[cfg(feature = "etcd")]
    all.push((
        "etcd",
        &[
            "connect_timeout_ms",
            "response_timeout_ms",
            "prefix",
            "min_ttl_s",
        ],
    ));
    #[cfg(feature = "postgres")]
    all.push((
        "postgres",
        &[
            "connect_timeout_ms",
            "response_timeout_ms",
            "max_held_locks",
            "create_schema",
        ],
    ));
    all
}

/// Values a number option may be given: edges, overflows, garbage.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("1".to_owned()),
        Just(u64::MAX.to_string()),
        Just("18446744073709551616".to_owned()),
        Just(u32::MAX.to_string()),
        Just((tokio::sync::Semaphore::MAX_PERMITS as u64 + 1).to_string()),
        Just("-1".to_owned()),
        Just("1e3".to_owned()),
        Just(String::new()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        "[a-z0-9%.+-]{0,6}",
    ]
}

fn invalid(err: &Error) -> bool {
    err.is_invalid_input()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_text_as_a_url_is_checked_without_panic(text in any::<String>(), tail in "[a-z0-9:@,/?=&%.\\[\\]-]{0,40}") {
        for (scheme, _) in schemes() {
            for url in [text.clone(), format!("{scheme}://{tail}"), format!("{scheme}://{text}")] {
                if let Err(e) = check_url(&url) {
                    prop_assert!(invalid(&e), "{url}: {e:?}");
                }
            }
        }
    }

    #[test]
    fn any_option_value_is_checked_without_panic(pick in any::<prop::sample::Index>(), value in number()) {
        for (scheme, options) in schemes() {
            if options.is_empty() {
                continue;
            }
            let option = options[pick.index(options.len())];
            let url = format!("{scheme}://127.0.0.1:1/?{option}={value}");
            if let Err(e) = check_url(&url) {
                prop_assert!(invalid(&e), "{url}: {e:?}");
            }
        }
    }

    #[test]
    fn any_duration_text_is_parsed_or_refused(text in prop_oneof![any::<String>(), "[0-9]{0,25}(ms|s|m|min|h| s|)"]) {
        let _ = parse_duration(&text);
    }

    /// A profile with any value in any field: parsed, or refused naming it.
    #[test]
    fn any_profile_is_parsed_or_refused(
        url in prop_oneof![Just("memory://".to_owned()), "[a-z+]{1,12}://[a-z0-9:@,/?=&.-]{0,30}"],
        ttl in prop_oneof![number(), "[0-9]{1,25}(ms|s|m|h)"],
        wait in prop_oneof![number(), "[0-9]{1,25}(ms|s|m|h)"],
        prefix in any::<String>(),
        uses in "[a-z-]{0,24}",
        survives in number(),
        min_safety in "[a-z-]{0,16}",
        fencing in "[a-z]{0,8}",
    ) {
        let toml = format!(
            "[profiles.p]\nurl = {url:?}\nttl = {ttl:?}\nwait = {wait:?}\nprefix = {prefix:?}\nuse = {uses:?}\n\
             [profiles.p.require]\nfencing = {fencing:?}\nmin_safety = {min_safety:?}\nsurvives_server_loss = {survives}\n"
        );
        if let Err(e) = Config::parse(&toml, "properties.toml") {
            prop_assert!(invalid(&e), "{toml}: {e:?}");
        }
    }
}

/// The URLs of the servers the test command started, by scheme.
fn configured_servers() -> Vec<(&'static str, String)> {
    let mut servers = Vec::new();
    for (scheme, var) in [
        ("redis", "LOCKKIT_REDIS_URL"),
        ("redis+cluster", "LOCKKIT_REDIS_CLUSTER_URL"),
        ("redlock", "LOCKKIT_REDLOCK_URL"),
        ("etcd", "LOCKKIT_ETCD_URL"),
        ("postgres", "LOCKKIT_POSTGRES_URL"),
    ] {
        match std::env::var(var) {
            Ok(url) if schemes().iter().any(|(s, _)| *s == scheme) => servers.push((scheme, url)),
            _ if std::env::var("LOCKKIT_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
                panic!("{var} is not set, and LOCKKIT_REQUIRE_SERVERS=1")
            }
            _ => {}
        }
    }
    servers
}

/// `url` with `option=value` added to its query.
fn with_option(url: &str, option: &str, value: &str) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    let slash = if url
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'))
    {
        ""
    } else {
        "/"
    };
    format!("{url}{slash}{joiner}{option}={value}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Real servers, any option value: connect, take and give back a lock.
    /// Each step ends with a typed answer in time, and no task panics.
    #[test]
    fn any_option_value_connects_or_is_refused(value in number()) {
        count_panics();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        for (scheme, url) in configured_servers() {
            let options = schemes().into_iter().find(|(s, _)| *s == scheme).map(|(_, o)| o).unwrap_or(&[]);
            for option in options.iter().filter(|o| !["prefix", "tls", "create_schema"].contains(o)) {
            let url = with_option(&url, option, &value);
            let shown = lockkit::url::redact(&url);
            let before = PANICS.load(Ordering::SeqCst);
            let outcome = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), async {
                    let locker = lockkit::connect(&url).await?;
                    let key = format!("properties/{}", std::process::id());
                    match locker.try_acquire(&key, Duration::from_secs(5)).await {
                        Ok(lease) => locker.release(lease).await,
                        Err(e) => Err(e),
                    }
                })
                .await
            });
            match outcome {
                Err(_) => prop_assert!(false, "{shown}: no answer within 60 s"),
                Ok(Err(e)) => prop_assert!(
                    e.is_invalid_input() || e.is_unavailable() || e.is_contended(),
                    "{shown}: {e:?}"
                ),
                Ok(Ok(())) => {}
            }
            prop_assert_eq!(PANICS.load(Ordering::SeqCst), before, "{} panicked", shown);
            }
        }
    }
}
