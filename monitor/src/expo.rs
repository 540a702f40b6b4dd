//! The Prometheus text exposition format (0.0.4): parsing what a shim answers into
//! families, adding labels to every sample, merging the families of many shims (one
//! `# HELP` and one `# TYPE` per family, all its samples together) and rendering them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    /// The value and optional timestamp, as written (validated).
    pub value: String,
}

/// A metric family: its HELP, TYPE and samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Family {
    pub help: Option<String>,
    pub kind: Option<String>,
    pub samples: Vec<Sample>,
}

/// Families by name, in name order.
pub type Families = BTreeMap<String, Family>;

/// What was wrong with a line of an exposition.
#[derive(Debug, PartialEq)]
pub struct ParseError {
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

const KINDS: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    valid_name(name) && !name.contains(':')
}

/// Whether sample `name` belongs to family `family` of type `kind`.
fn belongs(name: &str, family: &str, kind: Option<&str>) -> bool {
    if name == family {
        return true;
    }
    let Some(suffix) = name.strip_prefix(family) else {
        return false;
    };
    match kind {
        Some("histogram") => matches!(suffix, "_bucket" | "_sum" | "_count"),
        Some("summary") => matches!(suffix, "_sum" | "_count"),
        _ => false,
    }
}

fn unescape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('"') if quote => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn escape_label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn valid_float(s: &str) -> bool {
    matches!(s, "+Inf" | "-Inf" | "Inf" | "NaN") || s.parse::<f64>().is_ok()
}

/// Parses the labels of a sample, `rest` starting just after `{`; the labels and what
/// follows the closing `}`.
/// A sample's labels, in order.
type Labels = Vec<(String, String)>;

fn parse_labels(mut rest: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| "a label without '='".to_string())?;
        let name = rest[..eq].trim();
        if !valid_label_name(name) {
            return Err(format!("invalid label name {name:?}"));
        }
        rest = rest[eq + 1..].trim_start();
        rest = rest
            .strip_prefix('"')
            .ok_or_else(|| format!("the value of label {name} is not quoted"))?;
        // The closing quote: the first one not escaped.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(i);
                break;
            }
        }
        let end = end.ok_or_else(|| format!("the value of label {name} is not closed"))?;
        labels.push((name.to_string(), unescape(&rest[..end], true)));
        rest = rest[end + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("labels not separated by ','".into());
        }
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..end];
    if !valid_name(name) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.trim_start().strip_prefix('{') {
        let (l, after) = parse_labels(after)?;
        labels = l;
        rest = after;
    }
    let fields: Vec<&str> = rest.split_whitespace().collect();
    match fields.as_slice() {
        [value] if valid_float(value) => {}
        [value, ts] if valid_float(value) && ts.parse::<i64>().is_ok() => {}
        _ => return Err(format!("invalid value {:?} of {name}", rest.trim())),
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value: fields.join(" "),
    })
}

/// Parses an exposition in the text format into its families. A sample belongs to the
/// family of the `# TYPE`/`# HELP` lines before it when its name is the family's (or a
/// histogram's or summary's `_bucket`, `_sum`, `_count`); any other sample makes an
/// untyped family of its own name.
pub fn parse(text: &str) -> Result<Families, ParseError> {
    let mut families = Families::new();
    let mut current: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let err = |what: String| ParseError { line: i + 1, what };
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            let (keyword, rest) = comment
                .split_once(char::is_whitespace)
                .unwrap_or((comment, ""));
            if keyword != "HELP" && keyword != "TYPE" {
                continue; // an ordinary comment
            }
            let rest = rest.trim_start();
            let (name, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            if !valid_name(name) {
                return Err(err(format!("invalid metric name {name:?} in # {keyword}")));
            }
            let family = families.entry(name.to_string()).or_default();
            if keyword == "HELP" {
                if family.help.is_some() {
                    return Err(err(format!("a second # HELP of {name}")));
                }
                family.help = Some(unescape(text, false));
            } else {
                let kind = text.trim();
                if !KINDS.contains(&kind) {
                    return Err(err(format!("unknown type {kind:?} of {name}")));
                }
                if family.kind.is_some() || !family.samples.is_empty() {
                    return Err(err(format!("# TYPE of {name} after its samples or twice")));
                }
                family.kind = Some(kind.to_string());
            }
            current = Some(name.to_string());
            continue;
        }
        let sample = parse_sample(line).map_err(err)?;
        let owner = match &current {
            Some(f)
                if belongs(
                    &sample.name,
                    f,
                    families.get(f).and_then(|f| f.kind.as_deref()),
                ) =>
            {
                f.clone()
            }
            _ => sample.name.clone(),
        };
        families.entry(owner).or_default().samples.push(sample);
    }
    Ok(families)
}

/// Sets `labels` on every sample of `families`, replacing a label of the same name that
/// a sample already has (so that a series never has a label twice).
pub fn add_labels(families: &mut Families, labels: &[(&str, &str)]) {
    for family in families.values_mut() {
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

/// Why a family of a source was left out of the merge.
#[derive(Debug, PartialEq)]
pub struct Conflict {
    pub family: String,
    pub kept: String,
    pub dropped: String,
}

/// Merges `from` into `into`: the samples of a family already there are appended to it
/// (its HELP and TYPE kept, a missing HELP taken from `from`); a family whose TYPE differs
/// from the one already there is left out (a scrape with two types for one name would be
/// rejected whole), and reported.
pub fn merge(into: &mut Families, from: Families) -> Vec<Conflict> {
    let mut conflicts = Vec::new();
    for (name, family) in from {
        let Some(existing) = into.get_mut(&name) else {
            into.insert(name, family);
            continue;
        };
        let kind = |k: &Option<String>| k.clone().unwrap_or_else(|| "untyped".into());
        if kind(&existing.kind) != kind(&family.kind) {
            conflicts.push(Conflict {
                family: name,
                kept: kind(&existing.kind),
                dropped: kind(&family.kind),
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

/// Renders families in the text format, in name order; families without samples are left
/// out.
pub fn render(families: &Families) -> String {
    let mut out = String::new();
    for (name, family) in families {
        if family.samples.is_empty() {
            continue;
        }
        if let Some(help) = &family.help {
            let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
        }
        if let Some(kind) = &family.kind {
            let _ = writeln!(out, "# TYPE {name} {kind}");
        }
        for s in &family.samples {
            out.push_str(&s.name);
            if !s.labels.is_empty() {
                out.push('{');
                for (i, (n, v)) in s.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{n}=\"{}\"", escape_label_value(v));
                }
                out.push('}');
            }
            out.push(' ');
            out.push_str(&s.value);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIM: &str = r#"# HELP kata_guest_meminfo Statistics about memory usage in the guest.
# TYPE kata_guest_meminfo gauge
kata_guest_meminfo{item="mem_total"} 5.24288e+08
kata_guest_meminfo{item="mem_free"} 4.1e+08
# a comment
# HELP kata_shim_rpc_durations_histogram_milliseconds RPC latency.
# TYPE kata_shim_rpc_durations_histogram_milliseconds histogram
kata_shim_rpc_durations_histogram_milliseconds_bucket{action="create",le="1"} 0
kata_shim_rpc_durations_histogram_milliseconds_bucket{action="create",le="+Inf"} 1
kata_shim_rpc_durations_histogram_milliseconds_sum{action="create"} 812
kata_shim_rpc_durations_histogram_milliseconds_count{action="create"} 1
lonely_metric 3 1700000000000
"#;

    #[test]
    fn a_shim_exposition_parses_into_its_families() {
        let f = parse(SHIM).expect("parses");
        assert_eq!(f.len(), 3);
        let mem = &f["kata_guest_meminfo"];
        assert_eq!(mem.kind.as_deref(), Some("gauge"));
        assert_eq!(mem.samples.len(), 2);
        assert_eq!(
            mem.samples[0].labels,
            vec![("item".to_string(), "mem_total".to_string())]
        );
        let h = &f["kata_shim_rpc_durations_histogram_milliseconds"];
        assert_eq!(
            h.samples.len(),
            4,
            "buckets, sum and count are the histogram's"
        );
        assert_eq!(f["lonely_metric"].kind, None);
        assert_eq!(f["lonely_metric"].samples[0].value, "3 1700000000000");
    }

    #[test]
    fn label_values_keep_their_escapes_through_a_round_trip() {
        let text = "# TYPE m gauge\nm{path=\"a\\\\b\",q=\"say \\\"hi\\\"\",n=\"x\\ny\",e=\"\"} 1\n";
        let f = parse(text).expect("parses");
        let labels = &f["m"].samples[0].labels;
        assert_eq!(labels[0].1, "a\\b");
        assert_eq!(labels[1].1, "say \"hi\"");
        assert_eq!(labels[2].1, "x\ny");
        assert_eq!(labels[3].1, "");
        assert_eq!(render(&f), text);
    }

    #[test]
    fn malformed_lines_are_refused_with_their_line_number() {
        for (text, line) in [
            ("m{a=\"1\" 2\n", 1),
            ("# TYPE m gauge\nm{a=1} 2\n", 2),
            ("m 1\nm two\n", 2),
            ("# TYPE m widget\n", 1),
            ("9m 1\n", 1),
            ("m{a=\"1\"} 1\n# TYPE m gauge\n", 2),
            ("m{a=\"x} 1\n", 1),
        ] {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
    }

    #[test]
    fn added_labels_replace_a_label_of_the_same_name() {
        let mut f = parse("m{sandbox_id=\"fake\",a=\"1\"} 1\n").expect("parses");
        add_labels(&mut f, &[("sandbox_id", "s1"), ("cri_name", "web")]);
        assert_eq!(
            render(&f),
            "m{a=\"1\",sandbox_id=\"s1\",cri_name=\"web\"} 1\n"
        );
    }

    #[test]
    fn merged_shims_give_one_help_and_type_per_family() {
        let mut all = Families::new();
        for id in ["s1", "s2"] {
            let mut f = parse(SHIM).expect("parses");
            add_labels(&mut f, &[("sandbox_id", id)]);
            assert!(merge(&mut all, f).is_empty());
        }
        let text = render(&all);
        assert_eq!(text.matches("# TYPE kata_guest_meminfo gauge").count(), 1);
        assert_eq!(text.matches("# HELP kata_guest_meminfo ").count(), 1);
        assert_eq!(text.matches("kata_guest_meminfo{").count(), 4);
        // A family's lines stay together: nothing of another family between them.
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let first = lines
            .iter()
            .position(|l| l.starts_with("kata_guest_meminfo{"));
        let last = lines
            .iter()
            .rposition(|l| l.starts_with("kata_guest_meminfo{"));
        assert_eq!(last.zip(first).map(|(l, f)| l - f), Some(3));
        assert!(
            text.contains("kata_guest_meminfo{item=\"mem_total\",sandbox_id=\"s2\"} 5.24288e+08")
        );
        // And it parses back as the same families.
        assert_eq!(parse(&text).expect("re-parses"), all);
    }

    #[test]
    fn a_family_with_another_type_is_left_out_and_reported() {
        let mut all = parse("# TYPE m gauge\nm 1\n").expect("parses");
        let conflicts = merge(&mut all, parse("# TYPE m counter\nm 2\n").expect("parses"));
        assert_eq!(
            conflicts,
            vec![Conflict {
                family: "m".into(),
                kept: "gauge".into(),
                dropped: "counter".into()
            }]
        );
        assert_eq!(render(&all), "# TYPE m gauge\nm 1\n");
    }
}
