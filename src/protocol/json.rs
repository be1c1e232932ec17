//! The JSON the protocol needs, read and written by hand: a pull reader over the frame's text, a
//! writer into a `String`, and [`Json`], an app's payload kept as the validated text it came as.
//!
//! Why not serde: in the browser build serde_json and the derives' generic code were ~100 KB of
//! the ~225 KB of wasm, and float formatting came along for its error messages although the
//! protocol has no floats. The protocol's shapes are few and fixed (objects of strings, `u64`s,
//! booleans, arrays and nested objects), so a reader that knows them is small. It follows
//! RFC 8259 strictly, as serde_json does: no trailing commas, no leading zeros, no control
//! characters or lone surrogates in strings, nesting at most [`MAX_DEPTH`] deep, nothing after
//! the value.
//!
//! Error positions are byte offsets, turned into a line and column only when reported.

use crate::prelude::*;
use alloc::borrow::Cow;
use core::fmt;

/// Deepest nesting of arrays and objects accepted anywhere (serde_json's default is 128 too).
pub const MAX_DEPTH: u32 = 128;

/// A byte offset where the text stopped making sense; [`super::DecodeError::Malformed`] turns
/// it into a line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntaxError(pub(crate) usize);

pub(crate) type Result<T> = core::result::Result<T, SyntaxError>;

/// A position of a [`Reader`] (byte offset and nesting depth).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark(usize, u32);

/// Reads one JSON text, value by value, without building a tree.
pub struct Reader<'a> {
    text: &'a str,
    pos: usize,
    depth: u32,
}

impl<'a> Reader<'a> {
    pub fn new(text: &'a str) -> Self {
        Self {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// Where the reader is, to [`rewind`](Self::rewind) to (a tagged object is read in two
    /// passes, and an error is reported where its value began).
    pub(crate) fn pos(&self) -> Mark {
        Mark(self.pos, self.depth)
    }

    pub(crate) fn rewind(&mut self, mark: Mark) {
        self.pos = mark.0;
        self.depth = mark.1;
    }

    pub(crate) fn error<T>(&self) -> Result<T> {
        Err(SyntaxError(self.pos))
    }

    /// The text from `start` to here. Both ends are always at ASCII bytes; `str::get` rather
    /// than indexing keeps the panic path (and the `Debug` formatting it drags along, ~5 KB of
    /// wasm) out of the build.
    fn slice(&self, start: usize) -> Result<&'a str> {
        self.text
            .get(start..self.pos)
            .map_or_else(|| self.error(), Ok)
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// Skips whitespace and returns the next byte without taking it.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes().get(self.pos) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(b);
            }
            self.pos += 1;
        }
        None
    }

    fn eat(&mut self, b: u8) -> Result<()> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            self.error()
        }
    }

    fn literal(&mut self, word: &str) -> Result<()> {
        if self.bytes()[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            self.error()
        }
    }

    /// Only whitespace is left.
    pub fn end(&mut self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => self.error(),
        }
    }

    /// `null` is next: takes it.
    pub fn null(&mut self) -> bool {
        if self.peek() == Some(b'n') && self.literal("null").is_ok() {
            return true;
        }
        false
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.peek() {
            Some(b't') => self.literal("true").map(|()| true),
            Some(b'f') => self.literal("false").map(|()| false),
            _ => self.error(),
        }
    }

    /// A non-negative integer that fits a `u64`; a fraction, exponent or sign is an error.
    pub fn u64(&mut self) -> Result<u64> {
        self.peek();
        let start = self.pos;
        let mut n: u64 = 0;
        while let Some(&b @ b'0'..=b'9') = self.bytes().get(self.pos) {
            if self.pos > start && self.bytes()[start] == b'0' {
                return self.error();
            }
            n = match n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(b - b'0')))
            {
                Some(n) => n,
                None => return self.error(),
            };
            self.pos += 1;
        }
        match self.bytes().get(self.pos) {
            _ if self.pos == start => self.error(),
            Some(b'.' | b'e' | b'E') => self.error(),
            _ => Ok(n),
        }
    }

    /// A string, borrowed from the text when it has no escapes.
    pub fn str(&mut self) -> Result<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.pos;
        let bytes = self.bytes();
        loop {
            match bytes.get(self.pos) {
                None => return self.error(),
                Some(b'"') => {
                    let s = self.slice(start)?;
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(&b) if b < 0x20 => return self.error(),
                Some(_) => self.pos += 1,
            }
        }
        let mut out = String::from(self.slice(start)?);
        loop {
            match bytes.get(self.pos) {
                None => return self.error(),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = match bytes.get(self.pos) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            out.push(self.unicode_escape()?);
                            continue;
                        }
                        _ => return self.error(),
                    };
                    self.pos += 1;
                    out.push(c);
                }
                Some(&b) if b < 0x20 => return self.error(),
                Some(_) => {
                    // Copy the run up to the next quote or escape in one go (it is valid UTF-8:
                    // both delimiters are ASCII).
                    let run = self.pos;
                    while !matches!(bytes.get(self.pos), None | Some(b'"' | b'\\' | 0..=0x1f)) {
                        self.pos += 1;
                    }
                    out.push_str(self.slice(run)?);
                }
            }
        }
    }

    /// After `\u`: four hex digits, and for a high surrogate the `\uXXXX` of its low half.
    fn unicode_escape(&mut self) -> Result<char> {
        let hi = self.hex4()?;
        let code = match hi {
            0xD800..=0xDBFF => {
                if !self.bytes()[self.pos..].starts_with(b"\\u") {
                    return self.error();
                }
                self.pos += 2;
                let lo = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return self.error();
                }
                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
            }
            0xDC00..=0xDFFF => return self.error(),
            _ => hi,
        };
        char::from_u32(code).map_or_else(|| self.error(), Ok)
    }

    fn hex4(&mut self) -> Result<u32> {
        let Some(digits) = self.bytes().get(self.pos..self.pos + 4) else {
            return self.error();
        };
        let mut n = 0;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return self.error(),
            };
            n = n * 16 + u32::from(v);
        }
        self.pos += 4;
        Ok(n)
    }

    fn enter(&mut self, open: u8) -> Result<()> {
        self.eat(open)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error();
        }
        Ok(())
    }

    /// An object: `entry` is called with each key and must read (or [`skip`](Self::skip)) its
    /// value.
    pub fn object(&mut self, mut entry: impl FnMut(&mut Self, &str) -> Result<()>) -> Result<()> {
        self.list(b'{', b'}', &mut |r| {
            let key = r.str()?;
            r.eat(b':')?;
            entry(r, &key)
        })
    }

    /// An array: `item` is called for each element and must read it.
    pub fn array(&mut self, mut item: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.list(b'[', b']', &mut item)
    }

    /// `open`, then `item`s separated by commas, then `close`. Not generic: one copy of the loop
    /// for every caller (the closures differ, the loop does not).
    fn list(
        &mut self,
        open: u8,
        close: u8,
        item: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        self.enter(open)?;
        if self.peek() != Some(close) {
            loop {
                item(self)?;
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(c) if c == close => break,
                    _ => return self.error(),
                }
            }
        }
        self.pos += 1;
        self.depth -= 1;
        Ok(())
    }

    /// Checks and passes over any one value; returns its text.
    pub fn skip(&mut self) -> Result<&'a str> {
        let start = match self.peek() {
            Some(_) => self.pos,
            None => return self.error(),
        };
        match self.bytes()[start] {
            b'{' => self.object(|r, _| r.skip().map(drop))?,
            b'[' => self.array(|r| r.skip().map(drop))?,
            b'"' => {
                self.str()?;
            }
            b't' | b'f' => {
                self.bool()?;
            }
            b'n' if self.null() => {}
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return self.error(),
        }
        self.slice(start)
    }

    /// Any JSON number (only checked, never converted).
    fn number(&mut self) -> Result<()> {
        let bytes = self.bytes();
        let digits = |r: &mut Self| {
            let start = r.pos;
            while matches!(bytes.get(r.pos), Some(b'0'..=b'9')) {
                r.pos += 1;
            }
            if r.pos == start {
                r.error()
            } else {
                Ok(start)
            }
        };
        if bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        let int = digits(self)?;
        if bytes[int] == b'0' && self.pos - int > 1 {
            return self.error();
        }
        if bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            digits(self)?;
        }
        if matches!(bytes.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(bytes.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            digits(self)?;
        }
        Ok(())
    }
}

/// Writes JSON into a `String`. Separators are placed by looking at the last byte written, so
/// callers only say where keys and array items begin.
#[derive(Default)]
pub struct Writer {
    out: String,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `bytes` before the first reallocation.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            out: String::with_capacity(bytes),
        }
    }

    pub fn finish(self) -> String {
        self.out
    }

    fn sep(&mut self) {
        if !matches!(self.out.as_bytes().last(), None | Some(b'{' | b'[' | b':')) {
            self.out.push(',');
        }
    }

    pub fn open(&mut self) {
        self.sep();
        self.out.push('{');
    }

    pub fn close(&mut self) {
        self.out.push('}');
    }

    pub fn open_array(&mut self) {
        self.sep();
        self.out.push('[');
    }

    pub fn close_array(&mut self) {
        self.out.push(']');
    }

    /// An entry of the object being written: `key` and its value.
    pub fn field<T: ToJson + ?Sized>(&mut self, key: &str, value: &T) {
        self.key(key);
        value.write_json(self);
    }

    /// The key of the next entry; its value follows.
    pub fn key(&mut self, key: &str) {
        self.sep();
        self.quoted(key);
        self.out.push(':');
    }

    /// A string, escaped as serde_json escapes it (quote, backslash and control characters).
    pub fn str(&mut self, s: &str) {
        self.sep();
        self.quoted(s);
    }

    fn quoted(&mut self, s: &str) {
        self.out.push('"');
        let mut run = 0;
        for (i, b) in s.bytes().enumerate() {
            let esc = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            // `i` and `run` sit at ASCII bytes, so `get` always succeeds (see `Reader::slice`).
            self.out.push_str(s.get(run..i).unwrap_or_default());
            if esc.is_empty() {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                self.out.push_str("\\u00");
                self.out.push(char::from(HEX[usize::from(b >> 4)]));
                self.out.push(char::from(HEX[usize::from(b & 15)]));
            } else {
                self.out.push_str(esc);
            }
            run = i + 1;
        }
        self.out.push_str(s.get(run..).unwrap_or_default());
        self.out.push('"');
    }

    pub fn u64(&mut self, n: u64) {
        self.sep();
        push_u64(&mut self.out, n);
    }

    /// Nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    pub fn bool(&mut self, b: bool) {
        self.sep();
        self.out.push_str(if b { "true" } else { "false" });
    }

    pub fn null(&mut self) {
        self.sep();
        self.out.push_str("null");
    }

    /// Text that is already one JSON value.
    pub fn raw(&mut self, json: &Json) {
        self.sep();
        self.out.push_str(&json.0);
    }
}

/// Appends `n` in decimal (without `core::fmt`, which the browser build otherwise barely needs).
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(buf[i..].iter().map(|&d| char::from(d)));
}

/// Appends `n` as 16 lowercase hex digits.
pub fn push_hex16(out: &mut String, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        (0..16)
            .rev()
            .map(|i| char::from(HEX[((n >> (i * 4)) & 15) as usize])),
    );
}

/// A value written as JSON.
pub trait ToJson {
    fn write_json(&self, w: &mut Writer);
}

/// A value read from JSON.
pub trait FromJson: Sized {
    fn read_json(r: &mut Reader<'_>) -> Result<Self>;
}

/// One JSON value kept as its text: an app's command payload, event payload or signalling data.
/// The protocol never looks inside; it is checked to be exactly one well-formed value and passed
/// on byte for byte (without the whitespace around it).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Json(Box<str>);

impl Json {
    /// `null`.
    pub fn null() -> Self {
        Self("null".into())
    }

    /// Checks that `text` is one JSON value.
    pub fn parse(text: &str) -> core::result::Result<Self, SyntaxError> {
        from_str(text)
    }

    /// `{"<key>": "<value>"}`.
    pub fn object_of_str(key: &str, value: &str) -> Self {
        let mut w = Writer::new();
        w.open();
        w.key(key);
        w.str(value);
        w.close();
        Self(w.finish().into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_null(&self) -> bool {
        &*self.0 == "null"
    }

    /// How deeply arrays and objects nest in it (0 for a scalar).
    pub fn depth(&self) -> usize {
        let (mut depth, mut deepest, mut in_str, mut escaped) = (0usize, 0usize, false, false);
        for b in self.0.bytes() {
            if in_str {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    /// The string value of `key` when this is an object that has it once (a built-in action's
    /// argument, such as `host.transfer`'s `to`). A key given twice answers `None`: readers
    /// differ on which one counts (`JSON.parse` and serde_json take the last), and the payload
    /// is stored and passed on as it came.
    pub fn get_str(&self, key: &str) -> Option<String> {
        let mut found = None;
        Reader::new(&self.0)
            .object(|r, k| {
                if k != key {
                    return r.skip().map(drop);
                }
                if found.is_some() {
                    return r.error();
                }
                found = Some(r.str()?.into_owned());
                Ok(())
            })
            .ok()?;
        found
    }
}

#[cfg(feature = "serde")]
impl From<serde_json::Value> for Json {
    fn from(v: serde_json::Value) -> Self {
        // serde_json writes one compact, valid JSON value.
        Self(v.to_string().into())
    }
}

#[cfg(feature = "serde")]
impl Json {
    /// The value, for a server that looks inside (`None`: a number beyond `f64`, which the
    /// grammar allows and serde_json refuses).
    pub fn value(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.0).ok()
    }
}

impl Default for Json {
    fn default() -> Self {
        Self::null()
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromJson for Json {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        r.skip().map(|text| Self(text.into()))
    }
}

impl ToJson for Json {
    fn write_json(&self, w: &mut Writer) {
        w.raw(self);
    }
}

/// Encodes one value.
pub fn to_string<T: ToJson + ?Sized>(value: &T) -> String {
    let mut w = Writer::new();
    value.write_json(&mut w);
    w.finish()
}

/// Decodes one value from the whole of `text`.
pub fn from_str<T: FromJson>(text: &str) -> core::result::Result<T, SyntaxError> {
    from_str_within(text, MAX_DEPTH)
}

/// Decodes one value from the whole of `text`, nesting at most `max_depth` deep (at most
/// [`MAX_DEPTH`]): a value that must leave room for the frames that carry it.
pub fn from_str_within<T: FromJson>(
    text: &str,
    max_depth: u32,
) -> core::result::Result<T, SyntaxError> {
    let mut r = Reader::new(text);
    r.depth = MAX_DEPTH.saturating_sub(max_depth);
    let v = T::read_json(&mut r)?;
    r.end()?;
    Ok(v)
}

/// Line and column (both from 1, the column in bytes) of byte `pos` of `text`.
pub(crate) fn line_column(text: &str, pos: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..pos.min(text.len())];
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let column = 1 + before.len()
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(text: &str) -> bool {
        Json::parse(text).is_ok()
    }

    #[test]
    fn accepts_rfc_8259_values() {
        for ok in [
            "null",
            "true",
            "false",
            "0",
            "-0",
            "12",
            "-1.5e+3",
            "1E-2",
            "0.25",
            "\"\"",
            "\"a\\u00e9\\ud83d\\ude00\\n\"",
            "[]",
            "{}",
            " [1, {\"a\": [null]}] ",
            "\"é😀\"",
        ] {
            assert!(valid(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_what_rfc_8259_does_not_allow() {
        for bad in [
            "",
            " ",
            "nul",
            "tru",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "[1,]",
            "{\"a\":1,}",
            "{a:1}",
            "[1 2]",
            "1 2",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"a\nb\"",
            "\"unterminated",
            "{\"a\"}",
            "[",
            "{",
            "NaN",
            "Infinity",
            "'a'",
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(valid(&deep(MAX_DEPTH as usize)));
        for (text, depth) in [
            ("1", 0),
            (r#""[{""#, 0),
            ("[]", 1),
            (r#"{"a":[1,{"b":"]}\\"}],"c":{}}"#, 3),
            (r#"["\"[",[[]]]"#, 3),
        ] {
            assert_eq!(Json::parse(text).unwrap().depth(), depth, "{text}");
        }
        assert_eq!(
            Json::parse(&deep(MAX_DEPTH as usize)).unwrap().depth(),
            MAX_DEPTH as usize
        );
        assert!(!valid(&deep(MAX_DEPTH as usize + 1)));
    }

    #[test]
    fn u64_takes_integers_only() {
        let read = |t: &str| from_str::<u64>(t);
        assert_eq!(read("0"), Ok(0));
        assert_eq!(read(" 18446744073709551615 "), Ok(u64::MAX));
        for bad in [
            "18446744073709551616",
            "-1",
            "1.0",
            "1e3",
            "01",
            "\"1\"",
            "",
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn strings_round_trip_through_writer_and_reader() {
        let samples = [
            "",
            "plain",
            "quote \" back \\ slash",
            "\u{0}\u{1f}\n\r\t\u{8}\u{c}",
            "é 😀 /",
        ];
        for s in samples {
            let text = to_string(s);
            assert_eq!(text, serde_like_escape(s), "{s:?}");
            assert_eq!(from_str::<String>(&text).unwrap(), s);
        }
    }

    /// What serde_json writes for a string (checked against it in the protocol tests).
    fn serde_like_escape(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn payload_text_is_kept_without_surrounding_space() {
        assert_eq!(
            Json::parse("  {\"a\" : 1}\n").unwrap().as_str(),
            "{\"a\" : 1}"
        );
        assert_eq!(
            Json::object_of_str("to", "b\"").get_str("to").as_deref(),
            Some("b\"")
        );
        assert_eq!(Json::parse("[\"to\"]").unwrap().get_str("to"), None);
        assert_eq!(Json::parse("{\"to\":1}").unwrap().get_str("to"), None);
        let twice = Json::parse("{\"to\":\"alice\",\"x\":[1],\"to\":\"bob\"}").unwrap();
        assert_eq!(twice.get_str("to"), None);
        let once = Json::parse("{\"x\":{\"to\":\"c\"},\"to\":\"alice\"}").unwrap();
        assert_eq!(once.get_str("to").as_deref(), Some("alice"));
    }

    #[test]
    fn error_positions_become_line_and_column() {
        let text = "{\n  \"a\": x}";
        let SyntaxError(pos) = Json::parse(text).unwrap_err();
        assert_eq!(line_column(text, pos), (2, 8));
    }
}
