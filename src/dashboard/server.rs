//! The live dashboard's HTTP server: hyper 1 on a current-thread tokio runtime, bound to
//! 127.0.0.1 only. Read-only (GET and HEAD; nothing it serves can approve), and a request
//! whose `Host` is not the address it serves is refused, so a web page that rebinds its
//! own DNS name to 127.0.0.1 cannot read the dashboard (DNS rebinding).
//!
//! It sleeps while nothing changes. With no `/events` client nothing watches or polls: a
//! page or `/api/status` request reads what changed then ([`super::Model::refresh`], a
//! `stat` per loop file). The first `/events` client starts a watcher (`watcher`: the
//! kernel says which loops' files changed; a burst is taken in after [`DEBOUNCE`] and only
//! those loops are read again), the last one's leaving stops it. Where the kernel cannot
//! tell (a network file system, its watch limit reached, a failing watcher) the loops are
//! polled every [`POLL`] instead, still only while a client is connected, and stderr says
//! so once. Each `/events` client gets one event per change.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{Either, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{mpsc, watch};

use super::watcher::{Msg, Unwatched, Watcher};
use super::{Mode, Model};

/// Where the kernel cannot tell, how often the loops' files are looked at: a change
/// reaches the page within this plus the time to render it, well inside a second.
pub(super) const POLL: Duration = Duration::from_millis(500);
/// How long after the first event of a burst the changed loops are read: a tick writes its
/// state, then its log; both land in one refresh.
pub(super) const DEBOUNCE: Duration = Duration::from_millis(30);
/// A comment line to every `/events` client this often, so proxies and browsers keep it.
const KEEPALIVE: Duration = Duration::from_secs(15);

const APP_JS: &str = include_str!("app.js");
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error(
        "cannot listen on 127.0.0.1:{port}: {source}; pass another --port (0 picks a free one)"
    )]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("the dashboard's server: {0}")]
    Io(#[from] std::io::Error),
}

/// A bound, not yet serving, dashboard.
pub(crate) struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    model: Model,
}

struct Shared {
    model: Mutex<Model>,
    changed: watch::Sender<u64>,
    /// The `Host` values this server answers to: its address, by IP and as `localhost`.
    hosts: [String; 2],
    clients: Mutex<Clients>,
    /// What stderr was told about polling, so each is said once.
    told: Mutex<BTreeSet<String>>,
}

/// The `/events` clients connected, and how to stop the task that watches for them.
#[derive(Default)]
struct Clients {
    count: usize,
    stop: Option<mpsc::UnboundedSender<Msg>>,
}

type Reply = Response<Either<Full<Bytes>, Sse>>;

/// The body of `/events`: whatever the client's task sends.
pub(super) struct Sse(mpsc::Receiver<Bytes>);

impl Body for Sse {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

impl Server {
    /// Binds 127.0.0.1:`port` (0: a free port) to serve `model` (made live:
    /// [`Model::new`] or [`Model::many`] with `watch`).
    pub(crate) fn bind(model: Model, port: u16) -> Result<Server, ServeError> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))
            .map_err(|source| ServeError::Bind { port, source })?;
        let addr = listener.local_addr()?;
        Ok(Server {
            listener,
            addr,
            model,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process is stopped.
    pub(crate) fn run(self) -> Result<(), ServeError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let port = self.addr.port();
        let (changed, _) = watch::channel(self.model.version());
        let shared = Arc::new(Shared {
            model: Mutex::new(self.model),
            changed,
            hosts: [format!("127.0.0.1:{port}"), format!("localhost:{port}")],
            clients: Mutex::default(),
            told: Mutex::default(),
        });
        self.listener.set_nonblocking(true)?;
        let std_listener = self.listener;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener)?;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let sh = Arc::clone(&shared);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let sh = Arc::clone(&sh);
                        async move { Ok::<_, Infallible>(handle(&req, &sh)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        })
    }
}

fn lock(sh: &Shared) -> std::sync::MutexGuard<'_, Model> {
    sh.model.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the model; tells every `/events` client when it changed something.
fn publish(sh: &Shared, f: impl FnOnce(&mut Model) -> bool) {
    let version = {
        let mut m = lock(sh);
        f(&mut m).then(|| m.version())
    };
    if let Some(v) = version {
        sh.changed.send_replace(v);
    }
}

/// Says on stderr, once, that (some) loops are polled and why.
fn tell(sh: &Shared, why: &Unwatched) {
    let msg = match why {
        Unwatched::Network { .. } => format!(
            "loopflow dashboard: {why}: its loops are polled every {} ms while a page is open",
            POLL.as_millis()
        ),
        _ => format!(
            "loopflow dashboard: {why}: the loops are polled every {} ms while a page is open",
            POLL.as_millis()
        ),
    };
    let mut told = sh.told.lock().unwrap_or_else(|e| e.into_inner());
    if told.insert(msg.clone()) {
        eprintln!("{msg}");
    }
}

/// One `/events` client; the first starts watching the loops' files, the last one's
/// going stops it.
struct Subscription(Arc<Shared>);

impl Subscription {
    fn new(sh: &Arc<Shared>) -> Subscription {
        let mut c = sh.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.count += 1;
        if c.count == 1 {
            let (tx, rx) = mpsc::unbounded_channel();
            c.stop = Some(tx.clone());
            tokio::spawn(watch_files(Arc::clone(sh), tx, rx));
        }
        Subscription(Arc::clone(sh))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut c = self.0.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.count -= 1;
        if c.count == 0
            && let Some(stop) = c.stop.take()
        {
            let _ = stop.send(Msg::Stop);
        }
    }
}

/// Keeps the model current while `/events` clients are connected, until told to stop:
/// from the kernel's reports where it can, by polling where it cannot.
async fn watch_files(
    sh: Arc<Shared>,
    tx: mpsc::UnboundedSender<Msg>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) {
    let dirs = lock(&sh).dirs();
    let all: BTreeSet<usize> = (0..dirs.len()).collect();
    let (mut watcher, mut polled) = match Watcher::start(&dirs, tx) {
        Ok((w, unwatched)) => {
            for (_, why) in &unwatched {
                tell(&sh, why);
            }
            let polled = w.polled();
            (Some(w), polled)
        }
        Err(why) => {
            tell(&sh, &why);
            (None, all.clone())
        }
    };
    // What changed while nobody watched: read once the watches are in place.
    publish(&sh, Model::refresh);
    let mut next_poll = tokio::time::Instant::now() + POLL;
    loop {
        let msg = if polled.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout_at(next_poll, rx.recv()).await {
                Ok(msg) => msg,
                Err(_) => {
                    publish(&sh, |m| m.refresh_sources(&polled));
                    next_poll = tokio::time::Instant::now() + POLL;
                    continue;
                }
            }
        };
        let first = match msg {
            Some(Msg::Fs(ev)) => ev,
            Some(Msg::Stop) | None => return,
        };
        tokio::time::sleep(DEBOUNCE).await;
        let mut events = vec![first];
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Msg::Fs(ev) => events.push(ev),
                Msg::Stop => return,
            }
        }
        let Some(w) = watcher.as_mut() else { continue };
        match w.digest(events) {
            Ok(c) => publish(&sh, |m| m.apply(&c)),
            Err(why) => {
                tell(&sh, &why);
                watcher = None;
                polled = all.clone();
                publish(&sh, Model::refresh);
            }
        }
    }
}

fn reply(status: StatusCode, kind: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    r
}

fn text(status: StatusCode, msg: String) -> Reply {
    reply(status, "text/plain; charset=utf-8", format!("{msg}\n"))
}

/// Whether `host` (a `Host` header) names this server.
fn host_ok(sh: &Shared, host: Option<&str>) -> bool {
    host.is_some_and(|h| sh.hosts.iter().any(|ok| ok.eq_ignore_ascii_case(h)))
}

fn handle(req: &Request<Incoming>, sh: &Arc<Shared>) -> Reply {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if !host_ok(sh, host) {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "refused: Host {:?} is not this dashboard's address (a guard against DNS rebinding); open http://{}/",
                host.unwrap_or(""),
                sh.hosts[0]
            ),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the dashboard is read-only: approve with `loopflow approve`".into(),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/" => {
            publish(sh, Model::refresh);
            let page = lock(sh).page(Mode::Live);
            reply(StatusCode::OK, "text/html; charset=utf-8", page)
        }
        "/app.js" => reply(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS),
        "/api/status" => {
            publish(sh, Model::refresh);
            let doc = serde_json::to_string_pretty(&lock(sh).status()).unwrap_or_default();
            reply(StatusCode::OK, "application/json", format!("{doc}\n"))
        }
        "/events" => events(req, sh),
        "/favicon.ico" => reply(StatusCode::NO_CONTENT, "image/x-icon", ""),
        other => text(StatusCode::NOT_FOUND, format!("no page {other}")),
    }
}

/// `?v=VERSION&s=SEQ`: what the client's page already shows.
fn since(req: &Request<Incoming>) -> (u64, u64) {
    let mut v = (0, 0);
    for pair in req.uri().query().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("v", n)) => v.0 = n.parse().unwrap_or(0),
            Some(("s", n)) => v.1 = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    v
}

fn event(data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: update\ndata: {data}\n\n"))
}

/// `/events`: one `update` event per change, with the cards that changed since the
/// version the client's page shows, the page order, the summary and the new log lines.
fn events(req: &Request<Incoming>, sh: &Arc<Shared>) -> Reply {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let (mut version, mut seq) = since(req);
    let mut changed = sh.changed.subscribe();
    let sub = Subscription::new(sh);
    tokio::spawn(async move {
        let sh = &sub.0;
        if tx.send(Bytes::from("retry: 1000\n\n")).await.is_err() {
            return;
        }
        loop {
            let update = {
                let m = lock(sh);
                (m.version() > version || m.seq() > seq).then(|| {
                    let u = m.update_since(version, seq);
                    (u, m.version(), m.seq())
                })
            };
            if let Some((u, v, s)) = update {
                (version, seq) = (v, s);
                if tx.send(event(&u)).await.is_err() {
                    return;
                }
            }
            match tokio::time::timeout(KEEPALIVE, change_or_gone(&mut changed, &tx)).await {
                Ok(true) => {}
                // The client went away (or the server is stopping).
                Ok(false) => return,
                Err(_) => {
                    if tx.send(Bytes::from(": keepalive\n\n")).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut r = Response::new(Either::Right(Sse(rx)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// Waits for the model to change (`true`) or for the client's connection to drop its
/// stream (`false`), whichever comes first: a client that leaves is let go at once, so the
/// last one's leaving stops the watching without waiting for a keepalive to fail.
async fn change_or_gone(changed: &mut watch::Receiver<u64>, tx: &mpsc::Sender<Bytes>) -> bool {
    let mut change = std::pin::pin!(changed.changed());
    let mut gone = std::pin::pin!(tx.closed());
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = change.as_mut().poll(cx) {
            return Poll::Ready(r.is_ok());
        }
        gone.as_mut().poll(cx).map(|()| false)
    })
    .await
}
