//! The one rule for container and sandbox ids, which the shim, the agent and
//! `kata-runtime` all apply: containerd's identifier rule. An id names directories on
//! the host and in the guest, so an id one side accepts and another refuses would leave
//! host work behind; with one rule, a bad id is refused before anything is done.
//!
//! The rule (containerd's `identifiers.Validate`): 1 to 76 characters, ASCII letters and
//! digits in runs separated by single `.`, `_` or `-`; no separator first, last or twice
//! in a row. So no id is `.`, `..`, hidden, or holds a `/`.

/// The longest id containerd accepts.
pub const MAX_ID_LEN: usize = 76;

/// An id that breaks the rule, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidId {
    pub id: String,
    pub why: &'static str,
}

impl std::fmt::Display for InvalidId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} is not a valid id: {}; an id is 1 to {MAX_ID_LEN} ASCII letters and digits, \
             with single `.`, `_` or `-` between them (containerd's identifier rule)",
            self.id, self.why
        )
    }
}

impl std::error::Error for InvalidId {}

/// Checks `id` against the rule.
pub fn validate(id: &str) -> Result<(), InvalidId> {
    let invalid = |why| {
        Err(InvalidId {
            id: id.to_string(),
            why,
        })
    };
    if id.is_empty() {
        return invalid("it is empty");
    }
    if id.len() > MAX_ID_LEN {
        return invalid("it is too long");
    }
    let separator = |c: u8| matches!(c, b'.' | b'_' | b'-');
    let mut after_separator = true;
    for &c in id.as_bytes() {
        if c.is_ascii_alphanumeric() {
            after_separator = false;
        } else if separator(c) {
            if after_separator {
                return invalid("a separator starts it or follows another");
            }
            after_separator = true;
        } else {
            return invalid("it holds a character other than letters, digits, `.`, `_` and `-`");
        }
    }
    if after_separator {
        return invalid("it ends with a separator");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerds_rule() {
        for ok in [
            "a",
            "flt-shim-running",
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "a.b_c-d",
            "A9",
            &"x".repeat(MAX_ID_LEN),
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".x",
            "x.",
            "a..b",
            "a-_b",
            "a/b",
            "../etc",
            "a b",
            "é",
            "a\0b",
            "-a",
            &"x".repeat(MAX_ID_LEN + 1),
        ] {
            let err = validate(bad).unwrap_err();
            assert_eq!(err.id, bad);
            assert!(err.to_string().contains("not a valid id"), "{err}");
        }
    }
}
