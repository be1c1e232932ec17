// Misuse that the types must reject (tsc is expected to fail on this file).
import { connect } from "hostlease";

export async function bad() {
  const room = await connect({ url: "wss://example.test", room: "lunch", token: "t" });
  room.on("host", ({ nosuchfield }) => nosuchfield);
  const n: string = room.view.epoch;
  // The view is shared, the same object until it changes: its member list is read-only.
  room.view.members.push(room.view.members[0]!);
  // And so are the other lists and their entries.
  room.view.pending.sort();
  room.on("members", ({ members }) => { members[0]!.name = members[0]!.name.trim(); });
  return n;
}

export async function noToken() {
  // Neither `token` nor `getToken`: connect() would reject it (BadArgument).
  return connect({ url: "wss://example.test", room: "lunch" });
}
