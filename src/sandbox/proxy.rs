//! Egress-filtering HTTP proxy for sandboxed agent processes.
//!
//! The sandbox gives an agent no network of its own and points `HTTP(S)_PROXY` here, so this
//! proxy is the only way out. It therefore decides on exactly the host the client names,
//! forwards at most one request per client connection (nothing can ride past the check inside
//! a pipelined or mis-framed request), and cuts every connection when the owning loop drops it.
//!
//! One proxy serves a whole tick. Each spawn is a *client* with its own allowed hosts: the
//! seccomp supervisor, which makes every confined connect itself, tells the proxy which
//! client a connection's source port belongs to before the connect returns
//! ([`Proxy::attribute`]), so a request is judged (and a refusal reported) for the spawn
//! that made it. A client that ended ([`Proxy::forget`]) loses its open connections and
//! reaches nothing more.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::ToSocketAddrs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A client that has not sent its header block by then (or stalls a body upload that long)
/// is holding a thread for nothing.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the nonblocking listener is polled; `Drop` unparks it, so this bounds only the
/// accept latency after an idle spell, never shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
const MAX_LINE: usize = 8 * 1024;
const MAX_HEADERS: usize = 100;
const MAX_BLOCK: usize = 64 * 1024;
/// Distinct refused targets kept per client, so a hostile agent cannot grow the proxy.
const MAX_REFUSED: usize = 4096;
/// Hop-by-hop headers (RFC 9110 §7.6.1 plus legacy ones) that must not reach the origin.
const HOP_BY_HOP: &str = "connection proxy-connection keep-alive proxy-authorization \
                          proxy-authenticate te trailer transfer-encoding upgrade";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ports {
    Web,
    Any,
    Only(u16),
}

#[derive(Debug, Clone)]
struct Rule {
    /// A clean host (see [`clean_host`]); for a suffix rule it keeps its leading dot, so a
    /// plain `ends_with` can match neither `badexample.com` nor the bare suffix.
    host: String,
    suffix: bool,
    port: Ports,
}

/// One allowlist entry: `host` (ports 80 and 443), `*.suffix` (any subdomain of suffix, not
/// suffix itself, ports 80/443), `host:port`, `*.suffix:port`, an IPv4 literal
/// `1.2.3.4[:port]`, an IPv6 literal `[::1]` or `[::1]:port`. Hostnames compared
/// case-insensitively, a trailing dot ignored. `:*` as port = any port.
///
/// Matching is on the name the client asks for, never on what it resolves to: an IP entry
/// permits only requests that name that literal address.
#[derive(Debug, Clone, Default)]
pub(crate) struct Allow {
    rules: Vec<Rule>,
}

impl Allow {
    /// Parses entries; Err(message naming the bad entry and why) for an empty entry, a bad
    /// port, a bare `*`, `*.` alone, whitespace, a scheme (`https://x`) or a path.
    pub(crate) fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allow, String> {
        let rule = |e: &str| parse_rule(e).map_err(|why| format!("bad host entry {e:?}: {why}"));
        let rules = entries
            .iter()
            .map(|e| rule(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Allow { rules })
    }

    /// Whether a client may reach `host` (a name or IP literal, brackets optional) on `port`.
    pub(crate) fn permits(&self, host: &str, port: u16) -> bool {
        let bracketed = host.starts_with('[') && host.ends_with(']');
        let inner = host.get(usize::from(bracketed)..host.len() - usize::from(bracketed));
        let Some(host) = inner.and_then(|h| clean_host(h, bracketed || h.contains(':'))) else {
            return false;
        };
        let is_ip = host.parse::<IpAddr>().is_ok();
        self.rules.iter().any(|r| {
            let port_ok = match r.port {
                Ports::Web => port == 80 || port == 443,
                Ports::Any => true,
                Ports::Only(p) => p == port,
            };
            port_ok
                && match r.suffix {
                    true => !is_ip && host.len() > r.host.len() && host.ends_with(&r.host),
                    false => host == r.host,
                }
        })
    }
}

fn parse_rule(e: &str) -> Result<Rule, String> {
    let checks = [
        (e.is_empty(), "empty entry"),
        (e.contains(char::is_whitespace), "contains whitespace"),
        (e.contains("://"), "no scheme allowed, only a host"),
        (e.contains('/'), "no path allowed, only a host"),
    ];
    if let Some((_, why)) = checks.iter().find(|(bad, _)| *bad) {
        return Err(why.to_string());
    }
    let (host, bracketed, port) = split_authority(e).ok_or("malformed (IPv6 needs [ ])")?;
    let port = match port {
        None => Ports::Web,
        Some("*") => Ports::Any,
        Some(p) => Ports::Only(parse_port(p).ok_or_else(|| format!("bad port {p:?}"))?),
    };
    let suffix = host.strip_prefix("*.");
    let clean = match suffix {
        Some(s) => clean_host(s, false).filter(|s| s.parse::<IpAddr>().is_err()),
        None if host == "*" => return Err("a bare `*` would allow every host".into()),
        None => clean_host(host, bracketed),
    };
    let why = ["not a host name or IP", "`*.` needs a domain name after it"];
    let host = clean.ok_or(why[usize::from(suffix.is_some())])?;
    let (host, suffix) = match suffix {
        Some(_) => (format!(".{host}"), true),
        None => (host, false),
    };
    Ok(Rule { host, suffix, port })
}

/// Validates a host and puts it in the one form rules and requests are compared in:
/// lowercase, no trailing dot, IPv6 canonical and unbracketed.
fn clean_host(h: &str, ipv6: bool) -> Option<String> {
    if ipv6 {
        return h.parse::<Ipv6Addr>().ok().map(|a| a.to_string());
    }
    let h = h.to_ascii_lowercase();
    let h = h.strip_suffix('.').unwrap_or(&h);
    let byte = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let label = |l: &str| (1..=63).contains(&l.len()) && l.bytes().all(byte);
    let ok = h.parse::<Ipv4Addr>().is_ok() || (h.len() <= 253 && h.split('.').all(label));
    ok.then(|| h.to_string())
}

/// Splits `host[:port]` or `[v6][:port]` into (host, bracketed, port); None when malformed.
fn split_authority(s: &str) -> Option<(&str, bool, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        let port = tail.strip_prefix(':');
        return (tail.is_empty() || port.is_some()).then_some((h, true, port));
    }
    match s.split_once(':') {
        Some((h, p)) if !p.contains(':') => Some((h, false, Some(p))),
        Some(_) => None,
        None => Some((s, false, None)),
    }
}

/// Digits only: `from_str` alone would accept `+80`, which another parser may read otherwise.
fn digits(s: &[u8]) -> Option<u64> {
    let ok = !s.is_empty() && s.len() < 20 && s.iter().all(u8::is_ascii_digit);
    std::str::from_utf8(s).ok().filter(|_| ok)?.parse().ok()
}

fn parse_port(p: &str) -> Option<u16> {
    let n = u16::try_from(digits(p.as_bytes())?).ok()?;
    (n != 0).then_some(n)
}

/// A (host, port) a client asked for, host clean.
type Target = (String, u16);

fn parse_target(s: &str, default_port: Option<u16>) -> Option<Target> {
    let (h, bracketed, p) = split_authority(s)?;
    let port = match p {
        Some(p) => parse_port(p)?,
        None => default_port?,
    };
    Some((clean_host(h, bracketed)?, port))
}

/// Which client a connection is: a spawn's tag, or [`UNATTRIBUTED`].
pub(crate) type Tag = u64;

/// The tag of a connection no supervisor told the proxy about.
pub(crate) const UNATTRIBUTED: Tag = 0;

/// (every target ever refused, those not yet taken): each is reported once.
type Refused = (HashSet<Target>, Vec<Target>);

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Whether connections are attributed (a supervisor makes every confined connect): an
    /// unattributed one then comes from outside the sandbox and is refused. Without it,
    /// an unattributed connection may reach what any live client may.
    attributed: AtomicBool,
    /// The live clients and what each may reach.
    clients: Mutex<HashMap<Tag, Arc<Allow>>>,
    /// Source ports of connections the supervisor made, and their client.
    peers: Mutex<HashMap<u16, Tag>>,
    /// Clones of every live socket and its client, so `Drop` and `forget` can cut
    /// connections other threads are blocked on.
    live: Mutex<HashMap<u64, (TcpStream, Tag)>>,
    /// Per client: every target ever refused, and those not yet taken.
    refused: Mutex<HashMap<Tag, Refused>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running proxy. Dropping it stops accepting, and shuts down every open tunnel/connection
/// promptly (within ~100 ms): processes left behind must lose the network.
pub(crate) struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Binds 127.0.0.1:0 and serves on background threads; no client yet.
    pub(crate) fn start() -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        // Nonblocking so the accept thread can notice `stop`; a blocking accept could only be
        // woken by connecting to ourselves, which can fail and would leave the port open.
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name("loopflow-proxy".into())
            .spawn(move || accept_loop(&listener, &s))?;
        let acceptor = Some(acceptor);
        Ok(Proxy {
            addr,
            shared,
            acceptor,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether every confined connection is attributed by a supervisor (see [`Shared`]).
    pub(crate) fn set_attributed(&self, yes: bool) {
        self.shared.attributed.store(yes, Ordering::SeqCst);
    }

    /// Client `tag` may reach what `allow` permits, from now on.
    pub(crate) fn client(&self, tag: Tag, allow: Allow) {
        lock(&self.shared.clients).insert(tag, Arc::new(allow));
    }

    /// The connection from local port `port` is client `tag`'s.
    pub(crate) fn attribute(&self, port: u16, tag: Tag) {
        lock(&self.shared.peers).insert(port, tag);
    }

    /// Client `tag` ended: its open connections are cut, and a connection attributed to it
    /// later (a process it left behind) reaches nothing.
    pub(crate) fn forget(&self, tag: Tag) {
        lock(&self.shared.clients).remove(&tag);
        lock(&self.shared.refused).remove(&tag);
        lock(&self.shared.peers).retain(|_, t| *t != tag);
        for (s, t) in lock(&self.shared.live).values() {
            if *t == tag {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Refused (host, port) pairs of client `tag` so far, each once, in order of first
    /// refusal; drains them. A target already reported is not reported again.
    pub(crate) fn take_refused(&self, tag: Tag) -> Vec<(String, u16)> {
        lock(&self.shared.refused)
            .get_mut(&tag)
            .map(|r| std::mem::take(&mut r.1))
            .unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            t.thread().unpark();
            // Joining closes the listener before we return, so new connects are refused.
            let _ = t.join();
        }
        // Registration checks `stop` under this lock, so no socket can slip in after this.
        for (s, _) in lock(&self.shared.live).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Which client a connection from `peer` is, and what it may reach.
fn judge(shared: &Shared, peer: SocketAddr) -> (Tag, Arc<Allow>) {
    let tag = lock(&shared.peers).remove(&peer.port());
    let clients = lock(&shared.clients);
    match tag {
        // A client that ended reaches nothing.
        Some(t) => (t, clients.get(&t).cloned().unwrap_or_default()),
        None if shared.attributed.load(Ordering::SeqCst) => (UNATTRIBUTED, Arc::default()),
        None => {
            let rules = clients.values().flat_map(|a| a.rules.iter().cloned());
            (
                UNATTRIBUTED,
                Arc::new(Allow {
                    rules: rules.collect(),
                }),
            )
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let s = Arc::clone(shared);
                let (tag, allow) = judge(shared, peer);
                // If no thread can be had, the stream is dropped: the client sees a close.
                let conn = thread::Builder::new().name("loopflow-proxy-conn".into());
                let _ = conn.spawn(move || serve(stream, &s, &Client { tag, allow }));
            }
            // WouldBlock, or e.g. EMFILE: back off instead of spinning.
            Err(_) => thread::park_timeout(ACCEPT_POLL),
        }
    }
}

/// The client a connection belongs to, and what it may reach.
struct Client {
    tag: Tag,
    allow: Arc<Allow>,
}

/// The sockets one connection handler owns (and their client), unregistered when the
/// handler returns.
struct Registered<'a>(&'a Shared, Vec<u64>, Tag);

impl Registered<'_> {
    /// Tracks `s` so dropping the proxy can cut it; fails (and cuts it) once stopping.
    fn add(&mut self, s: &TcpStream) -> io::Result<()> {
        let clone = s.try_clone()?;
        let mut live = lock(&self.0.live);
        if self.0.stop.load(Ordering::SeqCst) {
            let _ = s.shutdown(Shutdown::Both);
            return Err(io::Error::other("proxy stopped"));
        }
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        live.insert(id, (clone, self.2));
        self.1.push(id);
        Ok(())
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut live = lock(&self.0.live);
        self.1.iter().for_each(|id| drop(live.remove(id)));
    }
}

/// Why a request was not served: a status line and body for the client, or just close.
enum Fail {
    Reply(&'static str, String),
    Close,
}

impl From<io::Error> for Fail {
    fn from(_: io::Error) -> Fail {
        Fail::Close
    }
}

fn bad(why: &str) -> Fail {
    Fail::Reply("400 Bad Request", format!("loopflow: bad request: {why}\n"))
}

fn serve(client: TcpStream, shared: &Shared, who: &Client) {
    let mut reg = Registered(shared, Vec::new(), who.tag);
    if reg.add(&client).is_ok()
        && client.set_nonblocking(false).is_ok()
        && let Err(Fail::Reply(status, body)) = handle(&client, shared, who, &mut reg)
    {
        let head = format!("HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n");
        let msg = format!(
            "{head}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = (&client).write_all(msg.as_bytes());
        close_gently(&client);
    }
}

/// Sends FIN, then discards what the client still sends for a moment: closing with unread
/// input makes the kernel send RST, which can destroy our reply before the client reads it.
fn close_gently(mut s: &TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let (mut buf, mut total) = ([0u8; 4096], 0);
    while let Ok(n @ 1..) = s.read(&mut buf) {
        total += n;
        if total > 1 << 20 {
            break;
        }
    }
}

/// Reads through the blank line; returns (header block without it, bytes read past it).
fn read_head(mut r: &TcpStream) -> Result<(Vec<u8>, Vec<u8>), Fail> {
    let (mut buf, mut chunk) = (Vec::with_capacity(4096), [0u8; 4096]);
    let deadline = Instant::now() + HEADER_TIMEOUT;
    loop {
        // A total deadline, not per read: a byte every 29 s must not hold a thread forever.
        let left = deadline.saturating_duration_since(Instant::now());
        // A zero timeout is an error, so a spent deadline ends the connection here.
        r.set_read_timeout(Some(left))?;
        let n = r.read(&mut chunk)?;
        let got = chunk.get(..n).unwrap_or_default();
        if got.is_empty() {
            return Err(Fail::Close);
        }
        let start = buf.len();
        buf.extend_from_slice(got);
        for i in start..buf.len() {
            if i >= MAX_BLOCK {
                return Err(bad("header block over 64 KiB"));
            } else if buf.get(i) != Some(&b'\n') {
                continue;
            } else if i == 0 || buf.get(i - 1) != Some(&b'\r') {
                return Err(bad("bare LF line ending"));
            } else if i >= 3 && buf.get(i - 3..i) == Some(b"\r\n\r".as_slice()) {
                let rest = buf.split_off(i + 1);
                buf.truncate(i - 3);
                return Ok((buf, rest));
            }
        }
    }
}

struct Head<'a> {
    method: &'a str,
    target: &'a str,
    version: &'a str,
    headers: Vec<(&'a str, &'a [u8])>,
}

impl Head<'_> {
    fn values<'b>(&'b self, name: &'b str) -> impl Iterator<Item = &'b [u8]> + 'b {
        let all = self.headers.iter();
        all.filter_map(move |&(n, v)| n.eq_ignore_ascii_case(name).then_some(v))
    }
}

fn is_token(s: &str) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    !s.is_empty() && s.bytes().all(tchar)
}

/// Strict parse of a header block whose CRLFs were checked: anything a lenient origin might
/// read differently from us is refused rather than guessed at.
fn parse_head(head: &[u8]) -> Result<Head<'_>, Fail> {
    let mut lines: Vec<&[u8]> = head.split(|&b| b == b'\n').collect();
    let last = lines.len().saturating_sub(1);
    for l in lines.iter_mut().take(last) {
        *l = l.strip_suffix(b"\r").unwrap_or(l);
    }
    if lines.len() > MAX_HEADERS + 1 {
        return Err(bad("more than 100 headers"));
    } else if lines.iter().any(|l| l.len() > MAX_LINE) {
        return Err(bad("header line over 8 KiB"));
    }
    let first = std::str::from_utf8(lines.first().copied().unwrap_or_default());
    let parts: Vec<&str> = first.unwrap_or_default().split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(bad("malformed request line"));
    };
    if !is_token(method) {
        return Err(bad("invalid method"));
    } else if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("invalid request target"));
    } else if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad("unsupported HTTP version"));
    }
    let mut headers = Vec::new();
    for l in lines.iter().skip(1) {
        if matches!(l.first(), Some(b' ' | b'\t')) {
            return Err(bad("obsolete line folding"));
        }
        let colon = l.iter().position(|&b| b == b':').unwrap_or(0);
        let (name, value) = l.split_at(colon);
        let name = std::str::from_utf8(name).ok().filter(|n| is_token(n));
        let name = name.ok_or_else(|| bad("invalid header name"))?;
        let value = value.get(1..).unwrap_or_default().trim_ascii();
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(bad("control character in header value"));
        }
        headers.push((name, value));
    }
    Ok(Head {
        method,
        target,
        version,
        headers,
    })
}

fn handle(
    client: &TcpStream,
    shared: &Shared,
    who: &Client,
    reg: &mut Registered,
) -> Result<(), Fail> {
    let (raw, leftover) = read_head(client)?;
    let head = parse_head(&raw)?;
    let cls: Vec<&[u8]> = head.values("content-length").collect();
    let has_te = head.values("transfer-encoding").next().is_some();
    let hosts: Vec<&[u8]> = head.values("host").collect();
    if cls.len() > 1 || hosts.len() > 1 {
        return Err(bad("duplicate Content-Length or Host"));
    } else if has_te && !cls.is_empty() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    } else if has_te {
        let msg = "loopflow: chunked request bodies are not supported; send Content-Length\n";
        return Err(Fail::Reply("411 Length Required", msg.into()));
    }
    let body_len = match cls.first() {
        None => 0,
        Some(v) => digits(v).ok_or_else(|| bad("invalid Content-Length"))?,
    };
    if head.method == "CONNECT" {
        let target = parse_target(head.target, None);
        let (host, port) = target.ok_or_else(|| bad("CONNECT needs host:port"))?;
        let upstream = open(shared, who, reg, &host, port)?;
        client.set_read_timeout(None)?;
        (&*client).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
        (&upstream).write_all(&leftover)?;
        return Ok(tunnel(client, &upstream)?);
    }
    let lower = head.target.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(bad("https URLs must be tunnelled with CONNECT"));
    } else if !lower.starts_with("http://") {
        return Err(bad(
            "only CONNECT and absolute-form http:// requests are served",
        ));
    }
    let rest = head.target.get(7..).unwrap_or_default();
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let target = parse_target(authority, Some(80)).filter(|_| !authority.contains('@'));
    let (host, port) = target.ok_or_else(|| bad("invalid URL host"))?;
    if let Some(h) = hosts.first() {
        let named = parse_target(std::str::from_utf8(h).unwrap_or_default(), Some(80));
        if named.as_ref() != Some(&(host.clone(), port)) {
            return Err(bad("Host header does not match the URL"));
        }
    }
    let upstream = open(shared, who, reg, &host, port)?;
    let slash = if path.starts_with('/') { "" } else { "/" };
    let mut out = format!("{} {slash}{path} {}\r\n", head.method, head.version).into_bytes();
    if hosts.is_empty() {
        out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    // Names listed in Connection are hop-by-hop too, but never the framing headers we checked.
    let nominated: Vec<String> = head
        .values("connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|n| String::from_utf8_lossy(n.trim_ascii()).to_ascii_lowercase())
        .filter(|n| n != "host" && n != "content-length")
        .collect();
    for (name, value) in &head.headers {
        let lname = name.to_ascii_lowercase();
        if !HOP_BY_HOP.split(' ').any(|h| h == lname) && !nominated.contains(&lname) {
            out.extend_from_slice(format!("{name}: ").as_bytes());
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    let early = usize::try_from(body_len).map_or(leftover.len(), |n| n.min(leftover.len()));
    out.extend_from_slice(leftover.get(..early).unwrap_or_default());
    (&upstream).write_all(&out)?;
    client.set_read_timeout(Some(HEADER_TIMEOUT))?;
    forward(client, &upstream, body_len - early as u64)
}

/// Checks the allowlist, then resolves and connects (in resolver order) to an allowed target.
fn open(
    shared: &Shared,
    who: &Client,
    reg: &mut Registered,
    host: &str,
    port: u16,
) -> Result<TcpStream, Fail> {
    let shown = match host.parse::<Ipv6Addr>() {
        Ok(ip) => SocketAddr::from((ip, port)).to_string(),
        Err(_) => format!("{host}:{port}"),
    };
    if !who.allow.permits(host, port) {
        let mut all = lock(&shared.refused);
        let refused = all.entry(who.tag).or_default();
        if refused.0.len() < MAX_REFUSED && refused.0.insert((host.to_string(), port)) {
            refused.1.push((host.to_string(), port));
        }
        let msg = format!("loopflow: network refused: {shown} (not in the loop's hosts)\n");
        return Err(Fail::Reply("403 Forbidden", msg));
    }
    let gateway = |why: &str| Fail::Reply("502 Bad Gateway", format!("loopflow: {why} {shown}\n"));
    let addrs = (host, port).to_socket_addrs();
    let mut addrs = addrs.map_err(|_| gateway("cannot resolve"))?;
    let connected = addrs.find_map(|a| TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).ok());
    let upstream = connected.ok_or_else(|| gateway("cannot connect to"))?;
    reg.add(&upstream)?;
    Ok(upstream)
}

/// Sends exactly `remaining` more body bytes (never what follows them) while streaming the
/// response back; both run at once so `Expect: 100-continue` and early replies work.
fn forward(client: &TcpStream, upstream: &TcpStream, remaining: u64) -> Result<(), Fail> {
    let (c, u) = (client.try_clone()?, upstream.try_clone()?);
    let body = thread::Builder::new().spawn(move || {
        let sent = io::copy(&mut (&c).take(remaining), &mut &u).unwrap_or(0);
        if sent < remaining {
            let _ = u.shutdown(Shutdown::Both);
        }
    })?;
    let _ = io::copy(&mut &*upstream, &mut &*client);
    let _ = upstream.shutdown(Shutdown::Both);
    close_gently(client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = body.join();
    Ok(())
}

fn tunnel(client: &TcpStream, upstream: &TcpStream) -> io::Result<()> {
    let (c, u) = (client.try_clone()?, upstream.try_clone()?);
    let up = thread::Builder::new().spawn(move || pump(&c, &u))?;
    pump(upstream, client);
    let _ = up.join();
    Ok(())
}

/// Copies until EOF, then half-closes `to` so its peer sees the end while the other direction
/// keeps flowing; on an error both sockets are torn down so the other direction ends too.
fn pump(mut from: &TcpStream, mut to: &TcpStream) {
    let ok = io::copy(&mut from, &mut to).is_ok();
    let _ = to.shutdown(if ok { Shutdown::Write } else { Shutdown::Both });
    if !ok {
        let _ = from.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_rules() {
        let a = Allow::parse(&["API.x.com.", "*.y.org:*", "10.0.0.1:22", "[::1]:9"]);
        let a = a.unwrap_or_default();
        for yes in "api.x.com:443 Api.X.Com.:80 a.b.y.org:1 10.0.0.1:22 [0::1]:9".split(' ') {
            let (host, port) = parse_target(yes, None).unwrap_or_default();
            assert!(a.permits(&host, port), "{yes}");
        }
        for no in "api.x.com:8080 x.com:443 y.org:443 10.0.0.1:80 [::1]:80".split(' ') {
            let (host, port) = parse_target(no, None).unwrap_or_default();
            assert!(!a.permits(&host, port), "{no}");
        }
        assert!(a.permits("[::1]", 9) && a.permits("API.X.COM", 443) && !a.permits("[x]", 9));
    }

    #[test]
    fn targets_are_cleaned() {
        assert_eq!(
            parse_target("Ex.COM.:443", None),
            Some(("ex.com".into(), 443))
        );
        assert_eq!(parse_target("[0::1]:8", None), Some(("::1".into(), 8)));
        assert_eq!(
            parse_target("ex.com", Some(80)),
            Some(("ex.com".into(), 80))
        );
        for bad in [
            "ex.com", "a/b:1", "a:+1", "[::1]x", "::1:80", "a..b:1", "[a]:1",
        ] {
            assert_eq!(parse_target(bad, None), None, "{bad}");
        }
    }

    #[test]
    fn strict_header_parsing() {
        let ok = |h: &str| parse_head(h.as_bytes()).is_ok();
        assert!(ok("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: y"));
        for bad in ["X: y\r\n z", "Bad Name: y", "X: a\rb", "NoColon"] {
            assert!(!ok(&format!("GET http://a/ HTTP/1.1\r\n{bad}")), "{bad:?}");
        }
        for bad in [
            "G(T http://a/ HTTP/1.1",
            "GET http://a/ x HTTP/1.1",
            "GET / HTTP/2",
        ] {
            assert!(!ok(bad), "{bad:?}");
        }
        assert!(!ok(&format!("GET / HTTP/1.1{}", "\r\nX: y".repeat(101))));
        assert!(!ok(&format!("GET / HTTP/1.1\r\nX: {}", "y".repeat(9000))));
    }
}
