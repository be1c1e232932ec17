// Serves the built package and the test page on loopback.
import http from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = fileURLToPath(new URL("../../", import.meta.url));
const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".html": "text/html" };

export function serveStatic() {
  const server = http.createServer(async (req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    const rel = path === "/" ? "test/browser/page.html" : normalize(path).replace(/^\/+/, "");
    if (rel.startsWith("..")) {
      res.writeHead(403).end();
      return;
    }
    try {
      const body = await readFile(join(pkgDir, rel));
      res.writeHead(200, { "content-type": TYPES[extname(rel)] ?? "application/octet-stream", "cache-control": "no-store" });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, port: server.address().port })));
}
