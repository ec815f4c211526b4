//! Which backend to talk to: `--url` or `--profile` (from the config file),
//! else `LOCK_URL`.

use std::path::PathBuf;
use std::time::Duration;

use lockkit::config::{Config, Profile};
use lockkit::{Error, Locker, Result};

/// The environment variable naming the backend when no flag does.
pub const URL_ENV: &str = "LOCK_URL";

/// Where the locks live, and the defaults that come with it.
pub struct Target {
    locker: Locker,
    profile: Option<Profile>,
}

impl Target {
    /// Resolves and connects. A profile's requirements are checked against
    /// the backend before anything else happens.
    pub async fn connect(
        url: Option<&str>,
        profile: Option<&str>,
        config: Option<PathBuf>,
    ) -> Result<Target> {
        if let Some(url) = url {
            return Ok(Target {
                locker: lockkit::connect(url).await?,
                profile: None,
            });
        }
        if let Some(name) = profile {
            let config = match config {
                Some(path) => Config::load(path)?,
                None => Config::from_env()?,
            };
            let profile = config.profile(name)?.clone();
            let locker = profile.connect().await?;
            return Ok(Target {
                locker,
                profile: Some(profile),
            });
        }
        match std::env::var(URL_ENV) {
            Ok(url) if !url.is_empty() => Ok(Target {
                locker: lockkit::connect(&url).await?,
                profile: None,
            }),
            _ => Err(Error::invalid(
                "url",
                format!("no backend given: pass --url URL or --profile NAME, or set {URL_ENV}"),
            )),
        }
    }

    /// The lock service.
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The backend key for `key`: with the profile's prefix, if any.
    pub fn key(&self, key: &str) -> String {
        match &self.profile {
            Some(p) => p.key(key),
            None => key.to_owned(),
        }
    }

    /// The TTL: the flag, else the profile's, else the default.
    pub fn ttl(&self, flag: Option<Duration>) -> Duration {
        flag.or(self.profile.as_ref().map(|p| p.ttl))
            .unwrap_or(lockkit::config::DEFAULT_TTL)
    }

    /// The wait: the flag, else the profile's, else until the lock is free
    /// (as `flock` and `etcdctl lock` do).
    pub fn wait(&self, flag: Option<Duration>) -> Duration {
        flag.or(self.profile.as_ref().map(|p| p.wait))
            .unwrap_or(Duration::MAX)
    }
}
