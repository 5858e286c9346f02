//! `umn doctor`: which backends work here, which features the kernel offers, and why something
//! is missing.
use ummunotify::BackendReport;

/// Renders the probe of every backend.
pub fn render(reports: &[BackendReport]) -> String {
    let mut out = String::new();
    for r in reports {
        match &r.status {
            Ok(how) => out.push_str(&format!("{}: {how}\n", r.name)),
            Err(why) => out.push_str(&format!("{}: UNAVAILABLE: {why}\n", r.name)),
        }
        if !r.kernel_features.is_empty() {
            out.push_str(&format!(
                "  kernel offers: {}\n",
                r.kernel_features.join(" ")
            ));
        }
        for n in &r.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
    }
    out
}

/// Whether at least one backend can start.
pub fn any_available(reports: &[BackendReport]) -> bool {
    reports.iter().any(|r| r.status.is_ok())
}
