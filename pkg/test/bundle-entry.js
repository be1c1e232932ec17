import { init, connect } from "hostlease";
export async function start(url, room, token) {
  await init();
  return connect({ url, room, token });
}
