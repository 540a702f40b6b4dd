//! Runs the host's tools (`qemu-system-x86_64 --version`, `containerd config dump`, ...)
//! with a deadline, so that a wedged tool cannot hang `kata-runtime`, and finds programs
//! in `PATH` the way containerd does.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one tool may run; all of ours answer in well under 100 ms.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(3);

/// What a tool printed, and whether it exited with 0.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The first non-empty line of stderr (or stdout), for error messages.
    pub fn complaint(&self) -> String {
        self.stderr
            .lines()
            .chain(self.stdout.lines())
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .to_string()
    }
}

/// Runs `program args` with stdin closed; kills it after [`TOOL_TIMEOUT`].
pub fn run(program: &Path, args: &[&str]) -> Result<Output, String> {
    let name = program.display();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    // Read both pipes on threads: a tool that fills a pipe would otherwise block forever.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{name} {} did not finish within {} s",
                    args.join(" "),
                    TOOL_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {name}: {e}")),
        }
    };
    Ok(Output {
        success: status.success(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The first executable file called `name` in `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// A regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_a_tool_and_collects_its_output() {
        let out = run(
            Path::new("/bin/sh"),
            &["-c", "echo out; echo err >&2; exit 3"],
        )
        .unwrap();
        assert!(!out.success);
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.complaint(), "err");
    }

    #[test]
    fn a_missing_tool_is_an_error_naming_it() {
        let err = run(Path::new("/nonexistent/tool"), &[]).unwrap_err();
        assert!(err.contains("/nonexistent/tool"), "{err}");
    }

    #[test]
    fn finds_sh_in_path() {
        assert!(find_in_path("sh").is_some());
        assert!(find_in_path("no-such-program-here").is_none());
    }
}
