//! Many marginals of a calibrated junction tree at once, at a bounded cost: every set that
//! lies in one clique but for at most one variable v.
//!
//! Joining v to the tree is a pass outward from a clique holding v: a clique C beyond
//! separator S (toward v) has p(C, v) = p(C) · p(S, v) / p(S), since C's other variables
//! reach v only through S (running intersection). One pass per variable serves every
//! set conditioned on it, so a round's cost is Σ_v values(v) · cells along the pass
//! plus one sum per set — where variable elimination per set pays a path's cliques
//! times the set's other values, set by set.

use super::factor::Factor;
use super::junction::JunctionTree;

/// How the marginal of a set is read: summed from clique `clique`, joined to `joined`
/// when the set has a variable outside it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reach {
    pub clique: usize,
    pub joined: Option<usize>,
}

/// How the marginal of `set` is read off the tree: from a clique holding it, or joined
/// to its one variable outside a clique (the one with fewest values); `None` if two or
/// more variables lie outside every clique holding the rest.
pub fn reach(tree: &JunctionTree, domain: &[usize], set: &[usize]) -> Option<Reach> {
    if let Some(clique) = tree.clique_of(set) {
        return Some(Reach { clique, joined: None });
    }
    set.iter()
        .filter_map(|&v| {
            let rest: Vec<usize> = set.iter().copied().filter(|&w| w != v).collect();
            tree.clique_of(&rest).map(|clique| Reach { clique, joined: Some(v) })
        })
        .min_by_key(|r| r.joined.map(|v| domain[v]))
}

/// The marginals (in the cliques' units) of `sets` (`None` for a set [`reach`] does not
/// reach); `marginals` are the tree's calibrated clique marginals. Passes for different
/// variables run on all cores.
pub fn marginals_of(
    tree: &JunctionTree,
    marginals: &[Factor],
    domain: &[usize],
    sets: &[Vec<usize>],
) -> Vec<Option<Factor>> {
    let mut out: Vec<Option<Factor>> = vec![None; sets.len()];
    let mut reaches = Vec::with_capacity(sets.len());
    // Sets inside a clique: summed down; the rest grouped by the variable joined.
    let mut by_variable: Vec<Vec<usize>> = vec![Vec::new(); domain.len()];
    for (i, set) in sets.iter().enumerate() {
        let found = reach(tree, domain, set);
        match found {
            Some(Reach { clique, joined: None }) => out[i] = Some(marginals[clique].sum_to(set)),
            Some(Reach { joined: Some(v), .. }) => by_variable[v].push(i),
            None => {}
        }
        reaches.push(found);
    }
    let reaches = &reaches;
    let mut passes: Vec<(usize, Vec<usize>)> =
        by_variable.into_iter().enumerate().filter(|(_, sets)| !sets.is_empty()).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(passes.len()).max(1);
    // Larger passes first, dealt round-robin, so the threads' shares are even.
    passes.sort_by_key(|(v, sets)| std::cmp::Reverse(domain[*v] * sets.len()));
    let shares: Vec<Vec<(usize, Vec<usize>)>> =
        (0..threads).map(|t| passes.iter().skip(t).step_by(threads).cloned().collect()).collect();
    let answers: Vec<(usize, Factor)> = std::thread::scope(|scope| {
        let parts: Vec<_> = shares
            .iter()
            .map(|share| {
                scope.spawn(move || {
                    share
                        .iter()
                        .flat_map(|(v, group)| {
                            let targets: Vec<(usize, &[usize], usize)> = group
                                .iter()
                                .filter_map(|&i| Some((i, sets[i].as_slice(), reaches[i]?.clique)))
                                .collect();
                            joined_pass(tree, marginals, domain, *v, &targets)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().expect("a marginal pass panicked")).collect()
    });
    for (i, factor) in answers {
        out[i] = Some(factor);
    }
    out
}

/// One pass joining variable `v` to the cliques of `targets` (set index, set, clique):
/// each target set's marginal, summed from p(clique, v).
fn joined_pass(
    tree: &JunctionTree,
    marginals: &[Factor],
    domain: &[usize],
    v: usize,
    targets: &[(usize, &[usize], usize)],
) -> Vec<(usize, Factor)> {
    let k = tree.cliques.len();
    let home = tree.cliques.iter().position(|c| c.contains(&v)).expect("every variable is in a clique");
    // The tree as seen from `home`: each clique's neighbour toward it, in visiting order.
    let mut toward = vec![usize::MAX; k];
    let mut order = vec![home];
    toward[home] = home;
    let mut at = 0;
    while at < order.len() {
        let c = order[at];
        for &(p, q) in &tree.edges {
            let next = if p == c {
                q
            } else if q == c {
                p
            } else {
                continue;
            };
            if toward[next] == usize::MAX {
                toward[next] = c;
                order.push(next);
            }
        }
        at += 1;
    }
    // Cliques on the way to a target, and the targets at each.
    let mut needed = vec![false; k];
    let mut at_clique: Vec<Vec<(usize, &[usize])>> = vec![Vec::new(); k];
    for &(i, set, clique) in targets {
        at_clique[clique].push((i, set));
        let mut c = clique;
        while !needed[c] {
            needed[c] = true;
            c = toward[c];
        }
    }
    needed[home] = true;
    // p(S, v) for each needed clique's separator toward home, made from its neighbour's joint.
    let mut incoming: Vec<Option<Factor>> = vec![None; k];
    let mut out = Vec::with_capacity(targets.len());
    for &c in order.iter().filter(|&&c| needed[c]) {
        let joint = match incoming[c].take() {
            None => marginals[c].clone(),
            Some(message) => join(&marginals[c], &message, domain, v),
        };
        for &(i, set) in &at_clique[c] {
            out.push((i, joint.sum_to(set)));
        }
        for next in (0..k).filter(|&n| needed[n] && toward[n] == c && n != c) {
            let mut separator: Vec<usize> = tree.separator(c, next);
            if !separator.contains(&v) {
                separator.push(v);
                separator.sort_unstable();
            }
            incoming[next] = Some(joint.sum_to(&separator));
        }
    }
    out
}

/// p(C ∪ {v}) = p(C) · p(S, v) / p(S) from clique C's marginal and the message p(S, v)
/// over its separator S toward v (a clique holding v already is its own joint).
fn join(clique: &Factor, message: &Factor, domain: &[usize], v: usize) -> Factor {
    if clique.vars.contains(&v) {
        return clique.clone();
    }
    let separator: Vec<usize> = message.vars.iter().copied().filter(|&w| w != v).collect();
    let over_separator = clique.sum_to(&separator);
    let mut ratio = message.clone();
    for (r, &s) in ratio.values.iter_mut().zip(&message.cells_in(&separator)) {
        let p = over_separator.values[s];
        *r = if p > 0.0 { *r / p } else { 0.0 };
    }
    let mut vars = clique.vars.clone();
    vars.push(v);
    vars.sort_unstable();
    let mut joint = Factor::filled(&vars, domain, 0.0);
    let from_clique = joint.cells_in(&clique.vars);
    let from_ratio = joint.cells_in(&ratio.vars);
    for ((j, &a), &b) in joint.values.iter_mut().zip(&from_clique).zip(&from_ratio) {
        *j = clique.values[a] * ratio.values[b];
    }
    joint
}
