// A room driven from a dedicated module worker (the browser test "in a Web Worker ..."): the SDK
// takes the worker's global scope for its timers, its clock and its network hooks.
import * as hl from "/index.js";

let room = null;
const log = [];
onmessage = async ({ data }) => {
  if (data.start) {
    await hl.init();
    room = await hl.connect(data.start);
    for (const t of ["connection", "host", "error"]) {
      room.on(t, (p) => log.push({ type: t, payload: p instanceof Error ? { code: p.code } : p }));
    }
    postMessage({ started: true });
  } else if (data.view) {
    postMessage({ view: { phase: room.view.phase, host: room.view.host, me: room.view.me }, log });
  }
};
