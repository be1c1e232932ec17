//! Packaging smoke: the built package imported by Node ESM (node's test runner), bundled by
//! esbuild and by Vite, and its types checked by `tsc` against a consumer file.

use std::path::Path;
use std::process::Command;

use crate::tools::{node_bin, node_modules};
use crate::{run, run_tests};

/// Makes `import "hostlease"` (and the test tools) from `pkg/test/` resolve: the built package
/// and playwright-core from `.tools/node`.
fn link_package(root: &Path) -> Result<(), String> {
    let dir = root.join("pkg/test/node_modules");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for (name, target) in [
        ("hostlease", "../..".to_owned()),
        (
            "playwright-core",
            format!("{}", node_modules(root).join("playwright-core").display()),
        ),
    ] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(&target, &link).map_err(|e| format!("link {name}: {e}"))?;
        }
    }
    Ok(())
}

/// The package in headless Chromium against the real server, with WebRTC between the pages:
/// server and browser run inside a loopback-only network namespace (the only way Chromium
/// gathers loopback ICE candidates), which also keeps every byte of the test on this machine.
/// Then the live-poll demo end to end (`demo.test.mjs`: the server serves www/ with the built
/// package laid out as `cargo xtask demo` does; screenshots in target/e2e-artifacts/), and the
/// README's quick start in a fresh Vite app (`quickstart.test.mjs`).
pub fn browser(root: &Path, totals: &mut (u64, u64, u64)) -> Result<(), String> {
    link_package(root)?;
    let bin = root.join("target/debug/hostlease-server");
    run_tests(
        "browser tests: the built package and the demo in Chromium against hostlease-server (loopback-only netns)",
        Command::new("unshare")
            .current_dir(root)
            .args(["-n", "sh", "-c"])
            .arg(
                // A test that hangs fails after 5 minutes, and handles a failed test left open
                // cannot keep the run alive: CI's time goes to tests, not to waiting.
                "ip link set lo up && exec node --test --test-concurrency=1 \
                 --test-timeout=300000 --test-force-exit \
                 pkg/test/browser.test.mjs pkg/test/demo.test.mjs pkg/test/quickstart.test.mjs",
            )
            .env("HOSTLEASE_SERVER_BIN", bin),
        totals,
    )
}

pub fn smoke(root: &Path, totals: &mut (u64, u64, u64)) -> Result<(), String> {
    link_package(root)?;
    let test = root.join("pkg/test");
    let out = root.join("target/pkg-smoke");
    let _ = std::fs::remove_dir_all(&out);

    run_tests(
        "Node ESM import (node --test)",
        Command::new("node")
            .current_dir(&test)
            // --expose-gc: one test checks that a closed room is collected. A test stuck on a
            // timer or socket fails after two minutes instead of holding CI to its limit.
            .args([
                "--expose-gc",
                "--test",
                "--test-timeout=120000",
                "--test-force-exit",
                "node-smoke.test.mjs",
            ]),
        totals,
    )?;

    run(
        "esbuild bundle",
        Command::new(node_bin(root, "esbuild"))
            .current_dir(&test)
            .args([
                "bundle-entry.js",
                "--bundle",
                "--format=esm",
                "--platform=browser",
                "--loader:.wasm=file",
            ])
            .arg(format!(
                "--outfile={}",
                out.join("esbuild/out.js").display()
            )),
    )?;
    let bundled = std::fs::read_to_string(out.join("esbuild/out.js")).map_err(|e| e.to_string())?;
    if !bundled.contains("hostlease_bg.wasm") || !bundled.contains("HostleaseError") {
        return Err("the esbuild bundle lacks the wasm loader or the wrapper".into());
    }
    // The .wasm imported through the package's `./hostlease_bg.wasm` export was copied next to
    // the bundle, byte for byte, under the name the bundle gives init().
    let wasm = std::fs::read(root.join("pkg/wasm/hostlease_bg.wasm")).map_err(|e| e.to_string())?;
    let copied = std::fs::read_dir(out.join("esbuild"))
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("hostlease_bg-") && n.ends_with(".wasm"))
        .ok_or("esbuild did not copy the .wasm imported as a file")?;
    let same = std::fs::read(out.join("esbuild").join(&copied)).map_err(|e| e.to_string())? == wasm;
    if !same || !bundled.contains(&format!("./{copied}")) {
        return Err(format!(
            "the esbuild bundle does not load the copied {copied}"
        ));
    }

    run(
        "vite build",
        Command::new(node_bin(root, "vite"))
            .current_dir(test.join("vite"))
            .args(["build", "--logLevel", "warn", "--outDir"])
            .arg(out.join("vite"))
            .env("NODE_PATH", node_modules(root)),
    )?;
    let assets =
        std::fs::read_dir(out.join("vite/assets")).map_err(|e| format!("vite output: {e}"))?;
    if !assets
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().ends_with(".wasm"))
    {
        return Err("the Vite build emitted no .wasm asset".into());
    }

    let tsc = |file: &str| {
        Command::new(node_bin(root, "tsc"))
            .current_dir(&test)
            .args([
                "--noEmit",
                "--strict",
                // The strictest consumers: an optional property may not be given `undefined`
                // unless the types say so.
                "--exactOptionalPropertyTypes",
                "--target",
                "es2022",
                "--module",
                "esnext",
                "--moduleResolution",
                "bundler",
                "--lib",
                "es2022,dom",
                "--skipLibCheck",
                "false",
            ])
            .arg(file)
            .output()
            .map_err(|e| format!("tsc: {e}"))
    };
    eprintln!("\n==> tsc --noEmit against the consumer files");
    let good = tsc("consumer.ts")?;
    if !good.status.success() {
        return Err(format!(
            "tsc rejected consumer.ts:\n{}",
            String::from_utf8_lossy(&good.stdout)
        ));
    }
    let bad = tsc("consumer-bad.ts")?;
    let text = String::from_utf8_lossy(&bad.stdout);
    let refused = [
        "nosuchfield",
        "TS2322",
        "type 'ConnectOptions'",
        "'push' does not exist on type 'readonly Member[]'",
        "'sort' does not exist on type 'readonly PendingCommand[]'",
        "Cannot assign to 'name' because it is a read-only property",
    ];
    if bad.status.success() || refused.iter().any(|r| !text.contains(r)) {
        return Err(format!(
            "tsc accepted misuse in consumer-bad.ts (the types are too loose):\n{text}"
        ));
    }
    eprintln!("types: consumer.ts accepted, consumer-bad.ts rejected as it should be");
    Ok(())
}
