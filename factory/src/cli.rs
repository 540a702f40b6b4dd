//! `kata-vm-factory init|status|destroy [--config PATH]` (what
//! `kata-runtime factory ...` runs): the command line, and the two commands that only
//! look at the pool directory. `status` lists the ready VMs; `destroy` stops the daemon
//! (its pid file) and removes every ready VM, also those of a daemon that crashed.
//! `init` is the daemon ([`super::daemon`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::daemon::{init, is_factory, now_ms, orphan_boots, pid_file_pid, remove_empty_dirs};
use super::pool;

const USAGE: &str = "\
usage: kata-vm-factory init [--config FILE]
       kata-vm-factory status [--config FILE]
       kata-vm-factory destroy [--config FILE]

  init     keep [factory] vm_cache_number booted, idle VMs ready in [factory]
           vm_cache_dir, in the foreground, until SIGTERM or SIGINT
  status   list the ready VMs (id, age, pool key, VMM pid)
  destroy  stop the running factory and every ready VM

  --config FILE  the configuration file (default: $KATA_CONF_FILE, then
                 /etc/kata-containers/configuration.toml, then
                 /usr/share/defaults/kata-containers/configuration.toml)";

/// How long `destroy` waits for the daemon to stop its VMs and exit.
const DESTROY_WAIT: Duration = Duration::from_secs(60);
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Init,
    Status,
    Destroy,
}

#[derive(Debug, PartialEq, Eq)]
struct Args {
    command: Command,
    config: Option<PathBuf>,
}

fn parse_args(args: &[OsString]) -> Result<Args, String> {
    let mut command = None;
    let mut config = None;
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = it.next() {
        if let Some(v) = arg.strip_prefix("--config=") {
            config = Some(PathBuf::from(v));
            continue;
        }
        match arg.as_str() {
            "--config" | "-c" => {
                config = Some(PathBuf::from(
                    it.next().ok_or_else(|| format!("{arg} needs a file"))?,
                ))
            }
            "init" if command.is_none() => command = Some(Command::Init),
            "status" if command.is_none() => command = Some(Command::Status),
            "destroy" if command.is_none() => command = Some(Command::Destroy),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    Ok(Args {
        command: command.ok_or("a command is needed: init, status or destroy")?,
        config,
    })
}

/// `factory ...`: `args` are the words after `factory`.
pub fn main(args: &[OsString]) -> ExitCode {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("factory: {why}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    let cfg = match load(args.config.as_deref()) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("factory: {why}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.command {
        Command::Init => init(cfg),
        Command::Status => status(&cfg),
        Command::Destroy => destroy(&cfg),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("factory: {why}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: Option<&Path>) -> Result<kata_config::Config, String> {
    let cfg = match path {
        Some(p) => kata_config::Config::load_from(p),
        None => kata_config::Config::load(),
    }
    .map_err(|e| e.to_string())?;
    Ok(cfg)
}

// --- status and destroy -----------------------------------------------------------------

fn status(cfg: &kata_config::Config) -> Result<(), String> {
    let dir = &cfg.factory.vm_cache_dir;
    match pid_file_pid(dir) {
        Some(pid) if is_factory(pid) => println!("factory: running, pid {pid}"),
        _ => println!("factory: not running"),
    }
    println!("pool directory: {}", dir.display());
    let now = now_ms();
    let ready = pool::list_ready(dir);
    println!("ready VMs: {}", ready.len());
    for (_, vm) in ready {
        let age = now.saturating_sub(vm.created_unix_ms) / 1000;
        println!(
            "{}  age {}s  key {}  vmm_pid {}{}",
            vm.id,
            age,
            vm.key,
            vm.info.vmm_pid,
            if vm.is_alive() { "" } else { "  (dead)" }
        );
    }
    Ok(())
}

fn destroy(cfg: &kata_config::Config) -> Result<(), String> {
    let dir = &cfg.factory.vm_cache_dir;
    if let Some(pid) = pid_file_pid(dir).filter(|&p| is_factory(p)) {
        // SAFETY: kill takes plain integers.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + DESTROY_WAIT;
        while is_factory(pid) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the factory (pid {pid}) did not stop within {DESTROY_WAIT:?} of SIGTERM"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("factory (pid {pid}) stopped");
    }
    // What a factory that is gone left (or one that crashed) is removed here.
    let me = std::process::id();
    let mut removed = 0;
    let mut keys = Vec::new();
    for (path, vm) in pool::list_ready(dir) {
        let taken = pool::claimed_file(dir, &vm.key, &format!("destroy-{me}-{}", vm.id));
        if std::fs::rename(&path, &taken).is_ok() {
            let left = pool::cleanup(&vm);
            if !left.is_empty() {
                eprintln!("factory destroy: {}: {left}", vm.id);
            }
            let _ = std::fs::remove_file(&taken);
            removed += 1;
        }
        if !keys.contains(&vm.key) {
            keys.push(vm.key);
        }
    }
    for (key, id) in orphan_boots(dir) {
        let left = pool::cleanup_by_id(dir, &key, &id);
        if !left.is_empty() {
            eprintln!("factory destroy: {id}: {left}");
        }
        let _ = std::fs::remove_file(pool::booting_file(dir, &key, &id));
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    if pid_file_pid(dir).is_some_and(|p| !is_factory(p)) {
        let _ = std::fs::remove_file(dir.join(pool::PID_FILE));
    }
    for key in keys {
        remove_empty_dirs(dir, &key);
    }
    println!("ready VMs removed: {removed}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Args, String> {
        parse_args(&words.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn commands_take_a_config_file_before_or_after() {
        assert_eq!(
            parse(&["init", "--config", "/a.toml"]).unwrap(),
            Args {
                command: Command::Init,
                config: Some("/a.toml".into())
            }
        );
        assert_eq!(
            parse(&["--config=/b.toml", "status"]).unwrap(),
            Args {
                command: Command::Status,
                config: Some("/b.toml".into())
            }
        );
        assert_eq!(parse(&["destroy"]).unwrap().command, Command::Destroy);
        assert!(parse(&[]).unwrap_err().contains("init, status or destroy"));
        assert!(parse(&["init", "status"])
            .unwrap_err()
            .contains("\"status\""));
        assert!(parse(&["init", "--config"])
            .unwrap_err()
            .contains("needs a file"));
    }
}
