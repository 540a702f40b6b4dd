//! `kata-vmm --config FILE`: boots the VM described by FILE and exits with 0 when the guest
//! powers off or resets (or when stopped by SIGTERM). `kata-vmm check`: says whether this
//! host's KVM can run it at full speed.

use std::path::PathBuf;

use vmm::builder::Vmm;
use vmm::check::check;
use vmm::config::VmConfig;
use vmm::logger::log;

const USAGE: &str = "usage: kata-vmm --config FILE | kata-vmm check";

fn main() {
    // Before anything else: no exec'd program of ours can gain privileges, and seccomp
    // filters can be installed without CAP_SYS_ADMIN.
    if let Err(e) = vmm::seccomp::set_no_new_privs() {
        log("error", &e.to_string());
        std::process::exit(1);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["check"] => {
            let verdict = check();
            println!("{}", verdict.describe());
            verdict.exit_code()
        }
        ["--config", path] => run(PathBuf::from(path)),
        ["--help"] | ["-h"] => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            64
        }
    };
    std::process::exit(code);
}

fn run(path: PathBuf) -> i32 {
    let result = VmConfig::from_file(&path)
        .map_err(|e| e.to_string())
        .and_then(|config| Vmm::build(&config).map_err(|e| e.to_string()))
        .and_then(|vmm| vmm.run().map_err(|e| e.to_string()));
    match result {
        Ok(reason) => {
            let level = if reason.code == 0 { "info" } else { "error" };
            log(level, &format!("the VM ended: {}", reason.message));
            reason.code
        }
        Err(e) => {
            log("error", &e);
            1
        }
    }
}
