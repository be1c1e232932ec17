//! Short names for what the `.wasm` and its JS glue call each other by.
//!
//! wasm-bindgen names an import after the JS it calls plus a hash
//! (`__wbg_addEventListener_847fd86b8c33ec43`, 23 of them) and an export after the Rust item
//! (`driver_handleFrame`, `__wbindgen_malloc`, 27): about 1.4 KB of names, each written once in
//! the `.wasm` and again in the glue, where the hashes do not compress. wasm-opt's
//! `--minify-imports-and-exports-and-modules` renames them in the `.wasm` (`a`, `b`, ...; the
//! module too) and prints what it renamed; [`rename_in_glue`] makes the same renames in the
//! glue. About 800 bytes brotli, shared by the two files.
//!
//! Strict: a report line it does not know, an import the glue does not define exactly once, or a
//! `wasm.<export>` in the renamed glue that the module lacks is an error, so that a change in
//! wasm-bindgen's or wasm-opt's output stops the build instead of shipping a glue that cannot
//! link. The browser and Node suites then run the renamed pair.

use crate::strip::{exports, imports, sections};
use std::collections::{HashMap, HashSet};

/// wasm-opt's report of the renames.
#[derive(Debug, PartialEq)]
pub struct Renames {
    /// (module, old name, new name) per import.
    pub imports: Vec<(String, String, String)>,
    /// (old name, new name) per export.
    pub exports: Vec<(String, String)>,
}

/// Reads the report wasm-opt prints: `{ "imports": [ [module, old, new], ... ], "exports":
/// [ [old, new], ... ] }`, one entry per line.
pub fn parse_report(text: &str) -> Result<Renames, String> {
    let mut out = Renames {
        imports: Vec::new(),
        exports: Vec::new(),
    };
    let mut part = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line {
            "{" | "}" | "]," | "]" => continue,
            r#""imports": ["# => part = Some(3),
            r#""exports": ["# => part = Some(2),
            _ => {
                let entry = line.strip_suffix(',').unwrap_or(line);
                let inner = entry
                    .strip_prefix('[')
                    .and_then(|e| e.strip_suffix(']'))
                    .ok_or_else(|| format!("wasm-opt's rename report: unexpected line {line:?}"))?;
                let strings: Vec<&str> = inner
                    .split(", ")
                    .map(|s| unquote(s))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        format!("wasm-opt's rename report: unexpected entry {line:?}")
                    })?;
                match (part, strings.as_slice()) {
                    (Some(3), &[m, old, new]) if ident(old) && ident(new) => {
                        out.imports.push((m.into(), old.into(), new.into()))
                    }
                    (Some(2), &[old, new]) if ident(old) && ident(new) => {
                        out.exports.push((old.into(), new.into()))
                    }
                    _ => {
                        return Err(format!(
                            "wasm-opt's rename report: unexpected entry {line:?}"
                        ))
                    }
                }
            }
        }
    }
    if out.imports.is_empty() || out.exports.is_empty() {
        return Err("wasm-opt's rename report names no imports or no exports".into());
    }
    Ok(out)
}

fn unquote(s: &str) -> Option<&str> {
    let s = s.strip_prefix('"')?.strip_suffix('"')?;
    (!s.contains(['"', '\\'])).then_some(s)
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn ident(s: &str) -> bool {
    !s.is_empty() && !s.as_bytes()[0].is_ascii_digit() && s.bytes().all(is_ident_char)
}

/// Where an identifier of the glue stands.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// `wasm.<word>`: a call into the module (or a read of its memory or table).
    Call,
    /// `<word>:`: a key, as each import's in the imports object.
    Key,
    Other,
}

/// `glue` with each identifier that `f` gives a new name for replaced, in one pass.
fn rewrite_words<'g>(
    glue: &'g str,
    mut f: impl FnMut(&'g str, Place) -> Option<&'g str>,
) -> String {
    let b = glue.as_bytes();
    let mut out = String::with_capacity(glue.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if !is_ident_char(b[i]) || (i > 0 && is_ident_char(b[i - 1])) {
            i += 1;
            continue;
        }
        let end = i + b[i..].iter().take_while(|&&c| is_ident_char(c)).count();
        let place = if i >= 5 && &b[i - 5..i] == b"wasm." && (i == 5 || !is_ident_char(b[i - 6])) {
            Place::Call
        } else if b.get(end) == Some(&b':') {
            Place::Key
        } else {
            Place::Other
        };
        if let Some(new) = f(&glue[i..end], place) {
            out.push_str(&glue[copied..i]);
            out.push_str(new);
            copied = end;
        }
        i = end;
    }
    out.push_str(&glue[copied..]);
    out
}

/// The exports the glue calls (`wasm.<name>`), as wasm-bindgen wrote it.
pub fn glue_calls(glue: &str) -> HashSet<String> {
    let mut calls = HashSet::new();
    rewrite_words(glue, |word, place| {
        if place == Place::Call {
            calls.insert(word.to_string());
        }
        None
    });
    calls
}

/// The glue with the renames of `report` applied: each import's key in the imports object, the
/// module's key, and every `wasm.<export>`. `renamed` is the module wasm-opt wrote, checked
/// against the report and against what the renamed glue calls.
pub fn rename_in_glue(glue: &str, report: &Renames, renamed: &[u8]) -> Result<String, String> {
    let secs = sections(renamed)?;
    let wasm_imports = imports(renamed, &secs)?;
    let wasm_exports: HashSet<String> = exports(renamed, &secs)?.into_iter().collect();
    let new_module = match wasm_imports.first() {
        Some(i) if wasm_imports.iter().all(|j| j.module == i.module) => &i.module,
        _ => return Err("the renamed module's imports are not all from one module".into()),
    };
    let mut old_modules: Vec<&str> = report.imports.iter().map(|(m, ..)| m.as_str()).collect();
    old_modules.dedup();
    let [old_module] = old_modules[..] else {
        return Err(format!(
            "the report names {} import modules, not one",
            old_modules.len()
        ));
    };
    let reported: HashSet<&str> = report.imports.iter().map(|(_, _, n)| n.as_str()).collect();
    let actual: HashSet<&str> = wasm_imports.iter().map(|i| i.name.as_str()).collect();
    if reported != actual
        || report
            .exports
            .iter()
            .any(|(_, n)| !wasm_exports.contains(n))
    {
        return Err("wasm-opt's rename report does not match the module it wrote".into());
    }
    let import_map: HashMap<&str, &str> = report
        .imports
        .iter()
        .map(|(_, o, n)| (o.as_str(), n.as_str()))
        .collect();
    let export_map: HashMap<&str, &str> = report
        .exports
        .iter()
        .map(|(o, n)| (o.as_str(), n.as_str()))
        .collect();

    // The module's key, exactly once.
    let glue = replace_once(
        glue,
        &format!("\"{old_module}\":"),
        &format!("\"{new_module}\":"),
    )
    .ok_or_else(|| {
        format!("the glue does not name the import module {old_module:?} exactly once")
    })?;

    // One pass over the identifiers, so that no name is renamed twice.
    let mut keys_renamed: HashMap<&str, usize> = HashMap::new();
    let mut calls = Vec::new();
    let out = rewrite_words(&glue, |word, place| match place {
        Place::Call => {
            let new = export_map.get(word).copied();
            calls.push(new.unwrap_or(word).to_string());
            new
        }
        Place::Key => import_map
            .get(word)
            .copied()
            .inspect(|_| *keys_renamed.entry(word).or_default() += 1),
        Place::Other => None,
    });

    if let Some((_, old, _)) = report
        .imports
        .iter()
        .find(|(_, old, _)| keys_renamed.get(old.as_str()) != Some(&1))
    {
        return Err(format!(
            "the glue does not define the import {old} exactly once"
        ));
    }
    if let Some(missing) = calls.iter().find(|c| !wasm_exports.contains(c.as_str())) {
        return Err(format!(
            "the renamed glue calls wasm.{missing}, which the module does not export"
        ));
    }
    Ok(out)
}

/// Where the one `head` in `text` begins, through the end of the first `close` after it.
fn block(text: &str, head: &str, close: &str) -> Result<std::ops::Range<usize>, &'static str> {
    let [start] = text.match_indices(head).map(|(i, _)| i).collect::<Vec<_>>()[..] else {
        return Err("not there exactly once");
    };
    let body = start + head.len();
    let end = body + text[body..].find(close).ok_or("no end")? + close.len();
    Ok(start..end)
}

/// `text` with `from`, which must stand in it exactly once, replaced by `to`.
fn replace_once(text: &str, from: &str, to: &str) -> Option<String> {
    (text.matches(from).count() == 1).then(|| text.replacen(from, to, 1))
}

/// wasm-bindgen's `encodeInto` polyfill, as it writes it.
const POLYFILL: &str = "if (!('encodeInto' in cachedTextEncoder)) {\n    cachedTextEncoder.encodeInto = function (arg, view) {\n        const buf = cachedTextEncoder.encode(arg);\n        view.set(buf);\n        return {\n            read: arg.length,\n            written: buf.length\n        };\n    };\n}\n";

/// The `Driver`'s early free, as wasm-bindgen writes it: `free()`, `__destroy_into_raw()` (only
/// `free` calls it) and the `Symbol.dispose` alias of `free`.
const FREE: &str = "    __destroy_into_raw() {\n        const ptr = this.__wbg_ptr;\n        this.__wbg_ptr = 0;\n        DriverFinalization.unregister(this);\n        return ptr;\n    }\n    free() {\n        const ptr = this.__destroy_into_raw();\n";
const DISPOSE: &str =
    "if (Symbol.dispose) Driver.prototype[Symbol.dispose] = Driver.prototype.free;\n";

/// The glue without what the wrapper cannot reach: `initSync` (the wrapper loads the module with
/// the glue's async default export only, and the package exports its wrapper alone, `"."`), that
/// init's warning about deprecated parameters (the wrapper passes `{ module_or_path }` or
/// nothing), the `TextEncoder.encodeInto` polyfill (every browser that parses the wrapper,
/// ES2022 with private class fields, has `encodeInto`: Chrome 74, Firefox 66, Safari 14.1; Node
/// 12), and the `Driver`'s `free()` with its `Symbol.dispose` alias (the wrapper never frees its
/// driver early: `close()` stops it, and the glue's `FinalizationRegistry` frees it with its
/// room). Strict too: a glue not written as wasm-bindgen 0.2 writes them is an error.
pub fn drop_unreachable(glue: &str) -> Result<String, String> {
    const WARNED: &str = "        } else {\n            console.warn('using deprecated parameters for the initialization function; pass a single object instead')\n        }\n";
    const EXPORT: &str = "export { initSync, __wbg_init as default };";
    const START: &str = "\nfunction initSync(module) {\n";
    let err = |what: &str| {
        format!("wasm-bindgen's glue: {what}; what the wrapper cannot reach is not dropped")
    };
    let glue = replace_once(glue, EXPORT, "export { __wbg_init as default };")
        .ok_or_else(|| err(&format!("not one `{EXPORT}`")))?;
    let sync = block(&glue, START, "\n}\n").map_err(|e| err(&format!("initSync: {e}")))?;
    // (Through the function's `}`: the line break after it stays.)
    let out = format!("{}{}", &glue[..sync.start], &glue[sync.end - 1..]);
    if out.contains("initSync") {
        return Err(err("initSync is named elsewhere too"));
    }
    let out = replace_once(&out, WARNED, "        }\n")
        .ok_or_else(|| err("not one warning about the init's deprecated parameters"))?;
    let out = replace_once(&out, POLYFILL, "").ok_or_else(|| err("not one encodeInto polyfill"))?;
    let out = replace_once(&out, DISPOSE, "").ok_or_else(|| err("not one Symbol.dispose alias"))?;
    // `free()` to its end: one call into the module, then the method's close.
    const CLOSE: &str = "\n    }\n";
    let free = block(&out, FREE, CLOSE).map_err(|e| err(&format!("Driver.free(): {e}")))?;
    if out[free.start + FREE.len()..free.end - CLOSE.len()].contains('\n') {
        return Err(err("Driver.free() is longer than one call"));
    }
    let out = format!("{}{}", &out[..free.start], &out[free.end..]);
    if out.contains("__destroy_into_raw") || out.contains(".free") {
        return Err(err("Driver.free() is named elsewhere too"));
    }
    Ok(out)
}

/// wasm-bindgen's `passStringToWasm0`, up to the end of its `TextEncoder.encode` branch (taken
/// when no `realloc` is passed).
const PASS_STRING: &str = "function passStringToWasm0(arg, malloc, realloc) {\n    if (realloc === undefined) {\n        const buf = cachedTextEncoder.encode(arg);\n        const ptr = malloc(buf.length, 1) >>> 0;\n        getUint8ArrayMemory0().subarray(ptr, ptr + buf.length).set(buf);\n        WASM_VECTOR_LEN = buf.length;\n        return ptr;\n    }\n";
/// That branch alone.
const PASS_STRING_ENCODE: &str = "function passStringToWasm0(arg, malloc) {\n    const buf = cachedTextEncoder.encode(arg);\n    const ptr = malloc(buf.length, 1) >>> 0;\n    getUint8ArrayMemory0().subarray(ptr, ptr + buf.length).set(buf);\n    WASM_VECTOR_LEN = buf.length;\n    return ptr;\n}\n";
/// How the glue passes wasm-bindgen's `realloc` to it.
const PASS_REALLOC: &str = ", wasm.__wbindgen_realloc)";

/// The glue with every string passed into the module by `TextEncoder.encode` (one copy, native)
/// instead of by the glue's own loop over the string's ASCII prefix followed by
/// `encodeInto` into memory grown with the module's `realloc`: the loop goes, and the module's
/// `__wbindgen_realloc` export, which only that path called, is then not called and dropped
/// (`strip::drop_exports`). Strict: a glue whose `passStringToWasm0` does not start with that
/// branch as wasm-bindgen 0.2 writes it, or that names `__wbindgen_realloc` anywhere but in
/// its calls, is an error.
pub fn encode_strings(glue: &str) -> Result<String, String> {
    let err = |what: &str| format!("wasm-bindgen's glue: {what}; strings not passed by encode()");
    let f =
        block(glue, PASS_STRING, "\n}\n").map_err(|e| err(&format!("passStringToWasm0: {e}")))?;
    let out = format!("{}{PASS_STRING_ENCODE}{}", &glue[..f.start], &glue[f.end..]);
    let calls = out.matches("passStringToWasm0(").count() - 1;
    if calls == 0 || out.matches(PASS_REALLOC).count() != calls {
        return Err(err("not every call passes wasm.__wbindgen_realloc"));
    }
    let out = out.replace(PASS_REALLOC, ")");
    if out.contains("realloc") {
        return Err(err("realloc is named elsewhere too"));
    }
    Ok(out)
}

/// wasm-bindgen's warning for a `.wasm` served without the `application/wasm` type (streaming
/// compilation fails; the glue falls back to a slower `WebAssembly.instantiate`).
const MIME_WARNING: &str = "console.warn(\"`WebAssembly.instantiateStreaming` failed because your server does not serve Wasm with `application/wasm` MIME type. Falling back to `WebAssembly.instantiate` which is slower. Original error:\\n\", e);";

/// The glue with that warning said in fewer words (the same advice and the error, −52 bytes of
/// brotli). A glue without it, as wasm-bindgen 0.2 writes it, is an error.
pub fn shorten_warning(glue: &str) -> Result<String, String> {
    replace_once(
        glue,
        MIME_WARNING,
        "console.warn(\"hostlease: the .wasm is not served as application/wasm (a slower load):\", e);",
    )
    .ok_or_else(|| "wasm-bindgen's glue: not one warning about the .wasm's MIME type".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"{
 "imports": [
  ["./m_bg.js", "__wbg_send_cd51063ca1be4d0f", "a"],
  ["./m_bg.js", "__wbindgen_init_externref_table", "b"]
 ],
"exports": [
  ["driver_new", "A"],
  ["memory", "x"],
  ["__wbindgen_unused", "B"]
 ]
}
"#;

    const GLUE: &str = r#"function imports() {
    const import0 = {
        __wbg_send_cd51063ca1be4d0f: function(a0, a1) { a0.send(s(a1)); },
        __wbindgen_init_externref_table: function() { const t = wasm.__wbindgen_externrefs; },
    };
    return { "./m_bg.js": import0 };
}
export class Driver { constructor() { this.p = wasm.driver_new(); } }
const mem = () => wasm.memory.buffer; const driver_new = 1; const o = { memory: 2 };
/** Text wasm-bindgen copies from doc comments, any UTF-8 (——x), before a call: */ wasm.driver_new();
"#;

    /// A module importing `names` from module `m` and exporting `exports` (all functions of
    /// type 0; nothing is checked past the two sections).
    fn module(m: &str, names: &[&str], exports: &[&str]) -> Vec<u8> {
        let name = |s: &str| {
            let mut v = vec![s.len() as u8];
            v.extend_from_slice(s.as_bytes());
            v
        };
        let section = |id: u8, entries: Vec<Vec<u8>>| {
            let mut body = vec![entries.len() as u8];
            entries.iter().for_each(|e| body.extend(e));
            let mut s = vec![id, body.len() as u8];
            s.extend(body);
            s
        };
        let mut out = b"\0asm\x01\0\0\0".to_vec();
        out.extend(section(
            2,
            names
                .iter()
                .map(|n| [name(m), name(n), vec![0, 0]].concat())
                .collect(),
        ));
        out.extend(section(
            7,
            exports
                .iter()
                .map(|n| [name(n), vec![0, 0]].concat())
                .collect(),
        ));
        out
    }

    #[test]
    fn the_report_is_read_strictly() {
        let r = parse_report(REPORT).unwrap();
        assert_eq!(
            r.imports[1],
            (
                "./m_bg.js".into(),
                "__wbindgen_init_externref_table".into(),
                "b".into()
            )
        );
        assert_eq!(
            r.exports,
            [
                ("driver_new".into(), "A".into()),
                ("memory".into(), "x".into()),
                ("__wbindgen_unused".into(), "B".into())
            ]
        );
        for bad in [
            REPORT.replace(r#""a"]"#, r#""a", "z"]"#),
            REPORT.replace(r#""A"]"#, r#""A b"]"#),
            REPORT.replace("\"exports\": [", "\"other\": ["),
            REPORT.replace(r#""x"]"#, r#""x\"y"]"#),
            "{\n}\n".to_string(),
        ] {
            assert!(parse_report(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_glue_gets_the_same_renames_and_nothing_else() {
        let r = parse_report(REPORT).unwrap();
        let wasm = module("a", &["a", "b"], &["A", "x", "B", "__wbindgen_externrefs"]);
        let glue = rename_in_glue(GLUE, &r, &wasm).unwrap();
        assert_eq!(
            glue,
            GLUE.replace("__wbg_send_cd51063ca1be4d0f:", "a:")
                .replace("__wbindgen_init_externref_table:", "b:")
                .replace("\"./m_bg.js\":", "\"a\":")
                .replace("wasm.driver_new()", "wasm.A()")
                .replace("wasm.memory.buffer", "wasm.x.buffer")
        );
        // What the glue calls, before the renames (the exports kept in the module).
        let calls = glue_calls(GLUE);
        let expect = ["__wbindgen_externrefs", "driver_new", "memory"];
        assert_eq!(calls, expect.into_iter().map(String::from).collect());
        // Names that are not imports' keys or calls into the module stay (`driver_new = 1`,
        // `{ memory: 2 }`), and an export the report renames but the glue never calls is fine.
        assert!(glue.contains("const driver_new = 1") && glue.contains("{ memory: 2 }"));
    }

    #[test]
    fn what_the_wrapper_cannot_reach_is_dropped_and_nothing_else() {
        let warned = "        if (o) {\n            ({m} = m)\n        } else {\n            console.warn('using deprecated parameters for the initialization function; pass a single object instead')\n        }\n";
        let glue = format!("export class Driver {{\n{FREE}        wasm.y(ptr, 0);\n    }}\n    close() {{\n        wasm.z(this.__wbg_ptr);\n    }}\n}}\n{DISPOSE}function a() {{\n    if (x) {{\n        return 1;\n    }}\n}}\n\nfunction initSync(module) {{\n    if (wasm !== undefined) return wasm;\n    if (m) {{\n        warn('initSync()');\n    }}\n    return f(module);\n}}\n\nasync function i(m) {{\n{warned}}}\nconst cachedTextEncoder = new TextEncoder();\n\n{POLYFILL}\nlet p;\nexport {{ initSync, __wbg_init as default }};\n");
        assert_eq!(
            drop_unreachable(&glue).unwrap(),
            "export class Driver {\n    close() {\n        wasm.z(this.__wbg_ptr);\n    }\n}\nfunction a() {\n    if (x) {\n        return 1;\n    }\n}\n\n\nasync function i(m) {\n        if (o) {\n            ({m} = m)\n        }\n}\nconst cachedTextEncoder = new TextEncoder();\n\n\nlet p;\nexport { __wbg_init as default };\n"
        );
        for bad in [
            glue.replace("export { initSync, ", "export { "),
            glue.replace("function initSync(module)", "function initSync(m)"),
            glue.replace("let p;", "let p = initSync;"),
            glue.replace("    return f(module);\n}\n", "    return f(module);\n"),
            glue.replace(
                "deprecated parameters for the",
                "deprecated parameters for an",
            ),
            glue.replace("view.set(buf);", "view.set(buf, 0);"),
            glue.replace("if (Symbol.dispose) ", "if (Symbol.asyncDispose) "),
            glue.replace("wasm.y(ptr, 0);\n", "wasm.y(ptr, 0);\n        more();\n"),
            glue.replace("let p;", "let p = d.free();"),
            glue.replace("    free() {\n", "    release() {\n"),
        ] {
            assert!(drop_unreachable(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn strings_are_passed_by_encode_and_realloc_is_no_longer_named() {
        let loop_ = "\n    let len = arg.length;\n    if (x) {\n        ptr = realloc(ptr, len, offset, 1) >>> 0;\n    }\n    return ptr;\n}\n";
        let glue = format!("a(passStringToWasm0(s, wasm.__wbindgen_malloc, wasm.__wbindgen_realloc));\n{PASS_STRING}{loop_}\nb(passStringToWasm0(t, wasm.__wbindgen_malloc, wasm.__wbindgen_realloc));\n");
        assert_eq!(
            encode_strings(&glue).unwrap(),
            format!("a(passStringToWasm0(s, wasm.__wbindgen_malloc));\n{PASS_STRING_ENCODE}\nb(passStringToWasm0(t, wasm.__wbindgen_malloc));\n")
        );
        for bad in [
            glue.replace(
                "b(passStringToWasm0(t, wasm.__wbindgen_malloc, wasm.__wbindgen_realloc))",
                "b(passStringToWasm0(t, wasm.__wbindgen_malloc))",
            ),
            glue.replace(
                "const buf = cachedTextEncoder.encode(arg);",
                "const buf = enc(arg);",
            ),
            glue.replace("if (realloc === undefined)", "if (!realloc)"),
            format!("{glue}const r = wasm.__wbindgen_realloc;\n"),
            format!("{glue}{glue}"),
        ] {
            assert!(encode_strings(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_mime_type_warning_is_shortened_and_nothing_else() {
        let glue = format!("if (a) {{\n    {MIME_WARNING}\n}} else {{ throw e; }}\n");
        assert_eq!(
            shorten_warning(&glue).unwrap(),
            "if (a) {\n    console.warn(\"hostlease: the .wasm is not served as application/wasm (a slower load):\", e);\n} else { throw e; }\n"
        );
        assert!(shorten_warning(&glue.replace("is slower", "is slow")).is_err());
        assert!(shorten_warning(&format!("{glue}{glue}")).is_err());
    }

    #[test]
    fn a_glue_or_module_that_does_not_match_the_report_is_an_error() {
        let r = parse_report(REPORT).unwrap();
        let wasm = module("a", &["a", "b"], &["A", "x", "B", "__wbindgen_externrefs"]);
        let cases = [
            // An import the glue does not define, or defines twice.
            (
                GLUE.replace("__wbg_send_cd51063ca1be4d0f:", "other:"),
                wasm.clone(),
            ),
            (
                GLUE.replace(
                    "const import0 = {",
                    "const import0 = { __wbg_send_cd51063ca1be4d0f: 1,",
                ),
                wasm.clone(),
            ),
            // The module key missing.
            (
                GLUE.replace("\"./m_bg.js\":", "\"./other.js\":"),
                wasm.clone(),
            ),
            // The glue calls an export the module lacks.
            (GLUE.replace("wasm.memory", "wasm.table"), wasm.clone()),
            (GLUE.to_string(), module("a", &["a", "b"], &["A", "x", "B"])),
            // The module's imports are not the report's.
            (
                GLUE.to_string(),
                module("a", &["a", "c"], &["A", "x", "B", "__wbindgen_externrefs"]),
            ),
            (
                GLUE.to_string(),
                module("a", &["a", "b"], &["A", "x", "__wbindgen_externrefs"]),
            ),
        ];
        for (glue, wasm) in cases {
            assert!(rename_in_glue(&glue, &r, &wasm).is_err(), "{glue}");
        }
    }
}
