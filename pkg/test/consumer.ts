// A consumer of the public types: `tsc --noEmit --strict --exactOptionalPropertyTypes` must
// accept it.
import { init, connect, fetchInbox, HostleaseError, CommandError, ErrorCode, type HostView, type InboxPage, type Room } from "hostlease";
// The .wasm as esbuild's `--loader:.wasm=file` (or webpack's asset modules) hands it: its URL.
import wasmUrl from "hostlease/hostlease_bg.wasm";

export async function main(channel: RTCDataChannel): Promise<number | null> {
  await init();
  await init(wasmUrl);
  const room: Room = await connect({ url: "wss://example.test", room: "lunch", getToken: async () => ({ token: "t", expiresAt: Date.now() + 60_000 }) });
  const off = room.on("host", ({ host, epoch, reason }) => console.log(host, epoch, reason));
  room.on("provisional", ({ coordinator }) => console.log(coordinator?.toUpperCase()));
  room.on("error", (e) => console.log(e.code));
  off();
  // A backend's answer whose expiry is unknown (as the runtime takes it).
  const expiry: number | undefined = undefined;
  await connect({ url: "wss://example.test", room: "lunch", getToken: () => ({ token: "t", expiresAt: expiry }) });
  // Options passed on as they came (a `token` that may be undefined, beside `getToken`).
  const passed: string | undefined = undefined;
  await connect({ url: "wss://example.test", room: "lunch", token: passed, getToken: () => "t" });
  // Closed when the component that made it goes (React's effect cleanup calls `abort()`).
  const unmounted = new AbortController();
  await connect({ url: "wss://example.test", room: "lunch", token: "t", signal: unmounted.signal });
  room.attachPeer("peer-1", channel);
  const view: HostView = room.view;
  const missed: InboxPage = await fetchInbox({ url: "wss://example.test", room: "lunch", token: "t", since: 0 });
  for (const { cursor, item } of missed.entries) console.log(cursor, item.kind === "event" ? item.action : item.host);
  const more: InboxPage = await room.inbox({ since: missed.next ?? 0 });
  console.log(more.next);
  try {
    const { seq } = await room.command("vote", { option: 1 });
    return seq + (view.epoch ?? 0);
  } catch (e) {
    if (e instanceof CommandError && e.code === ErrorCode.NotAuthoritative) return null;
    if (e instanceof HostleaseError) throw e;
    return null;
  } finally {
    const stamped = room.stamp({ q: 1 });
    const body: { q: number } | null = room.acceptStamped("p2", stamped);
    console.log(body?.q);
    room.close();
  }
}
