//! Backend URLs: parsing multi-host URLs and printing any URL without its password.
//!
//! `redlock://h1:6379,h2:6379,h3:6379`, `etcd://h1:2379,h2:2379` and
//! `redis+cluster://h1,h2` name several servers in one URL, which standard
//! URL parsers reject. [`ServerUrl`] parses them: each comma-separated host
//! is parsed as its own URL authority, so ports, IPv6 brackets and
//! percent-encoded credentials behave as usual.

use std::fmt;

use crate::{Error, Result, Secret};

/// One server of a [`ServerUrl`], with its credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Server {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port, if given.
    pub port: Option<u16>,
    /// User name, if given (percent-decoded).
    pub username: Option<String>,
    /// Password, if given (percent-decoded, never printed).
    pub password: Option<Secret>,
    /// The URL is [ambiguous](is_ambiguous): its servers are never shown.
    hidden: bool,
}

impl Server {
    /// `host:port` (with brackets for IPv6), using `default_port` when none was given.
    pub fn address(&self, default_port: u16) -> String {
        let port = self.port.unwrap_or(default_port);
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }

    /// How errors and logs name this server: `scheme://[user@]host:port`,
    /// or `scheme://***` when its URL is [ambiguous](is_ambiguous), since
    /// the host and port may then be pieces of a password.
    pub fn endpoint(&self, scheme: &str, default_port: u16) -> String {
        if self.hidden {
            return format!("{scheme}://***");
        }
        match &self.username {
            Some(user) => format!("{scheme}://{user}@{}", self.address(default_port)),
            None => format!("{scheme}://{}", self.address(default_port)),
        }
    }
}

/// A backend URL naming one or more servers:
/// `scheme://[user[:password]@]host[:port][,[user[:password]@]host[:port]...][/path][?query]`.
///
/// Credentials given on the first server apply to every server that names
/// none of its own, so `redlock://:secret@a,b,c` uses one password for all.
/// A server without credentials may not come before one with them (that is
/// how a `,` in a password that should have been encoded looks).
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// The scheme, lower-case ("redlock", "etcd", ...).
    pub scheme: String,
    /// The servers, in the order given.
    pub servers: Vec<Server>,
    /// The path without its leading `/` ("" when none).
    pub path: String,
    /// Query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The URL is [ambiguous](is_ambiguous): it is shown as its scheme only,
    /// and its options' names and values are never shown.
    hidden: bool,
}

impl ServerUrl {
    /// Parses a URL with one or more comma-separated servers.
    pub fn parse(input: &str) -> Result<ServerUrl> {
        let bad = |problem: String| Error::invalid("url", format!("{}: {problem}", shown(input)));
        let (scheme, rest) = input
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://host[:port][,host[:port]...]".into()))?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            return Err(bad(format!("`{scheme}` is not a valid scheme")));
        }
        let scheme = scheme.to_ascii_lowercase();
        let hidden = is_ambiguous(input);
        check_user_info(input)?;
        let (authority, tail) = split_authority(rest);
        if authority.is_empty() {
            return Err(bad("no server given".into()));
        }
        let mut servers = Vec::new();
        for (i, part) in authority.split(',').enumerate() {
            if part.is_empty() {
                return Err(bad(format!("server #{} is empty (stray comma?)", i + 1)));
            }
            // Parse each server as the authority of its own URL so the url
            // crate validates hosts, ports and percent-encoding for us.
            let one = url::Url::parse(&format!("{scheme}://{part}/"))
                .map_err(|e| bad(format!("server #{} is not host[:port]: {e}", i + 1)))?;
            let host = match one.host() {
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                Some(h) => h.to_string(),
                None => return Err(bad(format!("server #{} has no host", i + 1))),
            };
            let username = Some(decode(one.username())).filter(|u| !u.is_empty());
            let password = one.password().map(|p| Secret::new(decode(p)));
            servers.push(Server {
                host,
                port: one.port(),
                username,
                password,
                hidden,
            });
        }
        if let Some(first) = servers.first().cloned() {
            for s in servers.iter_mut().skip(1) {
                if s.username.is_none() && s.password.is_none() {
                    s.username = first.username.clone();
                    s.password = first.password.clone();
                }
            }
        }
        let parsed_tail = url::Url::parse(&format!("x://h{tail}"))
            .map_err(|e| bad(format!("bad path or query: {e}")))?;
        let path = parsed_tail.path().trim_start_matches('/').to_owned();
        let query = parsed_tail
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Ok(ServerUrl {
            scheme,
            servers,
            path,
            query,
            hidden,
        })
    }

    /// The value of a query parameter, if present (the last one wins).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses a query option in none of the `known` lists, naming it and
    /// the known ones: a misspelt option is not silently ignored.
    pub fn refuse_unknown_options(&self, known: &[&[&str]]) -> Result<()> {
        let is_known = |name: &str| known.iter().any(|list| list.contains(&name));
        let Some((name, _)) = self.query.iter().find(|(k, _)| !is_known(k)) else {
            return Ok(());
        };
        let mut all: Vec<&str> = known.iter().flat_map(|list| list.iter().copied()).collect();
        all.sort_unstable();
        Err(Error::invalid(
            "url",
            format!("{self}: unknown option `{name}`; known: {}", all.join(", ")),
        ))
    }

    /// The client certificate's and key's files (`cert_file`, `key_file`),
    /// if the URL names them: both or neither, or an error naming the one
    /// missing.
    pub fn client_cert_files(&self) -> Result<Option<(&str, &str)>> {
        match (self.param("cert_file"), self.param("key_file")) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::invalid(
                "key_file",
                format!("{self}: `cert_file` needs the key beside it, in `key_file`"),
            )),
            (None, Some(_)) => Err(Error::invalid(
                "cert_file",
                format!("{self}: `key_file` needs its certificate, in `cert_file`"),
            )),
        }
    }

    /// Parses a query parameter as a number of milliseconds.
    pub fn millis_param(&self, name: &str) -> Result<Option<std::time::Duration>> {
        match self.param(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(|ms| Some(std::time::Duration::from_millis(ms)))
                .map_err(|_| {
                    Error::invalid(
                        "url",
                        format!(
                            "{self}: parameter `{name}` must be a whole number of milliseconds, got `{v}`"
                        ),
                    )
                }),
        }
    }
}

/// The contents of the file that a connection `option` (`ca_file`,
/// `cert_file`, `key_file`) names, or an input error naming the option and
/// the path.
pub fn read_option_file(option: &'static str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::invalid(option, format!("cannot read `{path}`: {e}")))
}

/// Prints the URL without passwords.
impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if self.hidden {
            return f.write_str("***");
        }
        for (i, s) in self.servers.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if let Some(u) = &s.username {
                write!(f, "{u}@")?;
            }
            match s.port {
                Some(p) => f.write_str(&s.address(p))?,
                None if s.host.contains(':') => write!(f, "[{}]", s.host)?,
                None => f.write_str(&s.host)?,
            }
        }
        if !self.path.is_empty() {
            write!(f, "/{}", self.path)?;
        }
        Ok(())
    }
}

/// Without the password, and as `***` when its URL is [ambiguous](is_ambiguous).
impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.hidden {
            return f.write_str("Server(***)");
        }
        f.debug_struct("Server")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password)
            .finish()
    }
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerUrl({self})")
    }
}

/// A URL fit for logs and errors: the password (anything between `:` and
/// `@` in each server's user info) is replaced by `***`, and the query is
/// dropped, since query options may carry secrets too.
///
/// A password holding a character the URL should have encoded breaks the
/// URL up in the wrong places, so a piece of it could pass for a host, a
/// port or a path: then only the scheme is shown. So it is for an
/// [ambiguous](is_ambiguous) URL.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".to_owned();
    };
    if user_info_breaks_the_url(rest) || is_ambiguous(url) {
        return format!("{scheme}://***");
    }
    let (authority, tail) = split_authority(rest);
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let servers: Vec<String> = authority
        .split(',')
        .map(|part| match part.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:***@{host}"),
                None => format!("{userinfo}@{host}"),
            },
            None if looks_like_a_server(part) => part.to_owned(),
            // `user:password` whose `@host` was forgotten reads as a host and
            // a port that is no number: the "port" may be a password.
            None => "***".to_owned(),
        })
        .collect();
    format!("{scheme}://{}{path}", servers.join(","))
}

/// Whether `part` reads as `host`, `host:port` or `[v6]:port` with a port
/// that could be one (1 to 65535, no leading zero), as a server with no
/// user info must. A password of digits that could be a port cannot be
/// told from one: the docs ask for the `@`.
fn looks_like_a_server(part: &str) -> bool {
    let port = match part.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, "")) => return true,
            Some((_, after)) => after.strip_prefix(':'),
            None => return false,
        },
        None => match part.split_once(':') {
            Some((_, port)) => Some(port),
            None => return true,
        },
    };
    port.is_some_and(|p| {
        !p.starts_with('0') && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
    })
}

/// Refuses a URL whose user info (what comes before an `@`) seems to run
/// past where its servers end, which is how a password holding a character
/// the URL should have encoded looks. The error shows the scheme alone.
pub fn check_user_info(url: &str) -> Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(());
    };
    if user_info_breaks_the_url(rest) {
        return Err(Error::invalid(
            "url",
            format!(
                "{scheme}://***: the user info holds a character that must be percent-encoded \
                 (`/` as %2F, `?` as %3F, `#` as %23, `,` as %2C), or a server \
                 without credentials comes before one with them (give them first)"
            ),
        ));
    }
    Ok(())
}

/// Why an ambiguous URL's parts are not shown.
pub const AMBIGUOUS: &str = "the URL has an `@` after its servers, which may end a password \
     holding an unencoded `?` or `#`; encode them in a password as %3F and %23";

/// Whether an `@` comes after the URL's servers (in its path, query or
/// fragment). It may be part of an option's value (a file under
/// `/home/a@corp`), or the end of a password holding an unencoded `?` or `#`
/// (`redis://u:1?x@host`, whose servers would then read as `u:1`), and the
/// two cannot be told apart. Such a URL still parses, but its servers,
/// options and values are never shown: errors and logs name its scheme only.
pub fn is_ambiguous(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(_, rest)| split_authority(rest).1.contains('@'))
}

/// `read`, the outcome of reading `url` into settings, with the text of an
/// input error replaced when the URL is [ambiguous](is_ambiguous): the error
/// keeps the field it names (`url`, `prefix`, `ca_file`, ...), but neither
/// the URL's servers nor any option's name or value, any of which may then
/// be a piece of a password. Every backend reads its URL through this.
pub fn hide_if_ambiguous<T>(url: &str, read: Result<T>) -> Result<T> {
    match read {
        Err(Error::InvalidInput { field, .. }) if is_ambiguous(url) => {
            Err(hidden_input_error(&redact(url), field))
        }
        other => other,
    }
}

impl ServerUrl {
    /// `checked`, the outcome of checking options read from this URL
    /// (after [`hide_if_ambiguous`], at connect: a file an option names
    /// that cannot be read), with the text of an input error replaced as
    /// [`hide_if_ambiguous`] replaces it when the URL is ambiguous.
    pub fn hide_if_ambiguous<T>(&self, checked: Result<T>) -> Result<T> {
        match checked {
            // Shown as `scheme://***`, as `redact` shows an ambiguous URL.
            Err(Error::InvalidInput { field, .. }) if self.hidden => {
                Err(hidden_input_error(&self.to_string(), field))
            }
            other => other,
        }
    }
}

/// The input error about `field` of an ambiguous URL, shown as `shown`.
fn hidden_input_error(shown: &str, field: &'static str) -> Error {
    let what = match field {
        "url" => "the URL is refused".to_owned(),
        option => format!("option `{option}` is refused"),
    };
    Error::invalid(
        field,
        format!("{shown}: {what}; why is not shown: {AMBIGUOUS}"),
    )
}

/// The input of a URL that failed to parse, for its error: redacted, and
/// with nothing but the scheme when it has user info, since the failure
/// may be a password that broke the URL in a way [`redact`] cannot see.
fn shown(input: &str) -> String {
    match input.split_once("://") {
        Some((scheme, rest)) if rest.contains('@') => format!("{scheme}://***"),
        _ => redact(input),
    }
}

/// Whether user info (what comes before an `@`) seems to run past where
/// the URL's servers end: an `@` in the path (a password with an unencoded
/// `/`; a database name with an `@` encodes it, as `%40`), or after the
/// first `?` or `#` but before any `=` (a query value may hold an `@`), or
/// a server without `@` ahead of one with it (a `,` in a password).
fn user_info_breaks_the_url(rest: &str) -> bool {
    let (authority, tail) = split_authority(rest);
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let before_a_value = tail.split('=').next().unwrap_or("");
    let parts: Vec<&str> = authority.split(',').collect();
    let last_with_user_info = parts.iter().rposition(|p| p.contains('@'));
    path.contains('@')
        || before_a_value.contains('@')
        || last_with_user_info.is_some_and(|last| parts[..last].iter().any(|p| !p.contains('@')))
}

/// What follows `scheme://`, split into the servers and the rest (path,
/// query, fragment) at the first `/`, `?` or `#`.
fn split_authority(rest: &str) -> (&str, &str) {
    rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()))
}

/// Percent-decodes a user name or password. Not form decoding: a `+` in
/// user info is a plus, not a space.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_several_servers_with_shared_credentials() {
        let u = ServerUrl::parse(
            "redlock://app:s3cr%40t@10.0.0.1:7001,[::1]:7002,host-c?timeout_ms=50",
        )
        .unwrap();
        assert_eq!(u.scheme, "redlock");
        assert_eq!(u.servers.len(), 3);
        assert_eq!(u.servers[0].address(6379), "10.0.0.1:7001");
        assert_eq!(u.servers[1].address(6379), "[::1]:7002");
        assert_eq!(u.servers[2].address(6379), "host-c:6379");
        assert_eq!(u.servers[2].username.as_deref(), Some("app"));
        assert_eq!(
            u.servers[2].password.as_ref().map(Secret::expose),
            Some("s3cr@t")
        );
        assert_eq!(
            u.millis_param("timeout_ms").unwrap(),
            Some(std::time::Duration::from_millis(50))
        );
    }

    #[test]
    fn unknown_options_are_refused_naming_them_and_the_known_ones() {
        let u = ServerUrl::parse("redis://:pw@h?a=1&typo=2").unwrap();
        assert!(u.refuse_unknown_options(&[&["a", "typo"]]).is_ok());
        assert!(u.refuse_unknown_options(&[&["a"], &["typo"]]).is_ok());
        let err = u.refuse_unknown_options(&[&["b", "a"]]).unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("unknown option `typo`; known: a, b"),
            "{text}"
        );
        assert!(!text.contains("pw"), "{text}");
    }

    #[test]
    fn per_server_credentials_win() {
        let u = ServerUrl::parse("redlock://:a@h1:1,:b@h2:2/3").unwrap();
        assert_eq!(u.servers[1].password.as_ref().unwrap().expose(), "b");
        assert_eq!(u.path, "3");
    }

    #[test]
    fn display_and_errors_never_show_the_password() {
        let u = ServerUrl::parse("etcd://root:hunter2@h1:2379,h2:2379").unwrap();
        assert_eq!(u.to_string(), "etcd://root@h1:2379,root@h2:2379");
        assert!(!format!("{u:?}").contains("hunter2"));
        let err = ServerUrl::parse("etcd://root:hunter2@h1:99999")
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains("hunter2") && err.contains("server #1"),
            "{err}"
        );
    }

    #[test]
    fn malformed_urls_are_refused_with_the_reason() {
        for (input, expect) in [
            ("h1:6379", "expected scheme://"),
            ("redlock://", "no server"),
            ("redlock://a:1,,b:2", "server #2 is empty"),
            ("redlock://a:notaport", "server #1"),
            ("redlock://a:1?timeout_ms=x", ""),
        ] {
            match ServerUrl::parse(input) {
                Err(e) => assert!(e.to_string().contains(expect), "{input}: {e}"),
                Ok(u) => assert!(u.millis_param("timeout_ms").is_err(), "{input} parsed"),
            }
        }
    }

    #[test]
    fn a_password_that_reads_as_a_port_is_hidden() {
        for (url, shown) in [
            ("redis://default:S3cret", "redis://***"),
            ("redis://h:6379,u:S3cret/0", "redis://h:6379,***/0"),
            ("redis://[::1]:S3cret", "redis://***"),
            ("redis://[::1]:6379", "redis://[::1]:6379"),
            ("redis://default:0123", "redis://***"),
            ("redis://default:123456", "redis://***"),
            ("redis://default:", "redis://***"),
            ("redis://h", "redis://h"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn redact_hides_passwords_and_query() {
        assert_eq!(
            redact("postgres://u:pw@h:5432/db?password=pw"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("redlock://:a@h1,:b@h2"), "redlock://:***@h1,:***@h2");
        assert_eq!(redact("garbage"), "<not a URL>");
    }

    /// A password with a character the URL should have encoded: neither
    /// the refusal nor the redacted URL shows any piece of it.
    #[test]
    fn a_password_that_breaks_the_url_is_refused_without_showing_it() {
        for input in [
            "redlock://app:Xq,Zk@h1:6379,h2",
            "redis://app:Xq/Zk@h:6379/0",
            "redis://app:Xq#Zk@h",
            "redis://app:Xq?Zk@h/0?timeout_ms=5",
            "redis://app:12/Xq==Zk@h",
        ] {
            let err = ServerUrl::parse(input).expect_err(input).to_string();
            assert!(err.contains("percent-encoded"), "{input}: {err}");
            for piece in ["Xq", "Zk"] {
                assert!(!err.contains(piece), "{input}: `{piece}` in {err}");
            }
            let scheme = &input[..input.find(':').unwrap()];
            assert_eq!(redact(input), format!("{scheme}://***"));
        }
        // Unparsable with user info: the error shows the scheme alone (the
        // `=` hides from the check above that the password holds a `?`).
        let err = ServerUrl::parse("redis://app:Xq?a=Zk@h")
            .expect_err("port `Xq`")
            .to_string();
        assert!(
            err.contains("redis://***") && !err.contains("Xq") && !err.contains("Zk"),
            "{err}"
        );
        // An `@` in a query value is no user info: the URL is taken, but
        // it could be a password's end (`:7?Zk=Xq@h`), so nothing after the
        // scheme is shown.
        for valid in [
            "redis://h/0?prefix=team@x:",
            "etcd://h?ca_file=/home/a@corp/ca.pem",
            "redis://app:7?Zk=Xq@h",
        ] {
            let u = ServerUrl::parse(valid).expect(valid);
            assert!(is_ambiguous(valid), "{valid}");
            let scheme = &valid[..valid.find(':').unwrap()];
            assert_eq!(u.to_string(), format!("{scheme}://***"));
            assert_eq!(u.servers[0].endpoint(scheme, 1), format!("{scheme}://***"));
            assert_eq!(redact(valid), format!("{scheme}://***"));
        }
        let u = ServerUrl::parse("etcd://h?ca_file=/home/a@corp/ca.pem").unwrap();
        assert_eq!(u.param("ca_file"), Some("/home/a@corp/ca.pem"));
        let valid = "redis://app:7?Zk=Xq@h&timeout_ms=Xq@";
        let u = ServerUrl::parse(valid).unwrap();
        for err in [
            u.refuse_unknown_options(&[&["timeout_ms"]]),
            u.millis_param("timeout_ms").map(drop),
            Err(Error::invalid("prefix", "`Xq` is too long")),
        ] {
            let err = hide_if_ambiguous(valid, err).unwrap_err();
            let text = err.to_string();
            assert!(err.is_invalid_input(), "{text}");
            assert!(!text.contains("Zk") && !text.contains("Xq"), "{text}");
            assert!(text.contains("redis://***"), "{text}");
        }
        assert_eq!(
            redact("postgres://app:pw@db/app?password=ab@cd"),
            "postgres://***"
        );
        // A `+` is a plus, an encoded character is decoded.
        let u = ServerUrl::parse("redis://us%20er:a+b%2Fc@h").unwrap();
        assert_eq!(u.servers[0].username.as_deref(), Some("us er"));
        assert_eq!(
            u.servers[0].password.as_ref().map(Secret::expose),
            Some("a+b/c")
        );
        // An `@` in the password is taken as part of it, as URLs do.
        let u = ServerUrl::parse("redis://app:p@ss@h").unwrap();
        assert_eq!(
            u.servers[0].password.as_ref().map(Secret::expose),
            Some("p@ss")
        );
        assert_eq!(redact("redis://app:p@ss@h"), "redis://app:***@h");
    }
}
