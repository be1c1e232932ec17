//! The tools the wasm build and the browser tests need, installed into the ignored `.tools/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, output, run};

/// npm packages for building and testing the package (never a browser download: Chromium is
/// Debian's). binaryen's wasm-opt, not Debian's, whose `-Oz` output breaks in Chromium. Exact
/// versions: wasm-opt's and esbuild's output is what the size budget measures (it has no
/// headroom: a patch release that wrote a few bytes more would fail a clean run), and tsc's
/// messages are matched by the type test.
const NODE_TOOLS: &[&str] = &[
    "binaryen@132.0.0",
    "esbuild@0.28.2",
    "playwright-core@1.65.2",
    "typescript@5.9.3",
    "vite@8.4.1",
];
const NODE_BINS: &[&str] = &["wasm-opt", "wasm-dis", "esbuild", "tsc", "vite"];

/// Features the Rust wasm32 target emits by default; wasm-opt must be told.
pub const WASM_FEATURES: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-nontrapping-float-to-int",
    "--enable-sign-ext",
    "--enable-reference-types",
    "--enable-multivalue",
    "--enable-mutable-globals",
];

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub fn wasm_bindgen(root: &Path) -> PathBuf {
    root.join(".tools/bin/wasm-bindgen")
}

pub fn node_bin(root: &Path, name: &str) -> PathBuf {
    root.join(".tools/node/node_modules/.bin").join(name)
}

pub fn node_modules(root: &Path) -> PathBuf {
    root.join(".tools/node/node_modules")
}

/// The wasm-bindgen version in Cargo.lock: the CLI must match it exactly.
fn locked_wasm_bindgen(root: &Path) -> Result<String, String> {
    let lock =
        std::fs::read_to_string(root.join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"wasm-bindgen\"" {
            if let Some(v) = lines
                .next()
                .and_then(|v| v.trim().strip_prefix("version = \""))
            {
                return Ok(v.trim_end_matches('"').to_owned());
            }
        }
    }
    Err("wasm-bindgen is not in Cargo.lock".into())
}

pub fn ensure(root: &Path) -> Result<(), String> {
    let version = locked_wasm_bindgen(root)?;
    let have = output(Command::new(wasm_bindgen(root)).arg("--version")).unwrap_or_default();
    if !have.contains(&version) {
        // Without --locked: one of its locked dependencies is not in the reachable index.
        run(
            &format!("install wasm-bindgen-cli {version} into .tools (a few minutes, once)"),
            cargo().current_dir(root).args([
                "install",
                "--root",
                ".tools",
                "wasm-bindgen-cli",
                "--version",
                &version,
            ]),
        )?;
    }
    if NODE_BINS.iter().any(|b| !node_bin(root, b).exists())
        || !node_modules(root).join("playwright-core").exists()
    {
        npm_install(
            "install the npm build and test tools into .tools/node",
            &root.join(".tools/node"),
            NODE_TOOLS,
        )?;
    }
    for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        if !Path::new(path).exists() {
            return Err(format!(
                "{path} is missing: apt-get install -y {package} (.ci/run does)"
            ));
        }
    }
    Ok(())
}

/// `cargo test` of the crate for wasm32: the core's tests run in Node through
/// wasm-bindgen-test at their default, reduced sizes; the driver's in headless Chromium.
pub fn wasm_test_command(root: &Path) -> Command {
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args([
            "test",
            "-p",
            "hostlease",
            "--target",
            "wasm32-unknown-unknown",
            "--lib",
            "--tests",
        ])
        .env(
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER",
            root.join(".tools/bin/wasm-bindgen-test-runner"),
        )
        .env("CHROMEDRIVER", CHROMEDRIVER)
        .env(
            "WASM_BINDGEN_TEST_WEBDRIVER_JSON",
            root.join("webdriver.json"),
        )
        .env("WASM_BINDGEN_TEST_TIMEOUT", "180");
    cmd
}

/// Installs npm `packages` into `dir/node_modules` (created if missing), saving nothing.
pub fn npm_install(step: &str, dir: &Path, packages: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    run(
        step,
        Command::new("npm")
            .current_dir(dir)
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--prefix",
                ".",
            ])
            .args(packages),
    )
}
