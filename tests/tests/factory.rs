//! The VM pool's factory (`kata-runtime factory init|destroy`, `[factory]
//! vm_cache_number`): it keeps that many booted VMs ready, with agents that answer, refills
//! the pool after a claim, replaces a ready VM that is killed, and stops without leaving a
//! process, mount, network namespace, run directory or uid claim behind, on SIGTERM as
//! on `factory destroy`.
//!
//! The factory is a real one (`kata-runtime` and the shim from `KATA_TEST_SHIM_DIR`) with
//! a pool directory of the test's own; a test claims a VM the way a shim does (renaming
//! its ready file). Every factory started is ended by its pid, also when the test fails.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use e2e_tests::*;
use nix::sys::signal::Signal;
use serde_json::Value;

/// How many VMs the test factories keep ready.
const POOL_SIZE: usize = 2;
/// The agent's vsock port (protocols::AGENT_VSOCK_PORT).
const AGENT_PORT: u32 = 1024;

/// The test's pool: a directory and a configuration of its own, of the tests' QEMU
/// configuration.
fn pool(name: &str) -> TestPool {
    TestPool::new(&format!("factory-{name}"), RuntimeConfig::qemu(), POOL_SIZE)
}

/// Dropped before the factory it follows (declare it after), so that a VM the test
/// claimed and did not give back goes back on offer, and the factory's stop (or `destroy`)
/// removes it, also when the test failed.
struct GiveBack<'a>(&'a Path);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        give_back(self.0);
    }
}

/// The name under which the test claims a VM, as a shim claims it by its sandbox id.
const TEST_CLAIM: &str = "claimed-factory-test.json";

/// Puts the VM the test claimed back on offer (its ready file), if it holds one.
fn give_back(pool_dir: &Path) {
    for key in std::fs::read_dir(pool_dir).into_iter().flatten().flatten() {
        let claimed = key.path().join(TEST_CLAIM);
        let Ok(text) = std::fs::read(&claimed) else {
            continue;
        };
        if let Ok(v) = serde_json::from_slice::<Value>(&text) {
            let ready = key.path().join("ready").join(format!("{}.json", vm_id(&v)));
            let _ = std::fs::rename(&claimed, ready);
        }
    }
}

/// Whether the guest's agent takes a connection: the hybrid vsock socket answers
/// `CONNECT 1024` with `OK`, which it does only once the agent listens in the guest.
fn agent_answers(v: &Value) -> Result<(), String> {
    let socket = v["info"]["agent_socket"].as_str().unwrap_or_default();
    let mut stream = UnixStream::connect(socket).map_err(|e| format!("{socket}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| format!("{socket}: {e}"))?;
    if line.starts_with("OK ") {
        Ok(())
    } else {
        Err(format!("{socket} answered {line:?}"))
    }
}

/// Everything of the pool or of the VMs `ids` still on the host.
fn pool_leftovers(pool: &TestPool, ids: &[String]) -> Vec<String> {
    let mut left: Vec<String> = ids.iter().flat_map(|id| vm_leftovers(id)).collect();
    left.extend(pool.leftovers());
    left
}

/// Waits until nothing of the pool or of the VMs `ids` is left: no process, mount,
/// network namespace, run directory, share, uid claim, ready file or pid file.
fn assert_nothing_left(pool: &TestPool, ids: &[String]) {
    let clean = poll(Duration::from_secs(15), Duration::from_millis(100), || {
        pool_leftovers(pool, ids).is_empty().then_some(())
    });
    if clean.is_none() {
        panic!("left behind:\n{}", pool_leftovers(pool, ids).join("\n"));
    }
}

#[test]
fn the_factory_keeps_vms_ready_refills_replaces_and_leaves_nothing_on_sigterm() {
    let pool = pool("sigterm");
    let mut factory = TestFactory::start(&pool);
    let _give_back = GiveBack(&pool.dir);
    let mut seen: Vec<String> = Vec::new();

    // Filled, with agents that answer and uid claims naming each VM.
    pool.wait_full(&mut factory, &[]);
    let ready = pool.ready_files();
    for (path, v) in &ready {
        seen.push(vm_id(v));
        assert!(
            alive(vm_pid(v)),
            "{}: its VMM is not running",
            path.display()
        );
        if let Err(e) = agent_answers(v) {
            panic!("the agent of {} does not answer: {e}", vm_id(v));
        }
        if let Some(uid) = v["host_uid"].as_u64() {
            let claim = std::fs::read_to_string(format!("/run/vc/ids/{uid}"));
            assert_eq!(claim.ok().as_deref(), Some(vm_id(v).as_str()));
        }
    }

    // A shim claims one away (a rename of its ready file): the factory boots another.
    let (claimed_path, claimed) = &ready[0];
    let key_dir = claimed_path.parent().and_then(Path::parent).unwrap();
    let claimed_file = key_dir.join(TEST_CLAIM);
    std::fs::rename(claimed_path, &claimed_file).expect("claiming a ready VM");
    let refilled = pool.wait_full(&mut factory, &[vm_id(claimed)]);
    for v in &refilled {
        if !seen.contains(&vm_id(v)) {
            seen.push(vm_id(v));
        }
    }
    assert!(
        alive(vm_pid(claimed)),
        "the claimed VM must run on for its claimer"
    );

    // A ready VM killed with kill -9 is replaced, and what it left is removed.
    let victim = refilled
        .iter()
        .find(|v| vm_id(v) != vm_id(claimed))
        .cloned()
        .unwrap();
    assert!(signal(vm_pid(&victim), Signal::SIGKILL));
    let replaced = pool.wait_full(&mut factory, &[vm_id(&victim)]);
    for v in &replaced {
        if !seen.contains(&vm_id(v)) {
            seen.push(vm_id(v));
        }
        agent_answers(v).unwrap_or_else(|e| panic!("replacement's agent: {e}"));
    }
    let victim_left = poll(Duration::from_secs(30), Duration::from_millis(100), || {
        vm_leftovers(&vm_id(&victim)).is_empty().then_some(())
    });
    assert!(
        victim_left.is_some(),
        "the killed VM left behind:\n{}",
        vm_leftovers(&vm_id(&victim)).join("\n")
    );

    // The claimer gives its VM back (as if it never used it), so that the factory's
    // stop has it to remove too.
    give_back(&pool.dir);
    assert!(claimed_path.exists() && !claimed_file.exists());

    // SIGTERM: every ready VM stopped and removed, the factory gone, nothing left.
    assert!(signal(factory.pid, Signal::SIGTERM));
    assert!(
        wait_gone(factory.pid, FACTORY_STOP_LIMIT),
        "the factory did not stop on SIGTERM; its log:\n{}",
        factory.log()
    );
    assert_nothing_left(&pool, &seen);
}

#[test]
fn factory_destroy_stops_the_factory_and_its_vms() {
    let pool = pool("destroy");
    let mut factory = TestFactory::start(&pool);
    let ready = pool.wait_full(&mut factory, &[]);
    let ids: Vec<String> = ready.iter().map(vm_id).collect();

    let status = pool
        .kata_runtime(&["status"])
        .output()
        .expect("running factory status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "factory status: {text}");
    assert!(
        text.contains(&format!("running, pid {}", factory.pid)),
        "{text}"
    );
    for id in &ids {
        assert!(
            text.contains(id.as_str()),
            "status does not list {id}: {text}"
        );
    }

    let out = pool
        .kata_runtime(&["destroy"])
        .output()
        .expect("running factory destroy");
    assert!(
        out.status.success(),
        "factory destroy failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !alive(factory.pid),
        "the factory still runs after destroy returned"
    );
    assert_nothing_left(&pool, &ids);
}

#[test]
fn init_refuses_a_configuration_without_a_pool() {
    let pool = pool("off");
    let text = std::fs::read_to_string(&pool.config_file)
        .unwrap()
        .replace("vm_cache_number = 2", "vm_cache_number = 0");
    std::fs::write(&pool.config_file, text).unwrap();
    let out = pool
        .kata_runtime(&["init"])
        .output()
        .expect("running factory init");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("factory.vm_cache_number is 0"),
        "unexpected error: {err}"
    );
    assert!(!pool.dir.join("factory.pid").exists());
}

#[test]
fn a_crashed_factorys_ready_vms_are_removed_by_the_next_init_and_by_destroy() {
    let pool = pool("crash");
    let mut first = TestFactory::start(&pool);
    let orphans: Vec<Value> = pool.wait_full(&mut first, &[]);
    let orphan_ids: Vec<String> = orphans.iter().map(vm_id).collect();
    // kill -9: the factory cannot stop its VMs; they run on, still offered.
    assert!(signal(first.pid, Signal::SIGKILL));
    assert!(wait_gone(first.pid, Duration::from_secs(10)));
    for v in &orphans {
        assert!(alive(vm_pid(v)), "{} stopped with its factory", vm_id(v));
    }

    // The next factory of the pool removes them and offers VMs of its own.
    let mut second = TestFactory::start(&pool);
    let fresh = pool.wait_full(&mut second, &orphan_ids);
    let gone = poll(Duration::from_secs(30), Duration::from_millis(100), || {
        orphan_ids
            .iter()
            .all(|id| vm_leftovers(id).is_empty())
            .then_some(())
    });
    assert!(
        gone.is_some(),
        "the crashed factory's VMs were not removed:\n{}",
        orphan_ids
            .iter()
            .flat_map(|id| vm_leftovers(id))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // And `destroy` after another crash removes what that one left.
    let fresh_ids: Vec<String> = fresh.iter().map(vm_id).collect();
    assert!(signal(second.pid, Signal::SIGKILL));
    assert!(wait_gone(second.pid, Duration::from_secs(10)));
    let out = pool
        .kata_runtime(&["destroy"])
        .output()
        .expect("running factory destroy");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "factory destroy: {text}");
    assert!(
        text.contains(&format!("ready VMs removed: {POOL_SIZE}")),
        "{text}"
    );
    let mut all = orphan_ids;
    all.extend(fresh_ids);
    assert_nothing_left(&pool, &all);
}

#[test]
fn what_a_factory_killed_mid_boot_left_is_removed_by_destroy() {
    let pool = pool("midboot");
    let factory = TestFactory::start(&pool);
    // A VM being booted is marked `<key>/booting/<id>` until it is offered.
    let booting = poll(POOL_FILL_LIMIT, Duration::from_millis(5), || {
        std::fs::read_dir(&pool.dir)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|key| {
                std::fs::read_dir(key.path().join("booting"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .map(|m| m.file_name().to_string_lossy().into_owned())
            .next()
    });
    let Some(id) = booting else {
        panic!("no VM was ever booting; factory log:\n{}", factory.log());
    };
    assert!(signal(factory.pid, Signal::SIGKILL));
    assert!(wait_gone(factory.pid, Duration::from_secs(10)));
    let ready: Vec<String> = pool.ready().iter().map(vm_id).collect();

    let out = pool
        .kata_runtime(&["destroy"])
        .output()
        .expect("running factory destroy");
    assert!(
        out.status.success(),
        "factory destroy: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ids = ready;
    ids.push(id);
    assert_nothing_left(&pool, &ids);
}
