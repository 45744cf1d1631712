//! RE2 (as bundled with TensorFlow 2.18.1, UTF-8 mode, default options) on the `regex`
//! crate's `bytes::Regex`, whose search semantics (leftmost-first, UTF-8 classes, empty
//! matches at any byte offset, look-behind context before the start position) are RE2's.
//!
//! The syntaxes differ, so a pattern is translated ([`translate`]) rather than passed on:
//! - `\d \s \w \b` and their negations are ASCII in RE2 (`\s` is `[\t\n\f\r ]`, without
//!   `\v`) but Unicode in `regex`: they become explicit ASCII classes and `(?-u:\b)`;
//! - `\C` (any byte) becomes `(?s-u:.)`, `\Q…\E` quotes, octal escapes (`\0`, `\012`,
//!   `\12`) become `\x{…}`; `\pN`/`\p{Name}` take RE2's category and script names only;
//! - RE2 sees the 3-byte encodings of U+D800–U+DFFF as characters (`.`, negated classes and
//!   `\p{Cs}` match them, `\x{D800}` is one), `regex` sees invalid bytes: classes that
//!   hold surrogates get their byte sequences as an alternative;
//! - inside `[…]` RE2 has no nesting and no set operations (`[`, `&&`, `--`, `~~` are
//!   literal), so every literal there is written as `\x{…}`;
//! - a `{` that does not start an RE2 repetition (`a{`, `a{,2}`, `a{01}`) is a literal;
//! - RE2 refuses what `regex` accepts: counts over 1000 (also as a product of nested counted
//!   repetitions), stacked repetition operators (`a**`, `a*+`, `a{2}*`), flags other than
//!   `i m s U`, `(?<name>…)` (this RE2 only knows `(?P<name>…)`), and escapes such as `\e`
//!   or `\_`.
//!
//! Known remaining differences: the Unicode tables' versions (RE2's are 15.0: `\p{Kawi}`
//! works, `\p{Garay}` does not); RE2's 8 MiB program limit is not `regex`'s size limit, so a
//! huge pattern may be refused by one and not the other; a repetition operator right after a
//! flag group (`a(?i)*`) applies to `a` in RE2 and is refused here.

use std::fmt::Write as _;

use regex::bytes::{CaptureLocations, Regex, RegexBuilder};

/// RE2's limit on repetition counts (and on products of nested counted repetitions).
const MAX_REPEAT: u64 = 1000;

/// RE2's Unicode general categories; other `\p{…}` names are scripts.
const CATEGORIES: &[&str] = &[
    "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn", "N",
    "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So",
    "Z", "Zl", "Zp", "Zs",
];

/// RE2's scripts (Unicode 15.0).
const SCRIPTS: &[&str] = &[
    "Adlam",
    "Ahom",
    "Anatolian_Hieroglyphs",
    "Arabic",
    "Armenian",
    "Avestan",
    "Balinese",
    "Bamum",
    "Bassa_Vah",
    "Batak",
    "Bengali",
    "Bhaiksuki",
    "Bopomofo",
    "Brahmi",
    "Braille",
    "Buginese",
    "Buhid",
    "Canadian_Aboriginal",
    "Carian",
    "Caucasian_Albanian",
    "Chakma",
    "Cham",
    "Cherokee",
    "Chorasmian",
    "Common",
    "Coptic",
    "Cuneiform",
    "Cypriot",
    "Cypro_Minoan",
    "Cyrillic",
    "Deseret",
    "Devanagari",
    "Dives_Akuru",
    "Dogra",
    "Duployan",
    "Egyptian_Hieroglyphs",
    "Elbasan",
    "Elymaic",
    "Ethiopic",
    "Georgian",
    "Glagolitic",
    "Gothic",
    "Grantha",
    "Greek",
    "Gujarati",
    "Gunjala_Gondi",
    "Gurmukhi",
    "Han",
    "Hangul",
    "Hanifi_Rohingya",
    "Hanunoo",
    "Hatran",
    "Hebrew",
    "Hiragana",
    "Imperial_Aramaic",
    "Inherited",
    "Inscriptional_Pahlavi",
    "Inscriptional_Parthian",
    "Javanese",
    "Kaithi",
    "Kannada",
    "Katakana",
    "Kawi",
    "Kayah_Li",
    "Kharoshthi",
    "Khitan_Small_Script",
    "Khmer",
    "Khojki",
    "Khudawadi",
    "Lao",
    "Latin",
    "Lepcha",
    "Limbu",
    "Linear_A",
    "Linear_B",
    "Lisu",
    "Lycian",
    "Lydian",
    "Mahajani",
    "Makasar",
    "Malayalam",
    "Mandaic",
    "Manichaean",
    "Marchen",
    "Masaram_Gondi",
    "Medefaidrin",
    "Meetei_Mayek",
    "Mende_Kikakui",
    "Meroitic_Cursive",
    "Meroitic_Hieroglyphs",
    "Miao",
    "Modi",
    "Mongolian",
    "Mro",
    "Multani",
    "Myanmar",
    "Nabataean",
    "Nag_Mundari",
    "Nandinagari",
    "New_Tai_Lue",
    "Newa",
    "Nko",
    "Nushu",
    "Nyiakeng_Puachue_Hmong",
    "Ogham",
    "Ol_Chiki",
    "Old_Hungarian",
    "Old_Italic",
    "Old_North_Arabian",
    "Old_Permic",
    "Old_Persian",
    "Old_Sogdian",
    "Old_South_Arabian",
    "Old_Turkic",
    "Old_Uyghur",
    "Oriya",
    "Osage",
    "Osmanya",
    "Pahawh_Hmong",
    "Palmyrene",
    "Pau_Cin_Hau",
    "Phags_Pa",
    "Phoenician",
    "Psalter_Pahlavi",
    "Rejang",
    "Runic",
    "Samaritan",
    "Saurashtra",
    "Sharada",
    "Shavian",
    "Siddham",
    "SignWriting",
    "Sinhala",
    "Sogdian",
    "Sora_Sompeng",
    "Soyombo",
    "Sundanese",
    "Syloti_Nagri",
    "Syriac",
    "Tagalog",
    "Tagbanwa",
    "Tai_Le",
    "Tai_Tham",
    "Tai_Viet",
    "Takri",
    "Tamil",
    "Tangsa",
    "Tangut",
    "Telugu",
    "Thaana",
    "Thai",
    "Tibetan",
    "Tifinagh",
    "Tirhuta",
    "Toto",
    "Ugaritic",
    "Vai",
    "Vithkuqi",
    "Wancho",
    "Warang_Citi",
    "Yezidi",
    "Yi",
    "Zanabazar_Square",
];

/// The surrogate code points, which RE2 encodes in UTF-8 like any other.
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// A set of surrogates, as sorted disjoint ranges.
type Surrogates = Vec<(u32, u32)>;

fn all_surrogates() -> Surrogates {
    vec![SURROGATES]
}

/// Sorted, merged ranges.
fn merge(mut ranges: Surrogates) -> Surrogates {
    ranges.sort_unstable();
    let mut out: Surrogates = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The surrogates not in `ranges`.
fn complement(ranges: &[(u32, u32)]) -> Surrogates {
    let mut out = Vec::new();
    let mut next = SURROGATES.0;
    for &(lo, hi) in ranges {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = next.max(hi + 1);
    }
    if next <= SURROGATES.1 {
        out.push((next, SURROGATES.1));
    }
    out
}

/// The UTF-8 byte sequences (`ED A0..BF 80..BF`) of a set of surrogates, as a
/// non-Unicode alternation.
fn surrogate_bytes(ranges: &[(u32, u32)]) -> String {
    let mut alts = Vec::new();
    for &(lo, hi) in ranges {
        let (first_row, last_row) = (lo >> 6, hi >> 6);
        let mut row = first_row;
        while row <= last_row {
            let from = if row == first_row { lo & 0x3F } else { 0 };
            let to = if row == last_row { hi & 0x3F } else { 0x3F };
            if from == 0 && to == 0x3F {
                // Whole rows merge into one class of lead bytes.
                let mut end = row;
                while end < last_row && (end + 1 < last_row || hi & 0x3F == 0x3F) {
                    end += 1;
                }
                alts.push(format!(
                    "\\xED[\\x{:02X}-\\x{:02X}][\\x80-\\xBF]",
                    0x80 | (row & 0x3F),
                    0x80 | (end & 0x3F)
                ));
                row = end + 1;
            } else {
                alts.push(format!(
                    "\\xED\\x{:02X}[\\x{:02X}-\\x{:02X}]",
                    0x80 | (row & 0x3F),
                    0x80 | from,
                    0x80 | to
                ));
                row += 1;
            }
        }
    }
    format!("(?-u:{})", alts.join("|"))
}

/// A class (in `regex` syntax, `None` if it has no characters) plus the surrogates RE2
/// would also match, as one operand.
fn with_surrogates(class: Option<String>, surrogates: &[(u32, u32)]) -> String {
    match (class, surrogates.is_empty()) {
        (Some(class), true) => class,
        (None, true) => EMPTY_CLASS.to_string(),
        (None, false) => surrogate_bytes(surrogates),
        (Some(class), false) => format!("(?:{class}|{})", surrogate_bytes(surrogates)),
    }
}

/// A class that matches nothing (and one that matches every character).
const EMPTY_CLASS: &str = "[^\\x{0}-\\x{10FFFF}]";
const ANY_CLASS: &str = "[\\x{0}-\\x{10FFFF}]";

/// RE2's POSIX classes (ASCII, as in `regex`).
const POSIX: &[&str] = &[
    "alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower", "print", "punct",
    "space", "upper", "word", "xdigit",
];

/// Compiles an RE2 pattern (UTF-8), or says why RE2 would refuse it.
pub(crate) fn compile(pattern: &[u8]) -> Result<Regex, String> {
    let text = std::str::from_utf8(pattern).map_err(|_| "invalid UTF-8".to_string())?;
    let translated = translate(text)?;
    RegexBuilder::new(&translated)
        .build()
        .map_err(|e| e.to_string())
}

/// Compiles an RE2 pattern for `RE2::FullMatch`: a match must span the whole text.
pub(crate) fn compile_full(pattern: &[u8]) -> Result<Regex, String> {
    let text = std::str::from_utf8(pattern).map_err(|_| "invalid UTF-8".to_string())?;
    let translated = translate(text)?;
    RegexBuilder::new(&format!("\\A(?:{translated})\\z"))
        .build()
        .map_err(|e| e.to_string())
}

/// What a repetition operator would apply to.
#[derive(Debug, Clone, Copy)]
enum Last {
    /// Nothing (start, `(`, `|`): a repetition here is an error.
    Nothing,
    /// An operand whose nested counted repetitions multiply to `chain`; `repeated` if it
    /// is itself a repetition (reached past a flag group: RE2 repeats it again).
    Atom { chain: u64, repeated: bool },
    /// A repetition: another one right after it is an error in RE2.
    Repeat(u64),
}

/// An open group.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// Where the group starts in the output.
    start: usize,
    /// The largest product of nested counted repetitions inside.
    chain: u64,
    /// Whether `U` (swap greed) is in effect.
    ungreedy: bool,
}

/// Flag groups not yet written: RE2 lets a repetition right after `(?flags)` apply to the
/// operand before it, so they are written after that repetition.
#[derive(Debug)]
struct PendingFlags {
    text: String,
    /// `U` before them.
    ungreedy_before: bool,
}

struct Translator {
    chars: Vec<char>,
    pos: usize,
    out: String,
    groups: Vec<Group>,
    last: Last,
    /// Where the last operand starts in the output.
    atom_start: usize,
    pending: Option<PendingFlags>,
}

/// The `regex` crate's spelling of an RE2 pattern, or RE2's reason to refuse it.
pub(crate) fn translate(pattern: &str) -> Result<String, String> {
    let mut t = Translator {
        chars: pattern.chars().collect(),
        pos: 0,
        out: String::with_capacity(pattern.len() * 2),
        groups: vec![Group {
            start: 0,
            chain: 1,
            ungreedy: false,
        }],
        last: Last::Nothing,
        atom_start: 0,
        pending: None,
    };
    t.run()?;
    Ok(t.out)
}

fn hex(c: char) -> String {
    format!("\\x{{{:X}}}", u32::from(c))
}

/// RE2's `\d \s \w` (ASCII), as the contents of a class.
fn perl_class(c: char) -> Option<(&'static str, bool)> {
    match c {
        'd' => Some(("0-9", false)),
        'D' => Some(("0-9", true)),
        's' => Some(("\\t\\n\\x0C\\r ", false)),
        'S' => Some(("\\t\\n\\x0C\\r ", true)),
        'w' => Some(("0-9A-Za-z_", false)),
        'W' => Some(("0-9A-Za-z_", true)),
        _ => None,
    }
}

impl Translator {
    fn peek(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.pos += 1;
        Some(c)
    }

    fn ungreedy(&self) -> bool {
        self.groups.last().is_some_and(|g| g.ungreedy)
    }

    fn note_chain(&mut self, chain: u64) {
        if let Some(g) = self.groups.last_mut() {
            g.chain = g.chain.max(chain);
        }
    }

    /// Marks the start of an operand about to be written.
    fn begin_atom(&mut self) {
        self.atom_start = self.out.len();
    }

    fn atom(&mut self, chain: u64) {
        self.last = Last::Atom {
            chain,
            repeated: false,
        };
        self.note_chain(chain);
    }

    fn literal(&mut self, c: char) {
        self.begin_atom();
        if c.is_ascii_alphanumeric() {
            self.out.push(c);
        } else {
            self.out.push_str(&hex(c));
        }
        self.atom(1);
    }

    fn flush_flags(&mut self) {
        if let Some(p) = self.pending.take() {
            self.out.push_str(&p.text);
        }
    }

    /// Whether a repetition operator starts at the current position (after the
    /// character just read, `c`).
    fn repetition_ahead(&self, c: char) -> bool {
        matches!(c, '*' | '+' | '?') || (c == '{' && self.count_ahead().is_some())
    }

    /// Whether a flags-only group `(?flags)` follows the `(` just read (it joins the
    /// pending flags instead of flushing them).
    fn flag_group_ahead(&self) -> bool {
        self.peek(0) == Some('?')
            && self.chars[self.pos + 1..]
                .iter()
                .find(|c| !matches!(c, 'i' | 'm' | 's' | 'U' | '-'))
                == Some(&')')
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(c) = self.next() {
            let keeps_flags = self.repetition_ahead(c) || (c == '(' && self.flag_group_ahead());
            if !keeps_flags {
                self.flush_flags();
            }
            match c {
                '\\' => self.escape()?,
                '[' => {
                    self.begin_atom();
                    self.class()?;
                    self.atom(1);
                }
                '(' => self.group()?,
                ')' => {
                    if self.groups.len() < 2 {
                        return Err("unexpected )".into());
                    }
                    if let Some(g) = self.groups.pop() {
                        self.out.push(')');
                        self.atom_start = g.start;
                        self.atom(g.chain);
                    }
                }
                '|' => {
                    self.out.push('|');
                    self.last = Last::Nothing;
                }
                '*' | '+' | '?' => {
                    let lazy = self.lazy();
                    self.repeat(1, lazy, |out, lazy| {
                        out.push(c);
                        if lazy {
                            out.push('?');
                        }
                    })?;
                }
                '{' => self.counted()?,
                '.' => {
                    self.begin_atom();
                    let dot = with_surrogates(Some(".".into()), &all_surrogates());
                    self.out.push_str(&dot);
                    self.atom(1);
                }
                '^' | '$' => {
                    self.begin_atom();
                    self.out.push(c);
                    self.atom(1);
                }
                c => self.literal(c),
            }
        }
        self.flush_flags();
        if self.groups.len() != 1 {
            return Err("missing )".into());
        }
        Ok(())
    }

    fn lazy(&mut self) -> bool {
        let lazy = self.peek(0) == Some('?');
        if lazy {
            self.pos += 1;
        }
        lazy
    }

    /// Applies a repetition (which multiplies nested counts by `factor`) to the last
    /// operand, or refuses it as RE2 does; `emit` writes the operator, lazy or not.
    fn repeat(
        &mut self,
        factor: u64,
        lazy: bool,
        emit: impl FnOnce(&mut String, bool),
    ) -> Result<(), String> {
        let (chain, repeated) = match self.last {
            Last::Nothing => return Err("missing argument to repetition operator".into()),
            Last::Repeat(_) => return Err("bad repetition operator (stacked)".into()),
            Last::Atom { chain, repeated } => (chain.saturating_mul(factor), repeated),
        };
        if chain > MAX_REPEAT {
            return Err("bad repetition operator (nested counts over 1000)".into());
        }
        if repeated {
            // `regex` does not stack repetitions: group the repeated operand.
            if !self.out.is_char_boundary(self.atom_start) {
                return Err("internal error: operand start".into());
            }
            self.out.insert_str(self.atom_start, "(?:");
            self.out.push(')');
        }
        // RE2 reads greed with the flags in effect here; `regex` will read it with the
        // flags before any pending flag group, which is written after the operator.
        let swapped = self
            .pending
            .as_ref()
            .is_some_and(|p| p.ungreedy_before != self.ungreedy());
        emit(&mut self.out, lazy != swapped);
        self.flush_flags();
        self.last = Last::Repeat(chain);
        self.note_chain(chain);
        Ok(())
    }

    /// RE2's `ParseInteger`: decimal digits, no leading zero, below 10^9.
    fn integer(&self, at: &mut usize) -> Option<u64> {
        let digit = |i: usize| self.chars.get(i).and_then(|c| c.to_digit(10));
        digit(*at)?;
        if digit(*at) == Some(0) && digit(*at + 1).is_some() {
            return None;
        }
        let mut n = 0u64;
        while let Some(d) = digit(*at) {
            if n >= 100_000_000 {
                return None;
            }
            n = n * 10 + u64::from(d);
            *at += 1;
        }
        Some(n)
    }

    /// RE2's `MaybeParseRepeat` after a `{`: `(lo, hi, end)` for `{lo}`, `{lo,}` (hi
    /// `None`) or `{lo,hi}`, `end` just past the `}`.
    fn count_ahead(&self) -> Option<(u64, Option<u64>, usize)> {
        let mut at = self.pos;
        let lo = self.integer(&mut at)?;
        let hi = match self.chars.get(at) {
            Some(',') if self.chars.get(at + 1) == Some(&'}') => {
                at += 1;
                None
            }
            Some(',') => {
                at += 1;
                Some(self.integer(&mut at)?)
            }
            _ => Some(lo),
        };
        (self.chars.get(at) == Some(&'}')).then_some((lo, hi, at + 1))
    }

    /// After a `{`: a counted repetition, or else a literal `{`.
    fn counted(&mut self) -> Result<(), String> {
        let Some((lo, hi, end)) = self.count_ahead() else {
            self.literal('{');
            return Ok(());
        };
        self.pos = end;
        let lazy = self.lazy();
        if hi.is_some_and(|hi| hi < lo) || lo > MAX_REPEAT || hi.unwrap_or(0) > MAX_REPEAT {
            return Err("invalid repetition size".into());
        }
        let m = hi.unwrap_or(lo);
        let walked = lo >= 2 || hi.unwrap_or(0) >= 2;
        let factor = if walked && m > 0 { m } else { 1 };
        self.repeat(factor, lazy, |out, lazy| {
            let _ = match hi {
                Some(hi) if hi == lo => write!(out, "{{{lo}}}"),
                Some(hi) => write!(out, "{{{lo},{hi}}}"),
                None => write!(out, "{{{lo},}}"),
            };
            if lazy {
                out.push('?');
            }
        })
    }

    fn open_group(&mut self, text: &str, ungreedy: bool) {
        let start = self.out.len();
        self.out.push_str(text);
        self.groups.push(Group {
            start,
            chain: 1,
            ungreedy,
        });
        self.last = Last::Nothing;
    }

    /// After `(`: a group, a named group or flags.
    fn group(&mut self) -> Result<(), String> {
        let ungreedy = self.ungreedy();
        if self.peek(0) != Some('?') {
            self.open_group("(", ungreedy);
            return Ok(());
        }
        self.pos += 1;
        match self.peek(0) {
            Some('P') if self.peek(1) == Some('<') => {
                self.pos += 2;
                let mut name = String::new();
                loop {
                    match self.next() {
                        Some('>') => break,
                        Some(c) if c == '_' || c.is_alphanumeric() => name.push(c),
                        _ => return Err("invalid named capture group".into()),
                    }
                }
                if name.is_empty() {
                    return Err("invalid named capture group (?P<>".into());
                }
                // Names do not matter to a rewrite (and RE2 allows duplicates and a
                // leading digit, `regex` does not): the group is written unnamed.
                self.open_group("(", ungreedy);
                Ok(())
            }
            Some('P' | '<' | '=' | '!') | None => Err("invalid perl operator: (?".into()),
            Some(_) => {
                let (mut negated, mut saw_flag) = (false, false);
                let mut flags = String::new();
                let mut now_ungreedy = ungreedy;
                loop {
                    match self.next() {
                        Some(c @ ('i' | 'm' | 's' | 'U')) => {
                            saw_flag = true;
                            flags.push(c);
                            if c == 'U' {
                                now_ungreedy = !negated;
                            }
                        }
                        Some('-') if !negated => {
                            negated = true;
                            saw_flag = false;
                            flags.push('-');
                        }
                        Some(end @ (':' | ')')) => {
                            if negated && !saw_flag {
                                return Err("invalid perl operator: (?-".into());
                            }
                            if end == ':' {
                                self.open_group(&format!("(?{flags}:"), now_ungreedy);
                                return Ok(());
                            }
                            if !flags.is_empty() {
                                let text = format!("(?{flags})");
                                match &mut self.pending {
                                    Some(p) => p.text.push_str(&text),
                                    None => {
                                        self.pending = Some(PendingFlags {
                                            text,
                                            ungreedy_before: ungreedy,
                                        })
                                    }
                                }
                                if let Some(g) = self.groups.last_mut() {
                                    g.ungreedy = now_ungreedy;
                                }
                            }
                            // The operand before stays the operand (RE2 pushes nothing).
                            if let Last::Repeat(chain) = self.last {
                                self.last = Last::Atom {
                                    chain,
                                    repeated: true,
                                };
                            }
                            return Ok(());
                        }
                        _ => return Err("invalid perl operator: (?".into()),
                    }
                }
            }
        }
    }

    /// After a `\` outside a class.
    fn escape(&mut self) -> Result<(), String> {
        let Some(c) = self.next() else {
            return Err("trailing \\".into());
        };
        self.begin_atom();
        match c {
            'Q' => {
                while let Some(q) = self.next() {
                    if q == '\\' && self.peek(0) == Some('E') {
                        self.pos += 1;
                        break;
                    }
                    self.literal(q);
                }
            }
            'A' | 'z' => {
                self.out.push('\\');
                self.out.push(c);
                self.atom(1);
            }
            'b' | 'B' => {
                let _ = write!(self.out, "(?-u:\\{c})");
                self.atom(1);
            }
            'C' => {
                self.out.push_str("(?s-u:.)");
                self.atom(1);
            }
            'p' | 'P' => {
                let (class, surrogates) = self.unicode_class(c == 'P')?;
                self.out
                    .push_str(&with_surrogates(Some(class), &surrogates));
                self.atom(1);
            }
            _ => {
                if let Some((set, negated)) = perl_class(c) {
                    let class = format!("[{}{set}]", if negated { "^" } else { "" });
                    let surrogates = if negated {
                        all_surrogates()
                    } else {
                        Vec::new()
                    };
                    self.out
                        .push_str(&with_surrogates(Some(class), &surrogates));
                    self.atom(1);
                } else {
                    match self.escaped_char(c)? {
                        Ok(r) => self.literal(r),
                        Err(surrogate) => {
                            self.out
                                .push_str(&surrogate_bytes(&[(surrogate, surrogate)]));
                            self.atom(1);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// RE2's `ParseEscape` for the escapes that stand for one character: the character,
    /// or the code point of a surrogate.
    fn escaped_char(&mut self, c: char) -> Result<Result<char, u32>, String> {
        let bad = || Err(format!("invalid escape sequence: \\{c}"));
        let octal = |c: Option<char>| c.and_then(|c| c.to_digit(8));
        match c {
            '0'..='7' => {
                // \1-\7 are backreferences unless another octal digit follows.
                if c != '0' && octal(self.peek(0)).is_none() {
                    return bad();
                }
                let mut code = c.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match octal(self.peek(0)) {
                        Some(d) => {
                            code = code * 8 + d;
                            self.pos += 1;
                        }
                        None => break,
                    }
                }
                char::from_u32(code).map_or_else(bad, |c| Ok(Ok(c)))
            }
            'x' => {
                let code = if self.peek(0) == Some('{') {
                    self.pos += 1;
                    let mut code = 0u32;
                    let mut digits = 0;
                    loop {
                        match self.next() {
                            Some('}') if digits > 0 => break,
                            Some(h) if h.is_ascii_hexdigit() => {
                                code = code.saturating_mul(16) + h.to_digit(16).unwrap_or(0);
                                digits += 1;
                                if code > 0x10_FFFF {
                                    return bad();
                                }
                            }
                            _ => return bad(),
                        }
                    }
                    code
                } else {
                    match (self.next(), self.next()) {
                        (Some(a), Some(b)) if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
                            a.to_digit(16).unwrap_or(0) * 16 + b.to_digit(16).unwrap_or(0)
                        }
                        _ => return bad(),
                    }
                };
                Ok(char::from_u32(code).ok_or(code))
            }
            'a' => Ok(Ok('\x07')),
            'f' => Ok(Ok('\x0c')),
            'n' => Ok(Ok('\n')),
            'r' => Ok(Ok('\r')),
            't' => Ok(Ok('\t')),
            'v' => Ok(Ok('\x0b')),
            c if c.is_ascii() && !c.is_ascii_alphanumeric() => Ok(Ok(c)),
            _ => bad(),
        }
    }

    /// After `\p` or `\P`: `X` or `{Name}` / `{^Name}`, as a `regex` class (usable
    /// inside brackets too) and the surrogates it holds.
    fn unicode_class(&mut self, negated: bool) -> Result<(String, Surrogates), String> {
        let name: String = match self.next() {
            Some('{') => {
                let mut name = String::new();
                loop {
                    match self.next() {
                        Some('}') => break name,
                        Some(c) => name.push(c),
                        None => return Err("invalid character class range".into()),
                    }
                }
            }
            Some(c) => c.to_string(),
            None => return Err("invalid character class range".into()),
        };
        let (negated, name) = match name.strip_prefix('^') {
            Some(rest) => (!negated, rest.to_string()),
            None => (negated, name),
        };
        // The positive class in `regex` syntax, and whether it holds the surrogates.
        let (class, surrogates) = match name.as_str() {
            "Any" => (ANY_CLASS.to_string(), true),
            "Cs" => (EMPTY_CLASS.to_string(), true),
            n if CATEGORIES.contains(&n) => (format!("\\p{{{n}}}"), n == "C"),
            n if SCRIPTS.contains(&n) => (format!("\\p{{sc={n}}}"), false),
            _ => return Err(format!("invalid character class range: \\p{{{name}}}")),
        };
        if !negated {
            let surrogates = if surrogates {
                all_surrogates()
            } else {
                Vec::new()
            };
            return Ok((class, surrogates));
        }
        let class = match class.as_str() {
            ANY_CLASS => EMPTY_CLASS.to_string(),
            EMPTY_CLASS => ANY_CLASS.to_string(),
            _ => class.replacen("\\p", "\\P", 1),
        };
        let surrogates = if surrogates {
            Vec::new()
        } else {
            all_surrogates()
        };
        Ok((class, surrogates))
    }

    /// A character of a class (its code point): itself or an escape.
    fn class_char(&mut self) -> Result<u32, String> {
        match self.next() {
            Some('\\') => match self.next() {
                Some(e) => Ok(self.escaped_char(e)?.map_or_else(|s| s, u32::from)),
                None => Err("missing ]".into()),
            },
            Some(c) => Ok(u32::from(c)),
            None => Err("missing ]".into()),
        }
    }

    /// After `[`: RE2's class syntax, written with every literal as `\x{…}` (and the
    /// surrogates it holds as byte sequences).
    fn class(&mut self) -> Result<(), String> {
        let negated = self.peek(0) == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut items = String::new();
        let mut surrogates = Vec::new();
        let mut first = true;
        loop {
            match self.peek(0) {
                None => return Err("missing ]".into()),
                Some(']') if !first => {
                    self.pos += 1;
                    break;
                }
                _ => {}
            }
            first = false;
            if self.peek(0) == Some('[') && self.peek(1) == Some(':') {
                let close = (self.pos + 2..self.chars.len().saturating_sub(1)).find(|&i| {
                    self.chars.get(i) == Some(&':') && self.chars.get(i + 1) == Some(&']')
                });
                if let Some(close) = close {
                    let name: String = self.chars[self.pos + 2..close].iter().collect();
                    let (negated, base) = match name.strip_prefix('^') {
                        Some(base) => (true, base),
                        None => (false, name.as_str()),
                    };
                    if !POSIX.contains(&base) {
                        return Err(format!("invalid character class range: [:{name}:]"));
                    }
                    let _ = write!(items, "[:{name}:]");
                    if negated {
                        surrogates.extend(all_surrogates());
                    }
                    self.pos = close + 2;
                    continue;
                }
            }
            if self.peek(0) == Some('\\') {
                match self.peek(1) {
                    Some(p @ ('p' | 'P')) => {
                        self.pos += 2;
                        let (class, s) = self.unicode_class(p == 'P')?;
                        items.push_str(&class);
                        surrogates.extend(s);
                        continue;
                    }
                    Some(c) => {
                        if let Some((set, negated)) = perl_class(c) {
                            self.pos += 2;
                            if negated {
                                let _ = write!(items, "[^{set}]");
                                surrogates.extend(all_surrogates());
                            } else {
                                items.push_str(set);
                            }
                            continue;
                        }
                    }
                    None => {}
                }
            }
            let lo = self.class_char()?;
            let hi = if self.peek(0) == Some('-') && self.peek(1).is_some_and(|c| c != ']') {
                self.pos += 1;
                let hi = self.class_char()?;
                if hi < lo {
                    return Err("bad character class range".into());
                }
                hi
            } else {
                lo
            };
            // The surrogates go apart; `regex` writes only the scalar values.
            let (s_lo, s_hi) = (lo.max(SURROGATES.0), hi.min(SURROGATES.1));
            if s_lo <= s_hi {
                surrogates.push((s_lo, s_hi));
            }
            for (a, b) in [
                (lo, hi.min(SURROGATES.0 - 1)),
                (lo.max(SURROGATES.1 + 1), hi),
            ] {
                if let (true, Some(a), Some(b)) = (a <= b, char::from_u32(a), char::from_u32(b)) {
                    if a == b {
                        items.push_str(&hex(a));
                    } else {
                        let _ = write!(items, "{}-{}", hex(a), hex(b));
                    }
                }
            }
        }
        let mut surrogates = merge(surrogates);
        let class = match (items.is_empty(), negated) {
            (true, true) => ANY_CLASS.to_string(),
            (true, false) => EMPTY_CLASS.to_string(),
            (false, true) => format!("[^{items}]"),
            (false, false) => format!("[{items}]"),
        };
        if negated {
            surrogates = complement(&surrogates);
        }
        self.out
            .push_str(&with_surrogates(Some(class), &surrogates));
        Ok(())
    }
}

/// RE2's `MaxSubmatch`: the largest group a rewrite names.
fn max_submatch(rewrite: &[u8]) -> usize {
    let mut max = 0;
    let mut bytes = rewrite.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            if let Some(&d) = bytes.next() {
                if d.is_ascii_digit() {
                    max = max.max(usize::from(d - b'0'));
                }
            }
        }
    }
    max
}

/// RE2's `Rewrite`: appends `rewrite` with `\N` replaced by group N of the match; `false`
/// at a malformed escape (what was appended before it stays).
fn rewrite_into(out: &mut Vec<u8>, rewrite: &[u8], text: &[u8], locs: &CaptureLocations) -> bool {
    let mut bytes = rewrite.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(&d) if d.is_ascii_digit() => {
                if let Some(group) = locs
                    .get(usize::from(d - b'0'))
                    .and_then(|(s, e)| text.get(s..e))
                {
                    out.extend_from_slice(group);
                }
            }
            Some(b'\\') => out.push(b'\\'),
            _ => return false,
        }
    }
    true
}

/// The length of the UTF-8 character at the start of `s` as RE2's `chartorune` decodes
/// it (surrogates allowed, over-long forms and runes past U+10FFFF not), `None` where it
/// sees an error or too few bytes.
fn rune_len(s: &[u8]) -> Option<usize> {
    let c0 = u32::from(*s.first()?);
    if c0 < 0x80 {
        return Some(1);
    }
    let cont = |i: usize| {
        s.get(i)
            .map(|&b| u32::from(b) ^ 0x80)
            .filter(|&c| c & 0xC0 == 0)
    };
    let c1 = cont(1)?;
    if c0 < 0xE0 {
        let l = ((c0 << 6) | c1) & 0x7FF;
        return (c0 >= 0xC0 && l > 0x7F).then_some(2);
    }
    let c2 = cont(2)?;
    if c0 < 0xF0 {
        let l = ((((c0 << 6) | c1) << 6) | c2) & 0xFFFF;
        return (l > 0x7FF).then_some(3);
    }
    let c3 = cont(3)?;
    if c0 < 0xF8 {
        let l = ((((((c0 << 6) | c1) << 6) | c2) << 6) | c3) & 0x1F_FFFF;
        return (l > 0xFFFF && l <= 0x10_FFFF).then_some(4);
    }
    None
}

/// RE2's `Replace` (first match) or `GlobalReplace` (every match) of `re` in `text`.
pub(crate) fn replace(re: &Regex, text: &[u8], rewrite: &[u8], global: bool) -> Vec<u8> {
    if 1 + max_submatch(rewrite) > re.captures_len() {
        return text.to_vec();
    }
    let mut locs = re.capture_locations();
    let mut out = Vec::with_capacity(text.len());
    if !global {
        let Some(m) = re.captures_read_at(&mut locs, text, 0) else {
            return text.to_vec();
        };
        out.extend_from_slice(&text[..m.start()]);
        if !rewrite_into(&mut out, rewrite, text, &locs) {
            return text.to_vec();
        }
        out.extend_from_slice(&text[m.end()..]);
        return out;
    }
    let mut p = 0;
    let mut last_end = None;
    let mut count = 0usize;
    while p <= text.len() {
        let Some(m) = re.captures_read_at(&mut locs, text, p) else {
            break;
        };
        out.extend_from_slice(text.get(p..m.start()).unwrap_or_default());
        if m.is_empty() && last_end == Some(m.start()) {
            // No empty match where the last one ended: copy one character and go on.
            let rest = text.get(p..).unwrap_or_default();
            let n = rune_len(rest).unwrap_or(1).min(rest.len());
            out.extend_from_slice(&rest[..n]);
            p += n.max(1);
            continue;
        }
        // Like RE2's GlobalReplace, a malformed rewrite still writes what precedes the
        // bad escape.
        let _ = rewrite_into(&mut out, rewrite, text, &locs);
        p = m.end();
        last_end = Some(p);
        count += 1;
    }
    if count == 0 {
        return text.to_vec();
    }
    out.extend_from_slice(text.get(p..).unwrap_or_default());
    out
}
