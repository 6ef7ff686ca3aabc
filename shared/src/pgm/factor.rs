//! Dense tables over a few discrete variables: a clique's potential, belief or marginal.

/// A table over `vars` (ascending variable indices), row-major with the last variable
/// fastest, `sizes[i]` values for `vars[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Factor {
    pub vars: Vec<usize>,
    pub sizes: Vec<usize>,
    pub values: Vec<f64>,
}

impl Factor {
    /// A table of `vars` (ascending) over the model's `domain` (values per variable),
    /// every cell `value`.
    pub fn filled(vars: &[usize], domain: &[usize], value: f64) -> Self {
        debug_assert!(vars.windows(2).all(|w| w[0] < w[1]), "variables ascending");
        let sizes: Vec<usize> = vars.iter().map(|&v| domain[v]).collect();
        let cells = sizes.iter().product();
        Self { vars: vars.to_vec(), sizes, values: vec![value; cells] }
    }

    /// For every cell of this table, in order, the index of its cell in a table over
    /// `sub` (a subset of `vars`, ascending).
    pub fn cells_in(&self, sub: &[usize]) -> Vec<usize> {
        // The stride, in the sub-table, of each of this table's variables (0 if absent).
        let mut strides = vec![0; self.vars.len()];
        let mut stride = 1;
        for (i, v) in self.vars.iter().enumerate().rev() {
            if sub.contains(v) {
                strides[i] = stride;
                stride *= self.sizes[i];
            }
        }
        offsets(&self.sizes, &strides, 0).collect()
    }

    /// Each variable's stride in this table's cells (row-major: the last variable's is 1).
    pub fn strides(&self) -> Vec<usize> {
        (0..self.sizes.len()).map(|i| self.sizes[i + 1..].iter().product()).collect()
    }

    /// The table summed down to `sub` (a subset of `vars`, ascending).
    pub fn sum_to(&self, sub: &[usize]) -> Factor {
        if sub == self.vars {
            return self.clone();
        }
        self.sum_mapped(sub, &self.cells_in(sub))
    }

    /// [`Self::sum_to`] with `cells = self.cells_in(sub)` computed once by the caller.
    pub fn sum_mapped(&self, sub: &[usize], cells: &[usize]) -> Factor {
        let mut out = self.empty_over(sub);
        for (value, &cell) in self.values.iter().zip(cells) {
            out.values[cell] += value;
        }
        out
    }

    /// log Σ exp of the table (a log-space one) down to `sub`.
    pub fn logsumexp_to(&self, sub: &[usize]) -> Factor {
        self.logsumexp_mapped(sub, &self.cells_in(sub))
    }

    /// [`Self::logsumexp_to`] with `cells = self.cells_in(sub)` computed by the caller.
    pub fn logsumexp_mapped(&self, sub: &[usize], cells: &[usize]) -> Factor {
        let mut top = self.empty_over(sub);
        top.values.fill(f64::NEG_INFINITY);
        for (value, &cell) in self.values.iter().zip(cells) {
            top.values[cell] = top.values[cell].max(*value);
        }
        let mut out = self.empty_over(sub);
        for (value, &cell) in self.values.iter().zip(cells) {
            if top.values[cell].is_finite() {
                out.values[cell] += (value - top.values[cell]).exp();
            }
        }
        for (o, t) in out.values.iter_mut().zip(&top.values) {
            *o = if t.is_finite() { t + o.ln() } else { f64::NEG_INFINITY };
        }
        out
    }

    /// Adds `scale · other` (over a subset of `vars`) to every cell it covers.
    pub fn add_broadcast(&mut self, other: &Factor, scale: f64) {
        if other.vars == self.vars {
            // The same table shape (every fit step's update): cell by cell.
            self.values.iter_mut().zip(&other.values).for_each(|(v, o)| *v += scale * o);
            return;
        }
        let cells = self.cells_in(&other.vars);
        self.add_mapped(other, &cells, scale);
    }

    /// [`Self::add_broadcast`] with `cells = self.cells_in(&other.vars)` computed by the
    /// caller.
    pub fn add_mapped(&mut self, other: &Factor, cells: &[usize], scale: f64) {
        for (value, &cell) in self.values.iter_mut().zip(cells) {
            *value += scale * other.values[cell];
        }
    }

    /// The table at `given` (a value for each variable that has one; `None` for the
    /// others): a table over its other variables, visiting only their cells.
    pub fn sliced(&self, given: &[Option<usize>]) -> Factor {
        let strides = self.strides();
        let free: Vec<usize> = (0..self.vars.len()).filter(|&i| given[self.vars[i]].is_none()).collect();
        let base: usize = (0..self.vars.len()).filter_map(|i| given[self.vars[i]].map(|v| v * strides[i])).sum();
        let sizes: Vec<usize> = free.iter().map(|&i| self.sizes[i]).collect();
        let free_strides: Vec<usize> = free.iter().map(|&i| strides[i]).collect();
        let values = offsets(&sizes, &free_strides, base).map(|at| self.values[at]).collect();
        Factor { vars: free.iter().map(|&i| self.vars[i]).collect(), sizes, values }
    }

    fn empty_over(&self, sub: &[usize]) -> Factor {
        let sizes: Vec<usize> =
            sub.iter().map(|v| self.sizes[self.vars.iter().position(|w| w == v).expect("a subset")]).collect();
        let cells = sizes.iter().product();
        Factor { vars: sub.to_vec(), sizes, values: vec![0.0; cells] }
    }
}

/// Every cell of a table of `sizes`, in order (the last variable fastest), as the offset
/// `base + Σ index·stride` it falls at: an odometer over the cells.
pub(super) fn offsets<'a>(sizes: &'a [usize], strides: &'a [usize], base: usize) -> impl Iterator<Item = usize> + 'a {
    let mut index = vec![0; sizes.len()];
    let mut at = base;
    (0..sizes.iter().product::<usize>()).map(move |_| {
        let cell = at;
        for k in (0..sizes.len()).rev() {
            index[k] += 1;
            at += strides[k];
            if index[k] < sizes[k] {
                break;
            }
            at -= strides[k] * index[k];
            index[k] = 0;
        }
        cell
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_broadcasts_agree_with_explicit_loops() {
        // Variables 0, 2, 5 with 2, 3 and 4 values.
        let domain = [2, 9, 3, 9, 9, 4];
        let mut f = Factor::filled(&[0, 2, 5], &domain, 0.0);
        f.values.iter_mut().enumerate().for_each(|(i, v)| *v = i as f64);
        let at = |a: usize, b: usize, c: usize| ((a * 3 + b) * 4 + c) as f64;
        let over_0_5 = f.sum_to(&[0, 5]);
        for a in 0..2 {
            for c in 0..4 {
                assert_eq!(over_0_5.values[a * 4 + c], (0..3).map(|b| at(a, b, c)).sum::<f64>());
            }
        }
        let over_2 = f.logsumexp_to(&[2]);
        for b in 0..3 {
            let direct = (0..2).flat_map(|a| (0..4).map(move |c| at(a, b, c).exp())).sum::<f64>().ln();
            assert!((over_2.values[b] - direct).abs() < 1e-9);
        }
        let mut g = Factor::filled(&[0, 2, 5], &domain, 0.0);
        g.add_broadcast(&over_2, 2.0);
        assert_eq!(g.values[at(1, 2, 3) as usize], 2.0 * over_2.values[2]);
    }
}
