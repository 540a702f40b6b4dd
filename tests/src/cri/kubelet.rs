//! kubelet's volume layout, made by hand for a pod the CRI runs: what containerd's CRI
//! then hands the runtime as bind sources (`<root>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`),
//! with a tmpfs for a `medium: Memory` emptyDir and kubelet's atomic writer for
//! ConfigMaps. Its mounts are undone when it is dropped, a failed test's too.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::{bind_mount, CriContainerd, Pod};
use crate::StaticProbe;

pub struct FakeKubelet {
    root: PathBuf,
    volumes: PathBuf,
    /// tmpfs and bind mounts, undone at drop (last first).
    mounts: Vec<PathBuf>,
    version: AtomicU32,
}

impl FakeKubelet {
    /// A kubelet root under `dir` with the volumes directory of pod `uid`.
    pub fn new(dir: &Path, uid: &str) -> FakeKubelet {
        let root = dir.join("kubelet");
        let volumes = root.join("pods").join(uid).join("volumes");
        std::fs::create_dir_all(&volumes).expect("create the pod's volumes dir");
        FakeKubelet {
            root,
            volumes,
            mounts: Vec::new(),
            version: AtomicU32::new(0),
        }
    }

    fn plugin_dir(&self, plugin: &str, name: &str) -> PathBuf {
        let dir = self
            .volumes
            .join(format!("kubernetes.io~{plugin}"))
            .join(name);
        std::fs::create_dir_all(&dir).expect("create a volume dir");
        dir
    }

    /// A disk emptyDir with `mode` (kubelet: 0777; with fsGroup, setgid and the group).
    pub fn empty_dir(&self, name: &str, mode: u32, gid: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.plugin_dir("empty-dir", name);
        std::os::unix::fs::chown(&dir, None, Some(gid)).expect("chgrp the emptyDir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .expect("chmod the emptyDir");
        dir
    }

    /// A `medium: Memory` emptyDir: a tmpfs of `size` (tmpfs's `size=`) at its path.
    pub fn memory_empty_dir(&mut self, name: &str, size: &str) -> PathBuf {
        let dir = self.plugin_dir("empty-dir", name);
        let data = format!("size={size},mode=0777");
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", dir.display()));
        self.mounts.push(dir.clone());
        dir
    }

    /// kubelet's subPath `sub` of `volume` for `container`'s mount `n`: the directory
    /// made in the volume, bound at `pods/<uid>/volume-subpaths/<volume>/<container>/<n>`.
    pub fn sub_path(&mut self, volume: &Path, sub: &str, container: &str, n: u32) -> PathBuf {
        let dir = volume.join(sub);
        std::fs::create_dir_all(&dir).expect("create the subPath dir");
        let name = volume.file_name().expect("a volume has a name");
        let at = self
            .volumes
            .parent()
            .expect("the pod's dir")
            .join("volume-subpaths")
            .join(name)
            .join(container)
            .join(n.to_string());
        std::fs::create_dir_all(&at).expect("create the subPath mount point");
        mount(
            Some(&dir),
            &at,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("bind {} at {}: {e}", dir.display(), at.display()));
        self.mounts.push(at.clone());
        at
    }

    /// A ConfigMap volume holding `files`, written as kubelet's atomic writer does.
    pub fn configmap(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.plugin_dir("configmap", name);
        self.write_configmap(&dir, files);
        dir
    }

    /// kubelet's update of a ConfigMap volume: the files in a new `..<version>` dir,
    /// `..data` swapped to it by rename, new keys' symlinks, then the old version
    /// removed.
    pub fn write_configmap(&self, dir: &Path, files: &[(&str, &str)]) {
        let n = self.version.fetch_add(1, Ordering::SeqCst);
        let version = format!("..2026_11_28_00_00_00.{n}");
        let new = dir.join(&version);
        std::fs::create_dir(&new).expect("create a ConfigMap version dir");
        for (key, content) in files {
            std::fs::write(new.join(key), content).expect("write a ConfigMap key");
        }
        let old = std::fs::read_link(dir.join("..data")).ok();
        let tmp = dir.join("..data_tmp");
        symlink(&version, &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
        for (key, _) in files {
            let link = dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(format!("..data/{key}"), &link).expect("symlink a key");
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).expect("remove the old version");
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for dir in self.mounts.iter().rev() {
            let _ = umount2(dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The probe of [`assert_kubelet_volumes_behave`]
/// (busybox has no unix socket client and no inotify tool):
/// `listen PATH` echoes each connection's line back, prefixed "echo:";
/// `connect PATH MSG` sends MSG and prints the answer;
/// `inotify DIR` prints "ready", then the name of every entry created or moved into DIR.
const VOLUME_PROBE_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/inotify.h>

static int addr(const char *path, struct sockaddr_un *a) {
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    strncpy(a->sun_path, path, sizeof(a->sun_path) - 1);
    return socket(AF_UNIX, SOCK_STREAM, 0);
}

int main(int argc, char **argv) {
    struct sockaddr_un a;
    char buf[4096];
    if (argc == 3 && !strcmp(argv[1], "listen")) {
        int s = addr(argv[2], &a);
        unlink(argv[2]);
        if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 8)) { perror("listen"); return 1; }
        for (;;) {
            int c = accept(s, 0, 0);
            if (c < 0) continue;
            ssize_t n = read(c, buf, sizeof(buf) - 1);
            if (n > 0) { dprintf(c, "echo:%.*s", (int)n, buf); }
            close(c);
        }
    }
    if (argc == 4 && !strcmp(argv[1], "connect")) {
        int s = addr(argv[2], &a);
        if (connect(s, (struct sockaddr *)&a, sizeof(a))) { perror("connect"); return 1; }
        if (write(s, argv[3], strlen(argv[3])) < 0) { perror("write"); return 1; }
        ssize_t n = read(s, buf, sizeof(buf) - 1);
        if (n <= 0) { perror("read"); return 1; }
        printf("%.*s\n", (int)n, buf);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "inotify")) {
        int fd = inotify_init();
        if (fd < 0 || inotify_add_watch(fd, argv[2], IN_CREATE | IN_MOVED_TO | IN_DELETE) < 0) {
            perror("inotify"); return 1;
        }
        printf("ready\n");
        fflush(stdout);
        for (;;) {
            ssize_t n = read(fd, buf, sizeof(buf));
            for (char *p = buf; n > 0 && p < buf + n;) {
                struct inotify_event *e = (struct inotify_event *)p;
                printf("%s %s\n", e->mask & IN_DELETE ? "deleted" : "created", e->len ? e->name : "");
                fflush(stdout);
                p += sizeof(*e) + e->len;
            }
        }
    }
    fprintf(stderr, "usage: listen PATH | connect PATH MSG | inotify DIR\n");
    return 2;
}
"#;

/// kubelet's volumes as a pod uses them: a disk emptyDir that two containers share a
/// unix socket and a FIFO on (and a file through a subPath of it), a `medium: Memory` emptyDir that is a tmpfs of its
/// sizeLimit in the container, and a ConfigMap whose update (kubelet's `..data` swap on
/// the host) an inotify watcher in the container sees within a few seconds. `check`
/// looks at the running pod before it is removed (and checked for leftovers).
pub fn assert_kubelet_volumes_behave(c: &CriContainerd, check: impl FnOnce(&Pod)) {
    let h = c.handler();
    let config = c.pod_config("volumes");
    let uid = config
        .metadata
        .as_ref()
        .map(|m| m.uid.clone())
        .unwrap_or_default();
    let mut kubelet = FakeKubelet::new(&c.containerd().dir, &uid);
    // fsGroup 1234: the group's, setgid.
    let shared = kubelet.empty_dir("shared", 0o2775, 1234);
    let mem = kubelet.memory_empty_dir("mem", "64m");
    let cfg = kubelet.configmap("cfg", &[("greeting", "hello-v1")]);
    let sub = kubelet.sub_path(&shared, "sub", "client", 4);
    let probe = StaticProbe::build("volume-probe", VOLUME_PROBE_C);
    let pod = c.run_pod(config);

    let mounts = |ro_cfg: bool| {
        let mut cfg_mount = bind_mount(&cfg, "/cfg");
        cfg_mount.readonly = ro_cfg;
        let mut probe_mount = bind_mount(probe.dir(), "/probe");
        probe_mount.readonly = true;
        vec![
            bind_mount(&shared, "/shared"),
            bind_mount(&mem, "/mem"),
            cfg_mount,
            probe_mount,
        ]
    };
    let mut server = c.container_config(
        &pod,
        "server",
        &[
            "sh",
            "-c",
            "mkfifo /shared/fifo && (cat /shared/fifo > /shared/from-fifo &) && \
             mkdir -p /shared/sub && echo via-sub-path > /shared/sub/from-server && \
             exec /probe/volume-probe listen /shared/echo.sock",
        ],
    );
    server.mounts = mounts(true);
    let server = c.start_container(&pod, server);
    let mut client = c.container_config(
        &pod,
        "client",
        &[
            "sh",
            "-c",
            "/probe/volume-probe inotify /cfg > /mem/events & exec sleep 100000",
        ],
    );
    client.mounts = mounts(true);
    client.mounts.push(bind_mount(&sub, "/sub"));
    let client = c.start_container(&pod, client);
    let in_client = |script: &str| c.exec(&client, &["sh", "-c", script]);

    // A unix socket one container made on the emptyDir, the other connects to.
    let out = in_client(
        "for i in $(seq 1 50); do [ -S /shared/echo.sock ] && break; sleep 0.2; done; \
         /probe/volume-probe connect /shared/echo.sock ping",
    );
    assert_eq!(
        (out.exit_code, out.stdout.trim()),
        (0, "echo:ping"),
        "connect to the other container's socket: {}",
        out.stderr
    );
    // A FIFO likewise.
    let out = in_client("echo through-the-fifo | timeout 10 tee /shared/fifo >/dev/null");
    assert_eq!(
        out.exit_code, 0,
        "write the other container's FIFO: {}",
        out.stderr
    );
    let out = c.exec(
        &server,
        &["sh", "-c", "for i in $(seq 1 50); do [ -s /shared/from-fifo ] && break; sleep 0.2; done; cat /shared/from-fifo"],
    );
    assert_eq!(out.stdout.trim(), "through-the-fifo", "{}", out.stderr);
    // A subPath of the emptyDir is that directory of it.
    let out = in_client("cat /sub/from-server");
    assert_eq!(out.stdout.trim(), "via-sub-path", "{}", out.stderr);
    // In a VM the emptyDir is the guest's: nothing of it is on the host (but the
    // subPath's directory kubelet made).
    let on_host = shared.join("echo.sock").exists();
    assert_eq!(on_host, !h.is_vm(), "the host's emptyDir holds the socket");
    // kubelet's owner and mode (fsGroup).
    let out = in_client("stat -c '%a %g' /shared");
    assert_eq!(out.stdout.trim(), "2775 1234", "{}", out.stderr);

    // medium: Memory is a tmpfs of the sizeLimit.
    let out = in_client("grep ' /mem ' /proc/mounts; df -k /mem | tail -n 1");
    assert!(
        out.stdout.starts_with("tmpfs /mem tmpfs") && out.stdout.contains("size=65536k"),
        "/mem is not a 64 MiB tmpfs: {}",
        out.stdout
    );
    assert!(out.stdout.contains(" 65536 "), "df: {}", out.stdout);

    // The ConfigMap: as it is, then kubelet's update seen by the watcher.
    let out = in_client(
        "for i in $(seq 1 50); do grep -q ready /mem/events && break; sleep 0.2; done; \
         cat /mem/events; cat /cfg/greeting",
    );
    assert_eq!(out.stdout.trim(), "ready\nhello-v1", "{}", out.stderr);
    let swapped = Instant::now();
    kubelet.write_configmap(&cfg, &[("greeting", "hello-v2")]);
    let out = in_client(
        "for i in $(seq 1 100); do grep -q 'created ..data$' /mem/events && break; sleep 0.1; done; \
         cat /mem/events; cat /cfg/greeting",
    );
    let seen = swapped.elapsed();
    assert!(
        out.stdout.contains("created ..data\n") && out.stdout.trim().ends_with("hello-v2"),
        "no inotify event for the ConfigMap's update within 10 s: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(seen < Duration::from_secs(5), "the event took {seen:?}");
    eprintln!(
        "{}: ConfigMap update seen in the container after {seen:?}",
        h.name()
    );

    check(&pod);
    c.remove_pod_checked(pod);
}
