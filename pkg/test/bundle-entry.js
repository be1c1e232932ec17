import { init, connect } from "hostlease";
// As the README tells esbuild users: the .wasm imported as a file (`--loader:.wasm=file` copies
// it next to the bundle and gives its URL), and that URL passed to init().
import wasmUrl from "hostlease/hostlease_bg.wasm";
export async function start(url, room, token) {
  await init(wasmUrl);
  return connect({ url, room, token });
}
