//! Prometheus metrics: a text-exposition builder and a tiny HTTP server (`/metrics`,
//! and `/healthz` for probes). Metrics never carry counts of private rows or units.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

/// Builds one scrape in the Prometheus text format.
#[derive(Default)]
pub struct Exposition {
    text: String,
    declared: BTreeSet<String>,
}

impl Exposition {
    fn sample(&mut self, kind: &str, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        if self.declared.insert(name.to_string()) {
            let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
        let labels: Vec<String> =
            labels.iter().map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        let _ = writeln!(self.text, "{name}{labels} {value}");
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.sample("gauge", name, help, labels, value);
    }

    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.sample("counter", name, help, labels, value);
    }

    pub fn finish(self) -> String {
        self.text
    }
}

/// Something that renders a scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `/metrics` and `/healthz` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, render: Render) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(render())))
        .route("/healthz", get(|| std::future::ready("ok")));
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_once_with_escaped_labels() {
        let mut e = Exposition::default();
        e.gauge("rhosynth_epsilon_spent", "ε spent", &[("dataset", "a\"b")], 0.5);
        e.gauge("rhosynth_epsilon_spent", "ε spent", &[("dataset", "c")], 1.0);
        e.counter("rhosynth_tasks_total", "tasks", &[], 3.0);
        let text = e.finish();
        assert_eq!(text.matches("# TYPE rhosynth_epsilon_spent gauge").count(), 1);
        assert!(text.contains("rhosynth_epsilon_spent{dataset=\"a\\\"b\"} 0.5"));
        assert!(text.contains("rhosynth_tasks_total 3"));
    }
}
