//! Quorum and validity arithmetic, and the tally of one fan-out to all nodes.
//!
//! Pure functions only: the network lives in `nodes.rs`, so the rules that
//! decide whether a lock is held can be tested without servers.

use std::fmt;
use std::time::Duration;

/// How many of `nodes` must agree: a strict majority, `N/2 + 1`.
///
/// Two majorities of the same node set always share a node, which is what
/// makes both mutual exclusion and the fencing write-back work.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// How many of `nodes` may fail while a quorum can still be reached.
///
/// An even `N` tolerates no more failures than `N - 1`: four nodes need
/// three, so they survive one failure, as three nodes do.
pub fn tolerated_failures(nodes: usize) -> usize {
    nodes.saturating_sub(quorum(nodes))
}

/// Redlock's validity: what is left of `ttl` after the `elapsed` time the
/// quorum took and the clock `drift` allowance, or `None` when nothing is.
///
/// The grant counts only while this is positive.
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// What one node answered to one request of a fan-out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<T> {
    /// The node did what was asked (and returned `T`, e.g. its counter).
    Done(T),
    /// Another owner holds the key on this node, for `remaining` if known.
    Refused {
        /// The other owner's remaining TTL on this node.
        remaining: Option<Duration>,
    },
    /// The node could not be asked in time: an error or the per-node timeout.
    Failed(String),
}

/// The answers of all nodes to one request, by node index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally<T> {
    replies: Vec<Reply<T>>,
}

impl<T> Tally<T> {
    /// Collects the replies; `replies[i]` is node `i`'s answer.
    pub fn new(replies: Vec<Reply<T>>) -> Self {
        Tally { replies }
    }

    /// The number of nodes asked.
    pub fn nodes(&self) -> usize {
        self.replies.len()
    }

    /// The replies, by node index.
    pub fn replies(&self) -> &[Reply<T>] {
        &self.replies
    }

    /// The nodes that did what was asked, with their answers.
    pub fn done(&self) -> impl Iterator<Item = (usize, &T)> {
        self.replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Reply::Done(t) => Some((i, t)),
                _ => None,
            })
    }

    /// Indexes of the nodes whose reply matches `pick`.
    fn indexes(&self, pick: impl Fn(&Reply<T>) -> bool) -> Vec<usize> {
        self.replies
            .iter()
            .enumerate()
            .filter(|(_, r)| pick(r))
            .map(|(i, _)| i)
            .collect()
    }

    /// Number of nodes that did what was asked.
    pub fn done_count(&self) -> usize {
        self.indexes(|r| matches!(r, Reply::Done(_))).len()
    }

    /// True when a majority of the nodes did what was asked.
    pub fn has_quorum(&self) -> bool {
        self.done_count() >= quorum(self.nodes())
    }

    /// True when enough nodes refused that no answer from the failed ones
    /// could have made a quorum: plain contention, not an outage.
    pub fn refused_by_majority_of_possible(&self) -> bool {
        let refused = self.indexes(|r| matches!(r, Reply::Refused { .. })).len();
        refused > self.nodes() - quorum(self.nodes())
    }

    /// When the key may become free, as far as the refusing nodes tell: the
    /// time until enough refusals expire that the nodes not refusing form a
    /// quorum. `None` when some refusing node did not report its TTL.
    pub fn free_in(&self) -> Option<Duration> {
        let mut remaining = Vec::new();
        for r in &self.replies {
            if let Reply::Refused { remaining: left } = r {
                remaining.push((*left)?);
            }
        }
        remaining.sort();
        // Refusals that may stay while the others still form a quorum.
        let may_stay = self.nodes() - quorum(self.nodes());
        let must_expire = remaining.len().checked_sub(may_stay)?;
        must_expire.checked_sub(1).map(|i| remaining[i])
    }

    /// The error describing why no quorum was reached, naming the nodes
    /// (`endpoints[i]` is node `i`'s address).
    pub fn to_error(&self, operation: &'static str, endpoints: &[String]) -> QuorumError {
        let name = |i: usize| {
            endpoints
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("node #{}", i + 1))
        };
        QuorumError {
            operation,
            nodes: self.nodes(),
            needed: quorum(self.nodes()),
            done: self
                .indexes(|r| matches!(r, Reply::Done(_)))
                .into_iter()
                .map(name)
                .collect(),
            refused: self
                .indexes(|r| matches!(r, Reply::Refused { .. }))
                .into_iter()
                .map(name)
                .collect(),
            failed: self
                .replies
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match r {
                    Reply::Failed(why) => Some((name(i), why.clone())),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// No majority of the nodes did what was asked. Says how many nodes
/// granted, refused (another owner holds the key there) and failed or
/// timed out, and which. Kept as the `source` of the
/// [`lock_core::Error`] it causes, so callers can downcast to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumError {
    /// What was asked: "acquire", "extend", "fencing write-back", ...
    pub operation: &'static str,
    /// How many nodes were asked.
    pub nodes: usize,
    /// How many had to agree.
    pub needed: usize,
    /// The nodes that agreed.
    pub done: Vec<String>,
    /// The nodes where another owner holds the key.
    pub refused: Vec<String>,
    /// The nodes that failed or timed out, with what happened.
    pub failed: Vec<(String, String)>,
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reached no quorum: {} of {} nodes agreed ({} needed)",
            self.operation,
            self.done.len(),
            self.nodes,
            self.needed
        )?;
        if !self.done.is_empty() {
            write!(f, " [{}]", self.done.join(", "))?;
        }
        let refusal = if self.operation == "acquire" {
            "held by another owner"
        } else {
            "not held by this owner"
        };
        write!(f, "; {} refused ({refusal})", self.refused.len())?;
        if !self.refused.is_empty() {
            write!(f, " [{}]", self.refused.join(", "))?;
        }
        write!(f, "; {} failed or timed out", self.failed.len())?;
        if !self.failed.is_empty() {
            let failed: Vec<String> = self
                .failed
                .iter()
                .map(|(node, why)| format!("{node}: {why}"))
                .collect();
            write!(f, " [{}]", failed.join("; "))?;
        }
        Ok(())
    }
}

impl std::error::Error for QuorumError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let table = [
            (1, 1, 0),
            (2, 2, 0),
            (3, 2, 1),
            (4, 3, 1),
            (5, 3, 2),
            (6, 4, 2),
            (7, 4, 3),
        ];
        for (n, q, tolerated) in table {
            assert_eq!(quorum(n), q, "quorum of {n}");
            assert_eq!(
                tolerated_failures(n),
                tolerated,
                "tolerated failures of {n}"
            );
            assert!(2 * quorum(n) > n, "two quorums of {n} must share a node");
        }
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift_and_is_never_zero() {
        assert_eq!(validity(ms(1000), ms(30), ms(12)), Some(ms(958)));
        assert_eq!(
            validity(ms(1000), ms(988), ms(12)),
            None,
            "exactly used up is not valid"
        );
        assert_eq!(validity(ms(1000), ms(995), ms(12)), None);
        assert_eq!(validity(ms(1000), ms(1500), ms(0)), None);
    }

    fn tally(replies: &str) -> Tally<u64> {
        // g = granted (token 7), r = refused for 100 ms * position, f = failed.
        Tally::new(
            replies
                .chars()
                .enumerate()
                .map(|(i, c)| match c {
                    'g' => Reply::Done(7),
                    'r' => Reply::Refused {
                        remaining: Some(ms(100 * (i as u64 + 1))),
                    },
                    'f' => Reply::Failed("timed out after 50ms".into()),
                    _ => unreachable!(),
                })
                .collect(),
        )
    }

    #[test]
    fn a_majority_of_grants_is_needed() {
        assert!(tally("gggff").has_quorum());
        assert!(tally("gggrr").has_quorum());
        assert!(!tally("ggfff").has_quorum());
        assert!(!tally("ggrrf").has_quorum());
        assert!(
            tally("ggrf").done_count() == 2 && !tally("ggrf").has_quorum(),
            "2 of 4 is no majority"
        );
    }

    #[test]
    fn contention_only_when_failures_could_not_have_made_a_quorum() {
        assert!(tally("rrrgg").refused_by_majority_of_possible());
        assert!(tally("rrrff").refused_by_majority_of_possible());
        assert!(
            !tally("rrggf").refused_by_majority_of_possible(),
            "the failed node might have granted"
        );
        assert!(!tally("rrfff").refused_by_majority_of_possible());
    }

    #[test]
    fn free_in_waits_for_enough_refusals_to_expire() {
        // Refusals expire in 100, 200, 300 ms; 2 may stay, so the first must go.
        assert_eq!(tally("rrrgg").free_in(), Some(ms(100)));
        // Four refusing (100..400 ms): two must expire, the second at 200 ms.
        assert_eq!(tally("rrrrg").free_in(), Some(ms(200)));
        assert_eq!(tally("rrggg").free_in(), None, "nothing has to expire");
        let unknown = Tally::<u64>::new(vec![Reply::Refused { remaining: None }; 3]);
        assert_eq!(unknown.free_in(), None);
    }

    #[test]
    fn the_error_counts_and_names_every_node() {
        let endpoints: Vec<String> = (1..=5).map(|i| format!("10.0.0.{i}:6379")).collect();
        let err = tally("grfff").to_error("acquire", &endpoints);
        assert_eq!(
            (err.done.len(), err.refused.len(), err.failed.len()),
            (1, 1, 3)
        );
        let text = err.to_string();
        for expected in [
            "acquire reached no quorum: 1 of 5 nodes agreed (3 needed) [10.0.0.1:6379]",
            "1 refused (held by another owner) [10.0.0.2:6379]",
            "3 failed or timed out [10.0.0.3:6379: timed out after 50ms; 10.0.0.4:6379",
        ] {
            assert!(text.contains(expected), "{text}\nlacks: {expected}");
        }
    }
}
