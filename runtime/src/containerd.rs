//! containerd as `kata-runtime` sees it: the binary and its version, and the runtime
//! entries for `io.containerd.kata.v2` in its configuration, read the way containerd reads
//! it (`containerd --config FILE config dump`, which applies imports and defaults; the file
//! itself when containerd is not installed).
//!
//! The snippets an operator adds are the deploy files (`deploy/containerd/`), included
//! here so that `kata-runtime check` prints exactly what `make install` puts down.

use std::path::{Path, PathBuf};

use crate::command;
use crate::report::Line;

/// The runtime type containerd turns into the binary name `containerd-shim-kata-v2`.
pub const RUNTIME_TYPE: &str = "io.containerd.kata.v2";
/// The shim binary containerd looks for in its PATH.
pub const SHIM_BINARY: &str = "containerd-shim-kata-v2";
/// containerd's own configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// The runtimes for containerd 1.6/1.7 (configuration version 2).
pub const SNIPPET_V2: &str = include_str!("../../deploy/containerd/kata-containerd-1.x.toml");
/// The runtimes for containerd 2.x (configuration version 3, which 2.0 to 2.2 write, and 4,
/// which 2.3 and later write: the CRI's runtime tables are the same in both).
pub const SNIPPET_V3: &str = include_str!("../../deploy/containerd/kata-containerd-2.x.toml");
/// Where `make install` puts the snippets.
pub const INSTALLED_SNIPPETS: &str = "/usr/share/kata-containers/deploy/containerd";

/// The CRI plugins that hold runtime entries, by configuration version: 3 and 4 (containerd
/// 2.x), 2 (1.x), 1 (old 1.x files, which containerd 1.x still reads).
const CRI_PLUGINS: [&str; 3] = [
    "io.containerd.cri.v1.runtime",
    "io.containerd.grpc.v1.cri",
    "cri",
];

/// A runtime entry whose `runtime_type` is [`RUNTIME_TYPE`] or a flavour of it
/// (`io.containerd.kata-<flavour>.v2`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct RuntimeEntry {
    /// The runtime's name: a RuntimeClass `handler`.
    pub name: String,
    /// `options.ConfigPath`, when set.
    pub config_path: Option<String>,
    /// The shim binary containerd runs for it (`containerd-shim-kata-builtin-v2`), whose
    /// name picks its configuration file when there is no `ConfigPath`.
    pub shim: String,
    /// `runtime_path`, when set: the shim binary by path.
    pub runtime_path: Option<String>,
}

impl RuntimeEntry {
    /// The configuration file its shim reads, and how it was chosen.
    pub fn configuration(&self) -> Result<(PathBuf, String), kata_config::Error> {
        if let Some(path) = &self.config_path {
            return Ok((PathBuf::from(path), "ConfigPath".into()));
        }
        let name = kata_config::file_name_for_shim(&self.shim);
        let path =
            kata_config::find_config_file_for(&name, self.runtime_path.as_deref().map(Path::new))?;
        Ok((path, format!("{name} by the shim's name")))
    }
}

/// The shim binary containerd runs for `runtime_type` (`io.containerd.kata-builtin.v2`:
/// `containerd-shim-kata-builtin-v2`), when it is ours.
fn kata_shim_of(runtime_type: &str) -> Option<String> {
    let rest = runtime_type.strip_prefix("io.containerd.")?;
    let (name, version) = rest.rsplit_once('.')?;
    (version == "v2" && (name == "kata" || name.starts_with("kata-")))
        .then(|| format!("containerd-shim-{name}-v2"))
}

/// What was found about containerd.
#[derive(Debug)]
pub struct Containerd {
    /// The binary in PATH.
    pub binary: Option<PathBuf>,
    /// Its version (`1.6.20~ds1`), or why it is unknown.
    pub version: Result<String, String>,
    /// Its configuration file.
    pub config: PathBuf,
    /// The kata runtime entries in it, or why they could not be read.
    pub entries: Result<Vec<RuntimeEntry>, String>,
    /// The configuration's `version` (1 when absent), when it could be read.
    pub config_version: Option<i64>,
}

impl Containerd {
    /// Looks at the containerd in PATH and its configuration file `config`.
    pub fn inspect(config: &Path) -> Self {
        let binary = command::find_in_path("containerd");
        let version = match &binary {
            Some(bin) => command::run(bin, &["--version"]).and_then(|out| {
                parse_version(&out.stdout)
                    .ok_or_else(|| format!("cannot read a version in {:?}", out.stdout.trim()))
            }),
            None => Err("containerd is not in PATH".into()),
        };
        let doc = read_config(binary.as_deref(), config);
        Self {
            binary,
            version,
            config: config.to_path_buf(),
            config_version: doc.as_ref().ok().map(config_version),
            entries: doc.map(|d| kata_runtimes(&d)),
        }
    }

    /// The major version, when known.
    fn major(&self) -> Option<u32> {
        self.version.as_ref().ok()?.split('.').next()?.parse().ok()
    }

    /// The snippet for this containerd: the 2.x one (configuration version 3 or 4) for
    /// containerd 2.x, else the version 2 one.
    pub fn snippet(&self) -> &'static str {
        let v3 = match self.major() {
            Some(major) => major >= 2,
            None => self.config_version.is_some_and(|v| v >= 3),
        };
        if v3 {
            SNIPPET_V3
        } else {
            SNIPPET_V2
        }
    }

    /// The check lines: containerd itself, the shim in PATH, the runtime entries.
    pub fn lines(&self, shim: Option<&Path>) -> Vec<Line> {
        let mut lines = Vec::new();
        lines.push(match (&self.binary, &self.version) {
            (Some(bin), Ok(version)) => Line::ok(
                "containerd",
                format!("containerd {version} at {}", bin.display()),
            ),
            (Some(bin), Err(why)) => Line::fail(
                "containerd",
                format!("{} does not answer --version: {why}", bin.display()),
                "reinstall containerd (apt install --reinstall containerd)",
            ),
            (None, _) => Line::fail(
                "containerd",
                "containerd is not in PATH",
                "install containerd 1.6 or later (apt install containerd)",
            ),
        });
        lines.push(match shim {
            Some(path) => Line::ok("containerd shim", format!("{SHIM_BINARY} at {}", path.display())),
            None => Line::fail(
                "containerd shim",
                format!("{SHIM_BINARY} is not in PATH, so containerd cannot start {RUNTIME_TYPE}"),
                "run `make install` (it installs the shim in $(PREFIX)/bin, /usr/local/bin by default)",
            ),
        });
        lines.push(self.entries_line());
        lines
    }

    fn entries_line(&self) -> Line {
        let file = self.config.display();
        let add = format!(
            "add these lines to {file} (or append {INSTALLED_SNIPPETS}/{}), then restart containerd:\n{}",
            if self.snippet() == SNIPPET_V3 { "kata-containerd-2.x.toml" } else { "kata-containerd-1.x.toml" },
            strip_comments(self.snippet())
        );
        let entries = match &self.entries {
            Ok(entries) => entries,
            Err(why) => return Line::fail("containerd runtime", why.clone(), add),
        };
        if entries.is_empty() {
            return Line::fail(
                "containerd runtime",
                format!("no runtime with runtime_type = \"{RUNTIME_TYPE}\" in {file}"),
                add,
            );
        }
        let names: Vec<String> = entries.iter().map(describe_entry).collect();
        let broken: Vec<String> = entries
            .iter()
            .filter_map(|e| {
                let err = match e.configuration() {
                    Ok((path, _)) => kata_config::Config::load_from(&path).err()?,
                    Err(err) => err,
                };
                Some(format!("runtime {}: {err}", e.name))
            })
            .collect();
        if broken.is_empty() {
            Line::ok(
                "containerd runtime",
                format!("{} in {file}", names.join(", ")),
            )
        } else {
            Line::fail(
                "containerd runtime",
                broken.join("; "),
                "run `make install` (it installs configuration.toml and configuration-builtin.toml), or fix the runtime's ConfigPath",
            )
        }
    }
}

fn describe_entry(e: &RuntimeEntry) -> String {
    match (&e.config_path, e.configuration()) {
        (Some(path), _) => format!("{} (ConfigPath {path})", e.name),
        (None, Ok((path, how))) => format!("{} ({}: {how})", e.name, path.display()),
        (None, Err(_)) => format!(
            "{} ({} by the shim's name, not found)",
            e.name,
            kata_config::file_name_for_shim(&e.shim)
        ),
    }
}

/// The configuration as containerd reads it: `config dump` when containerd is there.
fn read_config(binary: Option<&Path>, config: &Path) -> Result<toml::Table, String> {
    if !config.exists() {
        return Err(format!(
            "{} does not exist, so containerd runs with its defaults, which have no kata runtime",
            config.display()
        ));
    }
    let config_arg = config.display().to_string();
    let text = match binary {
        Some(bin) => {
            let out = command::run(bin, &["--config", &config_arg, "config", "dump"])?;
            if !out.success {
                return Err(format!(
                    "containerd cannot load {config_arg}: {}",
                    out.complaint()
                ));
            }
            out.stdout
        }
        None => {
            std::fs::read_to_string(config).map_err(|e| format!("cannot read {config_arg}: {e}"))?
        }
    };
    toml::from_str(&text).map_err(|e| format!("{config_arg} is not valid TOML: {e}"))
}

/// The configuration's `version` key; files without one are version 1.
pub fn config_version(doc: &toml::Table) -> i64 {
    doc.get("version")
        .and_then(toml::Value::as_integer)
        .unwrap_or(1)
}

/// Every runtime entry of type [`RUNTIME_TYPE`] under any CRI plugin's
/// `containerd.runtimes`, in name order.
pub fn kata_runtimes(doc: &toml::Table) -> Vec<RuntimeEntry> {
    let plugins = doc.get("plugins").and_then(toml::Value::as_table);
    let mut entries: Vec<RuntimeEntry> = CRI_PLUGINS
        .iter()
        .filter_map(|p| {
            plugins?
                .get(*p)?
                .get("containerd")?
                .get("runtimes")?
                .as_table()
        })
        .flat_map(|runtimes| runtimes.iter())
        .filter_map(|(name, rt)| {
            let shim = kata_shim_of(rt.get("runtime_type").and_then(toml::Value::as_str)?)?;
            Some((name, rt, shim))
        })
        .map(|(name, rt, shim)| RuntimeEntry {
            name: name.clone(),
            shim,
            runtime_path: rt
                .get("runtime_path")
                .and_then(toml::Value::as_str)
                .filter(|p| !p.is_empty())
                .map(str::to_string),
            config_path: rt
                .get("options")
                .and_then(|o| o.get("ConfigPath"))
                .and_then(toml::Value::as_str)
                .filter(|p| !p.is_empty())
                .map(str::to_string),
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// The version in `containerd --version`'s output:
/// `containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3` gives
/// `1.6.20~ds1`; upstream builds print `v1.7.24` (the `v` is dropped).
pub fn parse_version(output: &str) -> Option<String> {
    let word = output.lines().next()?.split_whitespace().nth(2)?;
    let version = word.strip_prefix('v').unwrap_or(word);
    version
        .starts_with(|c: char| c.is_ascii_digit())
        .then(|| version.to_string())
}

/// The snippet without its comment lines and blank lines.
fn strip_comments(snippet: &str) -> String {
    snippet
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
