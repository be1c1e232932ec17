//! The order of the module's functions, chosen for brotli.
//!
//! Where a function sits in the code section changes nothing it does (calls, the table and the
//! exports name functions; the text format below names them by `$name`, so moving a definition
//! moves nothing else), but brotli codes a match the cheaper the nearer it is (the whole module is
//! within its window): a function next to one that reads alike compresses better. The functions come as rustc and wasm-opt left
//! them; [`by_likeness`] puts each next to the most alike of those left (greedy, from the
//! smallest): with runs of 12 bytes, 421 bytes less brotli on the bundle of stop 39 (30,389 to
//! 29,968), and 221 less raw. Brotli rewards it unevenly: runs of 8, 10, 16 and 24 bytes gave
//! 397, 364, 428 and 233 less there, and counting each function's trailing newline in its text
//! 240 less. On the code after a change the best run length moves by tens of bytes either way
//! (stop 40: 16 gave 36,478 B for the package where 12 gave 36,523), and where a function sits
//! also sets its index, whose LEB128 in every call is one byte below 128 and two above (so the
//! last stage's raw output moves by up to 350 bytes between orders). So the build makes the
//! module once for each of [`RUNS`] and keeps the smallest brotli (stop 41: 30,099, 30,072,
//! 30,104, 30,009 and 30,054 bytes for runs of 12 to 16; the same text gives the same choice).
//! Tried and worse there: the functions most called first, with the 1-byte indices (raw −413,
//! brotli +180 and more), from the longest function (+200 to +300), sorted by their text (+176).
//!
//! It works on binaryen's text (`wasm-dis`), whose module prints one field per top-level line
//! (` (func ...`, ` (data ...`, ...), each running to the next such line; the last wasm-opt stage
//! reads the reordered text. The same text in the same order gives the same `.wasm` (checked:
//! byte for byte).

/// The run lengths likeness is measured on, a module for each; the build keeps the smallest.
pub const RUNS: &[usize] = &[12, 13, 14, 15, 16];

/// `wat` (binaryen's text of a module) with its functions reordered by [`by_likeness`] with
/// likeness measured on runs of `run` bytes, or an error if its functions are not one run of
/// top-level fields.
pub fn by_likeness(wat: &str, run: usize) -> Result<String, String> {
    // Top-level fields: each starts at a line ` (` (or the module's closing `)`).
    let mut fields: Vec<&str> = Vec::new();
    let mut start = 0;
    let mut at = 0;
    for line in wat.split_inclusive('\n') {
        if at > 0 && (line.starts_with(" (") || line.starts_with(')')) {
            fields.push(&wat[start..at]);
            start = at;
        }
        at += line.len();
    }
    fields.push(&wat[start..]);
    let is_func = |f: &str| f.starts_with(" (func ");
    let first = fields
        .iter()
        .position(|f| is_func(f))
        .ok_or("no function in the module's text")?;
    let count = fields[first..].iter().take_while(|f| is_func(f)).count();
    if fields[first + count..].iter().any(|f| is_func(f)) {
        return Err("the module's functions are not one run of fields".into());
    }
    let funcs = &fields[first..first + count];
    let shingles: Vec<Vec<u64>> = funcs.iter().map(|f| shingles(f.trim_end(), run)).collect();
    let order = greedy(&shingles, funcs);
    let mut out = String::with_capacity(wat.len());
    fields[..first].iter().for_each(|f| out.push_str(f));
    order.iter().for_each(|&k| out.push_str(funcs[k]));
    fields[first + count..].iter().for_each(|f| out.push_str(f));
    Ok(out)
}

/// A function's text without its names (`$` and the name's characters become `$`: the same code
/// reads alike whatever its function, local and label indices) and with each run of whitespace
/// one space; its runs of `run` bytes, hashed, sorted, once each.
fn shingles(func: &str, run: usize) -> Vec<u64> {
    let mut text = Vec::with_capacity(func.len());
    let mut bytes = func.bytes().peekable();
    while let Some(b) = bytes.next() {
        if b == b'$' {
            while bytes
                .next_if(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$'))
                .is_some()
            {}
        } else if b.is_ascii_whitespace() {
            while bytes.next_if(u8::is_ascii_whitespace).is_some() {}
            text.push(b' ');
            continue;
        }
        text.push(b);
    }
    let mut set: Vec<u64> = text
        .windows(run)
        // FNV-1a: the same hashes on every machine and toolchain, so the same order.
        .map(|w| {
            w.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
        })
        .collect();
    set.sort_unstable();
    set.dedup();
    set
}

/// Jaccard likeness of two sorted sets.
fn likeness(a: &[u64], b: &[u64]) -> f64 {
    let (mut i, mut j, mut common) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let all = a.len() + b.len() - common;
    if all == 0 {
        1.0
    } else {
        common as f64 / all as f64
    }
}

/// From the function with the shortest text (the first such), each next one is the most alike
/// of those left to the one placed last (the first such).
fn greedy(shingles: &[Vec<u64>], funcs: &[&str]) -> Vec<usize> {
    let n = funcs.len();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut last = (0..n).min_by_key(|&k| (funcs[k].len(), k)).unwrap_or(0);
    for _ in 0..n {
        placed[last] = true;
        order.push(last);
        let mut best: Option<(usize, f64)> = None;
        for k in (0..n).filter(|&k| !placed[k]) {
            let s = likeness(&shingles[last], &shingles[k]);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((k, s));
            }
        }
        match best {
            Some((k, _)) => last = k,
            None => break,
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::by_likeness;

    const WAT: &str = "(module\n (type $0 (func))\n (func $0\n  (call $2)\n )\n (func $1 (param $0 i32)\n  (drop\n   (i32.add\n    (local.get $0)\n    (i32.const 1)\n   )\n  )\n )\n (func $2\n  (nop)\n )\n (func $3 (param $0 i32)\n  (drop\n   (i32.add\n    (local.get $0)\n    (i32.const 2)\n   )\n  )\n )\n (export \"a\" (func $1))\n)\n";

    fn funcs(wat: &str) -> Vec<&str> {
        wat.lines()
            .filter(|l| l.starts_with(" (func "))
            .map(|l| l.split(' ').nth(2).unwrap())
            .collect()
    }

    #[test]
    fn moves_whole_functions_and_nothing_else() {
        let out = by_likeness(WAT, 16).unwrap();
        assert_eq!(out.len(), WAT.len());
        // From the shortest ($2), then the most alike each time: $1 and $3 side by side.
        assert_eq!(funcs(&out), ["$2", "$0", "$1", "$3"]);
        let mut a: Vec<&str> = WAT.lines().collect();
        let mut b: Vec<&str> = out.lines().collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert!(out.starts_with("(module\n (type $0 (func))\n (func $2\n"));
        assert!(out.ends_with(" (export \"a\" (func $1))\n)\n"));
    }

    #[test]
    fn refuses_functions_split_by_another_field() {
        let split = WAT.replace(" (func $2", " (global $g i32 (i32.const 0))\n (func $2");
        assert!(by_likeness(&split, 16).is_err());
        assert!(by_likeness("(module\n)\n", 16).is_err());
    }
}
