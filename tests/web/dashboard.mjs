// Drives a running `loopflow dashboard` in headless Chromium (Debian's, through
// playwright-core; no browser download). Started by tests/it/dashboard.rs with one
// argument: a JSON file {url, bin, project, tick_loop, loops, xss_loop, screenshot}, and
// over many projects also tick_id (the tick loop's card, `project:loop`), xss_id and
// broken_ids (cards of projects that cannot be read).
// Exits non-zero with a message on the first failed expectation.
import { readFileSync } from "node:fs";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import http from "node:http";
import { chromium } from "playwright-core";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const fail = (msg) => {
  throw new Error(msg);
};
const expect = (ok, msg) => ok || fail(msg);
// Card ids may hold a `:` (`project:loop`): matched as an attribute, not as `#id`.
const card = (id) => `[id="loop-${id}"]`;
const tickId = cfg.tick_id ?? cfg.tick_loop;
const xssId = cfg.xss_id ?? cfg.xss_loop;

/** GET `path` with the given Host header, outside the browser (browsers set Host). */
function rawGet(path, host) {
  const u = new URL(cfg.url);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: u.hostname, port: u.port, path, headers: { Host: host } },
      (res) => {
        let body = "";
        res.on("data", (c) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode, body }));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

// A fresh profile: playwright passes it to Chromium as --user-data-dir.
const profile = mkdtempSync(join(tmpdir(), "loopflow-chromium-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: cfg.chromium || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1400, height: 1000 },
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
  ],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  // Anything fetched from outside 127.0.0.1 would be an external asset.
  const foreign = [];
  page.on("request", (r) => {
    if (!r.url().startsWith(cfg.url)) foreign.push(r.url());
  });
  page.setDefaultTimeout(60000);
  await page.goto(cfg.url, { waitUntil: "load" });

  // 1. Every loop is listed, halted ones first.
  for (const name of cfg.loops) {
    expect(await page.locator(card(name)).count() === 1, `loop ${name} is not on the page`);
  }
  for (const id of cfg.broken_ids ?? []) {
    const b = page.locator(`${card(id)}.project-broken`);
    expect(await b.count() === 1, `no broken-project card ${id}`);
    expect((await b.textContent()).includes("project unreadable"), `card ${id} does not say why`);
  }
  const order = await page.$$eval("article.loop", (els) => els.map((e) => e.dataset.standing));
  const firstOther = order.findIndex((s) => !["halted", "human", "goal"].includes(s));
  expect(
    firstOther < 0 || order.slice(firstOther).every((s) => !["halted", "human", "goal"].includes(s)),
    `halted loops are not first: ${order}`,
  );

  // 2. The score chart renders as SVG with a point per verdict.
  const points = await page.locator(`${card(tickId)} svg.chart circle`).count();
  expect(points === cfg.tick_points, `chart of ${cfg.tick_loop} has ${points} points, want ${cfg.tick_points}`);
  expect(await page.locator(`${card(tickId)} svg.chart polyline`).count() === 1, "no chart line");
  const box = await page.locator(`${card(tickId)} svg.chart`).boundingBox();
  expect(box && box.width > 100 && box.height > 40, `chart is not visible: ${JSON.stringify(box)}`);

  // 3. Agent text stays text: no script ran, no element was injected.
  const xss = page.locator(card(xssId));
  expect((await xss.textContent()).includes("<script>window.__xss=1</script>"), "the <script> verdict is not shown as text");
  expect(await page.evaluate(() => window.__xss === undefined), "agent text ran as script");
  expect(await page.locator("article script, article img, article iframe").count() === 0, "agent text became elements");

  // 4. A tick shows up without a reload (server-sent events).
  await page.evaluate(() => (window.__sameDocument = true));
  const iterBefore = await page.locator(`${card(tickId)} .iter`).textContent();
  execFileSync(cfg.bin, ["--project", cfg.project, "run", "--loop", cfg.tick_loop], { stdio: "inherit" });
  const ticked = Date.now();
  await page.waitForFunction(
    ([sel, before]) => document.querySelector(sel).textContent !== before,
    [`${card(tickId)} .iter`, iterBefore],
    { timeout: 60000 },
  );
  const latency = Date.now() - ticked;
  console.log(`NOTICE: the tick reached the page ${latency} ms after it ended`);
  expect(await page.evaluate(() => window.__sameDocument === true), "the page was reloaded");
  const after = await page.locator(`${card(tickId)} svg.chart circle`).count();
  expect(after === cfg.tick_points + 1, `chart did not grow: ${after}`);
  await page.waitForFunction(
    (loop) => Array.from(document.querySelectorAll("#log-lines li")).some((li) => li.textContent.includes(loop) && li.textContent.includes("TICK")),
    tickId,
    { timeout: 60000 },
  );
  expect(await page.evaluate(() => window.__xss === undefined), "agent text ran as script after an update");

  // 5. A request under a foreign Host (DNS rebinding) is refused; our own is served.
  const port = new URL(cfg.url).port;
  const spoofed = await rawGet("/api/status", `attacker.example:${port}`);
  expect(spoofed.status === 403, `spoofed Host got ${spoofed.status}`);
  const own = await rawGet("/api/status", `127.0.0.1:${port}`);
  expect(own.status === 200 && JSON.parse(own.body).loops, `own Host got ${own.status}`);

  expect(foreign.length === 0, `fetched from outside: ${foreign}`);
  expect(errors.length === 0, `page errors: ${errors}`);
  await page.screenshot({ path: cfg.screenshot, fullPage: true });
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  console.log(`NOTICE: page height ${height}px for ${cfg.loops.length} loops; screenshot ${cfg.screenshot}`);
  expect(height < 5000, `page is ${height}px tall`);
  console.log("dashboard browser test: ok");
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
