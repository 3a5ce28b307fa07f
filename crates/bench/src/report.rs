//! Scenario-independent results: an ordered list of named values and latency
//! summaries, rendered human-readable or as one flat JSON object.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// Highest latency recorded, in nanoseconds (one hour); larger values saturate.
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// A latency histogram in nanoseconds, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("static histogram bounds are valid")
}

#[derive(Debug, Clone)]
pub enum Value {
    Int(u64),
    Float(f64),
    Str(String),
}

impl Value {
    fn human(&self) -> String {
        match self {
            Value::Int(n) => group_thousands(*n),
            Value::Float(f) if f.abs() >= 1000.0 => group_thousands(f.round() as u64),
            Value::Float(f) => format!("{f:.3}"),
            Value::Str(s) => s.clone(),
        }
    }

    fn json(&self, out: &mut String) {
        match self {
            Value::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Float(f) if f.is_finite() => {
                let _ = write!(out, "{:.3}", f);
            }
            Value::Float(_) => out.push_str("null"),
            Value::Str(s) => json_str(out, s),
        }
    }
}

/// Percentiles of one latency histogram, in microseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        if h.is_empty() {
            return Latency {
                count: 0,
                mean_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        Latency {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

#[derive(Debug)]
struct Field {
    key: &'static str,
    label: &'static str,
    value: Value,
}

/// The outcome of one scenario run.
#[derive(Debug)]
pub struct Report {
    scenario: &'static str,
    params: Vec<Field>,
    results: Vec<Field>,
    latencies: Vec<(&'static str, &'static str, Latency)>,
    warnings: Vec<String>,
    errors: Vec<String>,
    failed: bool,
}

impl Report {
    pub fn new(scenario: &'static str) -> Self {
        Report {
            scenario,
            params: Vec::new(),
            results: Vec::new(),
            latencies: Vec::new(),
            warnings: Vec::new(),
            errors: Vec::new(),
            failed: false,
        }
    }

    /// A run parameter (shown under "parameters", JSON key as given).
    pub fn param(&mut self, key: &'static str, label: &'static str, value: Value) {
        self.params.push(Field { key, label, value });
    }

    /// A measured result.
    pub fn result(&mut self, key: &'static str, label: &'static str, value: Value) {
        self.results.push(Field { key, label, value });
    }

    /// A latency summary; JSON keys are `<key>_p50_us` and so on.
    pub fn latency(&mut self, key: &'static str, label: &'static str, lat: Latency) {
        self.latencies.push((key, label, lat));
    }

    pub fn warn(&mut self, msg: String) {
        self.warnings.push(msg);
    }

    /// An error: the run is reported but the process exits non-zero.
    pub fn error(&mut self, msg: String) {
        self.errors.push(msg);
        self.failed = true;
    }

    /// Marks the run failed without an error message (e.g. `--fail-on-loss`).
    pub fn fail(&mut self) {
        self.failed = true;
    }

    pub fn exit_code(&self) -> u8 {
        u8::from(self.failed)
    }

    pub fn human(&self) -> String {
        let width = self
            .params
            .iter()
            .chain(&self.results)
            .map(|f| f.label.len())
            .chain(self.latencies.iter().map(|l| l.1.len()))
            .max()
            .unwrap_or(0);
        let mut s = String::new();
        let _ = writeln!(s, "== statehub-bench {} ==", self.scenario);
        for f in &self.params {
            let _ = writeln!(s, "  {:width$}  {}", f.label, f.value.human());
        }
        let _ = writeln!(s, "-- results --");
        for f in &self.results {
            let _ = writeln!(s, "  {:width$}  {}", f.label, f.value.human());
        }
        for (_, label, l) in &self.latencies {
            let _ = writeln!(
                s,
                "  {:width$}  p50 {} | p90 {} | p99 {} | p99.9 {} | max {} | mean {} (n={})",
                label,
                fmt_us(l.p50_us),
                fmt_us(l.p90_us),
                fmt_us(l.p99_us),
                fmt_us(l.p999_us),
                fmt_us(l.max_us),
                fmt_us(l.mean_us),
                group_thousands(l.count),
            );
        }
        for w in &self.warnings {
            let _ = writeln!(s, "  warning: {w}");
        }
        for e in &self.errors {
            let _ = writeln!(s, "  ERROR: {e}");
        }
        s
    }

    /// One flat JSON object on one line.
    pub fn json(&self) -> String {
        let mut s = String::with_capacity(1024);
        s.push('{');
        s.push_str("\"scenario\":");
        json_str(&mut s, self.scenario);
        for f in self.params.iter().chain(&self.results) {
            s.push(',');
            json_str(&mut s, f.key);
            s.push(':');
            f.value.json(&mut s);
        }
        for (key, _, l) in &self.latencies {
            for (suffix, v) in [
                ("count", Value::Int(l.count)),
                ("mean_us", Value::Float(l.mean_us)),
                ("p50_us", Value::Float(l.p50_us)),
                ("p90_us", Value::Float(l.p90_us)),
                ("p99_us", Value::Float(l.p99_us)),
                ("p999_us", Value::Float(l.p999_us)),
                ("max_us", Value::Float(l.max_us)),
            ] {
                let _ = write!(s, ",\"{key}_{suffix}\":");
                v.json(&mut s);
            }
        }
        for (key, list) in [("warnings", &self.warnings), ("errors", &self.errors)] {
            let _ = write!(s, ",\"{key}\":[");
            for (i, e) in list.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                json_str(&mut s, e);
            }
            s.push(']');
        }
        let _ = write!(s, ",\"ok\":{}", !self.failed);
        s.push('}');
        s
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000_000.0 {
        format!("{:.1}s", us / 1_000_000.0)
    } else if us >= 10_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{us:.0}µs")
    }
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let head = match digits.len() % 3 {
        0 => 3.min(digits.len()),
        h => h,
    };
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    out.push_str(&digits[..head]);
    for chunk in digits.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
    }
    out
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1234567), "1,234,567");
    }

    #[test]
    fn json_is_one_line_and_escaped() {
        let mut r = Report::new("t");
        r.param("a", "A", Value::Str("x\"y\n".into()));
        r.result("b", "B", Value::Float(1.5));
        r.error("bad".into());
        let j = r.json();
        assert!(!j.contains('\n'));
        assert!(j.contains(r#""a":"x\"y\n""#));
        assert!(j.contains(r#""b":1.500"#));
        assert!(j.contains(r#""errors":["bad"]"#));
        assert!(j.ends_with(r#""ok":false}"#));
    }
}
