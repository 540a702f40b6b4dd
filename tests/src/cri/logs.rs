//! Container log files as the CRI writes them (`<log_directory>/<log_path>`), one record a
//! line: `TIMESTAMP STREAM TAG CONTENT`, with an RFC 3339 timestamp (nanoseconds), the
//! stream (`stdout` or `stderr`) and the tag `F` (a full line) or `P` (part of a line
//! longer than the runtime's maximum, continued by the next record of that stream).

use std::path::Path;

/// One line of a container's output, its partial records joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// The timestamp of the line's last record.
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    pub content: String,
}

/// The lines of a CRI log text; a malformed record is kept whole as a line of stream
/// `"?"`, so that a test sees it rather than losing it. A trailing partial line (its `F`
/// record not written yet) is left out.
pub fn parse_cri_log(text: &str) -> Vec<LogLine> {
    let mut lines = Vec::new();
    // Partial content per stream, waiting for its F record.
    let mut partial: Vec<(String, String)> = Vec::new();
    for record in text.lines() {
        let mut fields = record.splitn(4, ' ');
        let (time, stream, tag) = (fields.next(), fields.next(), fields.next());
        let content = fields.next().unwrap_or("");
        let (Some(time), Some(stream), Some(tag)) = (time, stream, tag) else {
            lines.push(malformed(record));
            continue;
        };
        if !matches!(stream, "stdout" | "stderr") {
            lines.push(malformed(record));
            continue;
        }
        let before = match partial.iter().position(|(s, _)| s == stream) {
            Some(i) => partial.remove(i).1,
            None => String::new(),
        };
        match tag {
            "P" => partial.push((stream.to_string(), before + content)),
            "F" => lines.push(LogLine {
                time: time.to_string(),
                stream: stream.to_string(),
                content: before + content,
            }),
            _ => lines.push(malformed(record)),
        }
    }
    lines
}

fn malformed(record: &str) -> LogLine {
    LogLine {
        time: String::new(),
        stream: "?".into(),
        content: record.to_string(),
    }
}

/// The lines of the CRI log file at `path` (none if it does not exist yet).
pub fn read_cri_log(path: &Path) -> Vec<LogLine> {
    std::fs::read_to_string(path)
        .map(|t| parse_cri_log(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_become_lines_with_partials_joined() {
        let text = "2024-01-02T03:04:05.123456789Z stdout F hello world\n\
                    2024-01-02T03:04:05.2Z stderr P par\n\
                    2024-01-02T03:04:05.3Z stdout F \n\
                    2024-01-02T03:04:05.4Z stderr F tial\n\
                    garbage\n\
                    2024-01-02T03:04:05.5Z stdout P unfinished\n";
        let lines = parse_cri_log(text);
        let got: Vec<(&str, &str)> = lines
            .iter()
            .map(|l| (l.stream.as_str(), l.content.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("stdout", "hello world"),
                ("stdout", ""),
                ("stderr", "partial"),
                ("?", "garbage"),
            ]
        );
        assert_eq!(lines[0].time, "2024-01-02T03:04:05.123456789Z");
        assert_eq!(lines[2].time, "2024-01-02T03:04:05.4Z");
    }
}
