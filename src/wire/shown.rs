//! Text a person is shown that a peer wrote (a command line, a directory, a variable): the
//! characters that do not show as themselves, and their escapes (PROTOCOL 7.3). The
//! daemon escapes them in the `display` texts approvers get; execctl escapes what it
//! prints (`cli::output::visible`). One table for both, so what an approver's screen
//! shows and what the daemon sends never disagree.
//!
//! Invariants:
//! - `invisible` holds for every character of general category `Cc`, `Cf`, `Zl`, `Zp`,
//!   every space (`Zs`) but U+0020, and every `Default_Ignorable_Code_Point` (assigned or
//!   not): nothing that renders as nothing, as a blank other than a space, or acts on the
//!   terminal passes unescaped. Everything else (printable text of any script) passes.
//! - An escape is `\u{hex}`, lower-case, of exactly one character.

use std::borrow::Cow;
use std::fmt::Write as _;

/// The characters that do not show as themselves, as inclusive ranges in order, derived
/// from the Unicode Character Database 14.0.0 (perl's unicore: `\p{Cc}`, `\p{Cf}`,
/// `\p{Zl}`, `\p{Zp}`, `\p{Zs}` but U+0020, `\p{Default_Ignorable_Code_Point}`), plus
/// U+13439..U+1343F, which Unicode 15.0 added as format controls (`Cf`). Adjacent ranges
/// are merged: U+007F..U+00A0 is DEL, the C1 controls and NO-BREAK SPACE.
const INVISIBLE: [(u32, u32); 29] = [
    (0x0000, 0x001F),   // C0 controls
    (0x007F, 0x00A0),   // DEL, C1 controls, NO-BREAK SPACE
    (0x00AD, 0x00AD),   // SOFT HYPHEN
    (0x034F, 0x034F),   // COMBINING GRAPHEME JOINER
    (0x0600, 0x0605),   // Arabic number signs
    (0x061C, 0x061C),   // ARABIC LETTER MARK
    (0x06DD, 0x06DD),   // ARABIC END OF AYAH
    (0x070F, 0x070F),   // SYRIAC ABBREVIATION MARK
    (0x0890, 0x0891),   // Arabic pound and piastre marks above
    (0x08E2, 0x08E2),   // ARABIC DISPUTED END OF AYAH
    (0x115F, 0x1160),   // Hangul choseong and jungseong fillers
    (0x1680, 0x1680),   // OGHAM SPACE MARK
    (0x17B4, 0x17B5),   // Khmer inherent vowels
    (0x180B, 0x180F),   // Mongolian variation selectors and vowel separator
    (0x2000, 0x200F),   // spaces, ZERO WIDTH SPACE, joiners, LRM, RLM
    (0x2028, 0x202F),   // line and paragraph separators, bidi embeddings, NNBSP
    (0x205F, 0x206F),   // MMSP, WORD JOINER, invisible operators, bidi isolates...
    (0x3000, 0x3000),   // IDEOGRAPHIC SPACE
    (0x3164, 0x3164),   // HANGUL FILLER
    (0xFE00, 0xFE0F),   // variation selectors
    (0xFEFF, 0xFEFF),   // ZERO WIDTH NO-BREAK SPACE (byte order mark)
    (0xFFA0, 0xFFA0),   // HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFFB),   // unassigned ignorables, interlinear annotation
    (0x110BD, 0x110BD), // KAITHI NUMBER SIGN
    (0x110CD, 0x110CD), // KAITHI NUMBER SIGN ABOVE
    (0x13430, 0x1343F), // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3), // shorthand format controls
    (0x1D173, 0x1D17A), // musical symbol format controls
    (0xE0000, 0xE0FFF), // tags, variation selectors supplement, unassigned ignorables
];

/// Whether `c` does not show as itself (see the module's invariants).
pub fn invisible(c: char) -> bool {
    let c = u32::from(c);
    INVISIBLE
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `text` with every invisible character written as its escape, `\u{200b}`; borrowed
/// when there is none.
pub fn escape_invisible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(invisible) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if invisible(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_ordered_and_apart() {
        for w in INVISIBLE.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 + 1 < w[1].0, "{w:x?}");
        }
    }

    /// Each range's first and last character are in, and the ones just outside are not.
    #[test]
    fn every_range_s_edges() {
        for &(lo, hi) in &INVISIBLE {
            for c in [lo, hi] {
                let c = char::from_u32(c).unwrap();
                assert!(invisible(c), "{:x}", u32::from(c));
            }
            for c in [lo.wrapping_sub(1), hi + 1] {
                if let Some(c) = char::from_u32(c) {
                    assert!(!invisible(c), "{:x}", u32::from(c));
                }
            }
        }
    }

    #[test]
    fn the_characters_the_protocol_names_are_invisible_and_text_is_not() {
        for c in [
            '\u{200b}',
            '\u{feff}',
            '\u{00ad}',
            '\u{2060}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{e0001}',
            '\u{e0041}',
            '\u{e01ef}',
            '\u{202e}',
            '\u{2028}',
            '\u{2029}',
            '\u{00a0}',
            '\u{3000}',
            '\u{1680}',
            '\u{180e}',
            '\u{9b}',
            '\u{1b}',
            '\t',
            '\n',
            '\u{7f}',
        ] {
            assert!(invisible(c), "{:x}", u32::from(c));
        }
        for c in [
            ' ',
            'a',
            '~',
            '\u{a1}',
            'é',
            'ß',
            'ж',
            '中',
            '\u{1f600}',
            '\u{0301}',
            '\u{2010}',
            '\u{2030}',
            '\u{205e}',
            '\u{2070}',
            '\u{fdff}',
            '\u{fe10}',
            '\u{fffc}',
            '\u{e1000}',
            '\u{10ffff}',
        ] {
            assert!(!invisible(c), "{:x}", u32::from(c));
        }
    }

    #[test]
    fn escapes_name_the_character_and_plain_text_is_borrowed() {
        assert_eq!(escape_invisible("rm -rf a\u{200b}b"), "rm -rf a\\u{200b}b");
        assert_eq!(
            escape_invisible("\u{feff}x\u{e0041}"),
            "\\u{feff}x\\u{e0041}"
        );
        assert_eq!(escape_invisible("tab\there"), "tab\\u{9}here");
        assert!(matches!(escape_invisible("plain ж text"), Cow::Borrowed(_)));
    }
}
