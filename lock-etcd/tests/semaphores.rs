//! What is special about semaphores on etcd (on the shared cluster): permits
//! share the lock's queue with the exclusive lock, so a caller in another
//! mode, even one that would wait, is refused at once and leaves nothing
//! in the queue; and a full semaphore reports its first holder's time left.

use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker, Mode, Wait};
use lock_etcd::EtcdBackend;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Wait = Wait::at_most(Duration::from_secs(20));

async fn connect() -> Option<(EtcdBackend, Locker)> {
    let url = server_url("LOCKKIT_ETCD_URL")?;
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    Some((backend.clone(), Locker::new(backend)))
}

#[tokio::test]
async fn each_permit_is_an_entry_of_the_queue() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-permits");
    let two = Mode::semaphore(2);
    let first = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 1");
    let second = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 2");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 2);
    // The holder etcd reports is the first permit's, by create revision.
    let head = backend.holder(&key).await.expect("holder").expect("held");
    assert_eq!(head.fencing_token, first.fencing_token());
    match locker.acquire_in(&key, two, TTL, Wait::NONE).await {
        Err(Error::Contended { remaining, .. }) => {
            let left = remaining.expect("the first permit's time left");
            assert!(left <= TTL, "{left:?}");
        }
        other => panic!("a third permit of 2: {other:?}"),
    }
    // The refused attempt wrote nothing that stays.
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 2);
    locker.release(first).await.expect("release");
    locker.release(second).await.expect("release");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);
}

#[tokio::test]
async fn a_waiter_in_another_mode_is_refused_at_once_and_leaves_no_entry() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-permit-modes");
    let permit = locker
        .acquire_in(&key, Mode::semaphore(3), TTL, Wait::NONE)
        .await
        .expect("a permit");
    // An exclusive waiter would otherwise queue behind the permits.
    let exclusive = locker.acquire(&key, TTL, WAIT).await;
    match exclusive {
        Err(Error::ModeConflict { held, asked, .. }) => {
            assert_eq!(held, Some(Mode::semaphore(3)));
            assert_eq!(asked, Mode::Exclusive);
        }
        other => panic!("an exclusive waiter on a semaphore: {other:?}"),
    }
    let other_number = locker.acquire_in(&key, Mode::semaphore(4), TTL, WAIT).await;
    assert!(
        matches!(
            other_number,
            Err(Error::ModeConflict {
                held: Some(Mode::Semaphore { permits: 3 }),
                ..
            })
        ),
        "{other_number:?}"
    );
    locker.release(permit).await.expect("release");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);

    let plain = locker.try_acquire(&key, TTL).await.expect("free again");
    let on_plain = locker.acquire_in(&key, Mode::semaphore(3), TTL, WAIT).await;
    assert!(
        matches!(
            on_plain,
            Err(Error::ModeConflict {
                held: Some(Mode::Exclusive),
                ..
            })
        ),
        "{on_plain:?}"
    );
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 1);
    locker.release(plain).await.expect("release");
}
