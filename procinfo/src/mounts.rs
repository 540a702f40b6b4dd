//! The mount tables (`/proc/<pid>/mountinfo`, `/proc/<pid>/mounts`), read the same way on
//! the host and in the guest.

/// A path field of a mount table: the kernel writes space, tab, newline and backslash as
/// a backslash and three octal digits. Anything else, a lone or short escape included, is
/// kept as it is.
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes_become_their_bytes_and_the_rest_stays() {
        assert_eq!(unescape(r"/a\040b\011c\012d\134e"), "/a b\tc\nd\\e");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/tail\"), r"/tail\");
        assert_eq!(unescape(r"/short\04"), r"/short\04");
        assert_eq!(unescape(r"/not\+12octal\9999"), r"/not\+12octal\9999");
        assert_eq!(unescape("/é\\040x"), "/é x");
    }
}
