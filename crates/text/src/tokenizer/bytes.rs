//! The bytes each token stands for, what a token-level constraint (a grammar
//! matched byte by byte, `ds4-constraint`) needs from a vocabulary.
//!
//! The decoder named by the tokenizer says how a vocabulary piece maps to
//! bytes: byte-level BPE (GPT-2's printable alphabet for the 256 bytes),
//! SentencePiece byte fallback (`<0x0A>`, with `▁` or a `Replace` pattern
//! standing for a space), or no decoder at all (`tokenizers` then joins
//! pieces with a space, so a piece stands for a space and itself). Special
//! (control) tokens are not text: they are reported by name, so a grammar
//! can never spell one by accident.

use std::collections::HashMap;

use serde_json::Value;

use super::Tokenizer;

/// What one token id stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// Text: the bytes the token adds when decoded inside a text.
    Text(Vec<u8>),
    /// A special (control) token, by its content (`<|im_end|>`).
    Special(String),
    /// An id with no vocabulary entry (or a piece the decoder cannot map):
    /// never part of a constrained text.
    Missing,
}

/// How the decoder turns pieces into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceForm {
    /// GPT-2 byte-level: every char of a piece is one byte.
    ByteLevel,
    /// SentencePiece: `<0xHH>` pieces are bytes, `space` stands for ' '.
    ByteFallback { space: char },
    /// Plain pieces that may use `space` for ' ' (Metaspace / Replace
    /// without byte fallback).
    Plain { space: char },
    /// No decoder: pieces are joined with a space.
    Joined,
}

impl Tokenizer {
    /// The bytes of every id below [`Tokenizer::vocab_size`], in id order.
    pub fn token_bytes(&self) -> Vec<TokenBytes> {
        let form = piece_form(
            self.inner
                .get_decoder()
                .and_then(|d| serde_json::to_value(d).ok()),
        );
        let added = self.inner.get_added_tokens_decoder();
        let chars = byte_level_chars();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return if token.special {
                        TokenBytes::Special(token.content.clone())
                    } else {
                        TokenBytes::Text(token.content.clone().into_bytes())
                    };
                }
                match self.inner.id_to_token(id) {
                    Some(piece) => piece_bytes(&piece, form, &chars),
                    None => TokenBytes::Missing,
                }
            })
            .collect()
    }
}

fn piece_bytes(piece: &str, form: PieceForm, chars: &HashMap<char, u8>) -> TokenBytes {
    match form {
        PieceForm::ByteLevel => piece
            .chars()
            .map(|c| chars.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .map_or(TokenBytes::Missing, TokenBytes::Text),
        PieceForm::ByteFallback { space } => {
            if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
                && hex.len() == 2
                && let Ok(b) = u8::from_str_radix(hex, 16)
            {
                return TokenBytes::Text(vec![b]);
            }
            TokenBytes::Text(piece.replace(space, " ").into_bytes())
        }
        PieceForm::Plain { space } => TokenBytes::Text(piece.replace(space, " ").into_bytes()),
        PieceForm::Joined => TokenBytes::Text(format!(" {piece}").into_bytes()),
    }
}

/// The decoder's form, read from its serialised JSON (some fields, such as
/// a `Replace` pattern, have no accessor).
fn piece_form(decoder: Option<Value>) -> PieceForm {
    let Some(decoder) = decoder else {
        return PieceForm::Joined;
    };
    let mut parts = Vec::new();
    flatten(&decoder, &mut parts);
    let kind = |name: &str| parts.iter().any(|d| d["type"] == name);
    if kind("ByteLevel") {
        return PieceForm::ByteLevel;
    }
    let space = parts
        .iter()
        .find_map(|d| match d["type"].as_str() {
            Some("Replace") if d["content"] == " " => single_char(&d["pattern"]["String"]),
            Some("Metaspace") => single_char(&d["replacement"]),
            _ => None,
        })
        .unwrap_or('▁');
    if kind("ByteFallback") {
        PieceForm::ByteFallback { space }
    } else {
        PieceForm::Plain { space }
    }
}

fn flatten<'v>(d: &'v Value, out: &mut Vec<&'v Value>) {
    match d["decoders"].as_array() {
        Some(list) => list.iter().for_each(|x| flatten(x, out)),
        None => out.push(d),
    }
}

fn single_char(v: &Value) -> Option<char> {
    let s = v.as_str()?;
    let mut it = s.chars();
    match (it.next(), it.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the
/// rest are shifted to U+0100 onwards in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable =
        |b: u8| matches!(b, b'!'..=b'~') || matches!(b, 0xA1..=0xAC) || matches!(b, 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        if printable(b) {
            map.insert(b as char, b);
        } else {
            map.insert(char::from_u32(next).unwrap_or('\0'), b);
            next += 1;
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forms_from_decoders() {
        assert_eq!(piece_form(None), PieceForm::Joined);
        assert_eq!(
            piece_form(Some(json!({"type": "ByteLevel"}))),
            PieceForm::ByteLevel
        );
        let sp = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        assert_eq!(piece_form(Some(sp)), PieceForm::ByteFallback { space: '▁' });
    }

    #[test]
    fn pieces_to_bytes() {
        let chars = byte_level_chars();
        assert_eq!(
            piece_bytes("Ġhi", PieceForm::ByteLevel, &chars),
            TokenBytes::Text(b" hi".to_vec())
        );
        assert_eq!(
            piece_bytes("Ċ", PieceForm::ByteLevel, &chars),
            TokenBytes::Text(b"\n".to_vec())
        );
        let sp = PieceForm::ByteFallback { space: '▁' };
        assert_eq!(
            piece_bytes("<0x0A>", sp, &chars),
            TokenBytes::Text(vec![10])
        );
        assert_eq!(
            piece_bytes("▁the", sp, &chars),
            TokenBytes::Text(b" the".to_vec())
        );
        assert_eq!(
            piece_bytes("w3", PieceForm::Joined, &chars),
            TokenBytes::Text(b" w3".to_vec())
        );
    }
}
