//! Looking up `process.user.username` in the container's own `/etc/passwd`, read after
//! the stage has entered the container's root, so the image decides what a name means.

use std::io::Read;
use std::path::Path;

use super::StageError;

/// A passwd file larger than this is not a user database anyone meant to ship.
const MAX_PASSWD_BYTES: u64 = 4 * 1024 * 1024;

/// uid and gid of `name` in the passwd file at `path`.
pub fn lookup(path: &Path, name: &str) -> Result<(u32, u32), StageError> {
    let read_error = |source| StageError::Os {
        action: format!("read {} to resolve user {name:?}", path.display()),
        source,
    };
    let file = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            StageError::NoPasswdFile {
                name: name.to_string(),
                path: path.to_path_buf(),
            }
        } else {
            read_error(e)
        }
    })?;
    let mut text = String::new();
    file.take(MAX_PASSWD_BYTES)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    find(&text, name).ok_or_else(|| StageError::UnknownUser {
        name: name.to_string(),
        path: path.to_path_buf(),
    })
}

/// The uid and gid fields of `name`'s line (`name:password:uid:gid:gecos:home:shell`).
fn find(passwd: &str, name: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.trim().parse().ok()?;
        let gid = fields.next()?.trim().parse().ok()?;
        Some((uid, gid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_uid_and_gid_by_exact_name() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\n\
                      # comment\n\
                      www-data:x:33:33::/var/www:/bin/false\n\
                      broken:x:notanumber:1::/:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
        assert_eq!(find(passwd, "www-data"), Some((33, 33)));
        assert_eq!(find(passwd, "nobody"), Some((65534, 65534)));
        assert_eq!(find(passwd, "root"), Some((0, 0)));
        assert_eq!(find(passwd, "www"), None);
        assert_eq!(find(passwd, "broken"), None);
        assert_eq!(find(passwd, "nosuchuser"), None);
    }
}
