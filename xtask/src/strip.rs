//! Post-link passes over the bundle's `.wasm`, for what only a panic would run or read.
//!
//! The bundle's panic handler (`src/web/mod.rs`) traps without looking at its `PanicInfo`.
//!
//! - [`snip_panics`], before wasm-opt: the functions of core and alloc that exist only to panic
//!   (bounds checks, `expect` on `None`, a `RefCell` borrowed twice, capacity overflow...) build
//!   a message (`fmt::Arguments`, the number formatting behind it) and call the panic handler,
//!   which traps. Their bodies become a bare `unreachable`: the same trap, at once, and wasm-opt
//!   then drops the formatting code nothing else calls (about 1.2 KB raw, 400 bytes brotli). This
//!   is what `wasm-snip --snip-rust-panicking-code` does, for a named list of functions that
//!   never return (each is `-> !` in the standard library), so no function that returns changes.
//! - [`zero_panic_text`], after wasm-opt: the messages of core's and alloc's panics and the
//!   source paths of panic locations are never read. wasm-opt removes code, not bytes of a data
//!   segment, so they stayed: 474 bytes of paths and 424 of messages, about 190 bytes brotli.
//!   Zeroed, they compress to almost nothing, and a last `wasm-opt -Oz` packs the zeroed runs
//!   out of the segments. Text the JS glue shows (wasm-bindgen's own errors) is not on the list
//!   and stays. The panic locations that name a zeroed path (file, line, column) are zeroed
//!   whole: about 180 bytes brotli more.
//! - [`drop_exports`], before wasm-opt: exports the glue never calls (wasm-bindgen's abort
//!   hooks, `__abort_handler` and `__instance_terminated`, for builds that unwind) go, and with
//!   them what only they kept alive; a mutable global no one outside can write is a constant.
//!
//! The browser tests run the bundle after both passes.

use std::collections::HashMap;
use std::ops::Range;

/// Messages of core's and alloc's panics (their fixed parts), as the compiler lays them out.
const PANIC_TEXT: &[&[u8]] = &[
    b"slice index starts at ",
    b" but ends at ",
    b"index out of bounds: the len is ",
    b" but the index is ",
    b"range start index ",
    b"range end index ",
    b" out of range for slice of length ",
    b"memory allocation of ",
    b" bytes failed",
    b"insertion index (is ",
    b") should be <= len (is ",
    b"removal index (is ",
    b") should be < len (is ",
    b"internal error: entered unreachable code",
    b"capacity overflow",
    b"Tried to shrink to a larger capacity",
    b"RefCell already mutably borrowed",
    b"RefCell already borrowed",
];

/// `core::fmt`'s table of two-digit pairs for printing integers. Only the panic messages printed
/// numbers, and their code is gone once [`snip_panics`] has run, but a data segment is not code:
/// the table stayed.
const DIGIT_PAIRS: &[u8; 200] = b"00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/// What [`zero_panic_text`] zeroed.
pub struct Zeroed {
    /// Bytes of panic messages and source paths.
    pub text: usize,
    /// Panic locations.
    pub locations: usize,
    /// Whether the digit-pair table went (nothing read it).
    pub digits: bool,
}

/// Zeroes panic text in the data section of `wasm`, the panic locations that name a path it
/// zeroed, and the digit-pair table if no code or data points into it.
pub fn zero_panic_text(wasm: &mut [u8]) -> Result<Zeroed, String> {
    let range = data_section(wasm)?;
    let segments = data_segments(wasm)?;
    let mut zeroed = 0;
    let paths = source_paths(&wasm[range.clone()])
        .into_iter()
        .map(|p| range.start + p.start..range.start + p.end)
        .collect::<Vec<_>>();
    let (paths, records) = located_paths(wasm, &segments, &paths);
    for p in &paths {
        wasm[p.clone()].fill(0);
        zeroed += p.len();
    }
    for r in &records {
        wasm[r.clone()].fill(0);
    }
    let data = &mut wasm[range];
    for text in PANIC_TEXT {
        let mut at = 0;
        while let Some(p) = data[at..].windows(text.len()).position(|w| w == *text) {
            let s = at + p;
            data[s..s + text.len()].fill(0);
            zeroed += text.len();
            at = s + text.len();
        }
    }
    let digits = zero_unread_digits(wasm, &segments)?;
    Ok(Zeroed {
        text: zeroed,
        locations: records.len(),
        digits,
    })
}

/// Candidate source paths in `data` (ranges of it): path characters up to a `.rs`, with a
/// `src/` in them. A candidate may start too early: a string that ends in a path character and
/// sits right before a path reads as part of it. [`located_paths`] finds where each one starts.
fn source_paths(data: &[u8]) -> Vec<Range<usize>> {
    let path_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-');
    let mut paths = Vec::new();
    let mut i = 0;
    while i + 3 <= data.len() {
        // (A path may run straight into the next string: `.rs` ends it whatever follows.)
        if &data[i..i + 3] != b".rs" {
            i += 1;
            continue;
        }
        let end = i + 3;
        let start = data[..i]
            .iter()
            .rposition(|&b| !path_char(b))
            .map_or(0, |p| p + 1);
        if data[start..end].windows(4).any(|w| w == b"src/") {
            paths.push(start..end);
        }
        i = end;
    }
    paths
}

/// The source paths the panic handler alone reads, and the panic locations naming them (ranges of
/// `wasm` both). A panic location (`core::panic::Location`: the file's address and length, the
/// line, the column; four `u32`s at an address aligned to 4) names a path when its file ends
/// exactly where a candidate of `paths` ends and starts inside it. Each path starts where the
/// earliest location naming it starts (not where the walk back over path characters stopped,
/// which can be inside the string before it), and must still hold a `src/`; a candidate no
/// location names is kept whole. The locations' line numbers were noise to brotli (45 records,
/// 180 bytes of the package), and moved its size by up to 90 bytes with a line added or removed
/// above a panicking call. (A looser match, "any record pointing at zeros", took 36 records of
/// real data too.)
fn located_paths(
    wasm: &[u8],
    segments: &[Segment],
    paths: &[Range<usize>],
) -> (Vec<Range<usize>>, Vec<Range<usize>>) {
    // Each candidate (cut to the segment its `.rs` is in: the walk back may have gone into the
    // bytes before it), its address in memory, and the earliest file address naming it.
    let mut candidates: Vec<(Range<usize>, Range<usize>, Option<usize>)> = paths
        .iter()
        .filter_map(|p| {
            let s = segments.iter().find(|s| s.bytes.contains(&(p.end - 1)))?;
            let start = p.start.max(s.bytes.start);
            let at = s.address + (start - s.bytes.start);
            Some((start..p.end, at..at + (p.end - start), None))
        })
        .collect();
    let u32_at = |i: usize| u32::from_le_bytes(wasm[i..i + 4].try_into().unwrap()) as usize;
    let mut records = Vec::new();
    for s in segments {
        // The first offset in the segment whose address is aligned to 4.
        let mut i = s.bytes.start + (4 - s.address % 4) % 4;
        while i + 16 <= s.bytes.end {
            let (file, len) = (u32_at(i), u32_at(i + 4));
            let named = candidates
                .iter_mut()
                .find(|(_, m, _)| len > 0 && m.contains(&file) && file + len == m.end);
            if let Some((_, _, first)) = named {
                *first = Some(first.map_or(file, |f| f.min(file)));
                records.push((i..i + 16, file + len));
                i += 16;
            } else {
                i += 4;
            }
        }
    }
    // Back to ranges of `wasm`: the path from its first named byte to its end.
    let located: Vec<(Range<usize>, Range<usize>)> = candidates
        .into_iter()
        .filter_map(|(p, m, first)| {
            let start = p.start + (first? - m.start);
            let path = start..p.end;
            let has_src = wasm[path.clone()].windows(4).any(|w| w == b"src/");
            has_src.then_some((path, m))
        })
        .collect();
    let records = records
        .into_iter()
        .filter(|(_, end)| located.iter().any(|(_, m)| m.end == *end))
        .map(|(r, _)| r)
        .collect();
    (located.into_iter().map(|(p, _)| p).collect(), records)
}

/// Zeroes [`DIGIT_PAIRS`] when nothing can read it: no address within it appears in the code
/// section as a LEB128 number (an `i32.const` or a load's offset; a chance match of other bytes
/// only keeps the table) and no data points into it. About 160 bytes brotli with the `RefCell`
/// messages next to it (the table is what kept their segment).
fn zero_unread_digits(wasm: &mut [u8], segments: &[Segment]) -> Result<bool, String> {
    let Some((at, address)) = segments.iter().find_map(|s| {
        let i = wasm[s.bytes.clone()]
            .windows(DIGIT_PAIRS.len())
            .position(|w| w == DIGIT_PAIRS)?;
        Some((s.bytes.start + i, s.address + i))
    }) else {
        return Ok(false);
    };
    let inside = address..address + DIGIT_PAIRS.len();
    let code = sections(wasm)?
        .into_iter()
        .find(|s| s.id == 10)
        .map_or(0..0, |s| s.body);
    let code = &wasm[code];
    let in_code = inside.clone().any(|a| {
        [leb128_bytes(a), sleb128_bytes(a)]
            .iter()
            .any(|p| code.windows(p.len()).any(|w| w == p))
    });
    let in_data = segments.iter().any(|s| {
        wasm[s.bytes.clone()].windows(4).any(|w| {
            let v = u32::from_le_bytes(w.try_into().unwrap()) as usize;
            inside.contains(&v)
        })
    });
    if in_code || in_data {
        return Ok(false);
    }
    wasm[at..at + DIGIT_PAIRS.len()].fill(0);
    Ok(true)
}

/// An active data segment: where it goes in memory and where its bytes are in the module.
struct Segment {
    address: usize,
    bytes: Range<usize>,
}

/// The data section's segments, each active in memory 0 at a constant address (as wasm-bindgen
/// and wasm-opt write them; anything else is an error).
fn data_segments(wasm: &[u8]) -> Result<Vec<Segment>, String> {
    let range = data_section(wasm)?;
    let mut c = Cursor {
        b: &wasm[..range.end],
        at: range.start,
    };
    let count = c.leb().ok_or("the data section is malformed")?;
    (0..count)
        .map(|_| {
            // Flag 0 (active, memory 0), then `i32.const <address> end`: a non-negative signed
            // LEB128 reads the same as an unsigned one.
            let (flag, op) = (c.byte(), c.byte());
            let address = c.leb();
            let (end, len) = (c.byte(), c.leb());
            match (flag, op, address, end, len) {
                (Some(0), Some(0x41), Some(address), Some(0x0b), Some(len)) => {
                    let start = c.at;
                    c.skip(len).ok_or("a data segment runs past its section")?;
                    Ok(Segment {
                        address,
                        bytes: start..start + len,
                    })
                }
                _ => Err("a data segment is not active at a constant address".to_string()),
            }
        })
        .collect()
}

/// The byte range of the data section's contents.
fn data_section(wasm: &[u8]) -> Result<Range<usize>, String> {
    sections(wasm)?
        .into_iter()
        .find(|s| s.id == 11)
        .map(|s| s.body)
        .ok_or_else(|| "the module has no data section".into())
}

/// One section of a module: its id, where it starts (its id byte) and its contents.
pub struct Section {
    id: u8,
    start: usize,
    body: Range<usize>,
}

pub fn sections(wasm: &[u8]) -> Result<Vec<Section>, String> {
    if wasm.get(..4) != Some(b"\0asm") || wasm.len() < 8 {
        return Err("not a wasm module".into());
    }
    let mut out = Vec::new();
    let mut i = 8;
    while i < wasm.len() {
        let id = wasm[i];
        let (size, n) = leb128(&wasm[i + 1..]).ok_or("a section's size is malformed")?;
        let body = i + 1 + n;
        let end = body
            .checked_add(size)
            .filter(|&e| e <= wasm.len())
            .ok_or("a section runs past the end")?;
        out.push(Section {
            id,
            start: i,
            body: body..end,
        });
        i = end;
    }
    Ok(out)
}

/// Functions of the standard library that never return: each builds a panic message and calls
/// the panic handler. Matched on the name with the crates' `[hash]` taken out.
fn always_panics(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "core::option::expect_failed",
        "core::option::unwrap_failed",
        "core::result::unwrap_failed",
        "core::cell::panic_already_borrowed",
        "core::cell::panic_already_mutably_borrowed",
        "alloc::raw_vec::capacity_overflow",
        "alloc::raw_vec::handle_error",
        "alloc::alloc::handle_alloc_error",
        "__rustc::__rdl_alloc_error_handler",
        "__rustc::__rust_alloc_error_handler",
    ];
    let name = without_hashes(name);
    name.starts_with("core::panicking::")
        || (name.starts_with("core::slice::index::slice_") && name.ends_with("_fail"))
        || EXACT.contains(&name.as_str())
        // `Vec::insert` / `Vec::remove`'s out-of-range index.
        || (name.starts_with("<alloc::vec::Vec<") && name.ends_with("::assert_failed"))
}

/// `core[c5930c85a12de822]::fmt` -> `core::fmt`.
fn without_hashes(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex > 0 && after.as_bytes().get(hex) == Some(&b']') {
            rest = &after[hex + 1..];
        } else {
            out.push('[');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Replaces the body of every function [`always_panics`] names with `unreachable`; returns the
/// new module and the names snipped. Needs the module's name section (wasm-bindgen keeps it;
/// wasm-opt `--strip-debug` drops it afterwards). Finding none of them is an error: the
/// compiler's naming has changed and the list needs a look.
pub fn snip_panics(wasm: &[u8]) -> Result<(Vec<u8>, Vec<String>), String> {
    let secs = sections(wasm)?;
    let imported = imported_functions(wasm, &secs)?;
    let names = function_names(wasm, &secs)?;
    let code = secs
        .iter()
        .find(|s| s.id == 10)
        .ok_or("the module has no code section")?;
    let bad = || "the code section is malformed".to_string();
    let mut r = Cursor {
        b: &wasm[code.body.clone()],
        at: 0,
    };
    let count = r.leb().ok_or_else(bad)?;
    let mut contents = leb128_bytes(count);
    let mut snipped = Vec::new();
    for f in 0..count {
        let size = r.leb().ok_or_else(bad)?;
        let body = r.bytes(size).ok_or_else(bad)?;
        match names.get(&(imported + f)) {
            Some(name) if always_panics(name) => {
                // No locals; `unreachable`; `end`.
                contents.extend_from_slice(&[3, 0, 0x00, 0x0b]);
                snipped.push(name.clone());
            }
            _ => {
                contents.extend_from_slice(&leb128_bytes(size));
                contents.extend_from_slice(body);
            }
        }
    }
    if snipped.is_empty() {
        return Err("no panicking function of core or alloc found by name to snip".into());
    }
    Ok((replace_section(wasm, code, &contents), snipped))
}

/// `wasm` with the contents of `section` (one of its sections) replaced by `contents`.
fn replace_section(wasm: &[u8], section: &Section, contents: &[u8]) -> Vec<u8> {
    let mut out = wasm[..section.start].to_vec();
    out.push(section.id);
    out.extend_from_slice(&leb128_bytes(contents.len()));
    out.extend_from_slice(contents);
    out.extend_from_slice(&wasm[section.body.end..]);
    out
}

/// How many functions the import section brings in (they come first in the index space).
fn imported_functions(wasm: &[u8], secs: &[Section]) -> Result<usize, String> {
    Ok(imports(wasm, secs)?.iter().filter(|i| i.kind == 0).count())
}

/// One entry of the import section.
pub struct Import {
    pub module: String,
    pub name: String,
    /// 0 function, 1 table, 2 memory, 3 global, 4 tag.
    pub kind: u8,
}

/// The import section's entries, in order.
pub fn imports(wasm: &[u8], secs: &[Section]) -> Result<Vec<Import>, String> {
    let Some(section) = secs.iter().find(|s| s.id == 2) else {
        return Ok(Vec::new());
    };
    let b = &wasm[section.body.clone()];
    let bad = || "the import section is malformed".to_string();
    let mut r = Cursor { b, at: 0 };
    let mut out = Vec::new();
    for _ in 0..r.leb().ok_or_else(bad)? {
        let module = r.name().ok_or_else(bad)?;
        let name = r.name().ok_or_else(bad)?;
        let kind = r.byte().ok_or_else(bad)?;
        match kind {
            0 => r.leb().map(drop).ok_or_else(bad)?,
            1 => {
                r.byte().ok_or_else(bad)?;
                r.limits().ok_or_else(bad)?;
            }
            2 => r.limits().ok_or_else(bad)?,
            3 => r.skip(2).ok_or_else(bad)?,
            4 => {
                r.byte().ok_or_else(bad)?;
                r.leb().ok_or_else(bad)?;
            }
            k => return Err(format!("an import of unknown kind {k}")),
        }
        out.push(Import { module, name, kind });
    }
    Ok(out)
}

/// The export section's names, in order.
pub fn exports(wasm: &[u8], secs: &[Section]) -> Result<Vec<String>, String> {
    Ok(export_entries(wasm, secs)?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// The export section's entries, in order: each one's name and its bytes in `wasm`.
fn export_entries(wasm: &[u8], secs: &[Section]) -> Result<Vec<(String, Range<usize>)>, String> {
    let Some(section) = secs.iter().find(|s| s.id == 7) else {
        return Ok(Vec::new());
    };
    let bad = || "the export section is malformed".to_string();
    let mut r = Cursor {
        b: &wasm[section.body.clone()],
        at: 0,
    };
    let mut out = Vec::new();
    for _ in 0..r.leb().ok_or_else(bad)? {
        let start = r.at;
        let name = r.name().ok_or_else(bad)?;
        r.byte().ok_or_else(bad)?;
        r.leb().ok_or_else(bad)?;
        let at = section.body.start;
        out.push((name, at + start..at + r.at));
    }
    Ok(out)
}

/// The module without the exports `keep` refuses; returns it and the names dropped. An export
/// nothing calls keeps its item alive and, for a mutable global, keeps wasm-opt from taking the
/// global for the constant it is.
pub fn drop_exports(
    wasm: &[u8],
    keep: impl Fn(&str) -> bool,
) -> Result<(Vec<u8>, Vec<String>), String> {
    let secs = sections(wasm)?;
    let Some(section) = secs.iter().find(|s| s.id == 7) else {
        return Ok((wasm.to_vec(), Vec::new()));
    };
    let (mut kept, mut entries, mut dropped) = (0, Vec::new(), Vec::new());
    for (name, bytes) in export_entries(wasm, &secs)? {
        if keep(&name) {
            kept += 1;
            entries.extend_from_slice(&wasm[bytes]);
        } else {
            dropped.push(name);
        }
    }
    let mut contents = leb128_bytes(kept);
    contents.extend_from_slice(&entries);
    Ok((replace_section(wasm, section, &contents), dropped))
}

/// The name section's function names, by function index.
fn function_names(wasm: &[u8], secs: &[Section]) -> Result<HashMap<usize, String>, String> {
    let bad = || "the name section is malformed".to_string();
    for s in secs.iter().filter(|s| s.id == 0) {
        let mut r = Cursor {
            b: &wasm[s.body.clone()],
            at: 0,
        };
        let len = r.leb().ok_or_else(bad)?;
        if r.bytes(len) != Some(b"name") {
            continue;
        }
        while r.at < r.b.len() {
            let sub = r.byte().ok_or_else(bad)?;
            let size = r.leb().ok_or_else(bad)?;
            if sub != 1 {
                r.skip(size).ok_or_else(bad)?;
                continue;
            }
            let mut names = HashMap::new();
            for _ in 0..r.leb().ok_or_else(bad)? {
                let index = r.leb().ok_or_else(bad)?;
                let len = r.leb().ok_or_else(bad)?;
                let name = r.bytes(len).ok_or_else(bad)?;
                names.insert(index, String::from_utf8_lossy(name).into_owned());
            }
            return Ok(names);
        }
    }
    Err(
        "the module has no function names (wasm-bindgen keeps them; run this before wasm-opt)"
            .into(),
    )
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let x = *self.b.get(self.at)?;
        self.at += 1;
        Some(x)
    }
    fn leb(&mut self) -> Option<usize> {
        let (v, n) = leb128(self.b.get(self.at..)?)?;
        self.at += n;
        Some(v)
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes(n).map(drop)
    }
    /// A name: its length, then as many bytes of UTF-8.
    fn name(&mut self) -> Option<String> {
        let len = self.leb()?;
        String::from_utf8(self.bytes(len)?.to_vec()).ok()
    }
    /// A table's or memory's limits: flags, minimum, and a maximum when flag 1 is set.
    fn limits(&mut self) -> Option<()> {
        let flags = self.byte()?;
        self.leb()?;
        if flags & 1 != 0 {
            self.leb()?;
        }
        Some(())
    }
}

fn leb128_bytes(mut v: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let x = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(x);
            return out;
        }
        out.push(x | 0x80);
    }
}

/// `v` as a signed LEB128 (as `i32.const` writes it): one more byte than unsigned when the top
/// bit of the last group is set.
fn sleb128_bytes(v: usize) -> Vec<u8> {
    let mut out = leb128_bytes(v);
    if out.last().is_some_and(|b| b & 0x40 != 0) {
        *out.last_mut().unwrap() |= 0x80;
        out.push(0);
    }
    out
}

fn leb128(b: &[u8]) -> Option<(usize, usize)> {
    let mut v = 0usize;
    for (i, &x) in b.iter().enumerate().take(5) {
        v |= usize::from(x & 0x7f) << (7 * i);
        if x < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where [`module`]'s data segment goes in memory.
    const DATA_AT: usize = 1024;

    /// A module of one custom section holding `decoy` and one data section: one segment of
    /// `data` at [`DATA_AT`].
    fn module(decoy: &[u8], data: &[u8]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        m.extend(section(0, decoy));
        let mut segments = vec![1, 0, 0x41];
        segments.extend(leb128_bytes(DATA_AT));
        segments.push(0x0b);
        segments.extend(leb128_bytes(data.len()));
        segments.extend(data);
        m.extend(section(11, &segments));
        m
    }

    /// A panic location: the file's address and length, the line, the column.
    fn location(file: usize, len: usize, line: u32, col: u32) -> Vec<u8> {
        let mut l = Vec::new();
        for v in [file as u32, len as u32, line, col] {
            l.extend(v.to_le_bytes());
        }
        l
    }

    #[test]
    fn only_panic_text_in_the_data_section_is_zeroed() {
        let mut data = b"\x01src/core/view.rs\x07/rustc/ab/library/alloc/src/vec/mod.rs\
                     capacity overflowkeep.rs null pointer passed to rust"
            .to_vec();
        data.resize(data.len().next_multiple_of(4), 0xee);
        let records_at = data.len();
        data.extend(location(DATA_AT + 1, 16, 3, 4));
        data.extend(location(DATA_AT + 18, 38, 5, 6));
        let decoy = b"src/x.rs";
        let mut m = module(decoy, &data);
        let n = zero_panic_text(&mut m).unwrap();
        let paths = "src/core/view.rs".len() + "/rustc/ab/library/alloc/src/vec/mod.rs".len();
        assert_eq!(n.text, paths + "capacity overflow".len());
        assert_eq!((n.locations, n.digits), (2, false));
        let out = &m[m.len() - data.len()..];
        let expect: Vec<u8> = {
            let mut e = data.to_vec();
            for (s, len) in [(1, 16), (18, 38), (56, 17), (records_at, 32)] {
                e[s..s + len].fill(0);
            }
            e
        };
        assert_eq!(out, &expect[..]);
        // Outside the data section nothing changes; a `.rs` name without `src/` stays too.
        assert!(m.windows(decoy.len()).any(|w| w == decoy));
        assert!(m.windows(7).any(|w| w == b"keep.rs"));
    }

    /// A path starts where the locations naming it say, not where path characters start: a live
    /// string ending in one, right before it, keeps its tail. A path no location names stays.
    #[test]
    fn a_path_starts_where_its_locations_say() {
        let mut data = b"\x01main-src/core/view.rs\x02src/core/unnamed.rs".to_vec();
        data.resize(44, 0xee);
        data.extend(location(DATA_AT + 6, 16, 9, 9));
        data.extend(location(DATA_AT + 14, 8, 9, 9)); // its `view.rs`
        let mut m = module(b"", &data);
        let n = zero_panic_text(&mut m).unwrap();
        assert_eq!((n.text, n.locations), (16, 2));
        let out = &m[m.len() - data.len()..];
        assert_eq!(&out[..6], b"\x01main-");
        assert_eq!(&out[6..22], &[0; 16]);
        assert_eq!(&out[22..42], b"\x02src/core/unnamed.rs");
        assert_eq!(&out[44..], &[0; 32]);
    }

    /// A path at the start of a segment whose length byte reads as a path character (`0`: 48
    /// bytes) is cut to the segment: the segment's header stays, and the paths after it keep
    /// their own addresses (a candidate that started in the header once fell out of the list
    /// and shifted every path after it onto another's address).
    #[test]
    fn a_path_at_a_segment_s_start_stays_in_its_segment() {
        let mut a = b"src/core/a.rs".to_vec();
        a.resize(16, 0xee);
        a.extend(location(DATA_AT, 13, 1, 1));
        a.resize(48, 0xee);
        let mut b = b"\x01\x02src/core/b.rs".to_vec();
        b.resize(16, 0xee);
        b.extend(location(DATA_AT + 1024 + 2, 13, 2, 2));
        let mut segments = vec![2];
        for (at, data) in [(DATA_AT, &a), (DATA_AT + 1024, &b)] {
            segments.extend([0, 0x41]);
            segments.extend(sleb128_bytes(at));
            segments.push(0x0b);
            segments.extend(leb128_bytes(data.len()));
            segments.extend(data.iter());
        }
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        m.extend(section(11, &segments));
        let header = m.windows(14).position(|w| w == b"0src/core/a.rs").unwrap();
        let n = zero_panic_text(&mut m).unwrap();
        assert_eq!((n.text, n.locations), (26, 2));
        assert_eq!(m[header], b'0', "the first segment's length");
        assert_eq!(
            &m[header + 1..header + 17],
            &[&[0; 13][..], &[0xee; 3]].concat()[..]
        );
        assert_eq!(
            &m[m.len() - b.len()..][..16],
            &[&[1, 2][..], &[0; 13], &[0xee]].concat()[..]
        );
    }

    /// A panic location (file address and length, line, column) naming a zeroed path is zeroed;
    /// one whose file is not a zeroed path, only part of one, or not aligned to 4 stays.
    #[test]
    fn only_locations_of_zeroed_paths_are_zeroed() {
        let path = b"src/core/view.rs"; // at DATA_AT + 4
        let other = b"keep.rs"; // no `src/`: stays, at DATA_AT + 20
        let mut data = b"\x01\x02\x03\x04".to_vec();
        data.extend(path);
        data.extend(other);
        data.push(0); // DATA_AT + 27: align the records to 4
        let records = [
            location(DATA_AT + 4, path.len(), 412, 9),   // zeroed
            location(DATA_AT + 12, 8, 2, 3),             // its `view.rs`: zeroed too
            location(DATA_AT + 4, path.len() - 1, 5, 5), // stops short of `.rs`
            location(DATA_AT + 20, other.len(), 7, 7),   // not a zeroed path
        ];
        for r in &records {
            data.extend(r);
        }
        // At DATA_AT + 94: not a location, whatever it reads like.
        let misaligned = location(DATA_AT + 4, path.len(), 1, 1);
        data.extend([0xee, 0xee]);
        let start = data.len();
        data.extend(&misaligned);
        data.extend([0xee, 0xee]);
        let mut m = module(b"", &data);
        let locations = zero_panic_text(&mut m).unwrap().locations;
        assert_eq!(locations, 2);
        let out = &m[m.len() - data.len()..];
        let records_at = 28;
        assert_eq!(&out[records_at..records_at + 32], &[0; 32]);
        assert_eq!(
            &out[records_at + 32..records_at + 64],
            &records[2..].concat()[..]
        );
        assert_eq!(&out[start..start + 16], &misaligned[..]);
    }

    /// The digit-pair table is zeroed when no code or data points into it, and kept when code
    /// names an address in it (as `i32.const` does: signed LEB128) or data holds one.
    #[test]
    fn the_digit_table_goes_only_when_nothing_points_into_it() {
        let mut data = b"keep".to_vec();
        data.extend(DIGIT_PAIRS);
        let table = DATA_AT + 4;
        let with_code = |code: &[u8], data: &[u8]| {
            let mut m = module(b"", data);
            m.extend(section(10, code));
            m
        };
        let mut unread = with_code(&[1, 2, 3], &data);
        assert!(zero_panic_text(&mut unread).unwrap().digits);
        assert!(unread.windows(4).any(|w| w == b"keep"));
        assert!(!unread.windows(20).any(|w| w == &DIGIT_PAIRS[..20]));
        // `i32.const <table + 10>` in the code.
        let mut code = vec![0x41];
        code.extend(sleb128_bytes(table + 10));
        let mut read = with_code(&code, &data);
        assert!(!zero_panic_text(&mut read).unwrap().digits);
        assert!(read.windows(200).any(|w| w == DIGIT_PAIRS));
        // A pointer to it in the data.
        let mut pointed = data.clone();
        pointed.extend((table as u32).to_le_bytes());
        let mut m = with_code(&[1, 2, 3], &pointed);
        assert!(!zero_panic_text(&mut m).unwrap().digits);
    }

    #[test]
    fn signed_leb128_has_a_sign_bit_to_spare() {
        assert_eq!(sleb128_bytes(63), vec![63]);
        assert_eq!(sleb128_bytes(64), vec![0xc0, 0]);
        assert_eq!(sleb128_bytes(1_054_064), vec![0xf0, 0xaa, 0xc0, 0]);
        assert_eq!(sleb128_bytes(1_000_000), leb128_bytes(1_000_000));
        assert_eq!(sleb128_bytes(8192), vec![0x80, 0xc0, 0]);
    }

    /// Data segments that are not active at a constant address are refused, not misread.
    #[test]
    fn only_active_segments_at_a_constant_are_read() {
        let mut passive = b"\0asm\x01\0\0\0".to_vec();
        passive.extend(section(11, &[1, 1, 3, b'a', b'b', b'c']));
        assert!(zero_panic_text(&mut passive).is_err());
        let mut short = b"\0asm\x01\0\0\0".to_vec();
        short.extend(section(11, &[1, 0, 0x41, 8, 0x0b, 9, b'a']));
        assert!(zero_panic_text(&mut short).is_err());
    }

    #[test]
    fn only_the_exports_refused_are_dropped() {
        // The module of the snip tests, with an export section after its function section:
        // function 1, the memory, function 3, in that order.
        let m = functions(None, BODIES);
        let secs = sections(&m).unwrap();
        let at = secs.iter().find(|s| s.id == 3).unwrap().body.end;
        let mut entries = vec![3];
        for (n, kind, index) in [("keep_f", 0, 1), ("memory", 2, 0), ("drop_f", 0, 3)] {
            entries.extend(name(n));
            entries.extend_from_slice(&[kind, index]);
        }
        let m = [&m[..at], &section(7, &entries), &m[at..]].concat();
        let (out, dropped) = drop_exports(&m, |n| n != "drop_f").unwrap();
        assert_eq!(dropped, ["drop_f"]);
        assert_eq!(
            exports(&out, &sections(&out).unwrap()).unwrap(),
            ["keep_f", "memory"]
        );
        // The kept entries are byte for byte what they were; no other section changed.
        let mut kept = vec![2];
        kept.extend_from_slice(&entries[1..entries.len() - "drop_f".len() - 3]);
        assert_eq!(
            out,
            [&m[..at], &section(7, &kept), &m[at + entries.len() + 2..]].concat()
        );
        // Keeping every one changes nothing; a module without exports is returned as it is.
        assert_eq!(drop_exports(&m, |_| true).unwrap(), (m.clone(), vec![]));
        let bare = functions(None, BODIES);
        assert_eq!(
            drop_exports(&bare, |_| false).unwrap(),
            (bare.clone(), vec![])
        );
        // A truncated export section is an error, not a panic.
        let cut = [&m[..at], &[7, 4, 3, 6, b'k', b'e'][..]].concat();
        assert!(drop_exports(&cut, |_| true).is_err());
    }

    fn section(id: u8, contents: &[u8]) -> Vec<u8> {
        let mut s = vec![id];
        s.extend_from_slice(&leb128_bytes(contents.len()));
        s.extend_from_slice(contents);
        s
    }

    fn name(s: &str) -> Vec<u8> {
        let mut v = leb128_bytes(s.len());
        v.extend_from_slice(s.as_bytes());
        v
    }

    /// Imports one function, a memory and a table, then defines three functions named
    /// `names` (indices 1..=3) with bodies `bodies`; a custom section `decoy` sits before the
    /// code, the name section after it.
    fn functions(names: Option<[&str; 3]>, bodies: [&[u8]; 3]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        m.extend(section(1, &[1, 0x60, 0, 0]));
        let mut imports = vec![3];
        for (module, field, desc) in [
            ("m", "f", &[0u8, 0][..]),
            ("m", "mem", &[2, 1, 1, 2][..]),
            ("m", "t", &[1, 0x70, 0, 0x81, 0x01][..]),
        ] {
            imports.extend(name(module));
            imports.extend(name(field));
            imports.extend_from_slice(desc);
        }
        m.extend(section(2, &imports));
        m.extend(section(3, &[3, 0, 0, 0]));
        let mut decoy = name("decoy");
        decoy.extend_from_slice(b"core::panicking::panic");
        m.extend(section(0, &decoy));
        let mut code = vec![3];
        for body in bodies {
            code.extend(leb128_bytes(body.len()));
            code.extend_from_slice(body);
        }
        m.extend(section(10, &code));
        if let Some(names) = names {
            let mut sub = vec![3];
            for (i, n) in names.iter().enumerate() {
                sub.extend(leb128_bytes(i + 1));
                sub.extend(name(n));
            }
            let mut custom = name("name");
            // A module-name subsection first, which the pass skips.
            custom.extend(section(0, &name("hostlease")));
            custom.extend(section(1, &sub));
            m.extend(section(0, &custom));
        }
        m
    }

    const PANICS: &str = "core[c5930c85a12de822]::panicking::panic_bounds_check";
    const RETURNS: &str = "hostlease::core::view::HostView::handle_server::h1";
    const ASSERT: &str = "<alloc[3ca501edff3f0c7c]::vec::Vec<_, _>>::remove::assert_failed";
    /// Bodies: no locals, then `nop`s of differing counts, `end`.
    const BODIES: [&[u8]; 3] = [&[0, 1, 0x0b], &[0, 1, 1, 0x0b], &[0, 1, 1, 1, 0x0b]];

    #[test]
    fn only_the_functions_that_always_panic_become_a_trap() {
        let m = functions(Some([PANICS, RETURNS, ASSERT]), BODIES);
        let (out, snipped) = snip_panics(&m).unwrap();
        assert_eq!(snipped, [PANICS, ASSERT]);
        let trap: &[u8] = &[0, 0x00, 0x0b];
        let expect = functions(Some([PANICS, RETURNS, ASSERT]), [trap, BODIES[1], trap]);
        let code = |m: &[u8]| {
            let s = sections(m).unwrap();
            let c = s.iter().find(|s| s.id == 10).unwrap();
            m[c.start..c.body.end].to_vec()
        };
        assert_eq!(code(&out), code(&expect));
        assert_eq!(out.len(), m.len() - 2);
        // Every other section is as it was, in the same order.
        let others = |m: &[u8]| -> Vec<Vec<u8>> {
            let s = sections(m).unwrap();
            s.iter()
                .filter(|s| s.id != 10)
                .map(|s| m[s.start..s.body.end].to_vec())
                .collect()
        };
        assert_eq!(others(&out), others(&m));
        assert_eq!(sections(&out).unwrap().len(), sections(&m).unwrap().len());
    }

    #[test]
    fn snipping_needs_names_and_something_to_snip() {
        let unnamed = functions(None, BODIES);
        assert!(snip_panics(&unnamed)
            .unwrap_err()
            .contains("no function names"));
        let none = functions(Some([RETURNS, RETURNS, RETURNS]), BODIES);
        assert!(snip_panics(&none)
            .unwrap_err()
            .contains("no panicking function"));
        assert!(snip_panics(b"nope").is_err());
        // A body running past its section is an error, not a panic.
        let mut cut = functions(Some([PANICS, RETURNS, ASSERT]), BODIES);
        let code = sections(&cut)
            .unwrap()
            .into_iter()
            .find(|s| s.id == 10)
            .unwrap();
        cut[code.body.start + 1] = 0x7f;
        assert!(snip_panics(&cut).is_err());
    }

    #[test]
    fn the_list_names_functions_that_never_return() {
        for panics in [
            PANICS,
            ASSERT,
            "core[c5930c85a12de822]::slice::index::slice_index_fail",
            "core[c5930c85a12de822]::slice::index::slice_end_index_len_fail",
            "core[c5930c85a12de822]::option::expect_failed",
            "core[c5930c85a12de822]::cell::panic_already_borrowed",
            "alloc[3ca501edff3f0c7c]::raw_vec::capacity_overflow",
            "__rustc[b7974e8690430dd9]::__rdl_alloc_error_handler",
        ] {
            assert!(always_panics(panics), "{panics}");
        }
        for returns in [
            RETURNS,
            "<core[c5930c85a12de822]::fmt::Formatter>::pad_integral",
            "core[c5930c85a12de822]::slice::index::range",
            "<alloc[3ca501edff3f0c7c]::vec::Vec<_, _>>::remove",
            "hostlease::core::panicking::helper",
            "core[nothex]::panicking::panic",
        ] {
            assert!(!always_panics(returns), "{returns}");
        }
        assert_eq!(without_hashes("a[0f]::b[x]::c["), "a::b[x]::c[");
    }

    #[test]
    fn a_module_without_a_data_section_is_an_error() {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        assert!(zero_panic_text(&mut m).is_err());
        assert!(zero_panic_text(&mut b"nope".to_vec()).is_err());
    }
}
