//! The guest lines: the kernel (an ELF vmlinux, with its release) and the initrd of the
//! configured backend.

use super::Backend;
use crate::components;
use crate::report::Line;

pub fn lines(backend: &Backend) -> Vec<Line> {
    let (kernel_key, kernel) = backend.kernel;
    let (initrd_key, initrd) = backend.initrd;
    let fix = |key: &str, script: &str| {
        format!("run `make install` (it builds it with guest/{script} and installs it), or set {key} in {}", backend.file)
    };
    vec![
        match components::kernel_release(kernel) {
            Ok(release) => Line::ok(
                "guest kernel",
                format!("Linux {release}, ELF vmlinux at {}", kernel.display()),
            ),
            Err(why) => Line::fail("guest kernel", why, fix(kernel_key, "build-kernel.sh")),
        },
        match components::initrd_format(initrd) {
            Ok(format) => Line::ok("guest initrd", format!("{format} at {}", initrd.display())),
            Err(why) => Line::fail("guest initrd", why, fix(initrd_key, "build-initrd.sh")),
        },
    ]
}
