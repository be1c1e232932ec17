//! A post-link pass over the bundle's `.wasm`: the text only a panic would read is zeroed.
//!
//! The bundle's panic handler (`src/web/mod.rs`) traps without looking at its `PanicInfo`, so
//! the messages of core's and alloc's panics and the source paths of panic locations are never
//! read. wasm-opt removes code, not bytes of a data segment, so they stayed: 474 bytes of paths
//! and 424 of messages, about 190 bytes brotli. Zeroed, they compress to almost nothing (as
//! `wasm-snip` does for code, this is for data). Text the JS glue shows (wasm-bindgen's own
//! errors) is not on the list and stays. The browser tests run the bundle after this pass.

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
];

/// Zeroes panic text in the data section of `wasm`; returns how many bytes.
pub fn zero_panic_text(wasm: &mut [u8]) -> Result<usize, String> {
    let range = data_section(wasm)?;
    let data = &mut wasm[range];
    let mut zeroed = 0;
    // Source paths: path characters up to a `.rs`, with a `src/` in them.
    let path_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-');
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
            data[start..end].fill(0);
            zeroed += end - start;
        }
        i = end;
    }
    for text in PANIC_TEXT {
        let mut at = 0;
        while let Some(p) = data[at..].windows(text.len()).position(|w| w == *text) {
            let s = at + p;
            data[s..s + text.len()].fill(0);
            zeroed += text.len();
            at = s + text.len();
        }
    }
    Ok(zeroed)
}

/// The byte range of the data section's contents.
fn data_section(wasm: &[u8]) -> Result<Range<usize>, String> {
    if wasm.get(..4) != Some(b"\0asm") {
        return Err("not a wasm module".into());
    }
    let mut i = 8;
    while i < wasm.len() {
        let id = wasm[i];
        let (size, n) = leb128(&wasm[i + 1..]).ok_or("a section's size is malformed")?;
        let body = i + 1 + n;
        let end = body
            .checked_add(size)
            .filter(|&e| e <= wasm.len())
            .ok_or("a section runs past the end")?;
        if id == 11 {
            return Ok(body..end);
        }
        i = end;
    }
    Err("the module has no data section".into())
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

    /// A module of one custom section holding `decoy` and one data section holding `data`.
    fn module(decoy: &[u8], data: &[u8]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        m.push(0);
        m.push(decoy.len() as u8);
        m.extend_from_slice(decoy);
        m.push(11);
        m.push(data.len() as u8);
        m.extend_from_slice(data);
        m
    }

    #[test]
    fn only_panic_text_in_the_data_section_is_zeroed() {
        let data = b"\x01src/core/view.rs\x07/rustc/ab/library/alloc/src/vec/mod.rs\
                     capacity overflowkeep.rs null pointer passed to rust";
        let decoy = b"src/x.rs";
        let mut m = module(decoy, data);
        let n = zero_panic_text(&mut m).unwrap();
        let paths = "src/core/view.rs".len() + "/rustc/ab/library/alloc/src/vec/mod.rs".len();
        assert_eq!(n, paths + "capacity overflow".len());
        let out = &m[m.len() - data.len()..];
        let expect: Vec<u8> = {
            let mut e = data.to_vec();
            for (s, len) in [(1, 16), (18, 38), (56, 17)] {
                e[s..s + len].fill(0);
            }
            e
        };
        assert_eq!(out, &expect[..]);
        // Outside the data section nothing changes; a `.rs` name without `src/` stays too.
        assert!(m.windows(decoy.len()).any(|w| w == decoy));
        assert!(m.windows(7).any(|w| w == b"keep.rs"));
    }

    #[test]
    fn a_module_without_a_data_section_is_an_error() {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        assert!(zero_panic_text(&mut m).is_err());
        assert!(zero_panic_text(&mut b"nope".to_vec()).is_err());
    }
}
