//! RESP frames (docs/resp.md): commands in, replies out.
//!
//! Modelled on tokio's mini-redis `frame.rs`, cut to what a server needs:
//! a command is an array of bulk strings (what every client library sends)
//! or an inline line (what a person types over `telnet`); a reply is any of
//! RESP2's types, plus RESP3's map and null for clients that said `HELLO 3`.
//!
//! Parsing never allocates on a length the client announces: a bulk length
//! over [`Limits::max_bulk`], an array over [`Limits::max_args`], or a bulk
//! that would take the command past [`Limits::max_command`] is a protocol
//! error before any byte of it is buffered, so a client cannot make the
//! server reserve memory it has not sent, and a command waiting for more
//! bytes is never longer than `max_command`.
//!
//! The flow: the connection loop (`mod.rs`) calls [`parse`] on what it has
//! read: `Ok(None)` reads more, a command's arguments (slices of the read
//! buffer) go to `cmd::run`, an error is answered `-ERR ...` and closes.
//! [`Reply::write`] appends each reply in the client's protocol.

use std::ops::Range;

/// What one command may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The longest argument, bytes (Redis's `proto-max-bulk-len`).
    pub max_bulk: usize,
    /// The most arguments in one command.
    pub max_args: usize,
    /// The longest inline command line, bytes.
    pub max_inline: usize,
    /// The longest command in all (its arguments and their framing), bytes.
    pub max_command: usize,
    /// Whether these are the limits before `AUTH`: an argument count or a
    /// bulk length over them then gets Redis's `unauthenticated` errors.
    pub pre_auth: bool,
}

/// A frame that cannot be read: answered with the error and the connection
/// closed, as Redis does (the rest of the stream cannot be trusted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    // Messages are Redis's own, so clients and operators recognise them.
    /// `*<n>` that is not a number, or a command (inline too) of more than
    /// [`Limits::max_args`] arguments.
    #[error("Protocol error: invalid multibulk length")]
    ArrayLen,
    /// `$<n>` that is not a number of 0 or more, or over
    /// [`Limits::max_bulk`].
    #[error("Protocol error: invalid bulk length")]
    BulkLen,
    /// A command array holding other than bulk strings (clients send none).
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A `*`/`$` line with no CRLF within [`MAX_COUNT_LINE`]: not buffered.
    #[error("Protocol error: too big mbulk count string")]
    CountLine,
    /// An inline line over [`Limits::max_inline`].
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    /// An inline quote never closed, or closed with no space after it.
    #[error("Protocol error: unbalanced quotes in request")]
    Unbalanced,
    /// A bulk's bytes not followed by CRLF: its announced length was wrong.
    #[error("Protocol error: bulk string not followed by CRLF")]
    BulkEnd,
    /// Too many arguments before `AUTH`, in Redis 7's words for it.
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthArrayLen,
    /// A bulk length over the pre-`AUTH` bound (a malformed one: `BulkLen`).
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthBulkLen,
    // Redis has no total limit below its 1 GB query buffer; this one is
    // freqcap's `max_body`, named so the operator knows which to raise.
    #[error("Protocol error: a command is over the size limit of {0} bytes")]
    TooBig(usize),
}

impl Limits {
    /// The error for an argument count over [`Limits::max_args`].
    fn too_many_args(&self) -> FrameError {
        if self.pre_auth {
            FrameError::UnauthArrayLen
        } else {
            FrameError::ArrayLen
        }
    }
}

/// A parsed command: its arguments, as ranges of the buffer it was read
/// from (inline commands, whose quotes are undone, carry their own bytes).
#[derive(Debug, PartialEq, Eq)]
pub enum Args {
    /// An array's bulk strings, as ranges of the read buffer: never copied.
    Ranges(Vec<Range<usize>>),
    /// An inline command's arguments, copied: quotes and escapes are undone.
    Owned(Vec<Vec<u8>>),
}

impl Args {
    /// The arguments as slices, the command's name first.
    pub fn slices<'a>(&'a self, buf: &'a [u8]) -> Vec<&'a [u8]> {
        match self {
            Args::Ranges(r) => r.iter().map(|r| &buf[r.clone()]).collect(),
            Args::Owned(v) => v.iter().map(Vec::as_slice).collect(),
        }
    }
}

/// The longest `*<n>` or `$<n>` line: 20 digits and a sign are plenty.
const MAX_COUNT_LINE: usize = 32;

/// Reads one command from the start of `buf`: `Ok(None)` if more bytes are
/// needed, else the command and how many bytes it used. An empty command
/// (`*0`, a blank inline line) comes back with no arguments: skip it.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(Args, usize)>, FrameError> {
    let parsed = match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_array(buf, limits),
        Some(_) => parse_inline(buf, limits),
    }?;
    // Every byte of `buf` belongs to the command still incomplete: the
    // count line under way is the only part not checked when announced.
    if parsed.is_none() && buf.len() > limits.max_command {
        return Err(FrameError::TooBig(limits.max_command));
    }
    Ok(parsed)
}

/// The line starting at `at`, without its CRLF, and where the next begins.
fn line(buf: &[u8], at: usize, max: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    // Look no further than a count line can be.
    let rest = &buf[at.min(buf.len())..buf.len().min(at + max + 2)];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&rest[..i], at + i + 2))),
        None if rest.len() > max + 1 => Err(FrameError::CountLine),
        None => Ok(None),
    }
}

/// A count line's digits as an integer (a sign allowed: `*-1`).
fn number(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// `*<n>` then n bulk strings. Each length is checked against `limits` as
/// soon as its line is read, before its bytes are waited for.
fn parse_array(buf: &[u8], limits: &Limits) -> Result<Option<(Args, usize)>, FrameError> {
    let Some((count, mut at)) = line(buf, 1, MAX_COUNT_LINE)? else {
        return Ok(None);
    };
    let n = number(count).ok_or(FrameError::ArrayLen)?;
    if n <= 0 {
        // `*0` and `*-1` are no command; Redis skips them too.
        return Ok(Some((Args::Ranges(Vec::new()), at)));
    }
    let n = usize::try_from(n).map_err(|_| FrameError::ArrayLen)?;
    if n > limits.max_args {
        return Err(limits.too_many_args());
    }
    // Capacity from what is buffered, not from what the client announced.
    let mut args = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&c) => return Err(FrameError::ExpectedBulk(char::from(c))),
        }
        let Some((len, start)) = line(buf, at + 1, MAX_COUNT_LINE)? else {
            return Ok(None);
        };
        let len = number(len)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or(FrameError::BulkLen)?;
        // Only a length over the bound has the pre-`AUTH` word.
        if len > limits.max_bulk {
            return Err(if limits.pre_auth {
                FrameError::UnauthBulkLen
            } else {
                FrameError::BulkLen
            });
        }
        let end = start + len;
        if end.saturating_add(2) > limits.max_command {
            return Err(FrameError::TooBig(limits.max_command));
        }
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(FrameError::BulkEnd);
        }
        args.push(start..end);
        at = end + 2;
    }
    Ok(Some((Args::Ranges(args), at)))
}

/// An inline command: one line, arguments split on spaces, with double and
/// single quotes as Redis reads them (backslash escapes inside double quotes).
fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Option<(Args, usize)>, FrameError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline {
            return Err(FrameError::InlineTooBig);
        }
        return Ok(None);
    };
    if nl > limits.max_inline {
        return Err(FrameError::InlineTooBig);
    }
    let text = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let args = split_args(text)?;
    if args.len() > limits.max_args {
        return Err(limits.too_many_args());
    }
    Ok(Some((Args::Owned(args), nl + 1)))
}

/// An inline line split on whitespace, a quoted run one argument. In quotes
/// `\<c>` is c, but `\n`, `\r`, `\t` in double quotes; outside, `\` is a byte.
fn split_args(text: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if text[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let mut arg = Vec::new();
        match text[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    let Some(&c) = text.get(i) else {
                        return Err(FrameError::Unbalanced);
                    };
                    i += 1;
                    if c == q {
                        break;
                    }
                    if c == b'\\' && i < text.len() {
                        let e = text[i];
                        i += 1;
                        arg.push(match (q, e) {
                            (b'"', b'n') => b'\n',
                            (b'"', b'r') => b'\r',
                            (b'"', b't') => b'\t',
                            (_, e) => e,
                        });
                    } else {
                        arg.push(c);
                    }
                }
                // A closing quote must end the argument.
                if text.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
                    return Err(FrameError::Unbalanced);
                }
            }
            _ => {
                while i < text.len() && !text[i].is_ascii_whitespace() {
                    arg.push(text[i]);
                    i += 1;
                }
            }
        }
        out.push(arg);
    }
    Ok(out)
}

/// A reply. `Map` and `Null` are written as RESP3 types to a client that said
/// `HELLO 3`, and as their RESP2 forms (a flat array, a null bulk) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, `+PONG`: always a constant, never allocated.
    Simple(&'static str),
    /// The message after `-`; its first word is the error code (`ERR`, ...).
    Error(String),
    /// `:<n>`: `CL.THROTTLE`'s five figures, `FC.CHECK`'s numbers.
    Int(i64),
    /// `$<len>`: any bytes (an `ECHO`, a name, `INFO`'s text).
    Bulk(Vec<u8>),
    /// No value (`CLIENT GETNAME` unset, a `retry_after_ms` of null).
    Null,
    /// `*<n>`, items in any of these forms.
    Array(Vec<Reply>),
    /// Named fields (`HELLO`, `FC.CHECK`), names being the front's constants.
    Map(Vec<(&'static str, Reply)>),
}

impl Reply {
    /// An error; `message` starts with its word (`ERR`, `NOAUTH`, ...:
    /// `cmd/mod.rs` says which comes from where).
    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error(message.into())
    }

    /// A bulk string of any bytes or text.
    pub fn bulk(s: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(s.into())
    }

    /// Appends the reply's bytes for a client speaking RESP `proto` (2 or 3).
    pub fn write(&self, proto: u8, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => line_of(out, b'+', s.as_bytes()),
            Reply::Error(m) => {
                // A CR or LF would end the line early and desync the client.
                let clean: Vec<u8> = m
                    .bytes()
                    .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b })
                    .collect();
                line_of(out, b'-', &clean);
            }
            Reply::Int(n) => int_line(out, b':', *n),
            Reply::Bulk(b) => {
                int_line(out, b'$', len(b.len()));
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::Null => out.extend_from_slice(b"$-1\r\n"),
            Reply::Array(items) => {
                int_line(out, b'*', len(items.len()));
                for i in items {
                    i.write(proto, out);
                }
            }
            Reply::Map(pairs) => {
                if proto >= 3 {
                    int_line(out, b'%', len(pairs.len()));
                } else {
                    int_line(out, b'*', len(pairs.len()).saturating_mul(2));
                }
                for (k, v) in pairs {
                    Reply::Bulk(k.as_bytes().to_vec()).write(proto, out);
                    v.write(proto, out);
                }
            }
        }
    }
}

/// A length as RESP's integer, saturating rather than panicking.
fn len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `<tag><n>\r\n` without allocating (five integers per `CL.THROTTLE`
/// reply: `to_string` showed in profiles).
fn int_line(out: &mut Vec<u8>, tag: u8, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut v = n.unsigned_abs();
    loop {
        at -= 1;
        // v % 10 < 10: the cast cannot truncate.
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.push(tag);
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// `<tag><body>\r\n`; the caller makes `body` free of CR and LF.
fn line_of(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_bulk: 16,
        max_args: 5,
        max_inline: 32,
        max_command: 64,
        pre_auth: false,
    };

    type Parsed = Option<(Vec<Vec<u8>>, usize)>;

    fn args(buf: &[u8]) -> Result<Parsed, FrameError> {
        Ok(parse(buf, &L)?
            .map(|(a, n)| (a.slices(buf).into_iter().map(<[u8]>::to_vec).collect(), n)))
    }

    #[test]
    fn arrays_of_bulk_strings() {
        let b = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n";
        let (a, n) = args(b).unwrap().unwrap();
        assert_eq!(a, vec![b"PING".to_vec(), b"hi".to_vec()]);
        assert_eq!(n, 22);
        // Every strict prefix asks for more.
        for cut in 0..22 {
            assert_eq!(args(&b[..cut]).unwrap(), None, "prefix {cut}");
        }
        assert_eq!(args(b"*0\r\n").unwrap(), Some((vec![], 4)));
        assert_eq!(args(b"*-1\r\n").unwrap(), Some((vec![], 5)));
    }

    #[test]
    fn announced_sizes_are_bounded_before_buffering() {
        assert_eq!(args(b"*6\r\n"), Err(FrameError::ArrayLen));
        assert_eq!(
            args(b"*99999999999999999999999\r\n"),
            Err(FrameError::ArrayLen)
        );
        assert_eq!(args(b"*1\r\n$17\r\n"), Err(FrameError::BulkLen));
        assert_eq!(args(b"*1\r\n$-1\r\n"), Err(FrameError::BulkLen));
        assert_eq!(args(b"*x\r\n"), Err(FrameError::ArrayLen));
        assert_eq!(args(b"*1\r\n:1\r\n"), Err(FrameError::ExpectedBulk(':')));
        assert_eq!(args(b"*1\r\n$2\r\nabcd"), Err(FrameError::BulkEnd));
        // A count line that never ends is cut off, not buffered for ever.
        assert_eq!(args(&[b'*'; 64]), Err(FrameError::CountLine));
    }

    #[test]
    fn a_command_is_bounded_in_total_when_announced() {
        // Four bulks of 10 are each under max_bulk; the fourth's length
        // takes the command past 64 bytes: refused before its bytes come.
        let ten = b"$10\r\n0123456789\r\n";
        let mut b = b"*5\r\n".to_vec();
        for _ in 0..3 {
            b.extend_from_slice(ten);
        }
        assert_eq!(args(&b), Ok(None));
        b.extend_from_slice(b"$10\r\n");
        assert_eq!(args(&b), Err(FrameError::TooBig(64)));
        // A count line under way past the total is refused too.
        let mut b = b"*5\r\n".to_vec();
        b.extend_from_slice(&ten[..]);
        b.extend_from_slice(&ten[..]);
        b.extend_from_slice(b"$1\r\nx\r\n$1\r\nx\r\n$1");
        b.extend_from_slice(&[b'0'; 20]);
        assert_eq!(args(&b), Err(FrameError::TooBig(64)));
        // Before AUTH the errors are Redis's unauthenticated ones.
        let pre = Limits {
            pre_auth: true,
            ..L
        };
        assert_eq!(parse(b"*6\r\n", &pre), Err(FrameError::UnauthArrayLen));
        assert_eq!(
            parse(b"*1\r\n$17\r\n", &pre),
            Err(FrameError::UnauthBulkLen)
        );
        assert_eq!(parse(b"*1\r\n$-1\r\n", &pre), Err(FrameError::BulkLen));
        assert_eq!(
            parse(b"a b c d e f\n", &pre),
            Err(FrameError::UnauthArrayLen)
        );
    }

    #[test]
    fn inline_commands() {
        let (a, n) = args(b"CL.THROTTLE k 1 2 3\r\n").unwrap().unwrap();
        assert_eq!(n, 21);
        assert_eq!(a.len(), 5);
        let (a, _) = args(b"ECHO \"a b\\n\" 'c d'\n").unwrap().unwrap();
        assert_eq!(
            a,
            vec![b"ECHO".to_vec(), b"a b\n".to_vec(), b"c d".to_vec()]
        );
        assert_eq!(args(b"ECHO \"ab\n"), Err(FrameError::Unbalanced));
        assert_eq!(args(b"\r\n").unwrap(), Some((vec![], 2)));
        assert_eq!(args(b"PING"), Ok(None));
        assert_eq!(args(&[b'a'; 40]), Err(FrameError::InlineTooBig));
        assert_eq!(args(b"a b c d e f\n"), Err(FrameError::ArrayLen));
    }

    #[test]
    fn replies_in_both_protocols() {
        let r = Reply::Map(vec![("a", Reply::Int(1)), ("b", Reply::Null)]);
        let mut two = Vec::new();
        r.write(2, &mut two);
        assert_eq!(two, b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n$-1\r\n");
        let mut three = Vec::new();
        r.write(3, &mut three);
        assert_eq!(three, b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n_\r\n");
        for n in [0, 7, -1, 1234567890, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            Reply::Int(n).write(2, &mut out);
            assert_eq!(out, format!(":{n}\r\n").into_bytes());
        }
        let mut e = Vec::new();
        Reply::error("ERR a\r\nb").write(2, &mut e);
        assert_eq!(e, b"-ERR a  b\r\n");
    }
}
