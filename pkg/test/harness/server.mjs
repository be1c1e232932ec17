// Starts the real hostlease-server (built by `cargo xtask test`) on loopback with a private
// SQLite database and `--dev` (join tokens minted over HTTP, as the demo does).
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../../../", import.meta.url));
export const BIN = process.env.HOSTLEASE_SERVER_BIN ?? join(root, "target/debug/hostlease-server");

const ADMIN_KEY = "browser-tests-admin-key";

export function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitHealthy(base, child) {
  for (let i = 0; i < 300; i++) {
    if (child.exitCode !== null) throw new Error(`hostlease-server exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${base}/healthz`)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("hostlease-server did not become healthy");
}

/** `leaseMs`: short TTLs keep failover scenarios quick (nothing asserts on speed). `www`: a
 * directory of static files to serve as well (the demo, as `cargo xtask demo` lays it out).
 * `heartbeatMs`: the server's heartbeat period (default 15 s). `appKey`: an app key file whose
 * join tokens the server takes too (besides the dev endpoint's). */
export async function startServer({ leaseMs = 1500, www, heartbeatMs, appKey } = {}) {
  const dir = await mkdtemp(join(tmpdir(), "hostlease-e2e-"));
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let child = null;
  const logs = [];
  const launch = async () => {
    child = spawn(BIN, [
      "serve", "--db", `sqlite://${join(dir, "hostlease.db")}`, "--listen", `127.0.0.1:${port}`, "--dev",
      "--server-key", join(dir, "server-key.json"), "--lease-ms", String(leaseMs),
      ...(www ? ["--www", www] : []),
      ...(heartbeatMs ? ["--heartbeat-ms", String(heartbeatMs)] : []),
      ...(appKey ? ["--app-key", appKey] : []),
    ], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn", HOSTLEASE_ADMIN_KEY: ADMIN_KEY } });
    child.stdout.on("data", (d) => logs.push(String(d)));
    child.stderr.on("data", (d) => logs.push(String(d)));
    await waitHealthy(base, child);
  };
  await launch();
  return {
    port,
    base,
    logs,
    async mintToken(room, participant, ttlMs) {
      const res = await fetch(`${base}/dev/token`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ room, participant, name: participant, may_host: true, ttl_ms: ttlMs }),
      });
      if (!res.ok) throw new Error(`dev token: HTTP ${res.status}`);
      return (await res.json()).token;
    },
    /** `GET /v1/rooms/{room}` (the snapshot) as the app's backend reads it, with the admin key. */
    async snapshot(room) {
      const res = await fetch(`${base}/v1/rooms/${encodeURIComponent(room)}`, {
        headers: { authorization: `Bearer ${ADMIN_KEY}` },
      });
      if (!res.ok) throw new Error(`snapshot: HTTP ${res.status} ${await res.text()}`);
      return res.json();
    },
    /** `POST /v1/admin/rooms/{room}/{action}` as the app's backend would. */
    async admin(room, action, body = {}) {
      const res = await fetch(`${base}/v1/admin/rooms/${encodeURIComponent(room)}/${action}`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN_KEY}` },
        body: JSON.stringify(body),
      });
      if (!res.ok) throw new Error(`admin ${action}: HTTP ${res.status} ${await res.text()}`);
      return res.json();
    },
    /** kill -9: nothing flushed, nothing said goodbye. */
    async kill() {
      const c = child;
      c.kill("SIGKILL");
      await new Promise((r) => (c.exitCode !== null || c.signalCode ? r() : c.once("exit", r)));
    },
    /** Starts again on the same database and port. */
    restart: launch,
    async stop() {
      if (child && child.exitCode === null && !child.signalCode) {
        child.kill("SIGTERM");
        await new Promise((r) => child.once("exit", r));
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
