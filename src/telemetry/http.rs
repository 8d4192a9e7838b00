//! One OTLP/HTTP POST: HTTP/1.1 over a plain TCP connection, every step under one
//! deadline. Collectors listen on `http://` where loopflow runs (a local OpenTelemetry
//! Collector or Jaeger on `:4318`); an `https://` endpoint is refused with what to do
//! instead, rather than pulling a TLS stack into every tick's binary.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The most of an answer read: the status line and headers are all that matter.
const ANSWER_MAX: usize = 64 << 10;

/// (host:port, path) of an `http://` URL.
fn split(url: &str) -> Result<(String, String), String> {
    if url.starts_with("https://") {
        return Err(format!(
            "{url}: https is not supported; export to a local OpenTelemetry Collector over http (http://localhost:4318) and let it forward to your backend"
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: not an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{url}: no host (or credentials in the URL)"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

/// Whether `url` is one [`post`] can send to.
pub(super) fn check_url(url: &str) -> Result<(), String> {
    split(url).map(|_| ())
}

/// POSTs `body` to `url`; `Ok` on a 2xx answer within `timeout`.
pub(super) fn post(
    url: &str,
    content_type: &str,
    headers: &[(String, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("no answer within {} ms", timeout.as_millis()))
    };
    let (authority, path) = split(url)?;
    let addrs: Vec<_> = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .collect();
    let mut stream = None;
    let mut last = format!("{authority}: no address");
    for a in &addrs {
        match TcpStream::connect_timeout(a, left()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    let mut s = stream.ok_or(last)?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: loopflow/{}\r\n",
        body.len(),
        env!("CARGO_PKG_VERSION")
    );
    for (k, v) in headers {
        // A header that would split the request is dropped, not sent.
        if k.bytes().all(|c| c.is_ascii_graphic() && c != b':') && !v.contains(['\r', '\n']) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            format!("no answer within {} ms", timeout.as_millis())
        } else {
            e.to_string()
        }
    };
    s.set_write_timeout(Some(left()?)).map_err(io)?;
    s.write_all(head.as_bytes()).map_err(io)?;
    s.write_all(body).map_err(io)?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The status line is all that is needed; read until it is whole (or the peer closes).
    while !answer.contains(&b'\n') && answer.len() < ANSWER_MAX {
        s.set_read_timeout(Some(left()?)).map_err(io)?;
        match s.read(&mut buf).map_err(io)? {
            0 => break,
            n => answer.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(answer.split(|b| *b == b'\n').next().unwrap_or(&[]))
        .trim()
        .to_string();
    let code = line
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(c) if (200..300).contains(&c) => Ok(()),
        Some(c) => Err(format!("the collector answered {c}")),
        None if answer.is_empty() => {
            Err("the collector closed the connection without an answer".into())
        }
        None => Err(format!(
            "not an HTTP answer: {:?}",
            line.chars().take(60).collect::<String>()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(
            split("http://localhost:4318/v1/traces").unwrap(),
            ("localhost:4318".into(), "/v1/traces".into())
        );
        assert_eq!(
            split("http://collector/v1/traces").unwrap(),
            ("collector:80".into(), "/v1/traces".into())
        );
        assert!(
            split("https://api.honeycomb.io/v1/traces")
                .unwrap_err()
                .contains("Collector")
        );
        assert!(split("ftp://x").is_err());
        assert!(split("http://user:pw@host/").is_err());
    }
}
