// loopflow dashboard: applies the server's `update` events to the page without a reload.
// Every HTML fragment comes from the server already escaped; nothing here builds markup
// from agent text, and the page's CSP forbids inline scripts.
"use strict";
(function () {
  const body = document.body;
  let version = body.dataset.version || "0";
  let seq = body.dataset.seq || "0";
  const dot = document.getElementById("live");

  function card(html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    return t.content.firstElementChild;
  }

  function apply(u) {
    const loops = document.getElementById("loops");
    for (const [name, html] of Object.entries(u.loops)) {
      const next = card(html);
      if (!next) continue;
      const old = document.getElementById("loop-" + name);
      if (old) {
        // Keep what the reader opened.
        const open = old.querySelector("details") && old.querySelector("details").open;
        if (open && next.querySelector("details")) next.querySelector("details").open = true;
        old.replaceWith(next);
      } else {
        loops.append(next);
      }
    }
    const wanted = new Set(u.order.map((n) => "loop-" + n));
    for (const el of Array.from(loops.querySelectorAll("article.loop"))) {
      if (!wanted.has(el.id)) el.remove();
    }
    for (const name of u.order) {
      const el = document.getElementById("loop-" + name);
      if (el) loops.append(el);
    }
    const empty = loops.querySelector("p.empty");
    if (empty && u.order.length) empty.remove();
    const summary = document.getElementById("summary");
    const auditOpen = summary.querySelector("details") && summary.querySelector("details").open;
    summary.innerHTML = u.summary;
    if (auditOpen && summary.querySelector("details")) summary.querySelector("details").open = true;
    const log = document.getElementById("log-lines");
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    for (const line of u.log) log.insertAdjacentHTML("beforeend", line);
    while (log.children.length > 200) log.firstElementChild.remove();
    if (atEnd) log.scrollTop = log.scrollHeight;
    document.getElementById("updated").textContent = u.at.slice(0, 10) + " " + u.at.slice(11, 16) + "Z";
    version = String(u.version);
    seq = String(u.seq);
    body.dataset.version = version;
    body.dataset.seq = seq;
  }

  function connect() {
    const es = new EventSource("/events?v=" + encodeURIComponent(version) + "&s=" + encodeURIComponent(seq));
    es.addEventListener("open", () => dot && dot.classList.remove("off"));
    es.addEventListener("error", () => dot && dot.classList.add("off"));
    es.addEventListener("update", (e) => {
      try {
        apply(JSON.parse(e.data));
      } catch (err) {
        console.error("loopflow dashboard: bad update", err);
      }
    });
  }

  const log = document.getElementById("log-lines");
  if (log) log.scrollTop = log.scrollHeight;
  connect();
})();
