//! Project tasks: `cargo xtask test`, `cargo xtask bench`, `cargo xtask demo`.
//!
//! Plain `std` only, so the task runner itself compiles in a second.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

/// Crates that must never be in the native dependency tree of `hostlease`.
const BROWSER_CRATES: &[&str] = &[
    "wasm-bindgen",
    "wasm-bindgen-futures",
    "js-sys",
    "web-sys",
    "serde-wasm-bindgen",
    "gloo-net",
    "gloo-timers",
    "gloo-utils",
    "console_error_panic_hook",
];

/// Sizes `cargo xtask test` runs at (the issue asks for at least these).
const PROPTEST_CASES: &str = "10000";
const SIM_SCHEDULES: &str = "10000";
/// The property tests' seed on CI (`CI` set and `PROPTEST_RNG_SEED` not), so that a run on CI
/// is the run that passed before it: a random draw that fails once in a while would hold back
/// whatever change happens to be on top. Outside CI every run draws new cases.
const CI_PROPTEST_SEED: &str = "20261204";

fn ci_proptest_seed() -> Option<(&'static str, &'static str)> {
    let on_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    (on_ci && std::env::var_os("PROPTEST_RNG_SEED").is_none())
        .then_some(("PROPTEST_RNG_SEED", CI_PROPTEST_SEED))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&root),
        Some("bench") => bench(&root),
        Some("build") => build(&root).map(|_| ()),
        Some("demo") => demo(&root),
        _ => {
            eprintln!("usage: cargo xtask <test|build|bench|demo>");
            eprintln!(
                "  build  the wasm package into pkg/ (wasm-bindgen, wasm-opt -Oz), with its sizes"
            );
            eprintln!("  test   fmt, clippy, every native test at full size, wasm check, dependency check");
            eprintln!("  bench  the core's benchmarks, as a table");
            eprintln!(
                "  demo   build everything and run the live-poll demo on http://127.0.0.1:7700/"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `RUSTFLAGS` for the bundle: the caller's, and the cargo home cut from the source paths that
/// panic locations embed (a dependency's is otherwise the machine's absolute path into the cargo
/// home, and the bundle's size would depend on where that is).
fn wasm_rustflags() -> String {
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(home) = home {
        flags.push_str(&format!(" --remap-path-prefix={}=", home.display()));
    }
    flags
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(step: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {step}");
    let status = cmd
        .status()
        .map_err(|e| format!("{step}: cannot start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step}: failed ({status})"))
    }
}

/// Runs `cmd`, echoing its output, and adds up the `test result:` lines of the test harnesses.
fn run_tests(step: &str, cmd: &mut Command, totals: &mut (u64, u64, u64)) -> Result<(), String> {
    eprintln!("\n==> {step}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{step}: cannot start: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        println!("{line}");
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("test result: ") {
            totals.0 += count(rest, " passed");
            totals.1 += count(rest, " failed");
            totals.2 += count(rest, " ignored");
        } else if let Some(n) = t.strip_prefix("# pass ").or(t.strip_prefix("ℹ pass ")) {
            // node's test runner
            totals.0 += n.trim().parse().unwrap_or(0);
        } else if let Some(n) = t.strip_prefix("# fail ").or(t.strip_prefix("ℹ fail ")) {
            totals.1 += n.trim().parse().unwrap_or(0);
        }
    }
    let status = child.wait().map_err(|e| format!("{step}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step}: failed ({status})"))
    }
}

/// The number before `label` in a `test result:` line.
fn count(line: &str, label: &str) -> u64 {
    line.find(label)
        .and_then(|end| {
            let start = line[..end]
                .rfind(|c: char| !c.is_ascii_digit())
                .map_or(0, |i| i + 1);
            line[start..end].parse().ok()
        })
        .unwrap_or(0)
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("cannot start: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ensure_wasm_target() -> Result<(), String> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed
        .lines()
        .any(|l| l.trim() == "wasm32-unknown-unknown")
    {
        run(
            "install the wasm32 target",
            Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]),
        )?;
    }
    Ok(())
}

/// The crate names in `hostlease`'s normal dependency tree for `target` (`None`: the host).
fn dependency_names(root: &Path, target: Option<&str>) -> Result<Vec<String>, String> {
    let mut cmd = cargo();
    cmd.current_dir(root).args([
        "tree",
        "-p",
        "hostlease",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    let text = output(&mut cmd)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

fn check_dependencies(root: &Path) -> Result<(), String> {
    eprintln!("\n==> native dependency tree of hostlease has no browser crate");
    let native = dependency_names(root, None)?;
    let found: Vec<&String> = native
        .iter()
        .filter(|n| BROWSER_CRATES.contains(&n.as_str()))
        .collect();
    if !found.is_empty() {
        return Err(format!("browser crates in the native tree: {found:?}"));
    }
    // The check means something only if the wasm build does pull them in.
    let wasm = dependency_names(root, Some("wasm32-unknown-unknown"))?;
    if !wasm.iter().any(|n| n == "wasm-bindgen") {
        return Err("the wasm dependency tree has no wasm-bindgen: the check is vacuous".into());
    }
    eprintln!(
        "native tree: {} crates, none of {:?}",
        native.len(),
        BROWSER_CRATES
    );
    Ok(())
}

fn test(root: &Path) -> Result<(), String> {
    let started = Instant::now();
    let mut steps: Vec<(&str, f64, bool)> = Vec::new();
    let mut totals = (0u64, 0u64, 0u64);
    let mut failure = None;

    macro_rules! step {
        ($name:expr, $body:expr) => {{
            let t = Instant::now();
            let r: Result<(), String> = $body;
            let ok = r.is_ok();
            steps.push(($name, t.elapsed().as_secs_f64(), ok));
            if let Err(e) = r {
                failure.get_or_insert(e);
            }
        }};
    }

    step!(
        "fmt",
        run(
            "cargo fmt --check",
            cargo()
                .current_dir(root)
                .args(["fmt", "--all", "--", "--check"])
        )
    );
    step!(
        "clippy",
        run(
            "cargo clippy (warnings are errors)",
            cargo().current_dir(root).args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings"
            ])
        )
    );
    step!(
        "native tests",
        run_tests(
            "cargo test --workspace (full-size property tests and simulation)",
            cargo()
                .current_dir(root)
                .args(["test", "--workspace"])
                .env("PROPTEST_CASES", PROPTEST_CASES)
                .envs(ci_proptest_seed())
                .env("HOSTLEASE_SIM_SCHEDULES", SIM_SCHEDULES),
            &mut totals
        )
    );
    step!(
        "wasm check",
        ensure_wasm_target().and_then(|()| run(
            "cargo check --target wasm32-unknown-unknown",
            cargo().current_dir(root).args([
                "check",
                "-p",
                "hostlease",
                "--lib",
                "--target",
                "wasm32-unknown-unknown"
            ])
        ))
    );
    step!("dependency check", check_dependencies(root));
    step!("tools", tools::ensure(root));
    step!(
        "wasm tests",
        run_tests(
            "the core's tests in wasm (Node) and the driver's in headless Chromium",
            &mut tools::wasm_test_command(root),
            &mut totals
        )
    );
    step!(
        "package build",
        build(root).and_then(|sizes| sizes::check_budget(root, &sizes))
    );
    step!("package smoke", pkg::smoke(root, &mut totals));
    step!(
        "browser e2e",
        // The server binary `cargo test --workspace` built for the server's own tests (with
        // the features the workspace's test dependencies turn on): a no-op after the native
        // tests. (`cargo build --profile test -p hostlease-server` resolved other features and
        // compiled tokio, axum and sqlx again: 2 min on CI.)
        run(
            "cargo test --workspace --no-run",
            cargo()
                .current_dir(root)
                .args(["test", "--workspace", "--no-run"])
        )
        .and_then(|()| pkg::browser(root, &mut totals))
    );

    eprintln!("\n==> summary");
    for (name, secs, ok) in &steps {
        eprintln!(
            "  {:<18} {:>7.1}s  {}",
            name,
            secs,
            if *ok { "ok" } else { "FAILED" }
        );
    }
    eprintln!(
        "  total {:.1}s; property tests at {PROPTEST_CASES} cases each (seed: {}), {SIM_SCHEDULES} simulated schedules",
        started.elapsed().as_secs_f64(),
        ci_proptest_seed().map_or("random, or PROPTEST_RNG_SEED", |(_, seed)| seed)
    );
    let failed_steps = steps.iter().filter(|s| !s.2).count();
    println!(
        "tests: {} passed, {} failed, {} skipped",
        totals.0, totals.1, totals.2
    );
    println!(
        "steps: {} passed, {} failed",
        steps.len() - failed_steps,
        failed_steps
    );
    match failure {
        Some(e) => Err(e),
        None if totals.0 == 0 => Err("no test ran".into()),
        None => Ok(()),
    }
}

/// Builds the npm package's wasm into `pkg/wasm/` and prints its sizes.
fn build(root: &Path) -> Result<sizes::Sizes, String> {
    ensure_wasm_target()?;
    tools::ensure(root)?;
    run(
        "cargo build --profile wasm --features bundle --target wasm32-unknown-unknown",
        cargo()
            .current_dir(root)
            .env("RUSTFLAGS", wasm_rustflags())
            .args([
                "build",
                "-p",
                "hostlease",
                "--lib",
                "--profile",
                "wasm",
                "--features",
                "bundle",
                "--target",
                "wasm32-unknown-unknown",
            ]),
    )?;
    let out = root.join("pkg/wasm");
    let built = root.join("target/wasm32-unknown-unknown/wasm/hostlease.wasm");
    run(
        "wasm-bindgen --target web",
        Command::new(tools::wasm_bindgen(root))
            .args([
                "--target",
                "web",
                "--no-typescript",
                "--out-name",
                "hostlease",
                "--out-dir",
            ])
            .arg(&out)
            .arg(&built),
    )?;
    let wasm = out.join("hostlease_bg.wasm");
    let bound = std::fs::read(&wasm).map_err(|e| format!("read {}: {e}", wasm.display()))?;
    let (snipped, names) = strip::snip_panics(&bound)?;
    eprintln!(
        "\n==> functions that only panic made a bare trap: {} (xtask/src/strip.rs)",
        names.len()
    );
    let glue_path = out.join("hostlease.js");
    let glue = std::fs::read_to_string(&glue_path)
        .map_err(|e| format!("read {}: {e}", glue_path.display()))?;
    eprintln!("\n==> strings passed into the module by TextEncoder.encode (the glue's realloc path dropped)");
    let glue = minify::encode_strings(&glue)?;
    let calls = minify::glue_calls(&glue);
    let (trimmed, dropped) = strip::drop_exports(&snipped, |name| calls.contains(name))?;
    eprintln!(
        "\n==> exports the glue never calls dropped: {}",
        dropped.join(", ")
    );
    std::fs::write(&wasm, trimmed).map_err(|e| format!("write {}: {e}", wasm.display()))?;
    // wasm-opt (npm binaryen) from `input` into `out`, with `passes`.
    let wasm_opt_into = |input: &Path, out: &Path, passes: &[&str]| {
        let mut c = Command::new(tools::node_bin(root, "wasm-opt"));
        c.args(passes)
            .args([
                "--strip-debug",
                "--strip-producers",
                "--strip-target-features",
            ])
            .args(tools::WASM_FEATURES)
            .arg(input)
            .arg("-o")
            .arg(out);
        c
    };
    // The same over the bundle in place.
    let wasm_opt = |passes: &[&str]| wasm_opt_into(&wasm, &wasm, passes);
    run(
        "wasm-opt -Oz (npm binaryen)",
        &mut wasm_opt(&["-Oz", "--converge"]),
    )?;
    eprintln!("\n==> short import and export names (wasm-opt; the glue renamed to match)");
    let report = output(&mut wasm_opt(&["--minify-imports-and-exports-and-modules"]))
        .map_err(|e| format!("wasm-opt --minify-imports-and-exports-and-modules: {e}"))?;
    let mut bytes = std::fs::read(&wasm).map_err(|e| format!("read {}: {e}", wasm.display()))?;
    let glue = minify::rename_in_glue(&glue, &minify::parse_report(&report)?, &bytes)?;
    eprintln!(
        "\n==> the glue's initSync, deprecated-parameter warning, encodeInto polyfill and \
         Driver.free() dropped (unreachable from the wrapper); its MIME-type warning shortened"
    );
    let glue = minify::drop_unreachable(&glue)?;
    let glue = minify::shorten_warning(&glue)?;
    std::fs::write(&glue_path, glue).map_err(|e| format!("write {}: {e}", glue_path.display()))?;
    let zeroed = strip::zero_panic_text(&mut bytes)?;
    std::fs::write(&wasm, &bytes).map_err(|e| format!("write {}: {e}", wasm.display()))?;
    eprintln!(
        "\n==> panic text zeroed: {} bytes, {} panic locations, digit table {} (xtask/src/strip.rs)",
        zeroed.text,
        zeroed.locations,
        if zeroed.digits { "zeroed" } else { "kept: something reads it" }
    );
    // The functions reordered, each next to the one most like it (xtask/src/order.rs), in
    // binaryen's text, which the last stage reads: once for each run length likeness can be
    // measured on, keeping the module that brotli makes smallest.
    let wat = root.join("target/hostlease_bg.wat");
    run(
        "wasm-dis (the module as text)",
        Command::new(tools::node_bin(root, "wasm-dis"))
            .arg(&wasm)
            .arg("-o")
            .arg(&wat),
    )?;
    let text = std::fs::read_to_string(&wat).map_err(|e| format!("read {}: {e}", wat.display()))?;
    // The candidates' last stages run side by side (each is mostly one thread).
    eprintln!(
        "\n==> wasm-opt again, once for each order (the zeroed text packed away; --flatten \
         --rereloop -Oz -Os --converge)"
    );
    // Every text is written before any stage starts, and every stage started is waited for,
    // whatever fails: none outlives the build, writing into files a rerun reads.
    let mut built = Vec::new();
    for &length in order::RUNS {
        let reordered = root.join(format!("target/hostlease_bg.runs{length}.wat"));
        std::fs::write(&reordered, order::by_likeness(&text, length)?)
            .map_err(|e| format!("write {}: {e}", reordered.display()))?;
        built.push((
            length,
            reordered,
            root.join(format!("target/hostlease_bg.runs{length}.wasm")),
        ));
    }
    let mut stages = Vec::new();
    let mut failed = None;
    for (length, reordered, out) in &built {
        // Flattened and re-reloop'd, then -Oz and -Os to convergence: 200 to 280 bytes less
        // brotli than -Oz alone (measured on this core; -Os after -Oz inlines and folds
        // differently).
        match wasm_opt_into(
            reordered,
            out,
            &["--flatten", "--rereloop", "-Oz", "-Os", "--converge"],
        )
        .spawn()
        {
            Ok(stage) => stages.push((length, stage)),
            Err(e) => {
                failed = Some(format!("wasm-opt: cannot start: {e}"));
                break;
            }
        }
    }
    for (length, mut stage) in stages {
        if failed.is_some() {
            let _ = stage.kill();
        }
        match stage.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => {
                failed.get_or_insert(format!(
                    "wasm-opt, the order of runs of {length} bytes: failed ({status})"
                ));
            }
            Err(e) => {
                failed.get_or_insert(format!("wasm-opt: {e}"));
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let built: Vec<PathBuf> = built.into_iter().map(|(_, _, out)| out).collect();
    let sizes = sizes::compressed(root, &built)?;
    let (best, _) = sizes
        .iter()
        .enumerate()
        .min_by_key(|&(k, s)| (s[2], k))
        .ok_or("no module built")?;
    std::fs::copy(&built[best], &wasm).map_err(|e| format!("copy to {}: {e}", wasm.display()))?;
    let tried: Vec<String> = (order::RUNS.iter().zip(&sizes))
        .map(|(length, s)| format!("{length}: {}", s[2]))
        .collect();
    eprintln!(
        "\n==> functions ordered by likeness over runs of {} bytes (xtask/src/order.rs; brotli \
         bytes by run length: {})",
        order::RUNS[best],
        tried.join(", ")
    );
    // The licence texts go into the package (npm packs `LICENSE*` at its root); one copy of
    // each stays in git, at the repository's root.
    for f in ["LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(root.join(f), root.join("pkg").join(f))
            .map_err(|e| format!("copy {f} into pkg/: {e}"))?;
    }
    let sizes = sizes::measure(root)?;
    sizes::print(&sizes);
    Ok(sizes)
}

fn bench(root: &Path) -> Result<(), String> {
    run(
        "cargo bench (the core)",
        cargo()
            .current_dir(root)
            .args(["bench", "-p", "hostlease", "--bench", "core"]),
    )?;
    run(
        "cargo bench (the server: load generator on the core vs a plain broadcaster, SQLite commits)",
        cargo()
            .current_dir(root)
            .args(["bench", "-p", "hostlease-server", "--bench", "load"]),
    )?;
    build(root)?;
    // The anchors are installed into a bench-only folder, never into the package.
    let anchors = root.join(".tools/bench");
    if !anchors.join("node_modules/livekit-client").exists() {
        tools::npm_install(
            "install the anchor SDKs into .tools/bench",
            &anchors,
            &["pusher-js@8", "ably@2", "livekit-client@2"],
        )?;
    }
    run(
        "browser benchmarks in headless Chromium (sizes, load time, message cost)",
        Command::new("node")
            .current_dir(root)
            .arg("pkg/bench/run.mjs")
            .arg(tools::node_modules(root))
            .arg(anchors.join("node_modules")),
    )
}

/// Builds the package and the server, lays the demo out in `target/demo-www`, and runs the
/// server on embedded SQLite in `./data/` with `--dev` (token minting for the demo) until Ctrl-C.
fn demo(root: &Path) -> Result<(), String> {
    build(root)?;
    run(
        "cargo build -p hostlease-server --release",
        cargo()
            .current_dir(root)
            .args(["build", "-p", "hostlease-server", "--release"]),
    )?;
    let www = root.join("target/demo-www");
    let _ = std::fs::remove_dir_all(&www);
    copy_dir(&root.join("www"), &www)?;
    std::fs::create_dir_all(www.join("pkg/wasm")).map_err(|e| e.to_string())?;
    for f in ["index.js", "wasm/hostlease.js", "wasm/hostlease_bg.wasm"] {
        std::fs::copy(root.join("pkg").join(f), www.join("pkg").join(f))
            .map_err(|e| format!("copy {f}: {e}"))?;
    }
    std::fs::create_dir_all(root.join("data")).map_err(|e| e.to_string())?;
    let listen = std::env::var("HOSTLEASE_DEMO_LISTEN").unwrap_or_else(|_| "127.0.0.1:7700".into());
    eprintln!(
        "\n  hostlease demo: open http://{listen}/ in two or three tabs, join the same room,"
    );
    eprintln!("  and close the host's tab to watch the host move. Ctrl-C stops the server.\n");
    // The server handles SIGINT itself (graceful shutdown); Ctrl-C reaches both processes.
    run(
        "hostlease-server serve --dev",
        Command::new(root.join("target/release/hostlease-server"))
            .current_dir(root)
            .args([
                "serve",
                "--db",
                "sqlite://data/hostlease.db",
                "--listen",
                &listen,
                "--dev",
                "--www",
            ])
            .arg(&www),
    )
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

mod minify;
mod order;
mod pkg;
mod sizes;
mod strip;
mod tools;
