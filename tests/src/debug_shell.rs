//! `kata-runtime exec SANDBOX-ID`, the guest's root shell through the agent's debug
//! console, as the tests drive it: input written at once on its stdin, which is then
//! closed; the process killed by its pid if the test ends before it does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::Background;

/// `kata-runtime`, next to the shim in `KATA_TEST_SHIM_DIR` (`make build` puts it there).
pub fn kata_runtime() -> PathBuf {
    let dir = std::env::var("KATA_TEST_SHIM_DIR")
        .expect("KATA_TEST_SHIM_DIR is not set: run the end-to-end tests with `make test`");
    let bin = Path::new(&dir).join("kata-runtime");
    assert!(
        bin.is_file(),
        "{} does not exist: build it with `make runtime`",
        bin.display()
    );
    bin
}

/// Starts `kata-runtime exec id` with `input` (small enough for the pipe) as its stdin.
pub fn debug_shell(id: &str, input: &str) -> Background {
    let mut child = Command::new(kata_runtime())
        .args(["exec", id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kata-runtime exec");
    let mut pipe = child.stdin.take().expect("stdin pipe");
    let run = Background::new(child);
    match pipe.write_all(input.as_bytes()) {
        Ok(()) => {}
        // A refusing kata-runtime may exit before it reads its input.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => panic!("write kata-runtime exec's stdin: {e}"),
    }
    run
}

/// Waits for a [`debug_shell`] to end, at most `limit`; its output, or a panic saying
/// what it printed so far (it is killed when the handle drops).
pub fn finish_shell(mut run: Background, limit: Duration) -> Output {
    run.wait_within(limit).unwrap_or_else(|| {
        panic!(
            "kata-runtime exec did not end within {} s; output so far: {:?}",
            limit.as_secs(),
            run.stdout_so_far()
        )
    })
}
