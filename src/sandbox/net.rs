//! The network of one tick under `network = "hosts"`: one proxy and one seccomp supervisor
//! serve every spawn of the tick (two threads a tick, not three a spawn), and each spawn is
//! a [`Client`] with its own allowed hosts, whose refusals are its own.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::proxy::{Allow, Proxy, Tag};

/// A tick's proxy and supervisor.
pub(crate) struct TickNet {
    proxy: Arc<Proxy>,
    #[cfg(target_os = "linux")]
    supervisor: Option<super::seccomp::Supervisor>,
    next: AtomicU64,
}

impl TickNet {
    /// Starts the proxy on 127.0.0.1 and, where the kernel notifies connects (`supervised`),
    /// the supervisor that makes them.
    pub(crate) fn start(supervised: bool) -> io::Result<Arc<TickNet>> {
        let proxy = Arc::new(Proxy::start()?);
        #[cfg(target_os = "linux")]
        let supervisor = if supervised {
            let p = Arc::clone(&proxy);
            let connected: super::seccomp::Connected =
                Box::new(move |local: SocketAddr, tag: Tag| p.attribute(local.port(), tag));
            proxy.set_attributed(true);
            Some(super::seccomp::Supervisor::start(proxy.addr(), connected)?)
        } else {
            None
        };
        #[cfg(not(target_os = "linux"))]
        let _ = supervised;
        Ok(Arc::new(TickNet {
            proxy,
            #[cfg(target_os = "linux")]
            supervisor,
            next: AtomicU64::new(1),
        }))
    }

    /// The proxy's address (what `HTTPS_PROXY` and the rest name).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// A new client that may reach what `allow` permits.
    pub(crate) fn client(self: &Arc<Self>, allow: Allow) -> Client {
        let tag = self.next.fetch_add(1, Ordering::Relaxed);
        self.proxy.client(tag, allow);
        Client {
            net: Arc::clone(self),
            tag,
        }
    }
}

/// One spawn's share of the tick's network; dropping it cuts the spawn's connections.
pub struct Client {
    net: Arc<TickNet>,
    tag: Tag,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({})", self.tag)
    }
}

impl Client {
    /// Serves the connects of the spawn's filter (`listener`) from now on.
    #[cfg(target_os = "linux")]
    pub fn watch(&self, listener: std::os::fd::OwnedFd) {
        match &self.net.supervisor {
            Some(s) => s.watch(listener, self.tag),
            // Nobody answers: its connects fail (ENOSYS) once the listener closes.
            None => drop(listener),
        }
    }

    /// What the spawn was refused so far, each once: addresses it tried to connect to
    /// directly, then hosts the proxy would not reach for it (and, without a supervisor,
    /// what the proxy refused to a connection it could not attribute). Drains.
    pub fn take_refused(&self) -> Vec<String> {
        #[cfg(target_os = "linux")]
        let mut out = self
            .net
            .supervisor
            .as_ref()
            .map(|s| s.take_refused(self.tag))
            .unwrap_or_default();
        #[cfg(not(target_os = "linux"))]
        let mut out = Vec::new();
        let mut proxied = self.net.proxy.take_refused(self.tag);
        proxied.extend(self.net.proxy.take_refused(super::proxy::UNATTRIBUTED));
        out.extend(proxied.into_iter().map(|(h, port)| {
            if h.contains(':') {
                format!("[{h}]:{port}")
            } else {
                format!("{h}:{port}")
            }
        }));
        out
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.net.proxy.forget(self.tag);
        #[cfg(target_os = "linux")]
        if let Some(s) = &self.net.supervisor {
            s.forget(self.tag);
        }
    }
}
