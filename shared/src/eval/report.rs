//! The evaluation report: `report.json` (everything, machine-readable) and a
//! self-contained `report.html` (inline SVG plots, no scripts, no external resources).

use std::fmt::Write as _;

use super::database::{DatabaseReport, Distance, Link, TableEvaluation};
use super::longitudinal::Longitudinal;
use super::privacy::PrivacyDiagnostics;
use super::utility::Utility;
use super::{EvalLimits, EvalReport, NOT_DP, SampleUse, StageTiming};

const REAL: &str = "#1f77b4";
const SYNTHETIC: &str = "#ff7f0e";

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Grouped bars of two distributions over the same labels.
fn bars(title: &str, labels: &[String], real: &[f64], synthetic: &[f64], real_name: &str) -> String {
    let (w, h, pad) = (640.0, 220.0, 30.0);
    let n = labels.len().max(1) as f64;
    let top = real.iter().chain(synthetic).copied().fold(1e-12, f64::max);
    let slot = (w - 2.0 * pad) / n;
    let mut svg = format!(
        "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" role=\"img\"><title>{}</title>",
        h + 40.0,
        escape(title)
    );
    for (i, label) in labels.iter().enumerate() {
        let x = pad + i as f64 * slot;
        for (k, (value, color)) in [(real[i], REAL), (synthetic[i], SYNTHETIC)].into_iter().enumerate() {
            let bh = value / top * (h - pad);
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{color}\"><title>{}: {value:.4}</title></rect>",
                x + k as f64 * slot * 0.45,
                h - bh,
                slot * 0.42,
                escape(label)
            );
        }
        if labels.len() <= 24 {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" transform=\"rotate(35 {:.1} {:.1})\">{}</text>",
                x,
                h + 12.0,
                x,
                h + 12.0,
                escape(&label.chars().take(14).collect::<String>())
            );
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{pad}\" y=\"14\" font-size=\"12\" fill=\"{REAL}\">■ {real_name}</text>\
         <text x=\"{}\" y=\"14\" font-size=\"12\" fill=\"{SYNTHETIC}\">■ synthetic</text></svg>",
        pad + 120.0
    );
    svg
}

/// Empirical CDFs of two sorted samples.
fn cdfs(title: &str, a: &[f64], a_name: &str, b: &[f64], b_name: &str) -> String {
    let (w, h, pad) = (640.0, 220.0, 30.0);
    let top = a.iter().chain(b).copied().filter(|x| x.is_finite()).fold(1e-12, f64::max);
    let line = |v: &[f64], color: &str| {
        let points: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, x)| {
                format!("{:.1},{:.1}", pad + x / top * (w - 2.0 * pad), h - (i + 1) as f64 / v.len() as f64 * (h - pad))
            })
            .collect();
        format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>", points.join(" "))
    };
    format!(
        "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" role=\"img\"><title>{}</title>{}{}\
         <text x=\"{pad}\" y=\"14\" font-size=\"12\" fill=\"{REAL}\">— {a_name}</text>\
         <text x=\"{}\" y=\"14\" font-size=\"12\" fill=\"{SYNTHETIC}\">— {b_name}</text>\
         <text x=\"{pad}\" y=\"{}\" font-size=\"10\">0</text><text x=\"{}\" y=\"{}\" font-size=\"10\">{top:.3}</text></svg>",
        h + 20.0,
        escape(title),
        line(a, REAL),
        line(b, SYNTHETIC),
        pad + 160.0,
        h + 14.0,
        w - pad - 30.0,
        h + 14.0
    )
}

/// The dynamics section: per numeric column, lag-1 autocorrelation and transition error,
/// with the held-out tables' figures as the real-vs-real floor; then both as plots.
fn dynamics(l: &Longitudinal) -> String {
    if l.dynamics.is_empty() {
        return String::new();
    }
    let figure = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.3}"));
    let mut out = String::from(
        "<h3>Dynamics within units</h3><p>Lag-1: the correlation of each value with the unit's previous one, on values as the \
         schema reads them (clamped to its declared bounds). \
         Transition error: the Frobenius norm of the difference of lag-1 transition matrices over the training \
         data's quintiles. Held-out is real against real: the floor (higher when the held-out set is small).</p>",
    );
    out.push_str(&metric_table(&[
        ("mean lag-1 gap, synthetic", figure(l.mean_lag1_gap()), "mean |lag-1 synthetic − lag-1 real| over columns"),
        ("mean lag-1 gap, held-out (floor)", figure(l.holdout_mean_lag1_gap()), "the same for real held-out units"),
        ("transition error, held-out (floor)", format!("{:.4}", l.holdout_transition_error()), "mean over columns"),
    ]));
    out.push_str(
        "<table><tr><th>column</th><th>lag-1 real</th><th>lag-1 held-out</th><th>lag-1 synthetic</th>\
         <th>transition error</th><th>held-out (floor)</th></tr>",
    );
    for d in &l.dynamics {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{:.4}</td></tr>",
            escape(&d.column),
            figure(d.lag1_real),
            figure(d.lag1_holdout),
            figure(d.lag1_synthetic),
            d.transition_error,
            d.holdout_transition_error
        );
    }
    out.push_str("</table>");
    out.push_str(&lag1_dots(l));
    let labels: Vec<String> = l.dynamics.iter().map(|d| d.column.clone()).collect();
    let floor: Vec<f64> = l.dynamics.iter().map(|d| d.holdout_transition_error).collect();
    let error: Vec<f64> = l.dynamics.iter().map(|d| d.transition_error).collect();
    out.push_str("<h4>transition error per column</h4>");
    out.push_str(&bars("transition error per column", &labels, &floor, &error, "held-out (floor)"));
    out
}

/// Lag-1 autocorrelation per column on a −1…1 axis: real, held-out and synthetic.
fn lag1_dots(l: &Longitudinal) -> String {
    let (w, pad, row) = (640.0, 120.0, 22.0);
    let h = row * l.dynamics.len() as f64 + 40.0;
    let x = |v: f64| pad + (v.clamp(-1.0, 1.0) + 1.0) / 2.0 * (w - pad - 20.0);
    let mut svg = format!(
        "<h4>lag-1 autocorrelation per column</h4><svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{w}\" height=\"{h}\" role=\"img\"><title>lag-1 autocorrelation per column</title>\
         <line x1=\"{0:.1}\" y1=\"20\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"#999\"/>",
        x(0.0),
        h - 16.0
    );
    for (i, d) in l.dynamics.iter().enumerate() {
        let y = 30.0 + i as f64 * row;
        let _ = write!(svg, "<text x=\"4\" y=\"{:.1}\" font-size=\"10\">{}</text>", y + 4.0, escape(&d.column));
        for (value, color, name) in [
            (d.lag1_real, REAL, "real"),
            (d.lag1_holdout, "#777", "held-out"),
            (d.lag1_synthetic, SYNTHETIC, "synthetic"),
        ] {
            if let Some(v) = value {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{color}\"><title>{} {name}: {v:.3}</title></circle>",
                    x(v),
                    escape(&d.column)
                );
            }
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">−1</text><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">0</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">1</text>\
         <text x=\"{pad}\" y=\"12\" font-size=\"12\" fill=\"{REAL}\">● real (train)</text>\
         <text x=\"{:.1}\" y=\"12\" font-size=\"12\" fill=\"#777\">● held-out</text>\
         <text x=\"{:.1}\" y=\"12\" font-size=\"12\" fill=\"{SYNTHETIC}\">● synthetic</text></svg>",
        x(-1.0) - 4.0,
        h - 2.0,
        x(0.0) - 3.0,
        h - 2.0,
        x(1.0) - 3.0,
        h - 2.0,
        pad + 110.0,
        pad + 200.0
    );
    svg
}

/// Each link's synthetic (and training) value against the held-out one on −1…1 axes,
/// the diagonal where they agree.
fn links_plot(links: &[&Link]) -> String {
    let (size, pad) = (360.0, 30.0);
    let at = |v: f64| pad + (v.clamp(-1.0, 1.0) + 1.0) / 2.0 * (size - 2.0 * pad);
    let mut svg = format!(
        "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{size}\" height=\"{size}\" role=\"img\">\
         <title>links: synthetic and train against held-out</title>\
         <rect x=\"{pad}\" y=\"{pad}\" width=\"{w}\" height=\"{w}\" fill=\"none\" stroke=\"#ccc\"/>\
         <line x1=\"{pad}\" y1=\"{far}\" x2=\"{far}\" y2=\"{pad}\" stroke=\"#999\"/>",
        w = size - 2.0 * pad,
        far = size - pad
    );
    for l in links.iter().filter(|l| l.held_out.is_finite()) {
        for (value, color, name) in [(l.train, "#777", "train"), (l.synthetic, SYNTHETIC, "synthetic")] {
            if value.is_finite() {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\" fill-opacity=\"0.7\"><title>{} × {}: \
                     held-out {:.3}, {name} {value:.3}</title></circle>",
                    at(l.held_out),
                    size - at(value),
                    escape(&l.attribute),
                    escape(&l.summary),
                    l.held_out
                );
            }
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{pad}\" y=\"{}\" font-size=\"10\">held-out −1 … 1 →</text>\
         <text x=\"2\" y=\"{pad}\" font-size=\"10\">1</text><text x=\"2\" y=\"{}\" font-size=\"10\">−1</text>\
         <text x=\"{}\" y=\"14\" font-size=\"12\" fill=\"{SYNTHETIC}\">● synthetic</text>\
         <text x=\"{}\" y=\"14\" font-size=\"12\" fill=\"#777\">● train (floor)</text></svg>",
        size - 8.0,
        size - pad,
        pad,
        pad + 90.0
    );
    svg
}

/// A table's row: its text cells, then its numbers at `precision` decimals.
fn table_row(texts: &[&str], numbers: &[f64], precision: usize) -> String {
    let mut row = String::from("<tr>");
    texts.iter().for_each(|t| {
        let _ = write!(row, "<td>{}</td>", escape(t));
    });
    numbers.iter().for_each(|n| {
        let _ = write!(row, "<td>{n:.precision$}</td>");
    });
    row.push_str("</tr>");
    row
}

/// A "metric / value / meaning" table.
fn metric_table(rows: &[(&str, String, &str)]) -> String {
    let mut out = String::from("<table><tr><th>metric</th><th>value</th><th>meaning</th></tr>");
    for (name, value, meaning) in rows {
        let _ = write!(out, "<tr><td>{}</td><td>{value}</td><td>{}</td></tr>", escape(name), escape(meaning));
    }
    out.push_str("</table>");
    out
}

/// The self-contained HTML page.
pub fn html(report: &EvalReport) -> String {
    let mut body = opening(&report.notice, &report.sampling, &report.guarantee);
    if let Some(u) = &report.utility {
        body.push_str(&utility_section(u));
    }
    let f = &report.fidelity;
    body.push_str("<h2>Fidelity</h2>");
    body.push_str(&metric_table(&[
        ("HIST", format!("{:.4}", f.hist), "mean per-column histogram intersection (1 = identical)"),
        ("Pair", format!("{:.4}", f.pair), "mean 2-way histogram intersection (1 − mean 2-way TVD)"),
        ("Triple", format!("{:.4}", f.triple), "mean 3-way histogram intersection (1 − mean 3-way TVD)"),
        ("CorAcc", format!("{:.4}", f.cor_acc), "share of column pairs with the same association level"),
    ]));
    body.push_str("<table><tr><th>column</th><th>HIST</th><th>W1 (scaled)</th><th>JS distance</th></tr>");
    for c in &f.columns {
        let fmt = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.4}"));
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{:.4}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.name),
            c.hist,
            fmt(c.w1),
            fmt(c.js)
        );
    }
    body.push_str("</table><h3>Marginals</h3>");
    for c in &f.columns {
        let _ = write!(body, "<h4>{}</h4>", escape(&c.name));
        body.push_str(&bars(&c.name, &c.labels, &c.real, &c.synthetic, "real (train)"));
    }
    if let Some(l) = &report.longitudinal {
        body.push_str("<h2>Longitudinal fidelity</h2>");
        body.push_str(&metric_table(&[
            (
                "state-transition divergence",
                format!("{:.4}", l.state_transition_divergence),
                "mean Frobenius norm of transition-matrix differences",
            ),
            (
                "TDCR JS",
                format!("{:.4}", l.tdcr_js),
                "JS distance of synthetic vs held-out nearest-table distances (max √ln 2 ≈ 0.833)",
            ),
            (
                "TDCR median (synthetic / held-out)",
                format!("{:.4} / {:.4}", l.tdcr_synthetic_median, l.tdcr_holdout_median),
                "nearest training table, DTW per feature / path length, summed",
            ),
            ("sequence-length TV", format!("{:.4}", l.sequence_length_tv), "total variation of rows per unit"),
        ]));
        let labels: Vec<String> = l.lengths.iter().map(ToString::to_string).collect();
        body.push_str("<h4>rows per unit</h4>");
        body.push_str(&bars("rows per unit", &labels, &l.real_lengths, &l.synthetic_lengths, "real (train)"));
        body.push_str(&dynamics(l));
    }
    body.push_str(&privacy_section(&report.privacy, ""));
    let _ = write!(
        body,
        "<h2>Sizes</h2><p>train {} rows, held-out {} rows, synthetic {} rows (private figures).</p>",
        report.rows.train, report.rows.test, report.rows.synthetic
    );
    body.push_str(&sampling_section(&report.sampling, &report.limits, &report.timings));
    page(&body)
}

/// The page of a database's evaluation: per table its integrity, fidelity, rows per
/// parent, cross-table measures and dynamics; then per unit the utility.
pub fn database_html(report: &DatabaseReport) -> String {
    let mut body = opening(&report.notice, &report.sampling, &report.guarantee);
    let _ = write!(
        body,
        "<p>Units read: train {}, held-out {}, synthetic {} (private figures). Every database is read as the job reads \
         its input: joined by keys and capped by the spec's rule. Distances are to the held-out database; the \
         training database's distance to it is the floor a perfect generator would reach.</p>",
        report.units.train, report.units.test, report.units.synthetic
    );
    body.push_str(
        "<h2>Summary</h2><table><tr><th>table</th><th>rows (synthetic / held-out)</th><th>with parent</th>\
         <th>HIST</th><th>rows per parent TVD</th><th>cross-table TVD (mean)</th><th>lag-1 gap (mean)</th></tr>",
    );
    for t in &report.tables {
        let children: Vec<String> = t.children.iter().map(|c| pair(&c.tvd)).collect();
        let gaps: Vec<f64> = t.lag1.iter().map(|l| (l.synthetic - l.held_out).abs()).collect();
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{} / {}</td><td>{:.2}%</td><td>{:.4}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.name),
            t.rows.synthetic,
            t.rows.test,
            100.0 * t.integrity.with_parent,
            t.fidelity.hist,
            if children.is_empty() { "–".to_string() } else { children.join("; ") },
            t.cross_mean().map_or("–".to_string(), |(s, r)| format!("{s:.3} / {r:.3}")),
            if gaps.is_empty() {
                "–".to_string()
            } else {
                format!("{:.3}", gaps.iter().sum::<f64>() / gaps.len() as f64)
            }
        );
    }
    body.push_str("</table><p>Cells with two figures: synthetic / train (the floor).</p>");
    if let Some((synthetic, train)) = report.links_error() {
        let links: Vec<&Link> = report.tables.iter().flat_map(|t| &t.links).collect();
        let _ = write!(
            body,
            "<h2>Links between a row and its children</h2><p>Each attribute of a row (or of its ancestor) against              each summary of its children (their count, the mean of each numeric value): Pearson's correlation,              or the correlation ratio η with a categorical attribute; {} links. Mean absolute difference from the              held-out database's: synthetic <b>{synthetic:.3}</b>, train {train:.3} (the floor). Per table below.</p>",
            links.len()
        );
        body.push_str(&links_plot(&links));
    }
    if let Some(u) = &report.utility {
        body.push_str(&utility_section(u));
    }
    for t in &report.tables {
        body.push_str(&table_section(t));
    }
    body.push_str(&privacy_section(
        &report.privacy,
        "<p>Per patient: each record is a patient's row of features (the root's values, each table's row count, \
         the means and shares of its values), the whole subtree in one row.</p>",
    ));
    body.push_str(&sampling_section(&report.sampling, &report.limits, &report.timings));
    page(&body)
}

/// "synthetic / train" of a distance.
fn pair(d: &Distance) -> String {
    format!("{:.3} / {:.3}", d.synthetic, d.train)
}

/// A table of distances: what, synthetic, train.
fn distance_table(title: &str, distances: &[Distance]) -> String {
    if distances.is_empty() {
        return String::new();
    }
    let mut out =
        format!("<h4>{}</h4><table><tr><th>measure</th><th>synthetic</th><th>train (floor)</th></tr>", escape(title));
    for d in distances {
        let _ = write!(out, "<tr><td>{}</td><td>{:.4}</td><td>{:.4}</td></tr>", escape(&d.what), d.synthetic, d.train);
    }
    out.push_str("</table>");
    out
}

/// One table's section.
fn table_section(t: &TableEvaluation) -> String {
    let mut body = format!("<h2>Table {}</h2>", escape(&t.name));
    if let Some(parent) = &t.parent {
        let i = &t.integrity;
        let _ = write!(
            body,
            "<p>Parent <b>{}</b>. Synthetic rows read {}: {} without their parent, {} duplicate keys, {} over the cap, \
             {} bad: <b>{:.2}%</b> with their parent.</p>",
            escape(parent),
            i.rows_read,
            i.without_parent,
            i.duplicate_keys,
            i.over_cap,
            i.bad,
            100.0 * i.with_parent
        );
    }
    let f = &t.fidelity;
    body.push_str(&metric_table(&[
        ("HIST", format!("{:.4}", f.hist), "own columns, synthetic against training rows"),
        ("Pair", format!("{:.4}", f.pair), "mean 2-way histogram intersection of own columns"),
        ("CorAcc", format!("{:.4}", f.cor_acc), "share of own column pairs with the same association level"),
    ]));
    for c in &t.children {
        let _ = write!(body, "<h4>{} rows per {} row: TVD {}</h4>", escape(&c.child), escape(&t.name), pair(&c.tvd));
        body.push_str(&bars(&c.child, &c.labels, &c.held_out, &c.synthetic, "real (held-out)"));
    }
    body.push_str(&distance_table("Cross-table joint distributions (TVD)", &t.cross));
    body.push_str(&distance_table("Means by an ancestor's attribute (mean absolute error)", &t.means));
    body.push_str(&distance_table("Transitions between siblings (TVD)", &t.transitions));
    if !t.lag1.is_empty() {
        body.push_str("<h4>Lag-1 correlation between siblings</h4><table><tr><th>column</th><th>held-out</th><th>train</th><th>synthetic</th></tr>");
        for l in &t.lag1 {
            body.push_str(&table_row(&[&l.column], &[l.held_out, l.train, l.synthetic], 3));
        }
        body.push_str("</table>");
    }
    if !t.links.is_empty() {
        body.push_str(
            "<h4>Links to the children (correlation, or η with a categorical attribute)</h4><table><tr>\
             <th>attribute</th><th>children's summary</th><th>held-out</th><th>train</th><th>synthetic</th></tr>",
        );
        for l in &t.links {
            body.push_str(&table_row(&[&l.attribute, &l.summary], &[l.held_out, l.train, l.synthetic], 3));
        }
        body.push_str("</table>");
    }
    if !t.within.is_empty() {
        body.push_str(
            "<h4>Values inside their interval</h4><table><tr><th>column</th><th>held-out</th><th>synthetic</th></tr>",
        );
        for w in &t.within {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{:.2}%</td><td>{:.2}%</td></tr>",
                escape(&w.column),
                100.0 * w.held_out,
                100.0 * w.synthetic
            );
        }
        body.push_str("</table>");
    }
    body
}

/// The banner, the notice, what was sampled and the formal guarantee: every report's top.
fn opening(notice: &str, sampling: &[SampleUse], guarantee: &Option<serde_json::Value>) -> String {
    let mut body = String::new();
    let explanation = notice.strip_prefix(NOT_DP).unwrap_or(notice).trim();
    let _ = write!(
        body,
        "<div class=\"banner\" role=\"alert\"><strong>{}</strong><br>This report is computed on private data and is \
         not differentially private. Do not publish it, and do not store it beside the released synthetic data.</div>\
         <h1>rhosynth evaluation report</h1><p class=\"notice\">{}</p>",
        escape(NOT_DP),
        escape(explanation)
    );
    let sampled: Vec<_> = sampling.iter().filter(|u| u.sampled).collect();
    if !sampled.is_empty() {
        let _ = write!(
            body,
            "<p class=\"notice\">Bounded cost: {} metric inputs were sampled under the evaluation's caps \
             (uniformly, seeded; not a privacy mechanism). See <a href=\"#sampling\">Sampling</a>.</p>",
            sampled.len()
        );
    }
    body.push_str("<h2>Formal guarantee</h2>");
    match guarantee {
        Some(g) => {
            let _ = write!(
                body,
                "<p>(ε = {}, δ = {}) under the {} accountant, dataset <b>{}</b>, ledger {} entry {}.</p>\
                 <p>Mechanisms: <code>{}</code></p><p>Declared public: {}</p>",
                g["epsilon"],
                g["delta"],
                escape(g["accountant"].as_str().unwrap_or("?")),
                escape(g["dataset_id"].as_str().unwrap_or("?")),
                escape(g["ledger_url"].as_str().unwrap_or("?")),
                g["ledger_entry"],
                escape(&g["mechanisms"].to_string()),
                escape(&g["public_inputs"].as_array().map(|a| a.len()).unwrap_or(0).to_string())
                    + " schema items (bounds, categories, bins) from the job spec"
            );
        }
        None => body.push_str("<p>No rhosynth manifest with the synthetic data: no formal guarantee is known.</p>"),
    }
    body
}

/// Train on synthetic, test on real: the scores table.
fn utility_section(u: &Utility) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h2>Utility (train on synthetic, test on real held-out)</h2><p>Target <b>{}</b>, positive class <b>{}</b>; \
         the rows trained on the real training table are the reference.</p>\
         <table><tr><th>model</th><th>trained on</th><th>ROC-AUC</th><th>PR-AUC</th><th>F1</th><th>accuracy</th></tr>",
        escape(&u.target),
        escape(&u.positive_class)
    );
    for s in &u.scores {
        body.push_str(&table_row(&[&s.model, &s.trained_on], &[s.roc_auc, s.pr_auc, s.f1, s.accuracy], 4));
    }
    body.push_str("</table>");
    body
}

/// The empirical privacy diagnostics (DCR, exact copies, membership attack), `what` said
/// of the records compared.
fn privacy_section(p: &PrivacyDiagnostics, what: &str) -> String {
    let mut body = String::new();
    let _ = write!(body, "<h2>Empirical privacy (diagnostics, not guarantees)</h2>{what}");
    body.push_str(&metric_table(&[
        (
            "DCR p5 / median, synthetic",
            format!("{:.4} / {:.4}", p.dcr_synthetic_p5, p.dcr_synthetic_median),
            "Gower distance to the closest training row",
        ),
        (
            "DCR p5 / median, held-out (reference)",
            format!("{:.4} / {:.4}", p.dcr_holdout_p5, p.dcr_holdout_median),
            "the same for real rows not used in training",
        ),
        ("exact-copy rate (NRS)", format!("{:.4}", p.exact_copy_rate), "synthetic rows identical to a training row"),
        (
            "membership-inference AUC",
            format!("{:.4}", p.membership_auc),
            "distance attack; 0.5 = cannot tell members apart",
        ),
    ]));
    body.push_str("<h4>distance to closest training record (CDF)</h4>");
    body.push_str(&cdfs(
        "distance to closest training record (CDF)",
        &p.dcr_holdout,
        "held-out real",
        &p.dcr_synthetic,
        "synthetic",
    ));
    body
}

/// What each metric read, the caps and the time per stage.
fn sampling_section(sampling: &[SampleUse], limits: &EvalLimits, timings: &[StageTiming]) -> String {
    let mut body = String::new();
    body.push_str(
        "<h2 id=\"sampling\">Sampling</h2><p>What each metric read. A table over a metric's cap is sampled \
         uniformly without replacement with a seeded, non-cryptographic RNG: this bounds the evaluation's cost and is \
         not a privacy mechanism. Below the caps every metric is exact.</p>\
         <table><tr><th>metric</th><th>table</th><th>used</th><th>available</th><th></th></tr>",
    );
    for u in sampling {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&u.metric),
            escape(&u.table),
            u.used,
            u.available,
            if u.sampled { "<b>sampled</b>" } else { "all" }
        );
    }
    body.push_str("</table>");
    let _ = write!(body, "<p>Caps: <code>{}</code></p>", escape(&serde_json::to_string(&limits).unwrap_or_default()));
    if !timings.is_empty() {
        let stages: Vec<String> = timings.iter().map(|t| format!("{} {:.1} s", escape(&t.stage), t.seconds)).collect();
        let _ = write!(body, "<p>Time per stage: {}.</p>", stages.join(", "));
    }
    body
}

/// The self-contained page around `body`.
fn page(body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>rhosynth evaluation report (not differentially private: do not publish)</title>\
         <style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #ccc;padding:4px 8px}}\
         .banner{{background:#b00020;color:#fff;padding:12px 16px;font-size:1.15em;border-radius:4px}}.notice{{background:#fff3cd;padding:8px}}svg.plot{{display:block;margin:8px 0}}code{{word-break:break-all}}</style>\
         </head><body>{body}</body></html>"
    )
}
