// Packaging smoke test in Node ESM: importing must not crash without a browser, the init guard
// must refuse use before init with a typed error, and the module must load from its bytes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";

const hl = await import("hostlease");

test("the package imports in Node without a browser", () => {
  for (const name of ["init", "connect", "version", "HostleaseError", "UsageError", "CommandError", "ErrorCode"]) {
    assert.ok(name in hl, `missing export ${name}`);
  }
});

test("use before init throws a UsageError with a code", async () => {
  assert.throws(() => hl.version(), (e) => e instanceof hl.UsageError && e instanceof hl.HostleaseError
    && e instanceof Error && e.code === "NotInitialized");
  await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" }),
    (e) => e instanceof hl.HostleaseError && e.code === "NotInitialized");
});

test("init loads the wasm from its bytes; bad arguments are typed errors", async () => {
  const bytes = await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url));
  await hl.init(bytes);
  assert.equal(hl.version(), 1);
  await assert.rejects(hl.connect({ room: "r" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
  await assert.rejects(hl.connect({ url: "ws://x", room: "r" }), (e) => e.code === "BadArgument");
});

test("errors carry stable codes and names", () => {
  const e = new hl.CommandError(hl.ErrorCode.StaleEpoch, "x");
  assert.equal(e.name, "CommandError");
  assert.equal(e.code, "StaleEpoch");
  assert.ok(e instanceof hl.HostleaseError);
});
