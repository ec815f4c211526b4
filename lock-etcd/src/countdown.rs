//! A waiter that knows how many entries are ahead of its own hands the
//! counting to the lock's feed ([`crate::feed`]): the feed counts the
//! deletions of entries created before the waiter's and tells it only the
//! outcome. A release then wakes the one waiter it makes the head, not
//! every waiter of this backend on that lock.

use tokio::sync::oneshot;

use crate::feed::Deletion;

/// What the feed tells a waiter counting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Told {
    /// Every entry that was ahead is deleted: the waiter heads the queue.
    Head,
    /// The waiter's own entry was deleted (its lease ended).
    Gone,
}

/// Where one deletion leaves a countdown.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Still waiting.
    Wait,
    /// Done: tell the waiter.
    Tell(Told),
    /// A deletion whose create revision is unknown: the count can no longer
    /// be trusted, and the waiter must read where it stands.
    Unsure,
}

/// A waiter's count of the entries ahead of its own entry `own`, created
/// at revision `created`, when `left` were ahead.
pub(crate) struct Countdown {
    own: Vec<u8>,
    created: i64,
    left: usize,
    tell: oneshot::Sender<Told>,
}

impl Countdown {
    /// A countdown and what it will tell; `left` must be at least 1.
    pub(crate) fn new(
        own: &[u8],
        created: i64,
        left: usize,
    ) -> (Countdown, oneshot::Receiver<Told>) {
        let (tell, told) = oneshot::channel();
        let countdown = Countdown {
            own: own.to_vec(),
            created,
            left,
            tell,
        };
        (countdown, told)
    }

    /// Counts one revision's deletions. Deletions at or before our entry's
    /// creation are of earlier entries (leases, and so keys, are reused)
    /// and were not counted; entries only join behind, each entry ahead is
    /// deleted once, and an entry created after ours is behind it. Our own
    /// entry deleted in the same revision as the last one ahead means it is
    /// gone, whatever order the transaction deleted them in.
    pub(crate) fn step(&mut self, at_once: &[Deletion]) -> Step {
        let Some(revision) = at_once.first().map(|gone| gone.revision) else {
            return Step::Wait;
        };
        if revision <= self.created {
            return Step::Wait;
        }
        if at_once.iter().any(|gone| gone.key == self.own) {
            return Step::Tell(Told::Gone);
        }
        for gone in at_once {
            match gone.created {
                Some(at) if at < self.created => {
                    debug_assert!(self.left > 0, "more entries ahead deleted than counted");
                    self.left = self.left.saturating_sub(1);
                }
                Some(_) => {}
                None => return Step::Unsure,
            }
        }
        if self.left == 0 {
            Step::Tell(Told::Head)
        } else {
            Step::Wait
        }
    }

    /// Whether the waiter still listens.
    pub(crate) fn listening(&self) -> bool {
        !self.tell.is_closed()
    }

    /// Tells the waiter the outcome (dropping the countdown unsaid tells it
    /// the feed can no longer count for it).
    pub(crate) fn tell(self, told: Told) {
        // The waiter left meanwhile: nobody to tell.
        let _ = self.tell.send(told);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &[u8] = b"queue/own";
    const CREATED: i64 = 100;

    fn gone(key: &str, revision: i64, created: Option<i64>) -> Deletion {
        Deletion {
            key: key.as_bytes().to_vec(),
            revision,
            created,
        }
    }

    /// The steps of a countdown with 3 entries ahead, one revision's
    /// deletions at a time.
    fn steps(revisions: &[&[Deletion]]) -> Vec<Step> {
        let (mut countdown, _told) = Countdown::new(OWN, CREATED, 3);
        revisions
            .iter()
            .map(|at_once| countdown.step(at_once))
            .collect()
    }

    #[test]
    fn the_waiter_heads_the_queue_once_every_entry_ahead_is_deleted() {
        let steps = steps(&[
            // An earlier entry under a reused key, deleted before ours was created.
            &[gone("queue/a", 90, Some(80))],
            &[gone("queue/a", 101, Some(10))],
            // Behind ours: not counted.
            &[gone("queue/late", 102, Some(101))],
            &[gone("queue/b", 103, Some(20))],
            &[gone("queue/c", 104, Some(30))],
        ]);
        use Step::*;
        assert_eq!(steps, [Wait, Wait, Wait, Wait, Tell(Told::Head)]);
    }

    #[test]
    fn the_deletion_of_our_own_entry_means_it_is_gone() {
        let steps = steps(&[
            // Our key, reused: an earlier entry's deletion.
            &[gone("queue/own", 99, Some(50))],
            &[gone("queue/own", 101, Some(CREATED))],
        ]);
        assert_eq!(steps, [Step::Wait, Step::Tell(Told::Gone)]);
    }

    /// One transaction deleting the entries ahead and then ours: the lock
    /// did not pass to us, our entry is gone.
    #[test]
    fn our_entry_deleted_with_the_last_ones_ahead_is_gone() {
        let steps = steps(&[
            &[gone("queue/a", 101, Some(10))],
            &[
                gone("queue/b", 102, Some(20)),
                gone("queue/c", 102, Some(30)),
                gone("queue/own", 102, Some(CREATED)),
            ],
        ]);
        assert_eq!(steps, [Step::Wait, Step::Tell(Told::Gone)]);
    }

    /// Several entries ahead deleted in one revision count as many.
    #[test]
    fn entries_ahead_deleted_together_each_count() {
        let steps = steps(&[
            &[
                gone("queue/a", 101, Some(10)),
                gone("queue/b", 101, Some(20)),
            ],
            &[
                gone("queue/late", 102, Some(101)),
                gone("queue/c", 102, Some(30)),
            ],
        ]);
        assert_eq!(steps, [Step::Wait, Step::Tell(Told::Head)]);
    }

    #[test]
    fn a_deletion_without_its_create_revision_leaves_the_count_unsure() {
        let steps = steps(&[
            &[gone("queue/a", 101, Some(10))],
            &[gone("queue/b", 102, None)],
        ]);
        assert_eq!(steps, [Step::Wait, Step::Unsure]);
    }
}
