// `cargo xtask bench` (browser part): bundle size of hostlease next to the anchors, load +
// instantiate time in the same page run, and the cost of one server message end to end against a
// plain-JS implementation of the same rules in the same page. Prints a Markdown table.
//
// argv: <node_modules with esbuild and playwright-core> <node_modules with the anchors>
import http from "node:http";
import { mkdir, readFile, writeFile, copyFile } from "node:fs/promises";
import { extname, join } from "node:path";
import { fileURLToPath } from "node:url";
import zlib from "node:zlib";
import { createRequire } from "node:module";
import { ENTRIES } from "./entries.mjs";

const [toolsModules, anchorModules] = process.argv.slice(2);
const require = createRequire(join(toolsModules, "noop.js"));
const esbuild = require("esbuild");
const { chromium } = require("playwright-core");
const pkgDir = fileURLToPath(new URL("../", import.meta.url));
const outDir = join(pkgDir, "../target/bench-bundles");
await mkdir(outDir, { recursive: true });

const brotli = (b) => zlib.brotliCompressSync(b, { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 11 } }).length;
const gzip = (b) => zlib.gzipSync(b, { level: 9 }).length;

// 1. Bundle sizes, minified ESM for the browser, same esbuild run for all.
const sizes = {};
for (const [name, source] of Object.entries(ENTRIES)) {
  const file = join(outDir, `${name.replace(/\W/g, "_")}.js`);
  await esbuild.build({
    stdin: { contents: source, resolveDir: outDir, loader: "js" },
    bundle: true, minify: true, format: "esm", platform: "browser", outfile: file,
    nodePaths: [anchorModules], logLevel: "error",
    // `hostlease` is this package (a fresh checkout has no node_modules linking it).
    plugins: [{ name: "hostlease", setup: (b) => b.onResolve({ filter: /^hostlease$/ }, () => ({ path: join(pkgDir, "index.js") })) }],
    define: { "process.env.NODE_ENV": '"production"' },
  });
  const js = await readFile(file);
  let raw = js.length, gz = gzip(js), br = brotli(js);
  if (name === "hostlease") {
    const wasm = await readFile(join(pkgDir, "wasm/hostlease_bg.wasm"));
    await copyFile(join(pkgDir, "wasm/hostlease_bg.wasm"), join(outDir, "hostlease_bg.wasm"));
    raw += wasm.length; gz += gzip(wasm); br += brotli(wasm);
  }
  sizes[name] = { raw, gz, br, file };
}

// 2 and 3 in Chromium.
const TYPES = { ".js": "text/javascript", ".wasm": "application/wasm", ".html": "text/html" };
const server = http.createServer(async (req, res) => {
  const p = new URL(req.url, "http://x").pathname;
  let file;
  if (p.startsWith("/bundles/")) file = join(outDir, p.slice("/bundles/".length));
  else if (p.startsWith("/pkg/")) file = join(pkgDir, p.slice("/pkg/".length));
  else file = join(pkgDir, "bench", p.slice(1) || "page.html");
  try {
    const body = await readFile(file);
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "cache-control": "no-store" });
    res.end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium", headless: true, chromiumSandbox: false,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ROUNDS = 9;
const load = {};
for (const name of Object.keys(ENTRIES)) load[name] = [];
for (let r = 0; r < ROUNDS; r++) {
  for (const name of Object.keys(ENTRIES)) {
    // A fresh page each time: nothing cached in the module map.
    const page = await browser.newPage();
    await page.goto(`${base}/page.html`);
    await page.waitForFunction(() => window.ready);
    load[name].push(await page.evaluate((n) => window.loadBundle(n), name.replace(/\W/g, "_")));
    await page.close();
  }
}
const page = await browser.newPage();
await page.goto(`${base}/messages.html`);
await page.waitForFunction(() => window.ready);
const N = 20_000;
// The mix (one host change in ten frames), then each kind of frame alone.
const MIXES = [["1 assignment in 10 frames, the rest events", 10], ["room events only", 0], ["assignments only", 1]];
const cost = [];
const MSG_ROUNDS = 9;
for (const [, every] of MIXES) cost.push(await page.evaluate(([n, rounds, e]) => window.run(n, rounds, e), [N, MSG_ROUNDS, every]));
await browser.close();
server.close();

const kb = (n) => (n / 1024).toFixed(1);
const hl = sizes.hostlease.br;
console.log("\n| package (esbuild --minify, same run) | raw KB | gzip KB | brotli KB | brotli vs hostlease | load + instantiate, ms (median of 9) |");
console.log("|---|---:|---:|---:|---:|---:|");
for (const [name, s] of Object.entries(sizes)) {
  console.log(`| ${name}${name === "hostlease" ? " (JS + wasm)" : ""} | ${kb(s.raw)} | ${kb(s.gz)} | ${kb(s.br)} | ${(s.br / hl).toFixed(2)} | ${median(load[name]).toFixed(1)} |`);
}
console.log(`\nOne server message end to end (${N} frames; ${MSG_ROUNDS} rounds after a warm-up one, each timing both sides`);
console.log("back to back: medians of the times in µs per message, and the median of the rounds' ratios). hostlease: a room");
console.log("event is parsed by JSON.parse in the wrapper, the core is told its seq, the listener gets the object;");
console.log("any other frame goes as text into the wasm (decode → core → the step's events as JSON → JSON.parse →");
console.log("listeners). Plain JS: JSON.parse → the same stale-drop + resync rules → event objects → a callback.\n");
console.log("| frames | hostlease | plain JS | ratio (goal ≤ 1.0) |\n|---|---:|---:|---:|");
MIXES.forEach(([name], i) => {
  const { wasm, plain } = cost[i];
  const ratio = median(wasm.map((w, r) => w / plain[r]));
  const b = i === 0 ? "**" : "";
  console.log(`| ${name} | ${(median(wasm) * 1000).toFixed(2)} | ${(median(plain) * 1000).toFixed(2)} | ${b}${ratio.toFixed(2)}${b} |`);
});
await writeFile(join(outDir, "results.json"), JSON.stringify({ sizes, load, cost }, null, 1));
