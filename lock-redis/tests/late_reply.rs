//! A grant whose reply comes back after its validity ran out, through a
//! proxy that delays the traffic between the client and a private Redis.

use lock_core::Wait;
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::Locker;
use lock_redis::RedisBackend;
use lock_testkit::{Net, Proxy, RedisServer};

const TTL: Duration = Duration::from_secs(2);
/// Each way: a round trip (2.4 s) outlasts the lease's validity (about
/// 1.98 s), while the grant outlives its late reply on the server (it
/// lapses 2 s after the request arrives, 1.2 s after it was sent).
const DELAY: Duration = Duration::from_millis(1200);

/// The late grant is refused and given back, and the wait, with time left,
/// asks again and wins once the network is quick again; it does not end in
/// an error that speaks of a lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_is_refused_and_the_wait_asks_again() {
    let server = RedisServer::start().expect("start redis");
    server
        .cli(&["CONFIG", "SET", "notify-keyspace-events", "K$"])
        .expect("keyspace events");
    let proxy = Proxy::start(server.port()).await.expect("proxy");
    let backend = RedisBackend::connect(&format!("redis://127.0.0.1:{}", proxy.port()))
        .await
        .expect("connect");
    let locker = Locker::new(backend);
    // Warm up: the connection and the script are in place before the delay.
    let warm = locker.try_acquire("warm", TTL).await.expect("warm-up");
    locker.release(warm).await.expect("warm-up release");

    // Each grant sets the lock's key on the server; its second `set` is the
    // retry's, asked only once the first reply came back too late.
    let client = redis::Client::open(server.url()).expect("client");
    let mut events = client.get_async_pubsub().await.expect("pubsub");
    events
        .subscribe("__keyspace@0__:lockkit:{late}")
        .await
        .expect("subscribe");
    let mut events = events.into_on_message();

    proxy.set(Net {
        delay: DELAY,
        blackhole: false,
    });
    let mut waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire("late", TTL, Wait::at_most(Duration::from_secs(60)))
                .await
        })
    };
    let mut sets = 0;
    while sets < 2 {
        let event = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::select! {
                event = events.next() => event.expect("keyspace events"),
                ended = &mut waiter => panic!("the wait ended after the late reply: {ended:?}"),
            }
        })
        .await
        .expect("a grant on the server within 30 s");
        if event.get_payload::<String>().expect("payload") == "set" {
            sets += 1;
        }
    }
    proxy.set(Net::default());
    let lease = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the retry's reply within 30 s")
        .expect("task")
        .expect("the retry, answered in time, holds the lock");
    locker.release(lease).await.expect("release");
}
