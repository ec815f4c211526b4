#![doc = include_str!("../README.md")]

mod descendants;
mod exit;
mod hold;
mod log;
mod printable;
mod run;
mod show;
mod stop;
mod target;
mod terminal;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use lockkit::config::{Config, parse_duration};
use lockkit::url;

use crate::target::Target;

/// Run a command under a distributed lock, and inspect or manage locks, on
/// any lockkit backend (memory, redis, redlock, etcd, postgres).
///
/// The backend comes from --url, or from --profile (a profile of the config
/// file, whose required guarantees are checked against the backend first),
/// not both; without either, from the LOCK_URL environment variable.
///
/// The library's warnings (a failed renewal being retried, a Redlock node
/// not answering) go to stderr; LOCKKIT_LOG sets the level: off, error,
/// warn (the default), info, debug or trace, or takes RUST_LOG-style
/// directives (`lock_core=info,warn`).
#[derive(Parser)]
#[command(name = "lockctl", version, after_help = exit::HELP)]
struct Cli {
    /// Backend URL, e.g. redis://127.0.0.1:6379 or etcd://h1:2379,h2:2379,h3:2379.
    // The value is never shown in the help: it may hold a password.
    #[arg(long, global = true, value_name = "URL", env = target::URL_ENV, hide_env_values = true)]
    url: Option<String>,
    /// Profile of the config file to use (its URL, TTL, wait, key prefix and requirements).
    #[arg(long, global = true, value_name = "NAME")]
    profile: Option<String>,
    /// Config file for --profile [default: $LOCKKIT_CONFIG].
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire KEY, run CMD while renewing it, release it when CMD ends.
    ///
    /// CMD runs in its own process group with LOCK_KEY (the backend key),
    /// LOCK_FENCING_TOKEN (pass it to the protected resource) and
    /// LOCK_DEADLINE (the lock's deadline when CMD started, in milliseconds
    /// since the Unix epoch on this machine's clock; lockctl renews the lock
    /// while CMD runs, so it matters only if renewals fail) in its
    /// environment. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to
    /// the group (with SIGCONT, so a stopped command gets them too); SIGTERM
    /// also to every other process CMD started (see below). What is still
    /// running --grace after a forwarded SIGTERM gets SIGKILL. lockctl
    /// itself is not stopped by Ctrl-Z (SIGTSTP), which would stop its
    /// renewals while CMD runs on. In a terminal, CMD's group gets the
    /// foreground, as under flock: CMD reads what is typed and Ctrl-C
    /// reaches it directly; a Ctrl-Z that stops it is undone (lockctl
    /// continues it: stopped, it would keep the lock from everyone with
    /// no one to resume it). If the lock is lost, CMD and every
    /// process it started get SIGTERM, then SIGKILL after --grace, and
    /// lockctl exits 77. Processes CMD leaves behind are terminated the same
    /// way before the lock is released (after a forwarded SIGTERM, within
    /// what is left of its --grace).
    ///
    /// "Every process CMD started" includes those that left its group: on
    /// Linux lockctl is a child subreaper, so a process that starts a
    /// session of its own (setsid), a daemon's double fork or a detaching
    /// server stays below lockctl, which finds it in /proc and stops it
    /// with the rest, looking again until none is left.
    ///
    /// What can still escape: everything, if lockctl itself is killed by
    /// SIGKILL (or crashes), since nothing is left to stop it; a process
    /// handed to another supervisor, which is not below lockctl
    /// (systemd-run, a command run over ssh, a container started by docker
    /// or podman, a job given to at or cron); a process running as another
    /// user that lockctl may not signal (through sudo, su or another setuid
    /// program, unless lockctl runs as root); and, on platforms other than
    /// Linux, every process that left the group.
    Run {
        /// The lock's key.
        key: String,
        #[command(flatten)]
        lock: LockArgs,
        /// Time between SIGTERM and SIGKILL when CMD and what it started must stop (at most 1h).
        #[arg(long, value_parser = grace, default_value = "10s")]
        grace: Duration,
        /// Take one of N permits of KEY as a semaphore (as `consul lock -n`): at most N
        /// commands run at once under KEY. Every runner of KEY must name the same N.
        /// Refused (exit 64) on a backend without semaphores.
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
        /// Take a shared (read) hold of KEY as a read-write lock: any number of
        /// `--shared` runs at once, none beside a run without it (the writer). A
        /// writer waiting for the readers makes new readers wait behind it.
        /// Refused (exit 64) on a backend without read-write locks.
        #[arg(long, conflicts_with = "permits")]
        shared: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Acquire KEY and hold it, renewing it, until Ctrl-C, SIGTERM or SIGHUP; then release it.
    ///
    /// Prints `KEY<TAB>held<TAB>fencing_token=N` once the lock is held, and
    /// `KEY<TAB>released` when it lets go (exit 0). Exit 77 if the lock is
    /// lost meanwhile, 75 if it was not acquired within --wait. Ctrl-Z is
    /// ignored: stopped, lockctl would stop renewing.
    Hold {
        /// The lock's key.
        key: String,
        #[command(flatten)]
        lock: LockArgs,
    },
    /// Whether KEY is held, with its remaining TTL and fencing token (exit 1 if free).
    Status {
        /// The lock's key.
        key: String,
        /// One JSON object: key, held, remaining_ms, fencing_token (null where unknown).
        #[arg(long)]
        json: bool,
    },
    /// The locks held under PREFIX (all when omitted), with remaining TTL and fencing token,
    /// and the keys there that will never expire (a leak scan).
    ///
    /// One line per lock: key, `held`, remaining=, fencing_token=, separated
    /// by tabs; then one line per leak: the server's own key name and
    /// `leak` (Redis: a lock's key with no TTL, which blocks its lock until
    /// someone deletes it). A key may have been written by a client that skipped
    /// lockkit's checks: characters that could spoof the terminal (controls,
    /// tabs, bidi overrides, zero-width and other invisible characters, line
    /// separators, private-use and unassigned code points) are shown escaped
    /// as \u{202e}, \t, \n or \r, and a backslash as \\. lockctl's other
    /// outputs and messages escape the same characters.
    List {
        /// Key prefix.
        prefix: Option<String>,
        /// One JSON object: `held` (objects as `status --json` prints them) and `leaks` (key names).
        #[arg(long)]
        json: bool,
    },
    /// Delete KEY's grant whoever holds it (operators only; exit 1 if it was free).
    ///
    /// The holder is not told until its next renewal; meanwhile it may still
    /// act as if it held the lock, which a fenced resource refuses.
    Release {
        /// The lock's key.
        key: String,
        /// Required: take the lock away from its holder.
        #[arg(long)]
        force: bool,
        /// Required: confirms that the holder may still be running.
        #[arg(long = "yes-i-know")]
        yes_i_know: bool,
    },
    /// Check a config file: parse it, then connect to each profile's backend
    /// and check its requirements (exit 78 if any profile is refused).
    CheckConfig {
        /// The config file.
        file: PathBuf,
        /// Only parse the file and check each URL as connecting would read it; do not connect.
        #[arg(long)]
        offline: bool,
    },
}

/// How long to hold a lock and how long to wait for it.
#[derive(Args)]
struct LockArgs {
    /// TTL of the grant, renewed every TTL/3 [default: the profile's, else 30s].
    #[arg(long, value_parser = duration)]
    ttl: Option<Duration>,
    /// How long to wait for the lock, e.g. 10s or 2m [default: the profile's, else until it is free].
    #[arg(long, value_parser = duration)]
    wait: Option<Duration>,
    /// Do not wait: fail with exit code 75 at once if the lock is held.
    #[arg(short = 'n', long, conflicts_with = "wait")]
    no_wait: bool,
}

impl LockArgs {
    /// The wait the flags ask for, if they ask for one.
    fn wait(&self) -> Option<Duration> {
        if self.no_wait {
            Some(Duration::ZERO)
        } else {
            self.wait
        }
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

/// The longest --grace: after a lost lock the group runs unprotected for
/// up to this long.
const MAX_GRACE: Duration = Duration::from_secs(3600);

fn grace(text: &str) -> Result<Duration, String> {
    let grace = parse_duration(text)?;
    if grace > MAX_GRACE {
        return Err(format!("at most {}s, got `{text}`", MAX_GRACE.as_secs()));
    }
    Ok(grace)
}

/// `text` with every URL in it redacted: clap quotes the arguments it
/// could not place, and a URL given without --url may carry a password.
/// A URL inside clap's quotes runs to the line's last quote (a password
/// may hold a quote or a space); any other, to the next blank.
fn scrub_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`'))
            .map_or(0, |i| i + 1);
        let line_end = rest[at..].find('\n').map_or(rest.len(), |i| at + i);
        let quoted = start > 0 && matches!(rest.as_bytes()[start - 1], b'\'' | b'"' | b'`');
        let end = if quoted {
            let quote = rest.as_bytes()[start - 1] as char;
            rest[at..line_end].rfind(quote).map_or(line_end, |i| at + i)
        } else {
            rest[at..line_end]
                .find(char::is_whitespace)
                .map_or(line_end, |i| at + i)
        };
        out.push_str(&rest[..start]);
        out.push_str(&url::redact(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let cli = match parsed {
        Ok((mut cli, matches)) => {
            // LOCK_URL is the fallback when no flag names a backend: a
            // --profile given with it set is no conflict.
            let from_env = matches.value_source("url") == Some(ValueSource::EnvVariable);
            if (from_env && cli.profile.is_some()) || cli.url.as_deref() == Some("") {
                cli.url = None;
            }
            cli
        }
        Err(e) if !e.use_stderr() => {
            // --help or --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's first paragraph, on one line: the problem without the usage.
            let text = scrub_urls(&e.to_string());
            let first: Vec<_> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            eprintln!(
                "lockctl: {}{} (see lockctl --help)",
                printable::text(first),
                double_dash_hint(e.kind())
            );
            return ExitCode::from(exit::USAGE);
        }
    };
    if let Err(problem) = log::init() {
        eprintln!("lockctl: {}", printable::text(&problem));
        return ExitCode::from(exit::CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    runtime.block_on(dispatch(cli))
}

async fn dispatch(cli: Cli) -> ExitCode {
    // Checked here rather than by clap's `conflicts_with`, which misses the
    // conflict when one global flag comes before the subcommand and the
    // other after it.
    if cli.url.is_some() && cli.profile.is_some() {
        eprintln!(
            "lockctl: the argument '--url <URL>' cannot be used with '--profile <NAME>': a profile brings its own URL and requirements"
        );
        return ExitCode::from(exit::USAGE);
    }
    if let Cmd::CheckConfig { file, offline } = &cli.command {
        return check_config(file, *offline).await;
    }
    if let Cmd::Release {
        force, yes_i_know, ..
    } = &cli.command
        && !(*force && *yes_i_know)
    {
        eprintln!(
            "lockctl: release takes the lock away from a holder that may still be running; pass --force --yes-i-know"
        );
        return ExitCode::from(exit::USAGE);
    }
    let target = match Target::connect(cli.url.as_deref(), cli.profile.as_deref(), cli.config).await
    {
        Ok(t) => t,
        Err(e) => return exit::fail(&e),
    };
    let locker = target.locker();
    match cli.command {
        Cmd::Run {
            key,
            lock,
            grace,
            permits,
            shared,
            command,
        } => {
            let opts = run::RunOptions {
                key: target.key(&key),
                mode: match (shared, permits) {
                    (true, _) => lockkit::Mode::Shared,
                    (false, Some(n)) => lockkit::Mode::semaphore(n),
                    (false, None) => lockkit::Mode::Exclusive,
                },
                ttl: target.ttl(lock.ttl),
                wait: target.wait(lock.wait()),
                grace,
                command,
            };
            let code = run::run(locker, opts).await;
            // What the backend kept for a next lock is not needed after
            // this: etcd's idle lease, say, would otherwise stay on the
            // cluster until its TTL ran out.
            locker.close_idle().await;
            code
        }
        Cmd::Hold { key, lock } => {
            let key = target.key(&key);
            let code =
                hold::hold(locker, &key, target.ttl(lock.ttl), target.wait(lock.wait())).await;
            locker.close_idle().await;
            code
        }
        Cmd::Status { key, json } => {
            let key = target.key(&key);
            if let Err(e) = locker.key(&key) {
                return exit::fail(&e);
            }
            match locker.inspect(&key).await {
                Ok(held) => match held.iter().find(|h| h.key == key) {
                    Some(h) if json => {
                        println!("{}", show::json(&show::Entry::held(h)));
                        ExitCode::SUCCESS
                    }
                    Some(h) => {
                        println!("{}", show::line(h));
                        ExitCode::SUCCESS
                    }
                    None if json => {
                        println!("{}", show::json(&show::Entry::free(&key)));
                        ExitCode::from(1)
                    }
                    None => {
                        println!("{}\tfree", printable::key(&key));
                        ExitCode::from(1)
                    }
                },
                Err(e) => exit::fail(&e),
            }
        }
        Cmd::List { prefix, json } => {
            let prefix = target.key(prefix.as_deref().unwrap_or(""));
            match locker.report(&prefix).await {
                Ok(report) if json => {
                    let listing = show::Listing::of(&report);
                    println!("{}", show::json(&listing));
                    ExitCode::SUCCESS
                }
                Ok(report) => {
                    for h in &report.held {
                        println!("{}", show::line(h));
                    }
                    for leak in &report.leaks {
                        println!("{}", show::leak_line(leak));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => exit::fail(&e),
            }
        }
        Cmd::Release { key, .. } => {
            let key = target.key(&key);
            match locker.force_release(&key).await {
                Ok(true) => {
                    println!("{}\treleased", printable::key(&key));
                    ExitCode::SUCCESS
                }
                Ok(false) => {
                    println!("{}\twas not held", printable::key(&key));
                    ExitCode::from(1)
                }
                Err(e) => exit::fail(&e),
            }
        }
        Cmd::CheckConfig { .. } => unreachable!("handled above"),
    }
}

/// A hint for `lockctl run KEY CMD ARGS` typed without `--`, which clap
/// reports only as an unexpected argument.
fn double_dash_hint(kind: clap::error::ErrorKind) -> &'static str {
    let args: Vec<OsString> = std::env::args_os().collect();
    let runs = args.iter().any(|a| a == "run");
    if kind == clap::error::ErrorKind::UnknownArgument && runs && !args.iter().any(|a| a == "--") {
        "; put the command after `--`: lockctl run KEY -- CMD [ARGS...]"
    } else {
        ""
    }
}

async fn check_config(file: &PathBuf, offline: bool) -> ExitCode {
    let config = match Config::load(file) {
        Ok(c) => c,
        Err(e) => return exit::fail(&e),
    };
    let mut worst: Option<u8> = None;
    for profile in config.profiles() {
        let url = url::redact(&profile.url);
        let url = printable::text(&url);
        let name = printable::text(&profile.name);
        if let Err(e) = config.profile(&profile.name) {
            eprintln!("lockctl: {}", printable::text(&e.to_string()));
            // A refused profile outranks an unreachable one.
            worst = Some(exit::CONFIG);
            continue;
        }
        if offline {
            println!("profile `{name}`: parsed ({url}); requirements not checked (--offline)");
            continue;
        }
        match profile.connect().await {
            Ok(locker) => {
                let caps = locker.capabilities();
                println!(
                    "profile `{name}`: ok ({url}: {}, {}, tolerates {} server failure(s))",
                    caps.backend, caps.safety, caps.tolerated_server_failures
                );
            }
            Err(e) => {
                eprintln!("lockctl: {}", printable::text(&e.to_string()));
                let code = exit::code_for(&e);
                // A refused profile outranks an unreachable one.
                worst = Some(match worst {
                    Some(w) if w == exit::CONFIG => w,
                    _ => code,
                });
            }
        }
    }
    worst.map(ExitCode::from).unwrap_or(ExitCode::SUCCESS)
}
