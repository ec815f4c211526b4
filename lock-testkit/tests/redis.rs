//! RedisServer and RedisNodes against real redis-server processes.

use std::collections::BTreeSet;
use std::io;
use std::time::{Duration, Instant};

use lock_testkit::{RedisNodes, RedisOptions, RedisServer};

#[test]
fn persistent_redis_keeps_a_key_across_kill_and_restart() -> io::Result<()> {
    let redis = RedisServer::start_with(RedisOptions {
        persistence: true,
        ..Default::default()
    })?;
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_ne!(
        redis.port(),
        16379,
        "must not use the shared dev server's port"
    );
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "appendfsync"])?,
        "appendfsync\nalways"
    );
    assert_eq!(redis.cli(&["SET", "fence", "42"])?, "OK");
    let old_pid = redis.pid().expect("running");

    redis.kill()?;
    assert!(!redis.is_running());
    assert!(redis.pid().is_none());
    let err = redis.ping(Duration::from_millis(200)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");

    redis.restart()?;
    assert!(redis.is_running());
    assert_ne!(redis.pid(), Some(old_pid));
    assert_eq!(redis.cli(&["GET", "fence"])?, "42");
    Ok(())
}

#[test]
fn redis_without_persistence_comes_back_empty() -> io::Result<()> {
    let redis = RedisServer::start()?;
    let port = redis.port();
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "appendonly"])?,
        "appendonly\nno"
    );
    assert_eq!(redis.cli(&["SET", "fence", "42"])?, "OK");
    assert_eq!(redis.cli(&["EXISTS", "fence"])?, "1");

    // restart() on a running server kills it first.
    redis.restart()?;
    assert_eq!(redis.port(), port);
    assert_eq!(redis.cli(&["EXISTS", "fence"])?, "0");
    Ok(())
}

#[test]
fn pause_makes_ping_time_out_and_resume_restores_it() -> io::Result<()> {
    let redis = RedisServer::start()?;
    redis.ping(Duration::from_secs(1))?;

    redis.pause()?;
    assert!(redis.is_running(), "a paused server is still running");
    let started = Instant::now();
    let err = redis.ping(Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "expected a timeout, got {err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));

    redis.resume()?;
    redis.ping(Duration::from_secs(1))?;
    Ok(())
}

#[test]
fn extra_args_are_passed_to_the_server() -> io::Result<()> {
    let redis = RedisServer::start_with(RedisOptions {
        persistence: false,
        extra_args: vec!["--maxmemory".into(), "10mb".into()],
        ..Default::default()
    })?;
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "maxmemory"])?,
        "maxmemory\n10485760"
    );
    Ok(())
}

#[test]
fn a_failing_start_reports_the_log_tail() {
    let err = RedisServer::start_with(RedisOptions {
        persistence: false,
        extra_args: vec!["--no-such-directive".into(), "1".into()],
        ..Default::default()
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("exited before it was answering PING"), "{msg}");
    assert!(msg.contains("no-such-directive"), "log tail missing: {msg}");
}

#[test]
fn redis_nodes_are_independent_servers() -> io::Result<()> {
    let nodes = RedisNodes::start(3)?;
    assert_eq!(nodes.len(), 3);
    let ports: BTreeSet<u16> = nodes.nodes().iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), 3);
    let expected: Vec<String> = nodes
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    assert_eq!(nodes.url(), format!("redlock://{}", expected.join(",")));

    nodes.node(0).cli(&["SET", "k", "only-on-0"])?;
    assert_eq!(nodes.node(1).cli(&["EXISTS", "k"])?, "0");
    nodes.node(1).kill()?;
    nodes.node(0).ping(Duration::from_secs(1))?;
    nodes.node(2).ping(Duration::from_secs(1))?;
    assert!(nodes.node(1).ping(Duration::from_millis(200)).is_err());
    Ok(())
}

#[test]
fn drop_kills_the_server() -> io::Result<()> {
    let redis = RedisServer::start()?;
    let pid = redis.pid().expect("running");
    let dir = redis.dir().to_path_buf();
    drop(redis);
    // Reaped, so the PID is gone entirely (not even a zombie).
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(!dir.exists());
    Ok(())
}
