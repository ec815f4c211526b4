//! Lock profiles from a TOML file, and the guarantees each one requires.
//!
//! A profile names a backend URL, a TTL, a wait, a key prefix, and what the
//! application REQUIRES of the backend. Connecting through a profile reads
//! the backend's [`capabilities()`](crate::LockBackend::capabilities) and
//! refuses to start when they fall short, saying which profile, which
//! requirement, and what the backend offers instead:
//!
//! ```toml
//! # lockkit.toml (path from a flag, or the LOCKKIT_CONFIG environment variable)
//! [profiles.payments]
//! url = "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379"
//! ttl = "30s"            # default 30s; units: ms, s, m, h
//! wait = "5s"            # default 0s: one attempt
//! prefix = "payments/"   # prepended to every key; default none
//! use = "financial-inventory"   # a ready-made requirement set (see RequirementSet)
//!
//! [profiles.payments.require]   # requirements of your own, on top of `use`
//! fencing = "strict"            # tokens strictly increase per key
//! no_clock_assumptions = true   # ... and that promise rests on no clock
//! survives_server_loss = 1      # tolerated_server_failures >= 1
//! min_safety = "consensus"      # in-process < single-node < quorum < consensus < acid-transaction
//! fifo_fair = true              # waiters are served in order
//! no_eviction = true            # no server that may evict lock keys (Redis: maxmemory-policy noeviction)
//! semaphores = true             # N-permit semaphores (every backend but Redlock)
//! read_write = true             # read-write locks (every backend; Sentinel not with min_replicas)
//! # lock_outlives_connection = false  # a dead client connection frees the lock at once (PostgreSQL only)
//! ```
//!
//! ```no_run
//! # async fn run() -> lockkit::Result<()> {
//! let config = lockkit::config::Config::from_env()?; // reads $LOCKKIT_CONFIG
//! let payments = config.profile("payments")?;
//! let locker = payments.connect().await?; // refuses a backend that falls short
//! let guard = locker.guard(&payments.key("invoice/42"), payments.guard_options()).await?;
//! # drop(guard); Ok(()) }
//! ```
//!
//! Every problem is an [`Error::InvalidInput`] whose message names the file,
//! the profile and the field; URLs in messages never show a password.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod requirements;

use requirements::SAFETY_NAMES;
pub use requirements::{RequirementSet, Requirements, Shortfall, safety_name};

use crate::{Error, GuardOptions, Locker, Result, url, validate};

/// The environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "LOCKKIT_CONFIG";

/// The TTL of a profile that names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A parsed configuration file: named lock profiles.
#[derive(Debug, Clone)]
pub struct Config {
    origin: String,
    profiles: BTreeMap<String, Profile>,
}

/// One lock profile: where the locks live, how they are taken, and what the
/// backend must guarantee.
#[derive(Clone)]
pub struct Profile {
    /// The profile's name in the file.
    pub name: String,
    /// The backend URL (may hold a password: print it with [`url::redact`]).
    pub url: String,
    /// TTL of each grant (renewed by guards).
    pub ttl: Duration,
    /// How long to wait for a held lock.
    pub wait: Duration,
    /// Prepended to every key taken through this profile.
    pub prefix: String,
    /// The ready-made set named by `use`, if any.
    pub uses: Option<RequirementSet>,
    /// Everything required: the set's requirements with the profile's own on top.
    pub requirements: Requirements,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("name", &self.name)
            .field("url", &url::redact(&self.url))
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("prefix", &self.prefix)
            .field("uses", &self.uses)
            .field("requirements", &self.requirements)
            .finish()
    }
}

/// Parses a duration as people write them: `500ms`, `30s`, `2m`, `1h`,
/// `1h 30m` (humantime's syntax; `0` alone is also accepted).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("`{text}` is not a duration like 500ms, 30s, 2m or 1h 30m ({e})"))
}

// ---- the file format ------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    profiles: BTreeMap<String, FileProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProfile {
    url: String,
    ttl: Option<String>,
    wait: Option<String>,
    #[serde(default)]
    prefix: String,
    #[serde(rename = "use")]
    uses: Option<String>,
    #[serde(default)]
    require: FileRequirements,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileRequirements {
    fencing: Option<String>,
    no_clock_assumptions: Option<bool>,
    survives_server_loss: Option<usize>,
    min_safety: Option<String>,
    fifo_fair: Option<bool>,
    lock_outlives_connection: Option<bool>,
    no_eviction: Option<bool>,
    semaphores: Option<bool>,
    read_write: Option<bool>,
}

impl Config {
    /// Reads and parses the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(
                "config",
                format!("cannot read config file {}: {e}", path.display()),
            )
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Reads the file named by `$LOCKKIT_CONFIG`.
    pub fn from_env() -> Result<Config> {
        Config::load(config_path_from_env()?)
    }

    /// Parses configuration text; `origin` names it in errors (a file path).
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_owned();
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            Error::invalid("config", format!("{origin}{at}: {msg}"))
        })?;
        if file.profiles.is_empty() {
            return Err(Error::invalid(
                "config",
                format!("{origin}: no profiles; add a [profiles.NAME] table with a `url`"),
            ));
        }
        let mut profiles = BTreeMap::new();
        for (name, raw) in file.profiles {
            let profile = Profile::from_file(&name, raw)
                .map_err(|problem| profile_error(origin, &name, problem))?;
            profiles.insert(name, profile);
        }
        Ok(Config {
            origin: origin.to_owned(),
            profiles,
        })
    }

    /// Where the configuration came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The profiles, by name.
    pub fn profiles(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.values()
    }

    /// The profile called `name`, its URL checked as `connect` would read
    /// it, without connecting ([`Profile::check_url`]). The error lists the
    /// profiles there are, or names what is wrong with the URL.
    pub fn profile(&self, name: &str) -> Result<&Profile> {
        let profile = self.profiles.get(name).ok_or_else(|| {
            let names: Vec<_> = self.profiles.keys().map(String::as_str).collect();
            Error::invalid(
                "profile",
                format!(
                    "{}: no profile `{name}`; profiles: {}",
                    self.origin,
                    names.join(", ")
                ),
            )
        })?;
        profile
            .check_url()
            .map_err(|e| profile_error(&self.origin, name, problem(e)))?;
        Ok(profile)
    }
}

/// The path in `$LOCKKIT_CONFIG`, or an error saying it is unset.
pub fn config_path_from_env() -> Result<PathBuf> {
    match std::env::var_os(CONFIG_ENV) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(Error::invalid(
            "config",
            format!("no configuration file given: pass one, or set {CONFIG_ENV}"),
        )),
    }
}

impl Profile {
    fn from_file(name: &str, raw: FileProfile) -> std::result::Result<Profile, String> {
        let duration = |field: &str, v: Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(t) => parse_duration(&t).map_err(|e| format!("{field}: {e}")),
        };
        let ttl = duration("ttl", raw.ttl, DEFAULT_TTL)?;
        if ttl.is_zero() {
            return Err("ttl: must be positive".into());
        }
        let wait = duration("wait", raw.wait, Duration::ZERO)?;
        check_scheme(&raw.url)?;
        let uses = match raw.uses {
            None => None,
            Some(n) => Some(RequirementSet::from_name(&n).ok_or_else(|| {
                format!(
                    "use: unknown requirement set `{n}`; sets: {}",
                    RequirementSet::ALL.map(|s| s.name()).join(", ")
                )
            })?),
        };
        let r = raw.require;
        let strict_fencing = match r.fencing.as_deref() {
            None | Some("any") => false,
            Some("strict") => true,
            Some(other) => {
                return Err(format!(
                    "require.fencing: `{other}` is not one of: strict, any"
                ));
            }
        };
        let min_safety = match r.min_safety.as_deref() {
            None => None,
            Some(n) => Some(
                SAFETY_NAMES
                    .iter()
                    .find(|(s, _)| *s == n)
                    .map(|(_, m)| *m)
                    .ok_or_else(|| {
                        format!(
                            "require.min_safety: `{n}` is not one of: {}",
                            SAFETY_NAMES
                                .iter()
                                .map(|(s, _)| *s)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?,
            ),
        };
        let own = Requirements {
            strict_fencing,
            no_clock_assumptions: r.no_clock_assumptions.unwrap_or(false),
            survives_server_loss: r.survives_server_loss.unwrap_or(0),
            min_safety,
            fifo_fair: r.fifo_fair.unwrap_or(false),
            lock_outlives_connection: r.lock_outlives_connection,
            no_eviction: r.no_eviction.unwrap_or(false),
            semaphores: r.semaphores.unwrap_or(false),
            read_write: r.read_write.unwrap_or(false),
        };
        let requirements = uses
            .map(RequirementSet::requirements)
            .unwrap_or_default()
            .and(own);
        Ok(Profile {
            name: name.to_owned(),
            url: raw.url,
            ttl,
            wait,
            prefix: raw.prefix,
            uses,
            requirements,
        })
    }

    /// The backend key for `key`: the profile's prefix, then `key`.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Checks the profile's URL as [`crate::connect`] reads it, without
    /// connecting: a malformed URL, an unknown option, a bad timeout, and
    /// for TLS a file that cannot be read (Redis, Redlock and etcd; the
    /// PostgreSQL driver reads its certificate files when it connects) are
    /// refused (see [`crate::check_url`]).
    pub fn check_url(&self) -> Result<()> {
        crate::check_url(&self.url)
    }

    /// Guard options with the profile's TTL and wait.
    pub fn guard_options(&self) -> GuardOptions {
        GuardOptions::new(self.ttl).wait(self.wait)
    }

    /// The lock `name` as this profile takes it: its key prefix applied,
    /// its TTL and wait as the options, on `locker` (one this profile
    /// connected, [`Profile::connect`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit::Result<()> {
    /// let config = lockkit::config::Config::parse(
    ///     "[profiles.jobs]\nurl = \"memory://\"\nprefix = \"jobs/\"\nttl = \"30s\"\n",
    ///     "inline",
    /// )?;
    /// let profile = config.profile("jobs")?;
    /// let locker = profile.connect().await?;
    /// let report = profile.lock(&locker, "nightly-report")?;
    /// assert_eq!(report.key(), "jobs/nightly-report");
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, locker: &Locker, name: &str) -> Result<crate::Lock> {
        locker.lock(&self.key(name), self.guard_options())
    }

    /// Checks the backend's capabilities against this profile's
    /// requirements, and the TTL against its limits. The error names the
    /// profile, each requirement not met, and what the backend offers.
    pub fn check(&self, locker: &Locker) -> Result<()> {
        let caps = locker.capabilities();
        let shortfalls = self.requirements.shortfalls(caps);
        let url = url::redact(&self.url);
        if !shortfalls.is_empty() {
            let set = self
                .uses
                .map(|s| format!(" (with `use = \"{s}\"`)"))
                .unwrap_or_default();
            let reasons: Vec<_> = shortfalls
                .iter()
                .map(|s| format!("requires {}; {url} offers {}", s.requires, s.offers))
                .collect();
            return Err(Error::invalid(
                "profile",
                format!(
                    "profile `{}`{set} {}",
                    self.name,
                    reasons.join("; it also ")
                ),
            ));
        }
        let drift = locker.options().drift.for_ttl(self.ttl);
        validate::ttl(self.ttl, &caps.limits, drift)
            .map_err(|e| Error::invalid("profile", format!("profile `{}`: {e}", self.name)))?;
        Ok(())
    }

    /// Connects to the profile's backend and checks it (see [`check`](Self::check)).
    pub async fn connect(&self) -> Result<Locker> {
        let locker = crate::connect(&self.url).await?;
        self.check(&locker)?;
        Ok(locker)
    }
}

/// Refuses, without connecting or reading anything the URL names, a URL
/// whose scheme this build cannot serve. The rest of the URL is checked
/// when its profile is picked ([`Config::profile`], [`Profile::check_url`]):
/// a TLS file that one host's profile names need not exist on another.
fn check_scheme(url: &str) -> std::result::Result<(), String> {
    crate::backend_of(url).map(drop).map_err(problem)
}

/// An input error as `field: problem`, to follow the profile's name.
/// A config file's error about one of its profiles, naming both.
fn profile_error(origin: &str, name: &str, problem: impl std::fmt::Display) -> Error {
    Error::invalid("config", format!("{origin}: profile `{name}`: {problem}"))
}

fn problem(e: Error) -> String {
    match e {
        Error::InvalidInput { field, problem } => format!("{field}: {problem}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Assumption, Capabilities, FencingGuarantee, MemoryBackend, SafetyModel, WakeUp};

    fn caps_like_redis() -> Capabilities {
        Capabilities::new("redis", SafetyModel::SingleNode)
            .with_fencing(
                FencingGuarantee::Strict,
                [Assumption::ServerClockNeverStepsBack],
            )
            .with_wake_up(WakeUp::PubSub)
    }

    fn caps_like_etcd() -> Capabilities {
        Capabilities::new("etcd", SafetyModel::Consensus)
            .with_fencing(FencingGuarantee::Strict, [Assumption::ConsensusMajority])
            .with_waiting_order(lock_core::WaitingOrder::Fifo {
                stall: lock_core::Stall::WaiterTtl,
            })
            .with_tolerated_server_failures(1)
    }

    fn caps_like_postgres() -> Capabilities {
        Capabilities::new("postgres", SafetyModel::AcidTransaction)
            .with_fencing(FencingGuarantee::Strict, [Assumption::DurableDatabase])
            .with_lock_outlives_connection(false)
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        for bad in ["30", "", "s", "-1s", "1x", "99999999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_profile_parses_with_its_set_and_own_requirements() {
        let c = Config::parse(
            r#"
            [profiles.payments]
            url = "memory://"
            ttl = "10s"
            wait = "2s"
            prefix = "pay/"
            use = "financial"
            [profiles.payments.require]
            fifo_fair = true
            "#,
            "test.toml",
        )
        .unwrap();
        let p = c.profile("payments").unwrap();
        assert_eq!(
            (p.ttl, p.wait),
            (Duration::from_secs(10), Duration::from_secs(2))
        );
        assert_eq!(p.key("x"), "pay/x");
        assert_eq!(p.uses, Some(RequirementSet::FinancialInventory));
        assert!(p.requirements.no_clock_assumptions && p.requirements.fifo_fair);
        let err = c.profile("nope").unwrap_err().to_string();
        assert!(
            err.contains("no profile `nope`") && err.contains("payments"),
            "{err}"
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_place() {
        let cases = [
            ("[profiles.a]\nurl = 1", "line 2"),
            (
                "[profiles.a]\nurl = \"memory://\"\nttl = \"3x\"",
                "ttl: `3x`",
            ),
            (
                "[profiles.a]\nurl = \"memory://\"\nuse = \"fast\"",
                "unknown requirement set `fast`",
            ),
            (
                "[profiles.a]\nurl = \"memory://\"\ncolour = 1",
                "unknown field `colour`",
            ),
            (
                "[profiles.a]\nurl = \"memory://\"\n[profiles.a.require]\nfencing = \"loose\"",
                "strict, any",
            ),
            (
                "[profiles.a]\nurl = \"memory://\"\n[profiles.a.require]\nmin_safety = \"raft\"",
                "consensus",
            ),
            (
                "[profiles.a]\nurl = \"zk://u:hunter2@h\"",
                "unknown scheme `zk`",
            ),
            ("[profiles.a]\nurl = \"localhost\"", "expected scheme"),
            ("", "no profiles"),
        ];
        for (text, want) in cases {
            let err = Config::parse(text, "f.toml").unwrap_err();
            assert!(err.is_invalid_input());
            let err = err.to_string();
            assert!(
                err.contains("f.toml") && err.contains(want),
                "{text:?}: {err}"
            );
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    /// A URL that `connect` would refuse without connecting is refused when
    /// its profile is picked, naming the file, the profile and what is
    /// wrong, not at the first connect.
    #[test]
    #[cfg(all(
        feature = "redis",
        feature = "etcd",
        feature = "redlock",
        feature = "postgres"
    ))]
    fn a_profile_url_is_checked_when_the_profile_is_picked() {
        let cases = [
            ("redis://u:hunter2@h:6379/0?colour=red", "colour"),
            ("redis://u:hunter2@h:port/0", "port"),
            (
                "redis+cluster://h1,h2?response_timeout_ms=0",
                "response_timeout_ms",
            ),
            (
                "etcd://u:hunter2@h:2379?response_timeout_ms=soon",
                "response_timeout_ms",
            ),
            ("redlock://u:hunter2@h1,h2,h3?colour=red", "colour"),
            ("postgres://u:hunter2@h/db?colour=red", "colour"),
            (
                "redis+sentinel://u:hunter2@s1,s2,s3/mymaster?min_replicas=many",
                "min_replicas",
            ),
            ("redis+sentinel://u:hunter2@s1,s2,s3", "name the master"),
        ];
        for (url, want) in cases {
            let text = format!("[profiles.orders]\nurl = \"{url}\"");
            let config = Config::parse(&text, "f.toml").expect("the scheme is known");
            let err = config.profile("orders").unwrap_err();
            assert!(err.is_invalid_input(), "{url}: {err}");
            let err = err.to_string();
            assert!(
                err.contains("f.toml") && err.contains("orders") && err.contains(want),
                "{url}: {err}"
            );
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn clock_free_fencing_is_refused_for_a_clock_seeded_counter() {
        let r = RequirementSet::FinancialInventory.requirements();
        let s = r.shortfalls(&caps_like_redis());
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].requires, "fencing that rests on no clock assumption");
        assert_eq!(
            s[0].offers,
            "a counter that rests on: the server's clock never steps backwards"
        );
        assert!(r.shortfalls(&caps_like_etcd()).is_empty());
        assert!(r.shortfalls(&caps_like_postgres()).is_empty());
    }

    #[test]
    fn each_set_admits_the_backends_its_docs_promise() {
        use RequirementSet::*;
        let fits = |set: RequirementSet| {
            [
                ("redis", caps_like_redis()),
                ("etcd", caps_like_etcd()),
                ("postgres", caps_like_postgres()),
            ]
            .into_iter()
            .filter(|(_, c)| set.requirements().shortfalls(c).is_empty())
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
        };
        assert_eq!(fits(IdempotentDeduplication), ["redis", "etcd", "postgres"]);
        assert_eq!(fits(GeneralMutex), ["redis", "etcd", "postgres"]);
        assert_eq!(fits(FinancialInventory), ["etcd", "postgres"]);
        assert_eq!(fits(StrongConsistency), ["etcd"]);
        assert_eq!(fits(BankingCore), ["postgres"]);
        let memory = MemoryBackend::new();
        let memory = crate::LockBackend::capabilities(&memory);
        assert!(
            RequirementSet::ALL
                .iter()
                .all(|s| !s.requirements().shortfalls(memory).is_empty())
        );
        for set in RequirementSet::ALL {
            assert_eq!(RequirementSet::from_name(set.name()), Some(set));
        }
    }

    /// A server that may evict a held lock's key breaks mutual exclusion:
    /// every set above deduplication refuses it, naming the policy and the fix.
    #[test]
    fn every_set_above_deduplication_refuses_a_server_that_may_evict_locks() {
        let evicting = caps_like_redis()
            .with_lock_key_eviction("`allkeys-lru` (maxmemory 2097152 bytes) on redis://h:6379");
        assert!(
            RequirementSet::IdempotentDeduplication
                .requirements()
                .shortfalls(&evicting)
                .is_empty()
        );
        let s = RequirementSet::GeneralMutex
            .requirements()
            .shortfalls(&evicting);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].requires.contains("evict no lock keys"), "{s:?}");
        assert!(
            s[0].offers
                .contains("`allkeys-lru` (maxmemory 2097152 bytes) on redis://h:6379")
                && s[0].offers.contains("maxmemory-policy noeviction"),
            "{s:?}"
        );
        for set in [
            RequirementSet::GeneralMutex,
            RequirementSet::FinancialInventory,
            RequirementSet::StrongConsistency,
            RequirementSet::BankingCore,
        ] {
            assert!(set.requirements().no_eviction, "{set}");
        }
        let own = Config::parse(
            "[profiles.a]\nurl = \"memory://\"\n[profiles.a.require]\nno_eviction = true",
            "f.toml",
        )
        .unwrap();
        let own = own.profile("a").unwrap();
        assert!(own.requirements.no_eviction);
        assert_eq!(own.requirements.shortfalls(&evicting).len(), 1);
        assert!(own.requirements.shortfalls(&caps_like_redis()).is_empty());
    }

    #[test]
    fn a_profile_may_require_read_write_locks() {
        let c = Config::parse(
            "[profiles.docs]\nurl = \"memory://\"\n[profiles.docs.require]\nread_write = true",
            "f.toml",
        )
        .unwrap();
        let wanted = c.profile("docs").unwrap().requirements;
        assert!(wanted.read_write);
        let without = caps_like_postgres().with_read_write(lock_core::Offer::Refused {
            reason: "not built yet",
        });
        let s = wanted.shortfalls(&without);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].requires.contains("read-write"), "{s:?}");
        assert!(s[0].offers.contains("not built yet"), "{s:?}");
        let with = caps_like_redis().with_read_write(lock_core::Offer::Offered {
            waiting_order: lock_core::WaitingOrder::Unordered,
        });
        assert!(wanted.shortfalls(&with).is_empty());
    }

    #[test]
    fn a_profile_may_require_semaphores() {
        let c = Config::parse(
            "[profiles.jobs]\nurl = \"memory://\"\n[profiles.jobs.require]\nsemaphores = true",
            "f.toml",
        )
        .unwrap();
        let wanted = c.profile("jobs").unwrap().requirements;
        assert!(wanted.semaphores);
        let without = caps_like_postgres().with_semaphore(lock_core::Offer::Refused {
            reason: "not built yet",
        });
        let s = wanted.shortfalls(&without);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].requires.contains("semaphores"), "{s:?}");
        assert!(s[0].offers.contains("not built yet"), "{s:?}");
        let with = caps_like_redis().with_semaphore(lock_core::Offer::Offered {
            waiting_order: lock_core::WaitingOrder::Unordered,
        });
        assert!(wanted.shortfalls(&with).is_empty());
    }

    #[tokio::test]
    async fn connecting_refuses_a_mismatch_naming_profile_requirement_and_offer() {
        let c = Config::parse(
            "[profiles.payments]\nurl = \"memory://\"\n[profiles.payments.require]\nno_clock_assumptions = true\nsurvives_server_loss = 1",
            "f.toml",
        )
        .unwrap();
        // Memory's fencing rests on process memory, not on a clock: only the
        // server-loss requirement falls short.
        let err = c
            .profile("payments")
            .unwrap()
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid profile: profile `payments` requires locks that survive the loss of 1 server(s); memory:// offers locks that survive the loss of 0"
        );
        let ok = Config::parse("[profiles.t]\nurl = \"memory://\"\nttl = \"1s\"", "f").unwrap();
        ok.profile("t").unwrap().connect().await.unwrap();
        let short = Config::parse("[profiles.t]\nurl = \"memory://\"\nttl = \"1ms\"", "f").unwrap();
        let err = short
            .profile("t")
            .unwrap()
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("profile `t`") && err.contains("ttl"), "{err}");
    }
}
