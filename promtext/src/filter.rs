//! A forgiving read of text from a source that is not trusted (the guest, for the shim):
//! each line is read with [`parse_line`] and what is malformed, over the limits or outside
//! the [`Filter`] is dropped and counted instead of failing the whole text.

use std::collections::{HashMap, HashSet};

use crate::model::{Exposition, Kind};
use crate::text::{parse_line, Limits, Line};

/// What a filtered read keeps.
#[derive(Debug, Clone, Copy)]
pub struct Filter<'a> {
    /// Families whose names start with one of these.
    pub prefixes: &'a [&'a str],
    /// Labels the reader adds itself: a sample that carries one is dropped (not forged).
    pub reserved_labels: &'a [&'a str],
    /// HELP of a family the text gives none.
    pub default_help: &'a str,
}

/// What [`parse_filtered`] kept, and how many sample lines it dropped.
#[derive(Debug, Default)]
pub struct Filtered {
    pub exposition: Exposition,
    pub dropped: usize,
}

/// Keeps only: samples of families named with one of the filter's prefixes, declared (if at
/// all) as gauge or counter (untyped ones are gauges), without a reserved label; well-formed
/// and within `limits`. Timestamps are dropped. Samples are grouped by family, so samples
/// the text interleaved still render as one family each.
pub fn parse_filtered(text: &str, filter: &Filter<'_>, limits: &Limits) -> Filtered {
    let mut out = Filtered::default();
    let mut kinds: HashMap<String, Kind> = HashMap::new();
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut refused: HashSet<String> = HashSet::new();
    let mut kept = 0usize;
    for line in text.lines() {
        let mut sample = match parse_line(line, limits) {
            Ok(Line::Blank | Line::Comment) => continue,
            Ok(Line::Help { name, text }) => {
                helps.insert(name, text);
                continue;
            }
            Ok(Line::Type { name, kind }) => {
                match kind {
                    Some(k @ (Kind::Gauge | Kind::Counter)) => {
                        kinds.insert(name, k);
                    }
                    _ => {
                        refused.insert(name);
                    }
                }
                continue;
            }
            Ok(Line::Sample(s)) => s,
            Err(_) => {
                // A bad HELP or TYPE line is not a sample: only samples are counted.
                if !line.trim_start().starts_with('#') {
                    out.dropped += 1;
                }
                continue;
            }
        };
        let allowed = filter.prefixes.iter().any(|p| sample.name.starts_with(p))
            && !refused.contains(&sample.name)
            && !sample
                .labels
                .iter()
                .any(|(k, _)| filter.reserved_labels.contains(&k.as_str()));
        if !allowed || kept >= limits.max_samples {
            out.dropped += 1;
            continue;
        }
        let kind = kinds.get(&sample.name).copied().unwrap_or(Kind::Gauge);
        if out
            .exposition
            .family(&sample.name)
            .is_some_and(|f| f.kind != Some(kind))
        {
            out.dropped += 1;
            continue;
        }
        sample.timestamp = None;
        let help = helps
            .get(&sample.name)
            .map(String::as_str)
            .unwrap_or(filter.default_help);
        let name = sample.name.clone();
        out.exposition
            .family_mut(&name, Some(help), Some(kind))
            .samples
            .push(sample);
        kept += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: Filter<'static> = Filter {
        prefixes: &["kata_guest_", "kata_agent_"],
        reserved_labels: &["sandbox_id"],
        default_help: "Reported by the guest.",
    };

    #[test]
    fn the_text_is_regrouped_and_filtered() {
        let text = "# HELP kata_guest_load Guest load.\n# TYPE kata_guest_load gauge\n\
            kata_guest_load{item=\"load1\"} 0.5\n\
            kata_agent_threads 3 1700000000000\n\
            kata_guest_load{item=\"load5\"} 0.25\n\
            kata_shim_threads 99\n\
            kata_guest_meminfo{item=\"mem_total\",sandbox_id=\"forged\"} 1\n\
            kata_guest_x{item=\"a\"} 1 2 3\n\
            kata_guest_y{item=\"unterminated} 1\n\
            kata_guest_z{item=\"a\",item=\"b\"} 1\n\
            kata_guest_w{0bad=\"a\"} 1\n\
            kata_guest_v notanumber\n\
            # TYPE kata_guest_h histogram\n\
            kata_guest_h 1\n";
        let p = parse_filtered(text, &GUEST, &Limits::GUEST);
        assert_eq!(p.dropped, 8, "{:?}", p.exposition.render());
        assert_eq!(
            p.exposition.render(),
            "# HELP kata_guest_load Guest load.\n# TYPE kata_guest_load gauge\n\
             kata_guest_load{item=\"load1\"} 0.5\nkata_guest_load{item=\"load5\"} 0.25\n\
             # HELP kata_agent_threads Reported by the guest.\n# TYPE kata_agent_threads gauge\n\
             kata_agent_threads 3\n"
        );
    }

    #[test]
    fn the_source_cannot_exceed_its_limits() {
        let text: String = (0..50)
            .map(|i| format!("kata_guest_a{{n=\"{i}\"}} 1\n"))
            .collect();
        let limits = Limits {
            max_samples: 10,
            ..Limits::GUEST
        };
        let p = parse_filtered(&text, &GUEST, &limits);
        assert_eq!(
            (p.exposition.families()[0].samples.len(), p.dropped),
            (10, 40)
        );
        let long = format!("kata_guest_a{{n=\"{}\"}} 1\n", "x".repeat(1000));
        let p = parse_filtered(&long, &GUEST, &Limits::GUEST);
        assert_eq!(p.dropped, 1);
    }
}
