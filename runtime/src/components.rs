//! What the components a sandbox uses say about themselves: QEMU's version and machine
//! types, virtiofsd's version, the guest kernel's release (from the banner inside the
//! vmlinux) and the initrd's format. Shared by `check` (which judges) and `env` (which
//! reports); each answer is a `Result` whose error says why it is unknown.

use std::path::Path;

use crate::command;

/// QEMU's `--version` first line, e.g. `QEMU emulator version 10.0.2 (Debian ...)`.
pub fn qemu_version(qemu: &Path) -> Result<String, String> {
    let out = command::run(qemu, &["--version"])?;
    let line = out.stdout.lines().next().unwrap_or("").trim().to_string();
    if !out.success || line.is_empty() {
        return Err(format!(
            "{} --version failed: {}",
            qemu.display(),
            out.complaint()
        ));
    }
    Ok(line)
}

/// `(major, minor)` from QEMU's version line.
pub fn parse_qemu_version(line: &str) -> Option<(u32, u32)> {
    let version = line.split("version ").nth(1)?.split_whitespace().next()?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// Whether `qemu -machine help` lists the microvm machine type.
pub fn qemu_has_microvm(qemu: &Path) -> Result<bool, String> {
    let out = command::run(qemu, &["-machine", "help"])?;
    if !out.success {
        return Err(format!(
            "{} -machine help failed: {}",
            qemu.display(),
            out.complaint()
        ));
    }
    Ok(lists_microvm(&out.stdout))
}

/// Whether a `-machine help` listing has a `microvm` machine.
pub fn lists_microvm(listing: &str) -> bool {
    listing
        .lines()
        .any(|l| l.split_whitespace().next() == Some("microvm"))
}

/// virtiofsd's version, e.g. `1.14.0` from `virtiofsd 1.14.0`.
pub fn virtiofsd_version(virtiofsd: &Path) -> Result<String, String> {
    let out = command::run(virtiofsd, &["--version"])?;
    let line = out.stdout.lines().next().unwrap_or("").trim();
    match line.strip_prefix("virtiofsd ") {
        Some(version) if out.success => Ok(version.trim().to_string()),
        _ => Err(format!(
            "{} --version did not answer like virtiofsd: {}",
            virtiofsd.display(),
            out.complaint()
        )),
    }
}

/// The guest kernel's release (`6.1.158`): the file must be an ELF vmlinux, and its
/// `Linux version ...` banner names the release.
pub fn kernel_release(kernel: &Path) -> Result<String, String> {
    let bytes =
        std::fs::read(kernel).map_err(|e| format!("cannot read {}: {e}", kernel.display()))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(format!(
            "{} is not an ELF vmlinux (a compressed bzImage will not boot with our VMMs)",
            kernel.display()
        ));
    }
    find_linux_banner(&bytes)
        .ok_or_else(|| format!("{} has no `Linux version` banner", kernel.display()))
}

/// The release in the first `Linux version <release> ` banner of a kernel image.
pub fn find_linux_banner(bytes: &[u8]) -> Option<String> {
    const BANNER: &[u8] = b"Linux version ";
    let mut from = 0;
    while let Some(at) = bytes[from..]
        .windows(BANNER.len())
        .position(|w| w == BANNER)
    {
        let start = from + at + BANNER.len();
        let release: String = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_graphic())
            .map(|&b| char::from(b))
            .collect();
        if release.starts_with(|c: char| c.is_ascii_digit()) {
            return Some(release);
        }
        from = start;
    }
    None
}

/// What the initrd is: `newc cpio, 2.6 MiB` (uncompressed, as we build it) or
/// `gzip-compressed, 1.1 MiB`.
pub fn initrd_format(initrd: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(initrd)
        .map_err(|e| format!("cannot inspect {}: {e}", initrd.display()))?;
    let mut head = [0u8; 6];
    let read = std::fs::File::open(initrd)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .map_err(|e| format!("cannot read {}: {e}", initrd.display()))?;
    let kind = match &head[..read] {
        b"070701" | b"070702" => "newc cpio",
        [0x1f, 0x8b, ..] => "gzip-compressed",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "zstd-compressed",
        [0xfd, b'7', b'z', b'X', b'Z', 0] => "xz-compressed",
        _ => {
            return Err(format!(
                "{} is not a cpio archive (nor a gzip, zstd or xz one)",
                initrd.display()
            ))
        }
    };
    Ok(format!(
        "{kind}, {:.1} MiB",
        meta.len() as f64 / (1024.0 * 1024.0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_versions() {
        let line = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)";
        assert_eq!(parse_qemu_version(line), Some((10, 0)));
        assert_eq!(
            parse_qemu_version("QEMU emulator version 7.2.15"),
            Some((7, 2))
        );
        assert_eq!(parse_qemu_version("qemu: unknown option"), None);
    }

    #[test]
    fn microvm_in_a_machine_listing() {
        let listing =
            "Supported machines are:\nmicrovm              microvm (i386)\npc    Standard PC\n";
        assert!(lists_microvm(listing));
        assert!(!lists_microvm(
            "Supported machines are:\npc    Standard PC\nnotmicrovm  x\n"
        ));
    }

    #[test]
    fn banner_skips_format_strings_and_stops_at_the_release() {
        let image =
            b"\x7fELF....Linux version %s (%s)\0....Linux version 6.1.158 (root@b) #1 SMP\n\0";
        assert_eq!(find_linux_banner(image).as_deref(), Some("6.1.158"));
        assert_eq!(find_linux_banner(b"no banner here"), None);
    }

    #[test]
    fn kernel_release_wants_an_elf_file() {
        let dir = tempfile::tempdir().unwrap();
        let bz = dir.path().join("bzImage");
        std::fs::write(&bz, b"MZ....Linux version 6.1.0 ").unwrap();
        assert!(kernel_release(&bz).unwrap_err().contains("not an ELF"));
        let elf = dir.path().join("vmlinux");
        std::fs::write(
            &elf,
            b"\x7fELF\x02\x01....Linux version 6.1.0-test (x) #1\0",
        )
        .unwrap();
        assert_eq!(kernel_release(&elf).unwrap(), "6.1.0-test");
        assert!(kernel_release(&dir.path().join("none"))
            .unwrap_err()
            .contains("cannot read"));
    }

    #[test]
    fn initrd_formats() {
        let dir = tempfile::tempdir().unwrap();
        let cpio = dir.path().join("a.img");
        std::fs::write(&cpio, b"07070100000000").unwrap();
        assert!(initrd_format(&cpio).unwrap().starts_with("newc cpio, "));
        let text = dir.path().join("b.img");
        std::fs::write(&text, b"hello").unwrap();
        assert!(initrd_format(&text).unwrap_err().contains("not a cpio"));
    }
}
