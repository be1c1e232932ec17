// A fault-injecting TCP proxy on loopback: cut, hold and restore the connections of one client.
// (Playwright's setOffline does not cut WebSockets or WebRTC.)
import net from "node:net";

export class FaultProxy {
  constructor(targetPort, targetHost = "127.0.0.1") {
    this.target = { port: targetPort, host: targetHost };
    this.pairs = new Set();
    this.accepted = 0; // connections the page opened through this proxy
    this.blocked = false;
    this.held = false;
    this.silent = false;
    this.limbo = new Set(); // connections taken in while silent: never forwarded, never closed
    this.wsDials = 0; // of those, the ones that asked for a WebSocket upgrade
    this.server = net.createServer((client) => this._accept(client));
  }

  listen() {
    return new Promise((resolve) => this.server.listen(0, "127.0.0.1", () => resolve(this.server.address().port)));
  }

  _accept(client) {
    this.accepted++;
    if (this.blocked) return client.destroy();
    if (this.silent) {
      this.limbo.add(client);
      client.on("error", () => {}).on("close", () => this.limbo.delete(client));
      client.once("data", (d) => { if (/^upgrade: *websocket/im.test(d.toString("latin1"))) this.wsDials++; });
      return;
    }
    const upstream = net.connect(this.target);
    const pair = { client, upstream };
    this.pairs.add(pair);
    const end = () => {
      client.destroy();
      upstream.destroy();
      this.pairs.delete(pair);
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
    client.pipe(upstream);
    upstream.pipe(client);
    if (this.held) this._pause(pair);
  }

  _pause(p) {
    p.client.pause();
    p.upstream.pause();
    p.client.unpipe(p.upstream);
    p.upstream.unpipe(p.client);
  }

  /** Destroys every connection and refuses new ones until `restore()`. */
  cut() {
    this.blocked = true;
    for (const p of this.pairs) {
      p.client.destroy();
      p.upstream.destroy();
    }
    this.pairs.clear();
    for (const c of this.limbo) c.destroy();
  }

  /** New connections are accepted and then left alone: nothing forwarded, nothing answered,
   * nothing closed (a route that went away mid-dial), until `restore()`; those stay so. */
  silence() {
    this.silent = true;
  }

  /** Stops forwarding (bytes wait in the kernel buffers) without closing anything. */
  hold() {
    this.held = true;
    for (const p of this.pairs) this._pause(p);
  }

  /** Accepts and forwards again. */
  restore() {
    this.blocked = false;
    this.silent = false;
    if (this.held) {
      this.held = false;
      for (const p of this.pairs) {
        p.client.pipe(p.upstream);
        p.upstream.pipe(p.client);
        p.client.resume();
        p.upstream.resume();
      }
    }
  }

  close() {
    this.cut();
    return new Promise((r) => this.server.close(() => r()));
  }
}
