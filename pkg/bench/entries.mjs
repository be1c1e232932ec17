// What each SDK's bundle contains: its connect-and-listen entry point, as an app would import it.
export const ENTRIES = {
  hostlease: `import { init, connect } from "hostlease"; export { init, connect };`,
  "pusher-js": `import Pusher from "pusher-js"; export { Pusher };`,
  "ably/modular": `import { BaseRealtime, WebSocketTransport, FetchRequest } from "ably/modular"; export { BaseRealtime, WebSocketTransport, FetchRequest };`,
  "livekit-client": `import { Room } from "livekit-client"; export { Room };`,
};

