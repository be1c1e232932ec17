//! Sizes of the built package (raw, gzip -9, brotli q11) and the size budget.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::output;
use crate::tools::node_bin;

pub const FILES: &[&str] = &[
    "pkg/wasm/hostlease_bg.wasm",
    "pkg/wasm/hostlease.js",
    "pkg/index.js",
];
const BUDGET: &str = "pkg/size-budget.json";

pub struct Sizes {
    /// `(file, raw, gzip, brotli)`
    pub files: Vec<(String, u64, u64, u64)>,
}

impl Sizes {
    pub fn brotli_total(&self) -> u64 {
        self.files.iter().map(|f| f.3).sum()
    }
}

/// Node's zlib does the compression, so the numbers match what a CDN would serve. The JS files
/// are measured as an app ships them: minified by esbuild (whitespace, comments and local names;
/// nothing bundled in), the way every bundler's production build treats a dependency.
pub fn measure(root: &Path) -> Result<Sizes, String> {
    let min_dir = root.join("target/pkg-size");
    std::fs::create_dir_all(&min_dir).map_err(|e| format!("{}: {e}", min_dir.display()))?;
    let mut measured = Vec::new();
    for f in FILES {
        if !f.ends_with(".js") {
            measured.push(root.join(f));
            continue;
        }
        let out = min_dir.join(f.replace('/', "_"));
        output(
            Command::new(node_bin(root, "esbuild"))
                .current_dir(root)
                .args([f, "--minify", "--format=esm", "--log-level=error"])
                .arg(format!("--outfile={}", out.display())),
        )
        .map_err(|e| format!("esbuild --minify {f}: {e}"))?;
        measured.push(out);
    }
    let files = compressed(root, &measured)?
        .into_iter()
        .zip(FILES)
        .map(|([raw, gz, br], f)| {
            let name = if f.ends_with(".js") {
                format!("{f} (minified)")
            } else {
                (*f).to_owned()
            };
            (name, raw, gz, br)
        })
        .collect();
    Ok(Sizes { files })
}

pub fn print(s: &Sizes) {
    eprintln!("\n| file | raw | gzip | brotli |\n|---|---:|---:|---:|");
    for (f, raw, gz, br) in &s.files {
        eprintln!("| {f} | {raw} | {gz} | {br} |");
    }
    let t = |i: usize| -> u64 { s.files.iter().map(|f| [f.1, f.2, f.3][i]).sum() };
    eprintln!("| **total** | {} | {} | {} |", t(0), t(1), t(2));
}

/// `[raw, gzip, brotli]` bytes of each of `files`, in order: Node's zlib, gzip -9 and brotli
/// quality 11.
pub fn compressed(root: &Path, files: &[PathBuf]) -> Result<Vec<[u64; 3]>, String> {
    let script = r#"
const fs = require("fs"), z = require("zlib");
for (const f of process.argv.slice(1)) {
  const b = fs.readFileSync(f);
  const gz = z.gzipSync(b, { level: 9 }).length;
  const br = z.brotliCompressSync(b, { params: { [z.constants.BROTLI_PARAM_QUALITY]: 11 } }).length;
  console.log(`${b.length}\t${gz}\t${br}`);
}"#;
    let text = output(
        Command::new("node")
            .current_dir(root)
            .arg("-e")
            .arg(script)
            .args(files),
    )?;
    let sizes: Vec<[u64; 3]> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split('\t').map(|n| n.parse::<u64>().ok());
            Some([it.next()??, it.next()??, it.next()??])
        })
        .collect();
    if sizes.len() != files.len() {
        return Err(format!("could not measure {} files: {text}", files.len()));
    }
    Ok(sizes)
}

/// Fails when the package grew past the budget in `pkg/size-budget.json`.
pub fn check_budget(root: &Path, s: &Sizes) -> Result<(), String> {
    let text = std::fs::read_to_string(root.join(BUDGET)).map_err(|e| format!("{BUDGET}: {e}"))?;
    let budget: u64 = text
        .split("\"brotli_bytes\"")
        .nth(1)
        .and_then(|r| {
            r.trim_start_matches([' ', ':'])
                .split(|c: char| !c.is_ascii_digit())
                .next()
        })
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{BUDGET} has no brotli_bytes"))?;
    let total = s.brotli_total();
    eprintln!("package: {total} bytes brotli, budget {budget}");
    if total > budget {
        return Err(format!(
            "the package is {total} bytes brotli, over its budget of {budget} ({BUDGET})"
        ));
    }
    Ok(())
}
