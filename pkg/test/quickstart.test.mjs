// The README's quick start, as a newcomer would run it: the package packed with `npm pack`,
// installed into a fresh Vite app (its README and licence texts checked), the quick-start block
// copied from README.md into its main.js, built by Vite and served by the real hostlease-server
// (`--dev --www`), and served by Vite's dev server too (`npm run dev`), in headless Chromium
// (playwright-core, Debian's browser), inside the loopback-only network namespace of `cargo
// xtask test`. The test plays the app's backend: it answers `/join-token` with a token minted by
// the server's dev endpoint. Waits are for conditions, with generous bounds.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { chromium } from "playwright-core";
import { BIN, freePort, startServer } from "./harness/server.mjs";
import { until } from "./harness/until.mjs";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const VITE = join(ROOT, ".tools/node/node_modules/.bin/vite");
/** What the test puts for the quick start's server URL: the page's own origin. */
const SAME_ORIGIN = 'location.origin.replace(/^http/, "ws")';
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-dev-shm-usage"];
/** What the quick start's placeholders stand for in this app. */
const PLACEHOLDER_URL = '"wss://your-server.example"';
const PREAMBLE = `// Not in the quick start: the peer connection and peer id it assumes the app already has.
const pc = new RTCPeerConnection();
const peerId = "peer-of-" + new URLSearchParams(location.search).get("as");
`;
/** Not in the quick start either: the room, for the test to read its view. */
const POSTAMBLE = "window.room = room;\n";
const INDEX_HTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>quick start</title></head>
<body><button id="openPoll">Open a poll</button><script type="module" src="/main.js"></script></body>
</html>
`;

/** The first ```js block under the heading `## <heading>` of a README. */
async function jsBlock(path, heading) {
  const readme = await readFile(path, "utf8");
  const at = readme.search(new RegExp(`^## ${heading}`, "m"));
  const m = at < 0 ? null : /^```js\n([\s\S]*?)^```/m.exec(readme.slice(at));
  assert.ok(m, `${path} has a \`\`\`js block under ## ${heading}`);
  return m[1];
}
const quickStart = (path) => jsBlock(path, "Quick start");

let app, srv, browser;

before(async () => {
  app = await mkdtemp(join(tmpdir(), "hostlease-quickstart-"));
  // `npm install hostlease`, from the package as it would be published (its `files` only).
  const packed = await run("npm", ["pack", "--silent", "--pack-destination", app], { cwd: join(ROOT, "pkg") });
  const tarball = packed.stdout.trim().split("\n").pop();
  await writeFile(join(app, "package.json"), JSON.stringify({ name: "quickstart", private: true, type: "module" }));
  await run("npm", ["install", "--offline", "--no-audit", "--no-fund", "--no-package-lock", `./${tarball}`], { cwd: app });
  // The package's own README (what the registry shows) ships in it, with this README's quick
  // start, and so do the licence texts it names.
  const code = await quickStart(join(ROOT, "README.md"));
  const installed = join(app, "node_modules/hostlease");
  assert.equal(await quickStart(join(installed, "README.md")), code, "the package's README has README.md's quick start");
  for (const f of ["LICENSE-MIT", "LICENSE-APACHE"]) {
    assert.match(await readFile(join(installed, f), "utf8"), /License/, `${f} is in the package`);
  }
  // Every file the package's `exports` map points at ships in it (its `files` list).
  const targets = (v) => (typeof v === "string" ? [v] : Object.values(v).flatMap(targets));
  const { exports } = JSON.parse(await readFile(join(installed, "package.json"), "utf8"));
  for (const f of targets(exports)) await stat(join(installed, f));
  assert.ok(code.includes(PLACEHOLDER_URL), `the quick start connects to ${PLACEHOLDER_URL}`);
  await writeFile(join(app, "main.js"), PREAMBLE + code.replace(PLACEHOLDER_URL, SAME_ORIGIN) + POSTAMBLE);
  await writeFile(join(app, "index.html"), INDEX_HTML);
  await run(VITE, ["build", "--logLevel", "warn"], { cwd: app });
  const assets = await readdir(join(app, "dist/assets"));
  assert.ok(assets.some((f) => f.endsWith(".wasm")), `Vite emitted the .wasm: ${assets}`);
  // 6 s leases: no lapse (an extra assignment in the room's seq) in a loaded machine's stall.
  srv = await startServer({ leaseMs: 6000, www: join(app, "dist") });
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, chromiumSandbox: false, args: ARGS });
});

after(async () => {
  await browser?.close();
  await srv?.stop();
  if (app) await rm(app, { recursive: true, force: true });
});

/** A tab of the app (by default the build, served by hostlease-server) for participant `pid`:
 * what it logs and every alert it raises. */
async function tab(pid, base = srv.base) {
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  const t = { pid, ctx, page, logs: [], alerts: [], errors: [] };
  page.on("console", (msg) => t.logs.push(msg.text()));
  page.on("pageerror", (e) => t.errors.push(String(e)));
  page.on("dialog", (d) => {
    t.alerts.push(d.message());
    d.dismiss().catch(() => {});
  });
  // The app's backend: `{ token, expiresAt }` for this participant.
  await page.route("**/join-token", async (route) => {
    const ttlMs = 3_600_000;
    const token = await srv.mintToken("lunch", pid, ttlMs);
    await route.fulfill({ json: { token, expiresAt: Date.now() + ttlMs } });
  });
  await page.goto(`${base}/?as=${pid}`);
  return t;
}

/** The newest `host …, epoch …` line the quick start's listener logged. */
function lastHost(t) {
  const lines = t.logs.map((l) => /^host (\S+), epoch (\d+) \((\S+)\)$/.exec(l)).filter(Boolean);
  const m = lines.at(-1);
  return m && { host: m[1], epoch: Number(m[2]), reason: m[3] };
}

async function roomSeq() {
  return (await srv.snapshot("lunch")).seq;
}

test("the README's quick start in a fresh Vite app: a host, its poll, and a new host when its tab is closed", async () => {
  // The room's seq counts assignments and events alike.
  const ada = await tab("ada");
  const first = await until("ada is host", () => lastHost(ada)?.host === "ada" && lastHost(ada));
  const bob = await tab("bob");
  await until("bob sees ada as host", () => lastHost(bob)?.host === "ada" && lastHost(bob)?.epoch === first.epoch);
  // Each tab's top-level `vote` (made right after connect, before the first snapshot) went
  // through: ada's grant, then two votes.
  await until("both votes in the room log", async () => (await roomSeq()) === 3);

  // The host's button opens a poll (once her lease is confirmed); bob's is refused with a code,
  // and nothing is sent.
  await until("ada may act as host", () => ada.page.evaluate(() => window.room.view.amHost));
  await ada.page.click("#openPoll");
  await until("ada's poll in the room log", async () => (await roomSeq()) === 4);
  await bob.page.click("#openPoll");
  await until("bob's refusal alerted", () => bob.alerts.length === 1);
  assert.equal(bob.alerts[0], "NotHost");
  assert.equal(await roomSeq(), 4);

  // Close the host's tab: bob becomes host in a later epoch, and his button now works.
  await ada.page.close();
  const next = await until("bob is host", () => lastHost(bob)?.host === "bob" && lastHost(bob));
  assert.ok(next.epoch > first.epoch, `epoch ${next.epoch} after ${first.epoch}`);
  // The closing tab's WebSocket closed cleanly: the server takes that as leaving.
  assert.equal(next.reason, "left");
  // His host commands work once his lease is confirmed, one probe round trip after the `host`
  // event (README: "amHost"); a click before that fails `LeaseExpired`.
  await until("bob may act as host", () => bob.page.evaluate(() => window.room.view.amHost));
  await bob.page.click("#openPoll");
  await until("bob's poll in the room log", async () => (await roomSeq()) === 6);
  assert.deepEqual(ada.alerts, []);
  assert.deepEqual(bob.alerts, ["NotHost"]);
  assert.deepEqual([...ada.errors, ...bob.errors], []);
  await ada.ctx.close();
  await bob.ctx.close();
});

// A newcomer's next step is `npm run dev`: Vite's dev server serves the app's modules and
// pre-bundles its dependencies, and the glue's `new URL("hostlease_bg.wasm", import.meta.url)`
// must still find the .wasm (no plugin, no `optimizeDeps` setting). After the test above, which
// leaves room "lunch" empty: the tab joining it becomes host.
test("the same app in Vite's dev server: the .wasm loads and the tab becomes host", async () => {
  // The dev server serves main.js as it is on disk: the quick start now dials hostlease-server.
  const main = await readFile(join(app, "main.js"), "utf8");
  assert.ok(main.includes(SAME_ORIGIN));
  await writeFile(join(app, "main.js"), main.replace(SAME_ORIGIN, JSON.stringify(srv.base.replace(/^http/, "ws"))));
  const port = await freePort();
  const vite = spawn(VITE, ["--port", String(port), "--strictPort", "--host", "127.0.0.1", "--logLevel", "warn"],
    { cwd: app, stdio: ["ignore", "pipe", "pipe"] });
  const out = [];
  vite.stdout.on("data", (d) => out.push(String(d)));
  vite.stderr.on("data", (d) => out.push(String(d)));
  try {
    const base = `http://127.0.0.1:${port}`;
    await until("Vite's dev server answers", async () => (await fetch(base, { signal: AbortSignal.timeout(2_000) }).catch(() => null))?.ok);
    const cat = await tab("cat", base);
    // A page error (the .wasm not found) ends the wait, and the assertion below shows it.
    await until("cat is host", () => lastHost(cat)?.host === "cat" || cat.errors.length > 0);
    assert.deepEqual(cat.errors, [], `Vite said: ${out.join("")}`);
    // What it loaded came from the dev server: the module graph Vite rewrote, not the build.
    assert.ok(await cat.page.evaluate(() => [...document.scripts].some((s) => s.src.endsWith("/@vite/client"))));
    await cat.ctx.close();
  } finally {
    if (vite.exitCode === null) {
      vite.kill();
      await once(vite, "exit");
    }
  }
});

test("server/README.md's Node backend block mints join tokens the real server takes", async () => {
  const dir = await mkdtemp(join(tmpdir(), "hostlease-backend-"));
  let backend;
  try {
    const keyFile = join(dir, "app-key.json");
    const otherKey = join(dir, "other-key.json");
    await run(BIN, ["keygen", "--out", keyFile]);
    await run(BIN, ["keygen", "--out", otherKey]);
    const block = await jsBlock(join(ROOT, "server/README.md"), "Minting a join token");
    await writeFile(join(dir, "mint.mjs"), block);
    // The block reads its key file once, when imported.
    const mint = async (file) => {
      process.env.HOSTLEASE_APP_KEY = file;
      try {
        return await import(`${pathToFileURL(join(dir, "mint.mjs"))}?key=${encodeURIComponent(file)}`);
      } finally {
        delete process.env.HOSTLEASE_APP_KEY;
      }
    };
    const { joinToken } = await mint(keyFile);
    backend = await startServer({ appKey: keyFile });
    const inbox = (room, token) => fetch(`${backend.base}/v1/rooms/${room}/inbox`, { headers: { authorization: `Bearer ${token}` } });
    const { token, expiresAt } = joinToken({ room: "backend", participant: "ann", name: "Ann", mayHost: true });
    assert.ok(expiresAt > Date.now() && expiresAt <= Date.now() + 3_600_000, `expiresAt ${expiresAt}`);
    assert.equal((await inbox("backend", token)).status, 200, "the server takes the token");
    // The check can fail: the server refuses a token for another room, or signed with another key.
    assert.equal((await inbox("elsewhere", token)).status, 403);
    const { joinToken: foreign } = await mint(otherKey);
    assert.equal((await inbox("backend", foreign({ room: "backend", participant: "ann" }).token)).status, 403);
  } finally {
    await backend?.stop();
    await rm(dir, { recursive: true, force: true });
  }
});
