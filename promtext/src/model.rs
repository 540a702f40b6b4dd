//! Families and samples, how they are built, combined and rendered.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::text::format_value;

/// A family's `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Kind {
    /// The word `# TYPE` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
            Kind::Untyped => "untyped",
        }
    }

    /// The kind `# TYPE` names, if it is one of the format's.
    pub fn from_word(word: &str) -> Option<Kind> {
        [
            Kind::Counter,
            Kind::Gauge,
            Kind::Histogram,
            Kind::Summary,
            Kind::Untyped,
        ]
        .into_iter()
        .find(|k| k.as_str() == word)
    }

    /// Whether sample `name` belongs to family `family` of this kind (a histogram's
    /// `_bucket`, `_sum`, `_count`; a summary's `_sum`, `_count`).
    pub fn owns(self, family: &str, name: &str) -> bool {
        if name == family {
            return true;
        }
        let Some(suffix) = name.strip_prefix(family) else {
            return false;
        };
        match self {
            Kind::Histogram => matches!(suffix, "_bucket" | "_sum" | "_count"),
            Kind::Summary => matches!(suffix, "_sum" | "_count"),
            _ => false,
        }
    }
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The full sample name: the family's, or with `_bucket`/`_sum`/`_count`.
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// Milliseconds since the epoch, when the line had one.
    pub timestamp: Option<i64>,
}

impl Sample {
    pub fn new(name: &str, labels: &[(&str, &str)], value: f64) -> Self {
        Sample {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
            timestamp: None,
        }
    }
}

/// A family: its name, HELP, TYPE and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: Option<String>,
    /// None: no `# TYPE` line (untyped, rendered without one).
    pub kind: Option<Kind>,
    pub samples: Vec<Sample>,
}

impl Family {
    /// The kind for comparisons: untyped when no `# TYPE` said otherwise.
    pub fn kind_or_untyped(&self) -> Kind {
        self.kind.unwrap_or(Kind::Untyped)
    }
}

/// Why a family was left out of a [`Exposition::merge`].
#[derive(Debug, PartialEq)]
pub struct Conflict {
    pub family: String,
    pub kept: &'static str,
    pub dropped: &'static str,
}

/// Families of samples, in the order they were first named.
#[derive(Debug, Default, Clone)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

impl PartialEq for Exposition {
    fn eq(&self, other: &Self) -> bool {
        self.families == other.families
    }
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// The family `name`, made (with `help` and `kind`) if it is not there yet.
    pub fn family_mut(
        &mut self,
        name: &str,
        help: Option<&str>,
        kind: Option<Kind>,
    ) -> &mut Family {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    help: help.map(str::to_string),
                    kind,
                    samples: Vec::new(),
                });
                self.index.insert(name.to_string(), self.families.len() - 1);
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    /// The family `name`, if there is one.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.index.get(name).map(|&i| &self.families[i])
    }

    /// Every family, in order.
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// Every family, in order, to change their samples.
    pub fn families_mut(&mut self) -> impl Iterator<Item = &mut Family> {
        self.families.iter_mut()
    }

    /// How many families there are (with samples or not).
    pub fn len(&self) -> usize {
        self.families.len()
    }

    pub fn is_empty(&self) -> bool {
        self.families.is_empty()
    }

    fn push(&mut self, help: &str, kind: Kind, sample: Sample) {
        let name = sample.name.clone();
        self.family_mut(&name, Some(help), Some(kind))
            .samples
            .push(sample);
    }

    /// Declares a family with no sample yet (it renders only once it has one).
    pub fn declare(&mut self, name: &str, help: &str, kind: Kind) {
        self.family_mut(name, Some(help), Some(kind));
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.push(help, Kind::Gauge, Sample::new(name, labels, value));
    }

    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.push(help, Kind::Counter, Sample::new(name, labels, value));
    }

    /// A histogram's samples: `bounds` are the buckets' upper bounds (ascending) and
    /// `buckets[i]` the observations at most `bounds[i]`, not cumulated; `buckets` has one
    /// more entry, for the observations above the last bound.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        buckets: &[u64],
        sum: f64,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulated = 0u64;
        let mut samples = Vec::with_capacity(bounds.len() + 3);
        for (i, bound) in bounds.iter().enumerate() {
            cumulated += buckets.get(i).copied().unwrap_or(0);
            let le = format_value(*bound);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            samples.push(Sample::new(&bucket, &with_le, cumulated as f64));
        }
        cumulated += buckets.get(bounds.len()).copied().unwrap_or(0);
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        samples.push(Sample::new(&bucket, &with_le, cumulated as f64));
        samples.push(Sample::new(&format!("{name}_sum"), labels, sum));
        samples.push(Sample::new(
            &format!("{name}_count"),
            labels,
            cumulated as f64,
        ));
        self.family_mut(name, Some(help), Some(Kind::Histogram))
            .samples
            .extend(samples);
    }

    /// Adds `other`'s families that this one does not have; a family already here keeps
    /// its own samples alone (what the shim does with the guest's families: the guest
    /// cannot add series to the host's).
    pub fn add_new_families(&mut self, other: Exposition) {
        for f in other.families {
            if self.index.contains_key(&f.name) {
                continue;
            }
            self.index.insert(f.name.clone(), self.families.len());
            self.families.push(f);
        }
    }

    /// Merges `other` in: the samples of a family already here are appended to it (its
    /// HELP and TYPE kept, a missing HELP taken from `other`); a family whose TYPE differs
    /// from the one here is left out (a scrape with two types for one name would be
    /// refused whole) and reported. What kata-monitor does with many shims' families.
    pub fn merge(&mut self, other: Exposition) -> Vec<Conflict> {
        let mut conflicts = Vec::new();
        for family in other.families {
            let Some(&i) = self.index.get(&family.name) else {
                self.index.insert(family.name.clone(), self.families.len());
                self.families.push(family);
                continue;
            };
            let existing = &mut self.families[i];
            if existing.kind_or_untyped() != family.kind_or_untyped() {
                conflicts.push(Conflict {
                    kept: existing.kind_or_untyped().as_str(),
                    dropped: family.kind_or_untyped().as_str(),
                    family: family.name,
                });
                continue;
            }
            if existing.help.is_none() {
                existing.help = family.help;
            }
            existing.samples.extend(family.samples);
        }
        conflicts
    }

    /// Sets `labels` on every sample, replacing a label of the same name that a sample
    /// already has (so that a series never has a label twice).
    pub fn add_labels(&mut self, labels: &[(&str, &str)]) {
        for family in &mut self.families {
            for sample in &mut family.samples {
                sample
                    .labels
                    .retain(|(name, _)| !labels.iter().any(|(l, _)| l == name));
                sample
                    .labels
                    .extend(labels.iter().map(|(n, v)| (n.to_string(), v.to_string())));
            }
        }
    }

    /// Keeps the families `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&Family) -> bool) {
        self.families.retain(|f| keep(f));
        self.reindex();
    }

    /// Puts the families in name order.
    pub fn sort_by_name(&mut self) {
        self.families.sort_by(|a, b| a.name.cmp(&b.name));
        self.reindex();
    }

    /// Renames a family and its samples' names with it (`prefix` + the old name).
    pub fn prefix_family(&mut self, name: &str, prefix: &str) {
        let Some(&i) = self.index.get(name) else {
            return;
        };
        let family = &mut self.families[i];
        family.name = format!("{prefix}{}", family.name);
        for s in &mut family.samples {
            s.name = format!("{prefix}{}", s.name);
        }
        self.reindex();
    }

    fn reindex(&mut self) {
        self.index = self
            .families
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
    }

    /// Whether a family of that name has samples.
    pub fn has(&self, name: &str) -> bool {
        self.family(name).is_some_and(|f| !f.samples.is_empty())
    }

    /// The value of the sample `name` with exactly `labels` (in any order), if any.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.families.iter().find_map(|f| {
            f.samples.iter().find_map(|s| {
                (s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v)))
                .then_some(s.value)
            })
        })
    }

    /// The text format: every family with samples, once.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            if let Some(help) = &f.help {
                let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(help));
            }
            if let Some(kind) = f.kind {
                let _ = writeln!(out, "# TYPE {} {}", f.name, kind.as_str());
            }
            for s in &f.samples {
                out.push_str(&s.name);
                if !s.labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in s.labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                    }
                    out.push('}');
                }
                out.push(' ');
                out.push_str(&format_value(s.value));
                if let Some(ts) = s.timestamp {
                    let _ = write!(out, " {ts}");
                }
                out.push('\n');
            }
        }
        out
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_once_with_their_samples_together() {
        let mut e = Exposition::new();
        e.gauge("a_b", "A b.", &[("item", "x")], 1.0);
        e.counter("c_total", "C.", &[], 2.0);
        e.gauge("a_b", "A b.", &[("item", "y")], 2.5);
        e.declare("empty", "Never set.", Kind::Gauge);
        assert_eq!(
            e.render(),
            "# HELP a_b A b.\n# TYPE a_b gauge\na_b{item=\"x\"} 1\na_b{item=\"y\"} 2.5\n\
             # HELP c_total C.\n# TYPE c_total counter\nc_total 2\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let mut e = Exposition::new();
        e.histogram("h", "H.", &[("a", "b")], &[1.0, 2.0], &[3, 0, 4], 12.5);
        assert_eq!(
            e.render(),
            "# HELP h H.\n# TYPE h histogram\nh_bucket{a=\"b\",le=\"1\"} 3\n\
             h_bucket{a=\"b\",le=\"2\"} 3\nh_bucket{a=\"b\",le=\"+Inf\"} 7\n\
             h_sum{a=\"b\"} 12.5\nh_count{a=\"b\"} 7\n"
        );
        assert_eq!(
            e.value("h_bucket", &[("le", "+Inf"), ("a", "b")]),
            Some(7.0)
        );
        assert!(e.has("h") && !e.has("h_bucket"));
    }

    #[test]
    fn adding_new_families_keeps_the_hosts_family_when_both_have_it() {
        let mut host = Exposition::new();
        host.gauge("m", "Host.", &[], 1.0);
        let mut guest = Exposition::new();
        guest.gauge("m", "Guest.", &[], 99.0);
        guest.gauge("g", "Guest only.", &[], 2.0);
        host.add_new_families(guest);
        assert_eq!(host.value("m", &[]), Some(1.0));
        assert_eq!(host.value("g", &[]), Some(2.0));
    }

    #[test]
    fn added_labels_replace_a_label_of_the_same_name() {
        let mut e = Exposition::new();
        e.gauge("m", "M.", &[("sandbox_id", "fake"), ("a", "1")], 1.0);
        e.add_labels(&[("sandbox_id", "s1"), ("cri_name", "web")]);
        assert_eq!(
            e.value(
                "m",
                &[("a", "1"), ("sandbox_id", "s1"), ("cri_name", "web")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn a_family_with_another_type_is_left_out_of_a_merge_and_reported() {
        let mut all = Exposition::new();
        all.gauge("m", "M.", &[], 1.0);
        let mut other = Exposition::new();
        other.counter("m", "M.", &[], 2.0);
        other.gauge("n", "N.", &[], 3.0);
        let conflicts = all.merge(other);
        assert_eq!(
            conflicts,
            vec![Conflict {
                family: "m".into(),
                kept: "gauge",
                dropped: "counter"
            }]
        );
        assert_eq!(all.value("m", &[]), Some(1.0));
        assert_eq!(all.value("n", &[]), Some(3.0));
    }

    #[test]
    fn renaming_sorting_and_retaining_keep_the_index_right() {
        let mut e = Exposition::new();
        e.gauge("z", "Z.", &[], 1.0);
        e.gauge("process_fds", "P.", &[], 2.0);
        e.gauge("a", "A.", &[], 3.0);
        e.prefix_family("process_fds", "kata_shim_");
        e.sort_by_name();
        e.retain(|f| f.name != "z");
        let names: Vec<&str> = e.families().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "kata_shim_process_fds"]);
        assert_eq!(e.value("kata_shim_process_fds", &[]), Some(2.0));
        assert!(e.family("kata_shim_process_fds").is_some() && e.family("z").is_none());
    }
}
