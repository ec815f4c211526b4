//! Coalescing: the acquires and releases that callers send to one server
//! while an earlier batch is on the wire go out together, as one `EVALSHA`
//! of [`BATCH_LUA`](crate::scripts::BATCH_LUA) for exclusive locks, or of
//! [`HOLDS_LUA`](crate::holds::HOLDS_LUA) for permits and read holds (and
//! their extends): a batch is a run, in the order asked, of the operations
//! of one script, so both kinds share the queue, the wire and its order.
//!
//! A Redis server spends more on each script call (finding the script,
//! setting up Lua, parsing the command, writing the reply) than on the few
//! commands a lock operation runs inside it, and the client spends more on
//! each request than on its arguments. Sending what has queued up in one
//! call shares those costs among all the callers of a busy client, like a
//! database's group commit. Nothing waits on a timer to fill a batch: the
//! batcher only lets the tasks that are ready to run go first, so that
//! callers woken together ask together; a lone caller's request leaves
//! after that one scheduling round, as a batch of one.
//!
//! A batch's answers reach its callers as [`Handout`] says: for a single
//! server, [`HANDOUT_ROUND`] at a time, the callers answered so far running
//! (and asking again) before the next are answered. Handed out all at once,
//! the answers of a busy batch wake all its callers together, they all ask
//! again together, and their next batch leaves only once the last of them
//! has asked: the client works while the server waits, then the other way
//! round. In rounds, the first callers' next operations leave while the
//! rest are still being answered, so the server works while the client
//! does (the lab's paired rounds against rslock measure it).
//!
//! Up to [`IN_FLIGHT`] batches are on the wire at once per server over the
//! redis crate's connection, and up to [`IN_FLIGHT_ON_OWN_SOCKET`] over the
//! batcher's own socket ([`Batcher::connect`], [`crate::socket`]), where,
//! for the callers of one server, a call waits for a few operations to
//! share it once two are on the wire. Batches leave in the order their
//! operations were asked, and an operation whose claim (lock and owner) is
//! still on the wire waits, with everything asked after it, until that
//! batch has answered and the claim's answer has been handed out: a
//! release asked after an acquire (for instance the clean-up of an acquire
//! whose caller stopped waiting) runs after it, even when the acquire is
//! stuck on a paused server, and so does whatever was asked after the
//! release. (On its own socket, a connection whose oldest call has gone
//! unanswered for the response timeout refuses, unsent, what is asked
//! then, but the operations of claims on the wire or waiting.) An acquire
//! whose caller has already gone when its batch is formed is not sent at
//! all, so it grants nothing.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use lock_core::OwnerToken;
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::{mpsc, oneshot};

use crate::LockKeys;
use crate::holds::{self, HoldOperation};
use crate::scripts::{self, AcquireReply, Operation, TokenRule};
use crate::socket::Dial;

mod line;
mod own_socket;

/// The most operations one call carries: 128 keep a call's reply small and
/// the server's other clients waiting no more than a few hundred µs.
pub const MAX_BATCH: usize = 128;

/// How many calls may be on the wire at once over the redis crate's
/// connection: while the server runs one, the next one fills up, so
/// neither side waits for the other. More did not help there: that
/// connection's own task passes every call and reply on.
pub const IN_FLIGHT: usize = 3;

/// How many calls may be on the wire at once over the batcher's own
/// socket. Callers answered together ask again on whichever worker thread
/// runs them, and a thread that has to be woken first answers late: with
/// only a few calls on the wire, the server then ran out of work. At 64
/// callers on two worker threads, 16 kept it busy (8 did not always); the
/// batches are smaller, which costs the server a little more per operation.
pub const IN_FLIGHT_ON_OWN_SOCKET: usize = 16;

/// How many answers of a batch [`Handout::InRounds`] hands out before it
/// lets the callers answered so far run.
pub const HANDOUT_ROUND: usize = 4;

/// How a batch's answers reach its callers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handout {
    /// All at once: for callers that wait on the batches of several
    /// servers (Redlock), where an answer held back delays its caller's
    /// whole round.
    AllAtOnce,
    /// [`HANDOUT_ROUND`] at a time: for callers of one server.
    InRounds,
}

/// A lock and the owner asking for it: what one operation names, shared by
/// the batchers of all the servers it goes to.
pub struct Claim {
    keys: LockKeys,
    owner: String,
    /// FNV-1a of the lock key and the owner, for the batcher's bookkeeping.
    id: u64,
}

/// Without the owner token, which is a secret.
impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("lock", &self.keys.lock)
            .finish_non_exhaustive()
    }
}

impl Claim {
    /// `owner`'s claim on the lock with these Redis `keys`.
    pub fn new(keys: LockKeys, owner: &OwnerToken) -> Arc<Claim> {
        let owner = owner.to_hex();
        let id = keys
            .lock
            .bytes()
            .chain(owner.bytes())
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        Arc::new(Claim { keys, owner, id })
    }

    /// The lock's Redis keys.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn id(&self) -> u64 {
        self.id
    }
}

/// One caller's request, waiting for its batch.
struct Request {
    claim: Arc<Claim>,
    operation: Work,
    reply: oneshot::Sender<RedisResult<i64>>,
}

/// What a request asks, and so which script runs it: a batch is a run of
/// requests of one script.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// An exclusive lock's operation, run by [`scripts::BATCH_LUA`].
    Lock(Operation),
    /// A permit's or a read hold's, run by [`holds::HOLDS_LUA`].
    Hold(HoldOperation),
}

impl Work {
    /// Whether it grants something, which a caller that has gone need not get.
    fn is_acquire(&self) -> bool {
        match self {
            Work::Lock(operation) => matches!(operation, Operation::Acquire { .. }),
            Work::Hold(operation) => operation.is_acquire(),
        }
    }

    /// Whether the two go in one call: they run by the same script.
    fn same_script(&self, other: &Work) -> bool {
        matches!(
            (self, other),
            (Work::Lock(_), Work::Lock(_)) | (Work::Hold(_), Work::Hold(_))
        )
    }
}

/// Sends acquires and releases to one server, coalesced. Cheap to clone;
/// clones share the queue. The background task that sends the batches ends
/// when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Batcher {
    queue: mpsc::UnboundedSender<Request>,
    /// How long a caller waits for its answer, when the connection does
    /// not bound each call itself.
    response_timeout: Option<Duration>,
}

impl Batcher {
    /// Starts sending batches over `conn` (a multiplexed connection; its
    /// response timeout, if any, bounds each batch), handing the answers
    /// out as `handout` says. Must be called within a Tokio runtime.
    pub fn start<C>(conn: C, rule: TokenRule, handout: Handout) -> Batcher
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(send_batches(conn, rule, handout, requests));
        Batcher {
            queue,
            response_timeout: None,
        }
    }

    /// Opens a connection of its own to the server `dial` names, and sends
    /// batches over it, handing the answers out as `handout` says (see
    /// [`crate::socket`] for why). Each caller waits at most the dial's
    /// response timeout for its answer (unless the batcher is
    /// [`bounded_by_callers`](Self::bounded_by_callers)). A broken connection fails the
    /// calls on it, and the next call connects again (after a failed dial,
    /// not before a pause of up to 50 ms, doubling to up to 1 s); one the
    /// server closes while idle is opened again at once. While its oldest call has gone
    /// unanswered for the response timeout, what is asked fails at once,
    /// unsent, but the operations of claims on the wire. Must be called
    /// within a Tokio runtime.
    pub async fn connect(dial: Dial, rule: TokenRule, handout: Handout) -> RedisResult<Batcher> {
        let socket = dial.open().await?;
        Ok(Self::on_line(line::Line::open(dial, socket), rule, handout))
    }

    /// Like [`connect`](Self::connect), but returns at once: the connection
    /// is opened in the background, and calls asked meanwhile wait for it.
    /// For a server that may be down now and up later (a Redlock node): a
    /// dial that fails fails the calls waiting for it, and those asked
    /// during a pause after it (up to 50 ms, doubling with each failure,
    /// with jitter, to up to 1 s), so that a server that refuses connections costs a call no
    /// time. (A dial that gets no answer holds the calls asked meanwhile
    /// for up to the connect timeout: the batching task waits for it.)
    pub fn connect_in_background(dial: Dial, rule: TokenRule, handout: Handout) -> Batcher {
        Self::on_line(line::Line::closed(dial), rule, handout)
    }

    fn on_line(line: line::Line, rule: TokenRule, handout: Handout) -> Batcher {
        let response_timeout = line.response_timeout();
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(own_socket::send_batches(line, rule, handout, requests));
        Batcher {
            queue,
            response_timeout: Some(response_timeout),
        }
    }

    /// This batcher, with how long to wait for each answer left to its
    /// callers: for callers that bound every call themselves (Redlock bounds
    /// each fan-out to its nodes by the per-node timeout), where a timer per
    /// call would be a second one. The connection still refuses new calls
    /// while it is stalled.
    pub fn bounded_by_callers(mut self) -> Batcher {
        self.response_timeout = None;
        self
    }

    /// One acquire attempt, as [`scripts::acquire`] with this batcher's
    /// token rule. Queued when called, not when first polled, so requests
    /// made one after another go out in that order.
    ///
    /// `others_wait`: others are known to wait for the lock, so the grant's
    /// release is to publish.
    pub fn acquire(
        &self,
        claim: Arc<Claim>,
        ttl: Duration,
        others_wait: bool,
    ) -> impl Future<Output = RedisResult<AcquireReply>> + Send + use<> {
        let answer = self.ask(claim, Work::Lock(Operation::acquire(ttl, others_wait)));
        async move { Ok(AcquireReply::from_reply(answer.await?)) }
    }

    /// Compare-and-delete, as [`scripts::release`]: false when the claim's
    /// owner did not hold the lock. `token` (0 when unknown) is the release
    /// message. Queued when called.
    pub fn release(
        &self,
        claim: Arc<Claim>,
        token: u64,
    ) -> impl Future<Output = RedisResult<bool>> + Send + use<> {
        let answer = self.ask(claim, Work::Lock(Operation::Release { token }));
        async move { Ok(answer.await? == 1) }
    }

    /// An operation on a permit or a read hold, as
    /// [`holds::run_holds`] with this batcher's token rule; its answer as
    /// [`HoldAnswer::read`](holds::HoldAnswer::read) reads it. Queued when
    /// called, in one queue with the claim's exclusive operations.
    pub fn hold(
        &self,
        claim: Arc<Claim>,
        operation: HoldOperation,
    ) -> impl Future<Output = RedisResult<holds::HoldAnswer>> + Send + use<> {
        let answer = self.ask(claim, Work::Hold(operation));
        async move { Ok(holds::HoldAnswer::read(&operation, answer.await?)) }
    }

    fn ask(
        &self,
        claim: Arc<Claim>,
        operation: Work,
    ) -> impl Future<Output = RedisResult<i64>> + Send + use<> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            claim,
            operation,
            reply,
        };
        let queued = self.queue.send(request).is_ok();
        let response_timeout = self.response_timeout;
        async move {
            if !queued {
                return Err(stopped());
            }
            let answer = match response_timeout {
                None => answer.await,
                Some(after) => tokio::time::timeout(after, answer)
                    .await
                    .map_err(|_| no_answer(after))?,
            };
            answer.unwrap_or_else(|_| Err(stopped()))
        }
    }
}

/// The server did not answer a call within `after`.
fn no_answer(after: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {after:?}"),
    ))
}

/// The batching task's runtime has shut down.
fn stopped() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "the connection's batching task has stopped (its Tokio runtime shut down)",
    ))
}

/// What a batching task keeps: the requests not sent yet, the claims on
/// the wire, and the answers not handed out yet.
struct Queue {
    handout: Handout,
    waiting: Vec<Request>,
    // The (lock, owner) pairs of the calls on the wire: an owner's later
    // operation on the same lock waits for them, as calls on one connection
    // are not guaranteed to run in the order their futures were created.
    busy: Busy,
    // Answers that came back and are not handed out yet, in order.
    answered: VecDeque<(Request, RedisResult<i64>)>,
}

impl Queue {
    fn new(handout: Handout) -> Queue {
        Queue {
            handout,
            waiting: Vec::with_capacity(MAX_BATCH),
            busy: Busy::default(),
            answered: VecDeque::new(),
        }
    }

    /// Hands out one round of answers (see [`Handout`]), and drops the
    /// acquires nobody waits for any more: sent, they would only grant a
    /// lock to no one. Runs on every pass, also while the wire is full.
    fn hand_out(&mut self) {
        let round = match self.handout {
            Handout::AllAtOnce => self.answered.len(),
            Handout::InRounds => HANDOUT_ROUND.min(self.answered.len()),
        };
        for (request, answer) in self.answered.drain(..round) {
            // Answered: the claim's later operations may go.
            self.busy.remove(&request.claim.id());
            let _ = request.reply.send(answer);
        }
        self.waiting
            .retain(|r| !(r.reply.is_closed() && r.operation.is_acquire()));
    }

    /// The next batch to send, its claims now on the wire; empty when
    /// nothing is ready.
    fn next_batch(&mut self) -> Vec<Request> {
        let batch = take_batch(&mut self.waiting, &self.busy);
        for request in &batch {
            self.busy.insert(request.claim.id());
        }
        batch
    }

    /// A batch's answers, one per operation, or the error of its whole call.
    fn answer(&mut self, batch: Vec<Request>, answers: RedisResult<Vec<RedisResult<i64>>>) {
        match answers {
            Ok(answers) => self.answered.extend(batch.into_iter().zip(answers)),
            Err(e) => self
                .answered
                .extend(batch.into_iter().map(|r| (r, Err(e.clone())))),
        }
    }

    /// Answers with `error`, unsent, the requests that joined the queue
    /// after the first `from`, but those whose claim is on the wire or has
    /// an earlier request waiting: they wait, to run after it.
    fn refuse_new(&mut self, from: usize, error: impl Fn() -> RedisError) {
        let new = self.waiting.split_off(from.min(self.waiting.len()));
        for request in new {
            let id = request.claim.id();
            if self.busy.contains(&id) || self.waiting.iter().any(|r| r.claim.id() == id) {
                self.waiting.push(request);
            } else {
                let _ = request.reply.send(Err(error()));
            }
        }
    }

    /// Whether calls wait to be fuller while the server is busy: only for
    /// callers of one server (see `own_socket::BUSY_WIRE`).
    fn fills_calls(&self) -> bool {
        self.handout == Handout::InRounds
    }

    /// Whether a batch is ready to send.
    fn has_ready(&self) -> bool {
        self.waiting
            .first()
            .is_some_and(|r| !self.busy.contains(&r.claim.id()))
    }

    /// How many requests wait to be sent.
    fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether answers wait to be handed out.
    fn has_answers(&self) -> bool {
        !self.answered.is_empty()
    }

    /// Whether nothing is left to send or hand out.
    fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.answered.is_empty()
    }

    /// Takes what callers asked: at least one request, unless the queue is
    /// closed (then false). Cancel-safe.
    async fn receive(&mut self, requests: &mut mpsc::UnboundedReceiver<Request>) -> bool {
        requests.recv_many(&mut self.waiting, MAX_BATCH).await > 0
    }

    /// After [`receive`](Self::receive): lets the tasks that are ready run,
    /// and takes what they asked meanwhile (see [`gather_ready`]).
    async fn gather_ready(&mut self, requests: &mut mpsc::UnboundedReceiver<Request>) {
        gather_ready(requests, &mut self.waiting).await;
    }

    /// Whether there is room to receive more requests.
    fn has_room(&self) -> bool {
        self.waiting.len() < MAX_BATCH
    }
}

/// The background task over a [`ConnectionLike`]: sends what has queued up
/// as one call, up to [`IN_FLIGHT`] calls at a time, hands out the
/// answers, and repeats.
async fn send_batches<C: ConnectionLike + Clone + Send + 'static>(
    conn: C,
    rule: TokenRule,
    handout: Handout,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut queue = Queue::new(handout);
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        queue.hand_out();
        while in_flight.len() < IN_FLIGHT {
            let batch = queue.next_batch();
            if batch.is_empty() {
                break;
            }
            in_flight.push(send(conn.clone(), rule.clone(), batch));
        }
        if !open && in_flight.is_empty() && queue.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            Some((batch, answers)) = in_flight.next(), if !in_flight.is_empty() => {
                // One answer per operation (`answers_of` checks the count).
                queue.answer(batch, answers);
            }
            received = queue.receive(&mut requests), if open && queue.has_room() => {
                open = received;
                if open {
                    queue.gather_ready(&mut requests).await;
                }
            }
            // More answers to hand out: the callers answered so far go first.
            () = tokio::task::yield_now(), if queue.has_answers() => {}
        }
    }
}

/// Lets the other tasks that are ready to run go first, then takes what
/// they asked meanwhile. An answer wakes all the callers of its batch at
/// once; without this, the first of them to ask again would leave alone, as
/// a batch of one, and take a place on the wire before the others have run.
/// One scheduling round is short beside a round trip (at one caller the
/// pairs per second did not move; at 64 callers, batches doubled in size).
async fn gather_ready(requests: &mut mpsc::UnboundedReceiver<Request>, waiting: &mut Vec<Request>) {
    tokio::task::yield_now().await;
    while waiting.len() < MAX_BATCH {
        match requests.try_recv() {
            Ok(request) => waiting.push(request),
            Err(_) => break,
        }
    }
}

/// The ids of the (lock, owner) pairs on the wire. Two pairs sharing an id
/// only make one wait a round for the other, so a short hash does.
type Busy = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Hashes a [`key_id`], already a hash, as itself.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

/// Takes up to [`MAX_BATCH`] waiting requests of one script, in order, up
/// to the first whose claim is on the wire: that one and all after it
/// wait, so that every operation runs after those asked before it, as on a
/// plain connection.
fn take_batch(waiting: &mut Vec<Request>, busy: &Busy) -> Vec<Request> {
    let Some(first) = waiting.first().map(|r| r.operation) else {
        return Vec::new();
    };
    let ready = waiting
        .iter()
        .take(MAX_BATCH)
        .take_while(|r| !busy.contains(&r.claim.id()) && r.operation.same_script(&first))
        .count();
    waiting.drain(..ready).collect()
}

/// The call that runs `batch` (a run of one script's requests): its
/// `EVALSHA`, or, `with_text`, the `EVAL` that also loads the script.
fn command(rule: &TokenRule, batch: &[Request], with_text: bool) -> redis::Cmd {
    match batch.first().map(|r| r.operation) {
        Some(Work::Hold(_)) => {
            let operations: Vec<(&LockKeys, &str, HoldOperation)> = batch
                .iter()
                .filter_map(|r| match r.operation {
                    Work::Hold(operation) => {
                        Some((&r.claim.keys, r.claim.owner.as_str(), operation))
                    }
                    Work::Lock(_) => None,
                })
                .collect();
            holds::holds_command(rule, &operations, with_text)
        }
        _ => {
            let operations: Vec<(&LockKeys, &str, Operation)> = batch
                .iter()
                .filter_map(|r| match r.operation {
                    Work::Lock(operation) => {
                        Some((&r.claim.keys, r.claim.owner.as_str(), operation))
                    }
                    Work::Hold(_) => None,
                })
                .collect();
            match with_text {
                true => scripts::batch_command_with_text(rule, &operations),
                false => scripts::batch_command(rule, &operations),
            }
        }
    }
}

/// Sends one batch; returns it with its answers: one per operation, or
/// the error of the whole call.
async fn send<C: ConnectionLike>(
    mut conn: C,
    rule: TokenRule,
    batch: Vec<Request>,
) -> (Vec<Request>, RedisResult<Vec<RedisResult<i64>>>) {
    let answers = async {
        let reply: redis::Value = match command(&rule, &batch, false).query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                command(&rule, &batch, true).query_async(&mut conn).await?
            }
            other => other?,
        };
        scripts::answers_of(reply, batch.len())
    }
    .await;
    (batch, answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_debug_output_hides_the_owner_token() {
        let owner = OwnerToken::random();
        let claim = Claim::new(crate::KeyLayout::default().keys("k"), &owner);
        let shown = format!("{claim:?}");
        assert!(
            shown.contains("lockkit:{k}") && !shown.contains(&owner.to_hex()),
            "{shown}"
        );
    }
}
