//! The small JSON reader ds4 uses on tool-call arguments (`json_args_parse`,
//! `json_skip_value`, `json_string`, `json_minify_raw_value` in
//! `antirez/ds4:ds4_server.c`), ported so canonical DSML is the bytes ds4
//! writes: string values are unescaped, every other value keeps its own
//! spelling (`2.50`, `-3e5`) with the whitespace outside strings removed, and
//! keys keep their order (duplicates included).
//!
//! It is as lenient as ds4's: numbers are what C's `strtod` accepts, a trailing
//! comma before `}` is fine, and a `\u` escape that is a lone surrogate becomes
//! U+FFFD (ds4 writes its raw bytes, which are not UTF-8).

/// One `"key": value` of an arguments object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Arg {
    pub key: String,
    /// The unescaped string, or the minified JSON text of any other value.
    pub value: String,
    pub is_string: bool,
}

/// ds4's `JSON_MAX_NESTING`.
const MAX_NESTING: usize = 256;

/// C's `isspace` in the "C" locale (Rust's `is_ascii_whitespace` omits `\v`).
pub(crate) fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

struct Scan<'a> {
    s: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn peek(&self) -> u8 {
        self.s.get(self.at).copied().unwrap_or(0)
    }

    fn ws(&mut self) {
        while self.at < self.s.len() && c_space(self.s[self.at]) {
            self.at += 1;
        }
    }

    fn lit(&mut self, lit: &str) -> bool {
        if self.s[self.at..].starts_with(lit.as_bytes()) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        if self.s.get(self.at) != Some(&b'\\') || self.s.get(self.at + 1) != Some(&b'u') {
            return None;
        }
        let digits = self.s.get(self.at + 2..self.at + 6)?;
        let text = std::str::from_utf8(digits).ok()?;
        let cp = u32::from_str_radix(text, 16).ok()?;
        self.at += 6;
        Some(cp)
    }

    /// `json_string`: a string literal, unescaped.
    fn string(&mut self) -> Option<String> {
        self.ws();
        if self.peek() != b'"' {
            return None;
        }
        self.at += 1;
        let mut out: Vec<u8> = Vec::new();
        while self.at < self.s.len() && self.s[self.at] != b'"' {
            let c = self.s[self.at];
            self.at += 1;
            if c != b'\\' {
                out.push(c);
                continue;
            }
            let e = self.peek();
            self.at += 1;
            let ch = match e {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    self.at -= 2;
                    let hi = self.hex4()?;
                    let mut cp = hi;
                    if (0xd800..=0xdbff).contains(&hi) {
                        let save = self.at;
                        match self.hex4() {
                            Some(lo) if (0xdc00..=0xdfff).contains(&lo) => {
                                cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                            }
                            // ds4 consumes the second escape even when it is not
                            // a low surrogate (its `json_u16` already advanced).
                            Some(_) => {}
                            None => self.at = save,
                        }
                    }
                    char::from_u32(cp).unwrap_or('\u{FFFD}')
                }
                _ => return None,
            };
            let mut buf = [0u8; 4];
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
        if self.peek() != b'"' {
            return None;
        }
        self.at += 1;
        Some(String::from_utf8_lossy(&out).into_owned())
    }

    /// What C's `strtod` accepts at the cursor: decimal (with fraction and
    /// exponent), hexadecimal, `inf`/`infinity`/`nan`, optionally signed.
    fn number(&mut self) -> bool {
        self.ws();
        let start = self.at;
        let mut i = self.at;
        if matches!(self.s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let rest = &self.s[i..];
        let lower: Vec<u8> = rest.iter().take(8).map(u8::to_ascii_lowercase).collect();
        for word in ["infinity", "inf", "nan"] {
            if lower.starts_with(word.as_bytes()) {
                self.at = i + word.len();
                return true;
            }
        }
        let hex = lower.starts_with(b"0x")
            && rest
                .get(2)
                .is_some_and(|b| b.is_ascii_hexdigit() || *b == b'.');
        let digit = |b: &u8| {
            if hex {
                b.is_ascii_hexdigit()
            } else {
                b.is_ascii_digit()
            }
        };
        if hex {
            i += 2;
        }
        let int_start = i;
        while self.s.get(i).is_some_and(digit) {
            i += 1;
        }
        let mut digits = i > int_start;
        if self.s.get(i) == Some(&b'.') {
            let frac = i + 1;
            let mut j = frac;
            while self.s.get(j).is_some_and(digit) {
                j += 1;
            }
            if digits || j > frac {
                digits = true;
                i = j;
            }
        }
        if !digits {
            self.at = start;
            return false;
        }
        let exp = if hex { b'p' } else { b'e' };
        if self.s.get(i).map(u8::to_ascii_lowercase) == Some(exp) {
            let mut j = i + 1;
            if matches!(self.s.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            let d = j;
            while self.s.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            if j > d {
                i = j;
            }
        }
        self.at = i;
        true
    }

    /// `json_skip_value_depth`.
    fn skip_value(&mut self, depth: usize) -> bool {
        self.ws();
        match self.peek() {
            b'"' => self.string().is_some(),
            b'{' => self.skip_container(depth, b'}', true),
            b'[' => self.skip_container(depth, b']', false),
            _ => self.lit("true") || self.lit("false") || self.lit("null") || self.number(),
        }
    }

    fn skip_container(&mut self, depth: usize, close: u8, object: bool) -> bool {
        if depth >= MAX_NESTING {
            return false;
        }
        self.at += 1;
        self.ws();
        if self.peek() == close {
            self.at += 1;
            return true;
        }
        loop {
            if object {
                if self.string().is_none() {
                    return false;
                }
                self.ws();
                if self.peek() != b':' {
                    return false;
                }
                self.at += 1;
            }
            if !self.skip_value(depth + 1) {
                return false;
            }
            self.ws();
            match self.peek() {
                c if c == close => {
                    self.at += 1;
                    return true;
                }
                b',' => self.at += 1,
                _ => return false,
            }
        }
    }
}

/// `json_minify_raw_value`: the first JSON value of `json` without the
/// whitespace outside its strings; `json` unchanged when it does not start
/// with a value.
pub(crate) fn minify(json: &str) -> String {
    let mut scan = Scan {
        s: json.as_bytes(),
        at: 0,
    };
    scan.ws();
    let start = scan.at;
    if !scan.skip_value(0) {
        return json.to_string();
    }
    let mut out = String::with_capacity(scan.at - start);
    let (mut in_string, mut escape) = (false, false);
    for c in json[start..scan.at].chars() {
        if in_string {
            out.push(c);
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !(c.is_ascii() && c_space(c as u8)) {
            out.push(c);
        }
    }
    out
}

/// `json_args_parse`: the members of a top-level JSON object, or `None` when
/// `json` is not one.
pub(crate) fn parse_object(json: &str) -> Option<Vec<Arg>> {
    let mut scan = Scan {
        s: json.as_bytes(),
        at: 0,
    };
    scan.ws();
    if scan.peek() != b'{' {
        return None;
    }
    scan.at += 1;
    scan.ws();
    let mut args = Vec::new();
    while scan.at < scan.s.len() && scan.peek() != b'}' {
        let key = scan.string()?;
        scan.ws();
        if scan.peek() != b':' {
            return None;
        }
        scan.at += 1;
        scan.ws();
        let arg = if scan.peek() == b'"' {
            Arg {
                key,
                value: scan.string()?,
                is_string: true,
            }
        } else {
            let start = scan.at;
            if !scan.skip_value(0) {
                return None;
            }
            Arg {
                key,
                value: minify(&json[start..scan.at]),
                is_string: false,
            }
        };
        args.push(arg);
        scan.ws();
        if scan.peek() == b',' {
            scan.at += 1;
        }
        scan.ws();
    }
    (scan.peek() == b'}').then_some(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(key: &str, value: &str, is_string: bool) -> Arg {
        Arg {
            key: key.into(),
            value: value.into(),
            is_string,
        }
    }

    #[test]
    fn members_keep_order_spelling_and_duplicates() {
        let got = parse_object(
            "{ \"b\" : \"x\\ty\\u00e9\\ud83d\\ude00\" , \"a\": [ 1, 2.50 , -3e5 ],\"a\":{\"k\": \"v w\"},}",
        );
        assert_eq!(
            got,
            Some(vec![
                arg("b", "x\ty\u{e9}\u{1F600}", true),
                arg("a", "[1,2.50,-3e5]", false),
                arg("a", "{\"k\":\"v w\"}", false),
            ])
        );
        assert_eq!(parse_object("{}"), Some(vec![]));
    }

    #[test]
    fn not_an_object_or_broken_is_none() {
        for bad in [
            "[1, 2]",
            "not json",
            "",
            "{\"a\" 1}",
            "{\"a\": }",
            "{\"a\": 1",
        ] {
            assert_eq!(parse_object(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn minify_is_ds4s() {
        assert_eq!(
            minify(" { \"a b\" : [ true , null ] } tail"),
            "{\"a b\":[true,null]}"
        );
        assert_eq!(minify("oops"), "oops");
        assert_eq!(minify("0x1F"), "0x1F");
        assert_eq!(minify("-Infinity"), "-Infinity");
    }
}
