//! The service a recording is of: the name its windows carry (`service_name`).
//!
//! Owns: [`service_of`] (from a command line) and [`target_naming`] (a running process's
//! command line and `OTEL_SERVICE_NAME`, from /proc).
//! Must not: send anything.

/// A service name from a command line: the script's name without `.py`, the module of
/// `-m`, else the program's name.
pub fn service_of(argv: &[String]) -> String {
    let base = |p: &str| {
        std::path::Path::new(p)
            .file_name()
            .map_or_else(|| p.to_string(), |f| f.to_string_lossy().into_owned())
    };
    if let Some(i) = argv.iter().position(|a| a == "-m") {
        if let Some(m) = argv.get(i + 1) {
            return m.clone();
        }
    }
    if let Some(script) = argv.iter().skip(1).find(|a| a.ends_with(".py")) {
        return base(script).trim_end_matches(".py").to_string();
    }
    argv.first()
        .map_or_else(|| "python".to_string(), |p| base(p))
}

/// A process's command line and its OTEL_SERVICE_NAME, from /proc.
pub fn target_naming(pid: i32) -> (Vec<String>, Option<String>) {
    let split = |b: Vec<u8>| -> Vec<String> {
        b.split(|&c| c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).map_or_else(|_| Vec::new(), split);
    let env = std::fs::read(format!("/proc/{pid}/environ")).map_or_else(|_| Vec::new(), split);
    let service = env
        .iter()
        .find_map(|e| e.strip_prefix("OTEL_SERVICE_NAME=").map(str::to_string))
        .filter(|s| !s.is_empty());
    (argv, service)
}
