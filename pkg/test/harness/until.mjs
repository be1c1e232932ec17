// Waits for a condition, with a generous bound: nothing in the tests asserts that something was
// fast, only that it happened.

/** Polls `fn` every `every` ms until it returns something truthy (returned); throws after
 * `timeout` ms, naming `what` and the last value seen. */
export async function until(what, fn, { timeout = 30_000, every = 100 } = {}) {
  const end = Date.now() + timeout;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, every));
  }
  throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)}`);
}
