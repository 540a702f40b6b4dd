//! Reading the text format: one line at a time ([`parse_line`]), or a whole exposition
//! ([`parse`]), within [`Limits`]; and the spelling of values and names both ways.

use crate::model::{Exposition, Kind, Sample};

/// Bounds on what a reader accepts. The shim reads the guest's text with tight ones (the
/// guest is not trusted); kata-monitor reads shims' with [`Limits::GENEROUS`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Samples accepted at most.
    pub max_samples: usize,
    /// Labels a sample may carry.
    pub max_labels: usize,
    /// Longest metric or label name.
    pub max_name: usize,
    /// Longest label value (bytes).
    pub max_label_value: usize,
    /// Longest HELP text kept (characters; the rest is cut).
    pub max_help: usize,
}

impl Limits {
    /// What the guest may send the shim.
    pub const GUEST: Limits = Limits {
        max_samples: 20_000,
        max_labels: 8,
        max_name: 128,
        max_label_value: 256,
        max_help: 256,
    };
    /// Bounds a well-behaved exporter never reaches.
    pub const GENEROUS: Limits = Limits {
        max_samples: 1_000_000,
        max_labels: 64,
        max_name: 1024,
        max_label_value: 16 * 1024,
        max_help: 16 * 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::GUEST
    }
}

/// One line of an exposition.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// Empty, or only blanks.
    Blank,
    /// A comment that is neither HELP nor TYPE.
    Comment,
    /// `# HELP name text` (unescaped, cut to the limit).
    Help { name: String, text: String },
    /// `# TYPE name kind`; None when the word is not one of the format's kinds.
    Type { name: String, kind: Option<Kind> },
    /// A sample.
    Sample(Sample),
}

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

impl std::error::Error for ParseError {}

/// Reads one line (without its newline; a trailing `\r` is ignored).
pub fn parse_line(line: &str, limits: &Limits) -> Result<Line, String> {
    let line = line.trim_end_matches('\r').trim();
    if line.is_empty() {
        return Ok(Line::Blank);
    }
    let Some(comment) = line.strip_prefix('#') else {
        return parse_sample(line, limits).map(Line::Sample);
    };
    let comment = comment.trim_start();
    let (keyword, rest) = comment
        .split_once(char::is_whitespace)
        .unwrap_or((comment, ""));
    if keyword != "HELP" && keyword != "TYPE" {
        return Ok(Line::Comment);
    }
    let rest = rest.trim_start();
    let (name, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if name.len() > limits.max_name || !valid_metric_name(name) {
        return Err(format!("invalid metric name {name:?} in # {keyword}"));
    }
    let name = name.to_string();
    if keyword == "HELP" {
        let text = unescape_help(text).chars().take(limits.max_help).collect();
        Ok(Line::Help { name, text })
    } else {
        Ok(Line::Type {
            name,
            kind: Kind::from_word(text.trim()),
        })
    }
}

/// Reads a whole exposition. A sample belongs to the family of the `# TYPE`/`# HELP` lines
/// before it when its name is the family's (or a histogram's or summary's `_bucket`,
/// `_sum`, `_count`); any other sample makes an untyped family of its own name. The first
/// malformed line, a second HELP or TYPE of a family, a TYPE after the family's samples or
/// more samples than the limit is an error naming the line.
pub fn parse(text: &str, limits: &Limits) -> Result<Exposition, ParseError> {
    let mut out = Exposition::new();
    let mut current: Option<String> = None;
    let mut samples = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let err = |what: String| ParseError { line: i + 1, what };
        match parse_line(raw, limits).map_err(err)? {
            Line::Blank | Line::Comment => {}
            Line::Help { name, text } => {
                let family = out.family_mut(&name, None, None);
                if family.help.is_some() {
                    return Err(err(format!("a second # HELP of {name}")));
                }
                family.help = Some(text);
                current = Some(name);
            }
            Line::Type { name, kind } => {
                let Some(kind) = kind else {
                    return Err(err(format!("an unknown type of {name}")));
                };
                let family = out.family_mut(&name, None, None);
                if family.kind.is_some() || !family.samples.is_empty() {
                    return Err(err(format!("# TYPE of {name} after its samples or twice")));
                }
                family.kind = Some(kind);
                current = Some(name);
            }
            Line::Sample(sample) => {
                samples += 1;
                if samples > limits.max_samples {
                    return Err(err(format!("more than {} samples", limits.max_samples)));
                }
                let owner = current
                    .as_deref()
                    .filter(|f| {
                        let kind = out.family(f).map_or(Kind::Untyped, |f| f.kind_or_untyped());
                        kind.owns(f, &sample.name)
                    })
                    .unwrap_or(&sample.name)
                    .to_string();
                out.family_mut(&owner, None, None).samples.push(sample);
            }
        }
    }
    Ok(out)
}

fn unescape_help(s: &str) -> String {
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
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// One sample line: `name{label="value",...} value [timestamp]`.
fn parse_sample(line: &str, limits: &Limits) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.len() > limits.max_name || !valid_metric_name(name) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.trim_start().strip_prefix('{') {
        let (parsed, tail) = parse_labels(after, limits)?;
        labels = parsed;
        rest = tail;
    }
    let bad_value = || format!("invalid value {:?} of {name}", rest.trim());
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().and_then(parse_value).ok_or_else(bad_value)?;
    let timestamp = match fields.next() {
        Some(ts) => Some(ts.parse::<i64>().map_err(|_| bad_value())?),
        None => None,
    };
    if fields.next().is_some() {
        return Err(bad_value());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
        timestamp,
    })
}

/// A sample's labels.
type Labels = Vec<(String, String)>;

/// The labels after `{`, up to and including `}`; returns them and what follows.
fn parse_labels<'a>(mut s: &'a str, limits: &Limits) -> Result<(Labels, &'a str), String> {
    let mut labels: Labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(tail) = s.strip_prefix('}') {
            return Ok((labels, tail));
        }
        let eq = s.find('=').ok_or("a label without '='")?;
        let key = s[..eq].trim();
        if key.len() > limits.max_name || !valid_label_name(key) {
            return Err(format!("invalid label name {key:?}"));
        }
        if labels.iter().any(|(k, _)| k == key) {
            return Err(format!("label {key} twice"));
        }
        if labels.len() >= limits.max_labels {
            return Err(format!("more than {} labels", limits.max_labels));
        }
        s = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("the value of label {key} is not quoted"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let unclosed = || format!("the value of label {key} is not closed");
        let end = loop {
            let (i, c) = chars.next().ok_or_else(unclosed)?;
            match c {
                '"' => break i,
                '\\' => match chars.next().ok_or_else(unclosed)?.1 {
                    'n' => value.push('\n'),
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    other => return Err(format!("an unknown escape \\{other} in label {key}")),
                },
                '\n' => return Err(unclosed()),
                c => value.push(c),
            }
            if value.len() > limits.max_label_value {
                return Err(format!(
                    "the value of label {key} is longer than {} bytes",
                    limits.max_label_value
                ));
            }
        };
        labels.push((key.to_string(), value));
        s = s[end + 1..].trim_start();
        if let Some(tail) = s.strip_prefix(',') {
            s = tail;
        } else if !s.starts_with('}') {
            return Err("labels not separated by ','".into());
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// A sample value as the format writes it: integers without a fraction, `NaN`, `+Inf`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Whether `name` is a valid metric name.
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name (`__` names are reserved).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
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

    fn strict(text: &str) -> Result<Exposition, ParseError> {
        parse(text, &Limits::GENEROUS)
    }

    #[test]
    fn an_exposition_parses_into_its_families() {
        let e = strict(SHIM).expect("parses");
        assert_eq!(e.len(), 3);
        let mem = e.family("kata_guest_meminfo").expect("meminfo");
        assert_eq!(mem.kind, Some(Kind::Gauge));
        assert_eq!(mem.samples.len(), 2);
        assert_eq!(mem.samples[0].value, 524_288_000.0);
        let h = e
            .family("kata_shim_rpc_durations_histogram_milliseconds")
            .expect("histogram");
        assert_eq!(
            h.samples.len(),
            4,
            "buckets, sum and count are the histogram's"
        );
        let lonely = e.family("lonely_metric").expect("lonely");
        assert_eq!(lonely.kind, None);
        assert_eq!(lonely.samples[0].timestamp, Some(1_700_000_000_000));
        // What renders parses back as the same families.
        assert_eq!(strict(&e.render()).expect("re-parses"), e);
    }

    #[test]
    fn label_values_and_help_keep_their_escapes_through_a_round_trip() {
        let text = "# HELP m Line one\\nline two \\\\ end.\n# TYPE m gauge\n\
                    m{path=\"a\\\\b\",q=\"say \\\"hi\\\"\",n=\"x\\ny\",e=\"\"} 1\n";
        let e = strict(text).expect("parses");
        let labels = &e.family("m").expect("m").samples[0].labels;
        assert_eq!(labels[0].1, "a\\b");
        assert_eq!(labels[1].1, "say \"hi\"");
        assert_eq!(labels[2].1, "x\ny");
        assert_eq!(labels[3].1, "");
        assert_eq!(e.render(), text);
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
            ("m{a=\"1\",a=\"2\"} 1\n", 1),
            ("m{a=\"\\x\"} 1\n", 1),
            ("m 1 2 3\n", 1),
            ("# HELP m a\n# HELP m b\n", 2),
        ] {
            let e = strict(text).expect_err(text);
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
    }

    #[test]
    fn limits_bound_names_labels_values_and_samples() {
        let tight = Limits {
            max_samples: 2,
            max_labels: 1,
            max_name: 8,
            max_label_value: 4,
            max_help: 3,
        };
        assert!(parse_line("m{a=\"1\",b=\"2\"} 1", &tight).is_err());
        assert!(parse_line("m{a=\"12345\"} 1", &tight).is_err());
        assert!(parse_line("m_very_long 1", &tight).is_err());
        assert_eq!(
            parse_line("# HELP m abcdef", &tight),
            Ok(Line::Help {
                name: "m".into(),
                text: "abc".into()
            })
        );
        assert_eq!(parse("m 1\nm 2\nm 3\n", &tight).expect_err("3 > 2").line, 3);
    }

    #[test]
    fn values_are_written_as_the_format_wants() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(2.5), "2.5");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("1e3"), Some(1000.0));
        assert_eq!(parse_value("0x10"), None);
    }
}
