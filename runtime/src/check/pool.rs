//! The `vm pool` line: with `[factory] vm_cache_number` above 0, sandboxes start from
//! booted VMs only while a factory keeps the pool filled; without one they boot cold.

use std::path::Path;

use kata_config::Config;
use kata_sandbox::pool;

use crate::report::Line;

const NAME: &str = "vm pool";

/// Says whether the pool the configuration asks for is kept.
pub fn line(config: &Config, file: &str) -> Line {
    let f = &config.factory;
    if !f.enabled() {
        return Line::ok(
            NAME,
            "off (factory.vm_cache_number = 0): every sandbox boots its own VM",
        );
    }
    let dir = &f.vm_cache_dir;
    let ready = ready_vms(dir);
    match factory_pid(dir) {
        Some(pid) => Line::ok(
            NAME,
            format!(
                "the factory (pid {pid}) keeps {} VMs ready in {}; {ready} ready now",
                f.vm_cache_number,
                dir.display()
            ),
        ),
        None => Line::warn(
            NAME,
            format!(
                "factory.vm_cache_number = {} in {file}, but no factory runs for {}: \
                 sandboxes boot cold",
                f.vm_cache_number,
                dir.display()
            ),
            "start the factory: `kata-runtime factory init` (foreground), or `systemctl \
             enable --now /usr/share/kata-containers/deploy/systemd/kata-vm-factory.service`",
        ),
    }
}

/// The pid of the factory running for `dir` (its pid file names a live
/// `kata-vm-factory init`).
fn factory_pid(dir: &Path) -> Option<i32> {
    pool::pid_file_pid(dir).filter(|&pid| pool::is_factory(pid))
}

/// How many ready files the pool holds (every key).
fn ready_vms(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|key| {
            std::fs::read_dir(key.path().join("ready"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .filter(|f| f.path().extension().is_some_and(|x| x == "json"))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    fn config(text: &str) -> Config {
        Config::from_str(text, "c.toml").unwrap()
    }

    #[test]
    fn off_is_fine_and_on_without_a_factory_warns_with_the_fix() {
        assert_eq!(line(&config(""), "c.toml").status, Status::Ok);
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[factory]\nvm_cache_number = 2\nvm_cache_dir = \"{}\"\n",
            dir.path().display()
        );
        // A pid file of a process that is no factory (this test) counts for nothing.
        std::fs::write(
            dir.path().join("factory.pid"),
            std::process::id().to_string(),
        )
        .unwrap();
        let l = line(&config(&text), "c.toml");
        assert_eq!(l.status, Status::Warn, "{l:?}");
        assert!(l.detail.contains("no factory runs"), "{l:?}");
        assert!(l.fix.unwrap().contains("kata-runtime factory init"));
    }

    #[test]
    fn ready_files_of_every_key_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        for (key, n) in [("a", 2), ("b", 1)] {
            let ready = dir.path().join(key).join("ready");
            std::fs::create_dir_all(&ready).unwrap();
            for i in 0..n {
                std::fs::write(ready.join(format!("pool-{i}.json")), "{}").unwrap();
            }
            std::fs::write(ready.join(".pool-9.tmp"), "").unwrap();
        }
        assert_eq!(ready_vms(dir.path()), 3);
    }
}
