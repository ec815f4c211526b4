//! The key layout of a lock and the requests that work on it.
//!
//! Each lock is a queue of entries, one per contender, each bound to its
//! contender's own lease: `{prefix}{len}/{key}/{lease id in 16 hex digits}`,
//! where `len` is the key's length in bytes. The length makes the layout
//! unambiguous: no lock's entries are ever inside another lock's range, even
//! for keys such as `a` and `a/0000000000000001`. The entry with the lowest
//! create revision holds the lock, and that revision is its fencing token.
//! The value of an entry is its owner token in hex, so that only the holder
//! can release or extend, even with a lease rebuilt in another process; a
//! semaphore's permit adds the number of permits (see [`crate::permits`]).

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use lock_core::LockKey;

/// How many of the entries ahead of its own a waiter reads (the nearest
/// ones): what it watches when it has no feed, and what it follows on the
/// feed when it does not know how many are ahead in all.
const KNOWN_AHEAD: i64 = 16;

/// How many entries, with their values, one read of a reader's look for
/// a writer takes; more are read page by page in the same revision.
const PAGE: i64 = 64;

/// Entries ahead of a waiter's own, nearest first, as read in one revision.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ahead {
    pub(crate) keys: Vec<Vec<u8>>,
    /// True when the read found no more: these are all the entries ahead.
    pub(crate) all: bool,
    /// How many entries are ahead in all, when known: from the enqueue,
    /// whose read covers the whole queue at the entry's creation. The lock's
    /// feed then counts the deletions of entries created before the
    /// waiter's own and wakes it when none is left, with no read, however
    /// long the queue ([`crate::countdown`]).
    pub(crate) count: Option<usize>,
}

impl Ahead {
    /// From a read of the entries created before the waiter's own, newest
    /// first, cut off at [`KNOWN_AHEAD`].
    pub(crate) fn of(read: &GetResponse) -> Ahead {
        Ahead {
            keys: read.kvs().iter().map(|kv| kv.key().to_vec()).collect(),
            all: !read.more(),
            count: None,
        }
    }

    /// From the enqueue's read of the newest entries, its own first (see
    /// [`Queue::enqueue`]); `None` if it does not start there. Every other
    /// entry then was created before it, so the read's count of the whole
    /// queue, less its own, is how many are ahead.
    pub(crate) fn at_enqueue(read: &GetResponse, own: &[u8]) -> Option<Ahead> {
        let mut ahead = Ahead::behind_own(read, own)?;
        // A count at odds with the entries read is not trusted.
        let listed = ahead.keys.len();
        ahead.count = usize::try_from(read.count() - 1)
            .ok()
            .filter(|&n| if ahead.all { n == listed } else { n > listed });
        Some(ahead)
    }

    /// From a read that starts with the waiter's own entry (the newest
    /// entries created at or before it); `None` if it does not start there
    /// (the entry is gone).
    pub(crate) fn behind_own(read: &GetResponse, own: &[u8]) -> Option<Ahead> {
        let (first, ahead) = read.kvs().split_first()?;
        (first.key() == own).then(|| Ahead {
            keys: ahead.iter().map(|kv| kv.key().to_vec()).collect(),
            all: !read.more(),
            count: None,
        })
    }

    /// The entry just ahead.
    pub(crate) fn nearest(&self) -> Option<&[u8]> {
        self.keys.first().map(Vec::as_slice)
    }
}

/// The entries of one lock.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    prefix: Vec<u8>,
}

impl Queue {
    pub(crate) fn new(namespace: &str, key: &LockKey) -> Self {
        Queue {
            prefix: format!("{namespace}{}/{key}/", key.as_str().len()).into_bytes(),
        }
    }

    /// The range every entry of this lock lies in.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The entry of the contender holding `lease`.
    pub(crate) fn entry(&self, lease: i64) -> Vec<u8> {
        let mut entry = self.prefix.clone();
        entry.extend_from_slice(format!("{lease:016x}").as_bytes());
        entry
    }

    /// Joins the queue in one revision: when the queue is empty, only puts
    /// `entry` bound to `lease` (the new entry heads it: nothing to read);
    /// otherwise puts it too, and reads the queue's head and its newest
    /// entries (the new one, then the ones ahead of it, nearest first). The
    /// put's revision is the entry's create revision either way. Lease ids
    /// are unique and a lease is bound to one entry at most, so the entry
    /// does not exist yet: an empty queue proves it, and in a busy one the
    /// put checks it (see [`Queue::joined`]).
    pub(crate) fn enqueue(&self, entry: &[u8], lease: i64, owner_hex: &str) -> Txn {
        // The entries ahead let a waiter wait on the lock's feed, or set up
        // its own watch before its first queue check rather than after it.
        let newest = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(KNOWN_AHEAD + 1);
        Txn::new()
            .when([self.empty()])
            .and_then([self.put(entry, lease, owner_hex)])
            .or_else([
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
                        .and_then([self.put(entry, lease, owner_hex)]),
                ),
                TxnOp::get(self.prefix.clone(), Some(self.head())),
                TxnOp::get(self.prefix.clone(), Some(newest)),
            ])
    }

    /// One attempt that never queues: puts `entry` bound to `lease` only if
    /// the queue is empty, and otherwise writes nothing and reads the head
    /// (for its remaining TTL).
    pub(crate) fn try_take(&self, entry: &[u8], lease: i64, owner_hex: &str) -> Txn {
        Txn::new()
            .when([self.empty()])
            .and_then([self.put(entry, lease, owner_hex)])
            .or_else([TxnOp::get(self.prefix.clone(), Some(self.head()))])
    }

    /// Whether the queue holds no entry: with a range, etcd compares every
    /// key in it, and an empty range as one key that does not exist.
    fn empty(&self) -> Compare {
        Compare::create_revision(self.prefix.clone(), CompareOp::Equal, 0).with_prefix()
    }

    fn put(&self, entry: &[u8], lease: i64, owner_hex: &str) -> TxnOp {
        TxnOp::put(entry, owner_hex, Some(PutOptions::new().with_lease(lease)))
    }

    /// Joins the line for a permit in one revision: puts `entry` bound to
    /// `lease` with `value` (it does not exist yet, as in
    /// [`enqueue`](Self::enqueue)), then reads the queue's head (for its
    /// mode) and counts its entries, the new one included: every other one
    /// was created before it, so the count less one is how many are ahead.
    pub(crate) fn enqueue_permit(&self, entry: &[u8], lease: i64, value: &str) -> Txn {
        let count = GetOptions::new().with_prefix().with_count_only();
        Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
            .and_then([
                self.put(entry, lease, value),
                TxnOp::get(self.prefix.clone(), Some(self.head())),
                TxnOp::get(self.prefix.clone(), Some(count)),
            ])
    }

    /// Reads, in one revision, up to `permits` of the entries created before
    /// `revision`, and `entry` itself (created at `revision`): fewer than
    /// `permits` ahead means the entry holds a permit. (Not a count: etcd
    /// counts a range before it filters it by create revision.)
    pub(crate) fn permits_ahead(&self, entry: &[u8], revision: i64, permits: u32) -> Txn {
        let ahead = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(revision - 1)
            .with_limit(i64::from(permits));
        Txn::new().and_then([
            TxnOp::get(self.prefix.clone(), Some(ahead)),
            TxnOp::get(entry, None),
        ])
    }

    /// Whether a reply to [`enqueue`](Self::enqueue) or
    /// [`try_take`](Self::try_take) shows the entry created anew (`Some`),
    /// and whether it heads the queue; `None` when no put ran (a try on a
    /// held lock). An entry that existed before is a bug: `Err`.
    pub(crate) fn joined(resp: &etcd_client::TxnResponse) -> Result<Option<bool>, ()> {
        if resp.succeeded() {
            return Ok(Some(true));
        }
        match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Txn(put)) if put.succeeded() => Ok(Some(false)),
            Some(TxnOpResponse::Txn(_)) => Err(()),
            _ => Ok(None),
        }
    }

    /// The entry with the lowest create revision: the holder.
    pub(crate) fn head(&self) -> GetOptions {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
    }

    /// Every entry, oldest first, with its value (its mode).
    pub(crate) fn in_order(&self) -> GetOptions {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
    }

    /// Reads, in one revision, the entries ahead of the one created at
    /// `revision` (nearest first) and that entry itself.
    pub(crate) fn check(&self, entry: &[u8], revision: i64) -> Txn {
        let ahead = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(KNOWN_AHEAD);
        Txn::new().and_then([
            TxnOp::get(self.prefix.clone(), Some(ahead)),
            TxnOp::get(entry, None),
        ])
    }

    /// Reads, from the member's own copy (serializable: no round to the
    /// leader), the entry created at `revision` and the ones ahead of it:
    /// the newest entries created at or before `revision`.
    pub(crate) fn local_check(&self, revision: i64) -> GetOptions {
        GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(revision)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(KNOWN_AHEAD + 1)
            .with_serializable()
    }

    /// Finds the entry created at `revision` (a lease rebuilt without its
    /// backend state knows only its fencing token).
    pub(crate) fn created_at(&self, revision: i64) -> GetOptions {
        GetOptions::new()
            .with_prefix()
            .with_min_create_revision(revision)
            .with_max_create_revision(revision)
            .with_limit(1)
    }

    /// Deletes `entry` only if it is still the one created at `revision` and
    /// still carries `value` (the holder's owner token, and for a permit
    /// the number of permits).
    pub(crate) fn release(entry: &[u8], revision: i64, value: &str) -> Txn {
        Txn::new()
            .when(Queue::still_ours(entry, revision, value))
            .and_then([TxnOp::delete(entry, None)])
    }

    /// Moves `entry` to `new_lease` only if it is still ours and still bound
    /// to `old_lease` (a put keeps the create revision, so the fencing token
    /// and the place in the queue stay).
    pub(crate) fn move_to_lease(
        entry: &[u8],
        revision: i64,
        value: &str,
        old_lease: i64,
        new_lease: i64,
    ) -> Txn {
        let mut compares = Queue::still_ours(entry, revision, value).to_vec();
        compares.push(Compare::lease(entry, CompareOp::Equal, old_lease));
        Txn::new().when(compares).and_then([TxnOp::put(
            entry,
            value,
            Some(PutOptions::new().with_lease(new_lease)),
        )])
    }

    fn still_ours(entry: &[u8], revision: i64, value: &str) -> [Compare; 2] {
        [
            Compare::create_revision(entry, CompareOp::Equal, revision),
            Compare::value(entry, CompareOp::Equal, value),
        ]
    }

    /// One attempt that never queues: puts `entry` bound to `lease` with
    /// `value` only if the queue is empty (a free key in one request, with
    /// no look), and otherwise writes nothing and sends `look`.
    pub(crate) fn take_if_empty(
        &self,
        entry: &[u8],
        lease: i64,
        value: &str,
        look: Vec<TxnOp>,
    ) -> Txn {
        Txn::new()
            .when([self.empty()])
            .and_then([self.put(entry, lease, value)])
            .or_else(look)
    }

    /// Puts `entry` bound to `lease` with `value` (it does not exist yet,
    /// as in [`enqueue`](Self::enqueue)), then sends `look` in the same
    /// revision: every other entry it reads was created before the new
    /// one, so the look is exactly what is ahead of it.
    pub(crate) fn put_and_look(
        &self,
        entry: &[u8],
        lease: i64,
        value: &str,
        look: Vec<TxnOp>,
    ) -> Txn {
        let mut then = vec![self.put(entry, lease, value)];
        then.extend(look);
        Txn::new()
            .when([Compare::create_revision(entry, CompareOp::Equal, 0)])
            .and_then(then)
    }

    /// Reads the head, and counts the queue's entries.
    pub(crate) fn head_read(&self) -> TxnOp {
        TxnOp::get(self.prefix.clone(), Some(self.head()))
    }

    /// Reads the newest entries created before revision `below` (all of
    /// them for `None`), newest first, with their values (their modes).
    pub(crate) fn newest_read(&self, below: Option<i64>) -> TxnOp {
        TxnOp::get(self.prefix.clone(), Some(self.newest(below)))
    }

    /// The newest entries created before `below`, a page of them.
    pub(crate) fn newest(&self, below: Option<i64>) -> GetOptions {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(PAGE);
        match below {
            Some(below) => newest.with_max_create_revision(below - 1),
            None => newest,
        }
    }

    /// Reads, in one revision, a reader's own entry (created at `revision`)
    /// and the newest entries ahead of it, with their modes: the reader
    /// holds once no writer is ahead.
    pub(crate) fn readers_check(&self, entry: &[u8], revision: i64) -> Txn {
        Txn::new().and_then([TxnOp::get(entry, None), self.newest_read(Some(revision))])
    }
}

/// The lock key of an entry, given the entry's key without the namespace
/// (`{len}/{key}/{16 hex digits}`); `None` for keys of another layout.
pub(crate) fn lock_key(entry: &[u8]) -> Option<String> {
    let slash = entry.iter().position(|&b| b == b'/')?;
    let len: usize = std::str::from_utf8(&entry[..slash]).ok()?.parse().ok()?;
    let rest = &entry[slash + 1..];
    if rest.len() != len + 17 || rest[len] != b'/' {
        return None;
    }
    String::from_utf8(rest[..len].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::Limits;
    use lock_core::raw::validate;

    fn key(k: &str) -> LockKey {
        validate::key(k, &Limits::default()).unwrap()
    }

    #[test]
    fn layout_is_readable_and_unambiguous() {
        let a = Queue::new("lockkit/", &key("a"));
        assert_eq!(a.entry(255), b"lockkit/1/a/00000000000000ff");
        let tricky = Queue::new("lockkit/", &key("a/00000000000000ff"));
        assert!(!tricky.prefix().starts_with(a.prefix()));
        assert!(!a.entry(1).starts_with(tricky.prefix()));
        let entry = tricky.entry(7);
        assert_eq!(
            lock_key(&entry[b"lockkit/".len()..]).as_deref(),
            Some("a/00000000000000ff")
        );
        assert_eq!(lock_key(b"2/a/0000000000000007"), None);
    }
}
