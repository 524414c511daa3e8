//! A short lowercase word kept inline: what an identity kind
//! ([`super::Kind`]) and an event type ([`super::EventType`]) are. Both are
//! `Copy` and compared on every decision, so neither allocates.

/// The longest word, in bytes: 17 bytes with its length.
pub const MAX_WORD_LEN: usize = 16;

/// 1 to [`MAX_WORD_LEN`] of `a`–`z`, `0`–`9` and `_`, starting with a
/// letter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Word {
    len: u8,
    bytes: [u8; MAX_WORD_LEN],
}

impl Word {
    /// A word known to be one (a constant).
    pub(crate) const fn from_static(s: &[u8]) -> Word {
        let mut bytes = [0; MAX_WORD_LEN];
        let mut i = 0;
        while i < s.len() {
            bytes[i] = s[i];
            i += 1;
        }
        Word {
            len: s.len() as u8,
            bytes,
        }
    }

    /// `s` as a word, if it is one.
    pub(crate) fn parse(s: &str) -> Option<Word> {
        let b = s.as_bytes();
        let ok = (1..=MAX_WORD_LEN).contains(&b.len())
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
        ok.then(|| Word::from_static(b))
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII is ever stored (`parse`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}
