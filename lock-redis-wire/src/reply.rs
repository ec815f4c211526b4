//! Reading the server's replies off a batcher's own socket (see
//! [`crate::socket`]): RESP2, and only the few shapes the batch script and
//! the connection's handshake answer with.
//!
//! The batch script answers an integer, or an array of integers and error
//! texts (one per operation), or an error for the whole call; `AUTH`,
//! `SELECT` and `CLIENT SETNAME` answer `+OK`. Anything else the server
//! sends this connection is a protocol error, and the connection is dropped.

use redis::{ErrorKind, RedisError, RedisResult};

/// The longest error text of one operation that is read.
const MAX_ERROR_TEXT: usize = 64 * 1024;

/// One complete reply.
#[derive(Debug)]
pub(crate) enum Reply {
    /// `+...`: a status (the handshake's `OK`).
    Status,
    /// `:n`, a batch of one's answer.
    Int(i64),
    /// `*n` of integers and error texts: a batch's answers, one per operation.
    Answers(Vec<RedisResult<i64>>),
    /// `-...`: the whole call failed (`NOSCRIPT`, `WRONGPASS`, `LOADING`, ...).
    Error(RedisError),
}

impl Reply {
    /// The answers of a batch of `count` operations, or the call's error.
    pub(crate) fn into_answers(self, count: usize) -> RedisResult<Vec<RedisResult<i64>>> {
        let answers = match self {
            Reply::Int(one) => vec![Ok(one)],
            Reply::Answers(many) => many,
            Reply::Error(e) => return Err(e),
            Reply::Status => return Err(unexpected("a status")),
        };
        if answers.len() == count {
            Ok(answers)
        } else {
            Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "the batch script answered a different number of operations than it was sent",
            )))
        }
    }
}

/// Reads one reply from the start of `buf`: `Ok(None)` while it is
/// incomplete, else the reply and how many bytes it took. `Err` when the
/// bytes are not a reply of the expected shapes.
pub(crate) fn parse(buf: &[u8]) -> RedisResult<Option<(Reply, usize)>> {
    let Some((line, mut at)) = line(buf, 0) else {
        return Ok(None);
    };
    let (kind, text) = line
        .split_first()
        .ok_or_else(|| unexpected("an empty line"))?;
    let reply = match kind {
        b'+' => Reply::Status,
        b':' => Reply::Int(integer(text)?),
        b'-' => Reply::Error(server_error(line)),
        b'*' => {
            let count = usize::try_from(integer(text)?).map_err(|_| unexpected("a null array"))?;
            let mut answers = Vec::with_capacity(count.min(crate::batch::MAX_BATCH));
            for _ in 0..count {
                match element(buf, at)? {
                    None => return Ok(None),
                    Some((answer, next)) => {
                        answers.push(answer);
                        at = next;
                    }
                }
            }
            Reply::Answers(answers)
        }
        _ => return Err(unexpected("a reply of another type")),
    };
    Ok(Some((reply, at)))
}

/// One element of a batch's array: an integer, or an operation's error
/// text (a bulk string).
fn element(buf: &[u8], at: usize) -> RedisResult<Option<(RedisResult<i64>, usize)>> {
    let Some((line, next)) = line(buf, at) else {
        return Ok(None);
    };
    match line.split_first() {
        Some((b':', text)) => Ok(Some((Ok(integer(text)?), next))),
        Some((b'$', text)) => {
            let len = usize::try_from(integer(text)?)
                .map_err(|_| unexpected("a null or negative length"))?;
            // An operation's error text is short; a longer length is
            // refused rather than waited for.
            if len > MAX_ERROR_TEXT {
                return Err(unexpected("an error text longer than 64 KiB"));
            }
            let end = next + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(unexpected("a string without its CRLF"));
            }
            let failed = RedisError::from((
                ErrorKind::Extension,
                "a lock operation failed in the batch script",
                String::from_utf8_lossy(&buf[next..end]).into_owned(),
            ));
            Ok(Some((Err(failed), end + 2)))
        }
        _ => Err(unexpected("an array element of another type")),
    }
}

/// The line starting at `at`, without its CRLF, and where the next begins.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|pair| pair == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn integer(text: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| unexpected("a malformed integer"))
}

/// An error line (`-CODE text`) as the redis crate's error of that code,
/// so that it maps to the same [`lock_core::Error`] kind as on any other
/// connection (see [`crate::map_error`]).
fn server_error(line: &[u8]) -> RedisError {
    let mut whole = line.to_vec();
    whole.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&whole).and_then(redis::Value::extract_error) {
        Err(e) => e,
        Ok(_) => unexpected("an error line the client could not read"),
    }
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from the server",
        what.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ServerErrorKind;

    fn whole(bytes: &[u8]) -> Reply {
        let (reply, used) = parse(bytes).expect("valid").expect("complete");
        assert_eq!(used, bytes.len(), "took the whole reply");
        reply
    }

    #[test]
    fn integers_and_arrays_of_answers_are_read() {
        assert!(matches!(whole(b":42\r\n"), Reply::Int(42)));
        assert!(matches!(whole(b":-1\r\n"), Reply::Int(-1)));
        let Reply::Answers(answers) = whole(b"*3\r\n:7\r\n$10\r\nERR broken\r\n:-31\r\n") else {
            panic!("an array")
        };
        assert_eq!(answers[0].as_ref().ok(), Some(&7));
        let failed = answers[1].as_ref().unwrap_err();
        assert!(failed.to_string().contains("ERR broken"), "{failed}");
        assert_eq!(answers[2].as_ref().ok(), Some(&-31));
        assert!(matches!(whole(b"+OK\r\n"), Reply::Status));
    }

    #[test]
    fn an_incomplete_reply_waits_for_more_at_every_cut() {
        let full = b"*2\r\n:7\r\n$3\r\nERR\r\n";
        for cut in 0..full.len() {
            assert!(
                parse(&full[..cut]).expect("valid so far").is_none(),
                "complete at {cut} of {}",
                full.len()
            );
        }
        // A second reply after the first is left for the next read.
        let mut two = full.to_vec();
        two.extend_from_slice(b":1\r\n");
        let (_, used) = parse(&two).unwrap().unwrap();
        assert_eq!(used, full.len());
    }

    #[test]
    fn error_lines_keep_their_code() {
        let Reply::Error(e) = whole(b"-NOSCRIPT No matching script.\r\n") else {
            panic!("an error")
        };
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::NoScript));
        let Reply::Error(e) = whole(b"-WRONGPASS invalid username-password pair\r\n") else {
            panic!("an error")
        };
        assert_eq!(e.code(), Some("WRONGPASS"), "{e}");
        let Reply::Error(e) = whole(b"-LOADING Redis is loading\r\n") else {
            panic!("an error")
        };
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::BusyLoading));
    }

    #[test]
    fn other_shapes_are_protocol_errors() {
        for bytes in [
            &b"$3\r\nabc\r\n"[..],
            b"*1\r\n*0\r\n",
            b":x\r\n",
            b"\r\n",
            b"*-1\r\n",
            b"*1\r\n$3\r\nabcde\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$99999999999\r\n",
        ] {
            assert!(
                parse(bytes).is_err(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn a_batchs_answers_must_match_its_operations() {
        let Reply::Answers(two) = whole(b"*2\r\n:1\r\n:2\r\n") else {
            panic!("an array")
        };
        assert!(Reply::Answers(two).into_answers(3).is_err());
        assert_eq!(
            Reply::Int(5).into_answers(1).unwrap()[0].as_ref().ok(),
            Some(&5)
        );
    }
}
