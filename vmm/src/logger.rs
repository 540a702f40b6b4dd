//! One JSON object per line on stderr, the shape the shim's slog-json lines have, so that a
//! parent can forward them unchanged.

/// Writes `msg` at `level` ("info", "warn", "error").
pub fn log(level: &str, msg: &str) {
    let line = serde_json::json!({
        "level": level,
        "source": "kata-vmm",
        "pid": std::process::id(),
        "msg": msg,
    });
    eprintln!("{line}");
}
