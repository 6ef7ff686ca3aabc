//! The target's table's model made the conditional it is drawn as.
//!
//! A child row is drawn from its view's model given the columns of its view it does not
//! own: its ancestors' values and, in a sequence, its place and its previous row's values
//! ([`View::given_columns`]). No measurement holds those columns alone (the plan measures
//! how a row's own values follow them), so the fitted model holds their joint as nearly
//! independent; drawn given all of them at once, it counts what they say alike many times
//! over (an old patient is often a sick one; a last admission is the last one however many
//! came before). Its own marginals are right, its conditionals on many given columns not:
//! on the simulated cohort 4.4–7.1% of the admissions drawn ended in death, where 8.1% of
//! the real ones did and the model's own marginal said so.
//!
//! So the model of the target's table ([`DatabaseParams::target`]) is tilted until the
//! rows drawn under synthetic parents hold the target's measured conditionals as the
//! fitted model holds them: for each measured set of the target `y`, given columns `g`
//! and the row's children's counts and means `s`, the drawn rows' count of `(y, s, g)` is
//! brought to their count of `g` times the fitted model's `p(y, s | g)` (raking, as
//! iterative proportional fitting does; a conditional model's moment conditions). A
//! function of the fitted models and of rows drawn from them alone: post-processing, free.
//!
//! Only those sets: not the row's other values. Raked too, the sets of a sequence's values
//! (a value and the one before it, a value and its parent's mean of it, a value and the
//! target) bring each of them to its measured pair's conditional, noisier than what the
//! model draws given them all: a vital's lag-1 persistence fell from 0.70–0.80 to
//! 0.44–0.61 (real 0.80), and PBC's log-bilirubin's from 0.81–0.83 to 0.65–0.70 (real
//! 0.92) with its visits' stage as the target (docs/database.md). The children's
//! summaries are raked with the target: they carry its link to the children (a death's
//! charts), measured at this table's sensitivity.
//!
//! [`DatabaseParams::target`]: super::DatabaseParams::target

use rand::Rng;

use super::sampler::{FittedView, Plans, cores, draw_tables, in_slices};
use crate::data::database::view::ColumnAt;
use crate::data::database::{Layout, View};
use crate::pgm::Factor;

/// The most rows of the target's table drawn a round (a public constant), as units of
/// `reach` rows each (4,000 patients at 5 admissions): enough that a measured set's cells
/// hold tens of rows and the drawn rate's sampling error stays under the test's, and a
/// bound on a round's memory and time whatever the caps.
pub const RAKING_ROWS: u64 = 20_000;

/// The most tilts raking makes: the sets share the target, so each moves it a fraction of
/// the way.
pub const RAKING_ROUNDS: usize = 16;

/// A count added to both sides of each ratio: a cell few drawn rows hold moves little.
const PRIOR_COUNT: f64 = 1.0;

/// What raking did: the gap between the drawn and the fitted conditionals (Σ |drawn −
/// wanted| over a set's cells, per drawn row, averaged over the sets) before and after,
/// the gap chance alone leaves in rows drawn from the wanted conditionals (the rule to
/// stop at), and the tilts made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Raked {
    pub before: f64,
    pub after: f64,
    pub chance: f64,
    pub tilts: usize,
}

/// Tilts the model of the target's table (module doc), drawing at most `rows` of its rows
/// a round, for at most `rounds` tilts: a public bound on its time (each row drawn at the
/// cost of its free cells, `pgm::Given`). It stops, or never starts, once the drawn
/// conditionals are as close to the fitted ones as rows drawn from the fitted ones
/// themselves would be (chance's gap): raking would then only chase the draws' own noise. `None` when there is nothing to rake (a target
/// of the root, drawn given nothing).
pub fn rake(
    layout: &Layout,
    views: &mut [FittedView],
    plans: &Plans,
    target: ColumnAt,
    rows: u64,
    rounds: usize,
    rng: &mut impl Rng,
) -> Option<Raked> {
    let t = target.table;
    layout.tables[t].parent?;
    let units = (rows / layout.reach(t)).max(1) as usize;
    let view = View { table: t };
    let given = view.given_columns(layout);
    // Its children's counts and means (the view's last columns): its link to its children.
    let summaries = view.previous_columns(layout).end..view.mean_columns(layout).end;
    // The fitted model's conditionals of the target (a view's own values come first) given
    // what it is drawn given, with its children's summaries: not with the row's other
    // values, which keep their conditionals on the target.
    let sets: Vec<Conditional> = (views[t].model.measured().iter())
        .filter(|set| {
            set.contains(&target.column)
                && set.iter().all(|c| *c == target.column || given.contains(c) || summaries.contains(c))
        })
        .map(|set| Conditional::of(&views[t], set, &given))
        .collect();
    // Sets sharing an own column move it together: each starts with its share of the way,
    // then a set drawn closer takes longer steps and one that overshot shorter.
    let sharing = |c: usize| sets.iter().filter(|s| s.cells.vars.contains(&c)).count();
    let most_sharing = |s: &Conditional| s.cells.vars.iter().filter(|c| !given.contains(c)).map(|&c| sharing(c)).max();
    let mut steps: Vec<f64> = sets.iter().map(|s| 1.0 / most_sharing(s).unwrap_or(1) as f64).collect();
    let mut last = vec![f64::INFINITY; sets.len()];
    let mut raked = Raked { before: 0.0, after: 0.0, chance: 0.0, tilts: 0 };
    for round in 0..=rounds {
        let shared: &[FittedView] = views;
        let roots = shared[0].model.sample(units, rng);
        let drawn_rows: Vec<Vec<usize>> = in_slices(roots, cores(), rng, |roots, rng| {
            let mut rows = Vec::new();
            draw_tables(layout, shared, plans, roots, t, Some(&mut rows), rng);
            rows
        })
        .concat();
        let mut tilts = Vec::with_capacity(sets.len());
        let (mut total, mut chance) = (0.0, 0.0);
        for (i, set) in sets.iter().enumerate() {
            let drawn = set.drawn(&drawn_rows);
            let set_gap = set.gap(&drawn);
            if round > 0 {
                steps[i] = if set_gap < last[i] { (steps[i] * 1.25).min(1.0) } else { steps[i] * 0.5 };
            }
            last[i] = set_gap;
            total += set_gap;
            chance += set.chance(&drawn);
            tilts.push(set.tilt(&drawn, steps[i]));
        }
        let per_row = |sum: f64| sum / sets.len().max(1) as f64 / drawn_rows.len().max(1) as f64;
        raked.after = per_row(total);
        if round == 0 {
            (raked.before, raked.chance) = (raked.after, per_row(chance));
        }
        if round == rounds || raked.after <= raked.chance {
            break;
        }
        views[t].model = views[t].model.tilted(&tilts);
        raked.tilts += 1;
    }
    Some(raked)
}

/// A measured set's conditional of its own columns given its given ones, as the fitted
/// model holds it.
struct Conditional {
    /// The set's cells, as a [`Factor`] over it orders them.
    cells: Factor,
    /// Each cell's cell among the given columns' (0 when the set holds none).
    given_cell: Vec<usize>,
    /// The fitted model's p(own | given) of each cell.
    p: Vec<f64>,
}

impl Conditional {
    fn of(view: &FittedView, set: &[usize], given: &[usize]) -> Self {
        let joint = view.model.marginal(set);
        let given_vars: Vec<usize> = set.iter().copied().filter(|c| given.contains(c)).collect();
        let given_cell = joint.cells_in(&given_vars);
        let of_given = joint.sum_mapped(&given_vars, &given_cell);
        let p = (joint.values.iter().zip(&given_cell))
            .map(|(&v, &g)| if of_given.values[g] > 0.0 { v / of_given.values[g] } else { 0.0 })
            .collect();
        let cells = Factor { values: vec![0.0; joint.values.len()], ..joint };
        Self { cells, given_cell, p }
    }

    /// `rows`' counts of the set's cells, and each cell's count wanted: its given cell's
    /// count times the fitted p(own | given).
    fn drawn(&self, rows: &[Vec<usize>]) -> Vec<(f64, f64)> {
        let strides = self.cells.strides();
        let mut counts = vec![0.0; self.p.len()];
        for row in rows {
            counts[self.cells.vars.iter().zip(&strides).map(|(&v, s)| row[v] * s).sum::<usize>()] += 1.0;
        }
        let mut of_given = vec![0.0; self.given_cell.iter().max().map_or(1, |m| m + 1)];
        for (count, &g) in counts.iter().zip(&self.given_cell) {
            of_given[g] += count;
        }
        counts.iter().zip(&self.given_cell).zip(&self.p).map(|((&count, &g), &p)| (count, of_given[g] * p)).collect()
    }

    /// Σ |count − wanted| over the set's cells.
    fn gap(&self, drawn: &[(f64, f64)]) -> f64 {
        drawn.iter().map(|(count, wanted)| (count - wanted).abs()).sum()
    }

    /// Σ over the set's cells of the mean |count − wanted| of counts drawn from the wanted
    /// conditional itself (binomial, given the given cell's count): the gap chance alone
    /// leaves. A cell's is √(2/π · n·p·(1 − p)) (normal) or, for a cell expecting well under
    /// a row, 2·n·p (its limit), whichever is smaller: the normal's overstates a sparse
    /// cell's.
    fn chance(&self, drawn: &[(f64, f64)]) -> f64 {
        let normal = |wanted: f64, p: f64| ((2.0 / std::f64::consts::PI) * wanted * (1.0 - p)).max(0.0).sqrt();
        drawn.iter().zip(&self.p).map(|(&(_, wanted), &p)| normal(wanted, p).min(2.0 * wanted)).sum()
    }

    /// The log tilt moving the drawn counts `step` of the way (in logs) to the wanted.
    fn tilt(&self, drawn: &[(f64, f64)], step: f64) -> Factor {
        let values = drawn.iter().map(|(count, wanted)| step * ((wanted + PRIOR_COUNT) / (count + PRIOR_COUNT)).ln());
        Factor { values: values.collect(), ..self.cells.clone() }
    }
}
