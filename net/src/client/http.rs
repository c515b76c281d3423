//! A small blocking HTTP/1.1 client over `std::net::TcpStream`, for the CLI and the
//! tests: one request per connection (`Connection: close`), bodies by `Content-Length`,
//! chunked transfer or end of stream, and a streaming reader for subscriptions.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::Duration;

/// A server's address, from `http://HOST:PORT` (a path after it is ignored), and the
/// token every request to it carries (docs/auth.md), if any.
#[derive(Clone, PartialEq, Eq)]
pub struct Server {
    /// `HOST:PORT`.
    pub authority: String,
    /// Sent as `Authorization: Bearer <token>`.
    token: Option<String>,
    /// The longest a connection is tried for, whatever the call's own timeout.
    connect_timeout: Option<Duration>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: Debug output ends up in logs.
        f.debug_struct("Server")
            .field("authority", &self.authority)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl Server {
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("server URL {url:?} must start with http://"))?;
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() {
            return Err(format!("server URL {url:?} has no host"));
        }
        let authority =
            if authority.contains(':') { authority.to_owned() } else { format!("{authority}:80") };
        Ok(Server { authority, token: None, connect_timeout: None })
    }

    /// Every request carries `token` (None, or an empty one: no Authorization header).
    /// A token must be visible ASCII: it is written into each request's head.
    pub fn with_token(mut self, token: Option<String>) -> Result<Self, String> {
        let token = token.filter(|token| !token.is_empty());
        if let Some(token) = &token
            && !token.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err(format!(
                "a token is visible ASCII (no spaces, line breaks or other letters); this one \
                 is {} bytes and is not",
                token.len()
            ));
        }
        self.token = token;
        Ok(self)
    }

    /// Each connection is tried for at most `timeout` (and at most the call's own
    /// timeout); None: the call's timeout alone.
    pub fn with_connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout.filter(|timeout| !timeout.is_zero());
        self
    }
}

/// A whole response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, &name.to_ascii_lowercase())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A response whose body is read as it arrives.
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Box<dyn BufRead + Send>,
    /// The body's `content-length`, if it has one.
    length: Option<u64>,
}

impl Streaming {
    /// The response whose head (`status`, `headers` as [`read_head`] gives them)
    /// `reader` has just given, its body to read as it arrives.
    pub fn after_head<R: BufRead + Send + 'static>(
        reader: R,
        method: &str,
        status: u16,
        headers: Vec<(String, String)>,
    ) -> Self {
        let mut length = None;
        let body: Box<dyn BufRead + Send> = if method == "HEAD" || status == 204 || status == 304 {
            Box::new(io::empty())
        } else if is_chunked(&headers) {
            Box::new(BufReader::new(Chunked::new(reader)))
        } else if let Some(len) = find(&headers, "content-length").and_then(|v| v.parse().ok()) {
            length = Some(len);
            Box::new(reader.take(len))
        } else {
            Box::new(reader)
        };
        Streaming { status, headers, body, length }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, &name.to_ascii_lowercase())
    }

    /// Reads the rest of the body.
    pub fn finish(mut self) -> io::Result<Response> {
        let mut body = Vec::new();
        read_body(&mut self.body, self.length, &mut body)?;
        Ok(Response { status: self.status, headers: self.headers, body })
    }
}

/// Sends one request and reads the whole response.
pub fn request(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<Response> {
    open(server, method, path, headers, body, None)?.finish()
}

/// Sends one request and returns once the response head has arrived. `timeout` bounds
/// each read of the body (None: wait as long as it takes).
pub fn open(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Option<Duration>,
) -> io::Result<Streaming> {
    open_on(connect(server, timeout)?, server, method, path, headers, body, timeout)
}

/// A connection to `server`, its addresses tried in turn within `timeout` or its connect
/// timeout, the shorter, in all (neither: as long as the kernel tries, about two
/// minutes), so that an unreachable host fails a call within the client's timeout too.
/// (Resolving the name is not bounded: it is the system resolver's.)
pub fn connect(server: &Server, timeout: Option<Duration>) -> io::Result<TcpStream> {
    let authority = &server.authority;
    let timeout = match (timeout, server.connect_timeout) {
        (Some(call), Some(connect)) => Some(call.min(connect)),
        (call, connect) => call.or(connect),
    };
    let Some(timeout) = timeout else {
        return TcpStream::connect(authority);
    };
    let (until, mut last) = (std::time::Instant::now() + timeout, None);
    for address in authority.to_socket_addrs()? {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&address, left) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("{authority} names no address"))
    }))
}

/// [`open`] on a connection to `server` the caller made (with socket options of its
/// own, say); the request asks the server to close it after the answer.
pub fn open_on(
    mut stream: TcpStream,
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Option<Duration>,
) -> io::Result<Streaming> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(timeout)?;
    let mut out = Vec::with_capacity(256 + body.map_or(0, <[u8]>::len));
    let mut headers = headers.to_vec();
    headers.push(("connection", "close"));
    encode_head(&mut out, method, path, server, &headers, body.map(<[u8]>::len));
    out.extend_from_slice(body.unwrap_or_default());
    // A server may answer before it has read the whole body (a body over its limit):
    // then the write fails, and the answer is what counts.
    let written = stream.write_all(&out);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    match (reader.read_line(&mut line), written) {
        (Ok(n), _) if n > 0 => {}
        (_, Err(error)) | (Err(error), Ok(())) => return Err(error),
        (Ok(_), Ok(())) => {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no response"));
        }
    }
    let (status, headers) = read_head(&mut reader, &mut line)?;
    Ok(Streaming::after_head(reader, method, status, headers))
}

/// A header's value, from headers as [`read_head`] gives them (names lowercased).
fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// Whether a body comes in chunks (`Transfer-Encoding: chunked`).
pub fn is_chunked(headers: &[(String, String)]) -> bool {
    find(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
}

/// A chunked body on a connection, read as it arrives, that can tell whether bytes of it
/// have come that nothing has read yet (an append session's answer).
pub struct ChunkedBody(BufReader<Chunked<BufReader<TcpStream>>>);

impl ChunkedBody {
    /// The body of the answer whose head `reader` has just given.
    pub fn new(reader: BufReader<TcpStream>) -> Self {
        ChunkedBody(BufReader::new(Chunked::new(reader)))
    }

    /// Whether bytes of the body have come that nothing has read: in the buffers, or
    /// due in the chunk being read. The socket itself is not asked.
    pub fn has_unread(&self) -> bool {
        let chunked = self.0.get_ref();
        !self.0.buffer().is_empty() || chunked.left > 0 || !chunked.inner.buffer().is_empty()
    }
}

impl Read for ChunkedBody {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl BufRead for ChunkedBody {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.0.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.0.consume(amount);
    }
}

/// Decodes a chunked body.
struct Chunked<R> {
    inner: R,
    /// Bytes left in the current chunk.
    left: u64,
    done: bool,
}

impl<R> Chunked<R> {
    fn new(inner: R) -> Self {
        Chunked { inner, left: 0, done: false }
    }
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "chunked body cut short: the connection closed between chunks",
                ));
            }
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = u64::from_str_radix(size, 16).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}"))
            })?;
            if self.left == 0 {
                // Trailers, then the blank line.
                loop {
                    line.clear();
                    if self.inner.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "chunked body cut short"));
        }
        self.left -= n as u64;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Reads the next event from an event stream; None at its end. An event of more than
/// [`RESPONSE_BODY_BYTES_MAX`] bytes is refused as malformed.
pub fn next_event(body: &mut dyn BufRead) -> io::Result<Option<Event>> {
    let mut event = Event::default();
    let mut any = false;
    let mut line = String::new();
    let mut budget = RESPONSE_BODY_BYTES_MAX;
    loop {
        line.clear();
        let read = (&mut *body).take(budget).read_line(&mut line)? as u64;
        if read == 0 && budget > 0 {
            return Ok(None);
        }
        budget -= read;
        if budget == 0 && !line.ends_with('\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an event of more than {RESPONSE_BODY_BYTES_MAX} bytes"),
            ));
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if any {
                return Ok(Some(event));
            }
            continue;
        }
        any = true;
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event.event = value.to_owned(),
            "id" => event.id = Some(value.to_owned()),
            "data" => {
                if !event.data.is_empty() {
                    event.data.push('\n');
                }
                event.data.push_str(value);
            }
            _ => {}
        }
    }
}

/// Percent-encodes one path segment (a stream key): everything but unreserved bytes.
pub fn encode_segment(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string()
}

const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Writes a request head; `content_length` None sends no body header.
pub fn encode_head(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    server: &Server,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) {
    use std::fmt::Write as _;
    let mut head = String::with_capacity(128 + path.len());
    let _ = write!(head, "{method} {path} HTTP/1.1\r\nhost: {}\r\n", server.authority);
    if let Some(token) = &server.token {
        let _ = write!(head, "authorization: Bearer {token}\r\n");
    }
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    if let Some(len) = content_length {
        let _ = write!(head, "content-length: {len}\r\n");
    }
    head.push_str("\r\n");
    out.extend_from_slice(head.as_bytes());
}

/// The rest of a response head after its status line (in `line`): the status, and the
/// headers with names lowercased, in order.
pub fn read_head<R: BufRead>(
    reader: &mut R,
    line: &mut String,
) -> io::Result<(u16, Vec<(String, String)>)> {
    let status =
        line.split_whitespace().nth(1).and_then(|s| s.parse::<u16>().ok()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}"))
        })?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "response head cut short"));
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            return Ok((status, headers));
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
}

/// Reads one whole response from a keep-alive connection. The second value says whether
/// the connection can carry another request (its body was delimited and the server did
/// not say `connection: close`).
pub fn read_response<R: BufRead>(reader: &mut R, method: &str) -> io::Result<(Response, bool)> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    let (status, headers) = read_head(reader, &mut line)?;
    let mut reusable =
        !find(&headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let mut body = Vec::new();
    if method == "HEAD" || status == 204 || status == 304 {
    } else if is_chunked(&headers) {
        read_body(Chunked::new(&mut *reader), None, &mut body)?;
    } else if let Some(len) = find(&headers, "content-length").and_then(|v| v.parse().ok()) {
        read_body(&mut *reader, Some(len), &mut body)?;
    } else {
        read_body(&mut *reader, None, &mut body)?;
        reusable = false;
    }
    Ok((Response { status, headers, body }, reusable))
}

/// The largest response body the client holds in memory; a larger one is refused as
/// malformed, never allocated for on the server's word. The largest a nova server sends
/// is a JSON page of one record at the largest record size (16 MiB) with every byte
/// written as a `\u00XX` escape: 96 MiB and its framing.
/// It also bounds one subscription event, or one binary page.
pub(super) const RESPONSE_BODY_BYTES_MAX: u64 = 128 << 20;

/// Reads a body of `declared` bytes (its `content-length`), or to its end, into `body`,
/// growing it as bytes arrive and failing past [`RESPONSE_BODY_BYTES_MAX`].
fn read_body(source: impl Read, declared: Option<u64>, body: &mut Vec<u8>) -> io::Result<()> {
    let too_large = |what: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a response body of {what} is over the {RESPONSE_BODY_BYTES_MAX} bytes this client takes"
            ),
        )
    };
    let cap = match declared {
        Some(len) if len > RESPONSE_BODY_BYTES_MAX => {
            return Err(too_large(format!("{len} bytes")));
        }
        Some(len) => len,
        None => RESPONSE_BODY_BYTES_MAX + 1,
    };
    let read = source.take(cap).read_to_end(body)? as u64;
    if declared.is_some_and(|len| read < len) {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "response body cut short"));
    }
    if read > RESPONSE_BODY_BYTES_MAX {
        return Err(too_large("more bytes".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{self, Read};

    use super::{Chunked, read_response};

    /// A `content-length` past what the client takes is refused before any allocation
    /// (once it was trusted, and a huge one aborted the process), and a body shorter
    /// than its `content-length` is cut short.
    #[test]
    fn a_response_body_is_held_to_its_length_and_the_cap() {
        let head = |len: &str| format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
        let huge = head(&u64::MAX.to_string());
        let error = read_response(&mut huge.as_bytes(), "GET").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        assert!(error.to_string().contains("18446744073709551615 bytes"), "{error}");

        let short = head("10") + "abc";
        let error = read_response(&mut short.as_bytes(), "GET").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");

        let whole = head("3") + "abcdef";
        let (response, reusable) = read_response(&mut whole.as_bytes(), "GET").unwrap();
        assert_eq!((&response.body[..], reusable), (&b"abc"[..], true));
    }

    /// A body without a length, and an SSE event, are held to the cap as they arrive:
    /// one byte past it is refused as malformed, not taken.
    #[test]
    fn a_body_or_an_event_past_the_cap_is_refused() {
        use super::{RESPONSE_BODY_BYTES_MAX, next_event};
        let past = || io::repeat(b'a').take(RESPONSE_BODY_BYTES_MAX + 1);
        let head: &[u8] = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n";
        let error = read_response(&mut io::BufReader::new(head.chain(past())), "GET").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");

        let mut event = io::BufReader::new((&b"data: "[..]).chain(past()));
        let error = next_event(&mut event).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        // One under it is taken whole.
        let at = (&b"data: "[..]).chain(io::repeat(b'a').take(1024)).chain(&b"\n\n"[..]);
        let event = next_event(&mut io::BufReader::new(at)).unwrap().expect("an event");
        assert_eq!(event.data.len(), 1024);
    }

    /// A connection that closes between chunks is a body cut short, as one that closes
    /// inside a chunk is: not a malformed chunk size.
    #[test]
    fn a_body_cut_between_chunks_is_cut_short() {
        let mut body = Chunked::new(&b"5\r\nhello\r\n"[..]);
        let mut buf = [0u8; 16];
        assert_eq!(body.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        let error = body.read(&mut buf).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{error}");

        let mut whole = Chunked::new(&b"5\r\nhello\r\n0\r\n\r\n"[..]);
        let mut out = String::new();
        whole.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello");

        let mut bad = Chunked::new(&b"zz\r\n"[..]);
        assert_eq!(bad.read(&mut buf).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
