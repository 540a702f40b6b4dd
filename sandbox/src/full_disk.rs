//! A create that failed because a file system it writes to is full (ENOSPC, or EDQUOT on
//! a quota): which file system, what is full (space or inodes), and what to do. The
//! failing step's own error says what it wrote; this names the file systems of the
//! places a create writes (the sandbox state, the VM's run directory, the share, the
//! bundle) that have no room left.
//!
//! Reads `statvfs` only.

use std::path::{Path, PathBuf};

/// Below this much free space (or these many free inodes) a file system counts as full:
/// a sandbox's create writes a few KiB, the VMM's logs up to their caps.
const FULL_BYTES: u64 = 1 << 20;
const FULL_INODES: u64 = 16;

/// Whether an error's text says a file system was full.
pub fn says_full(text: &str) -> bool {
    [
        "No space left on device",
        "os error 28",
        "Disk quota exceeded",
        "os error 122",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// What is full about the file system holding `path`, if it is: `no space (12 KiB of
/// 4 MiB free)` or `no inodes (0 of 1000 free)`.
fn fullness(path: &Path) -> Option<String> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let st = nix::sys::statvfs::statvfs(existing).ok()?;
    let frag = st.fragment_size().max(1);
    let free = st.blocks_available() * frag;
    let total = st.blocks() * frag;
    let (files, files_free) = (st.files(), st.files_available());
    if free < FULL_BYTES.min(total / 2) || (total > 0 && free == 0) {
        Some(format!(
            "no space ({} KiB of {} KiB free)",
            free / 1024,
            total / 1024
        ))
    } else if files > 0 && files_free < FULL_INODES {
        Some(format!("no inodes ({files_free} of {files} free)"))
    } else {
        None
    }
}

/// The file system mounted at or above `path`: its mount point, from mountinfo.
fn mount_point(path: &Path) -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mount_point_in(&info, path)
}

fn mount_point_in(mountinfo: &str, path: &Path) -> PathBuf {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.components().count())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// For an error whose text [`says_full`]: which of `places` (what, path) lie on a full
/// file system, and what to do; None for any other error.
pub fn explain(text: &str, places: &[(&str, PathBuf)]) -> Option<String> {
    if !says_full(text) {
        return None;
    }
    let full: Vec<String> = places
        .iter()
        .filter_map(|(what, path)| {
            let why = fullness(path)?;
            Some(format!(
                "{what} {} is on a full file system (mounted at {}): {why}",
                path.display(),
                mount_point(path).display()
            ))
        })
        .collect();
    let said = if full.is_empty() {
        let list: Vec<String> = places
            .iter()
            .map(|(what, p)| format!("{what} {}", p.display()))
            .collect();
        format!(
            "a file system the create writes to was full or over its quota (one of: {})",
            list.join(", ")
        )
    } else {
        full.join("; ")
    };
    Some(format!(
        "{said}; free space or inodes there (or give that file system more) and create it again; \
         nothing of the sandbox was left behind"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_file_systems_are_explained() {
        assert!(says_full(
            "writing x: No space left on device (os error 28)"
        ));
        assert!(says_full("Disk quota exceeded (os error 122)"));
        assert_eq!(explain("permission denied", &[("a", "/".into())]), None);
        // / is not full here: the text still names where the create writes.
        let text = explain(
            "No space left on device",
            &[("the sandbox state", PathBuf::from("/nonexistent/x"))],
        )
        .expect("an explanation");
        assert!(text.contains("/nonexistent/x"), "{text}");
        assert!(text.contains("free space"), "{text}");
    }

    #[test]
    fn the_deepest_mount_above_a_path_holds_it() {
        let info = "22 1 0:21 / / rw - ext4 /dev/sda rw\n\
                    23 22 0:22 / /run rw - tmpfs tmpfs rw\n\
                    24 23 0:23 / /run/vc rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_point_in(info, Path::new("/run/vc/sbs/a/persist.json")),
            PathBuf::from("/run/vc")
        );
        assert_eq!(
            mount_point_in(info, Path::new("/run/vcx")),
            PathBuf::from("/run")
        );
    }
}
