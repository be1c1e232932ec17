// Serves the built package and the test page on loopback, and under /esbuild/ the packaging
// smoke's esbuild bundle (target/pkg-smoke/esbuild: the .wasm imported as a file beside it).
import http from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = fileURLToPath(new URL("../../", import.meta.url));
const esbuildDir = fileURLToPath(new URL("../../../target/pkg-smoke/esbuild/", import.meta.url));
const EMPTY_PAGE = "<!doctype html><meta charset=utf-8><title>esbuild bundle</title>";
const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".html": "text/html" };

export function serveStatic() {
  const server = http.createServer(async (req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    if (path === "/esbuild/") {
      res.writeHead(200, { "content-type": "text/html" }).end(EMPTY_PAGE);
      return;
    }
    const [dir, rest] = path.startsWith("/esbuild/") ? [esbuildDir, path.slice(8)] : [pkgDir, path];
    const rel = rest === "/" ? "test/browser/page.html" : normalize(rest).replace(/^\/+/, "");
    if (rel.startsWith("..")) {
      res.writeHead(403).end();
      return;
    }
    try {
      const body = await readFile(join(dir, rel));
      res.writeHead(200, { "content-type": TYPES[extname(rel)] ?? "application/octet-stream", "cache-control": "no-store" });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, port: server.address().port })));
}
