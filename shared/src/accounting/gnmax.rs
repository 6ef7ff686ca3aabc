//! Analysis of PATE's Gaussian NoisyMax (GNMax) aggregator, Papernot et al. 2018,
//! "Scalable Private Learning with PATE".
//!
//! GNMax adds N(0, σ²) to every count of a k-class vote histogram and releases the
//! argmax. One privacy unit lives in one teacher's partition, so it can move one vote
//! from one class to another: L2 sensitivity √2, hence RDP α/σ² per answered query
//! (Prop. 8) whatever the votes — the *data-independent* cost that the ledger charges.
//!
//! The *data-dependent* bound (Thm. 6) is tighter when teachers agree, but it is a
//! function of the private votes: publishing it, or stopping on it, is itself a release.
//! It is offered here only as an internal diagnostic.
//!
//! PATE-TabTransGAN's Eq. 2 (a moments bound with 2/σ² derived for Laplace noise) is not a
//! valid bound for Gaussian noise and is deliberately not implemented.

use super::PrivacyError;
use super::math::{log_add, log_normal_sf, log1mexp};

/// Upper bound on ln Pr[GNMax ≠ plurality] for a vote histogram (Prop. 7, union bound):
/// `ln Σ_{i≠i*} P[N(0, 2σ²) > n_{i*} − n_i]`, capped at ln(1 − 1/k).
pub fn log_q(votes: &[f64], sigma: f64) -> Result<f64, PrivacyError> {
    if votes.len() < 2 {
        return Err(PrivacyError::InvalidParameter("a vote histogram needs at least two classes".into()));
    }
    if !(sigma > 0.0) {
        return Err(PrivacyError::InvalidParameter(format!("sigma must be > 0, got {sigma}")));
    }
    let top = (0..votes.len()).fold(0, |best, i| if votes[i] > votes[best] { i } else { best });
    let scale = std::f64::consts::SQRT_2 * sigma;
    let log_q = votes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != top)
        .fold(f64::NEG_INFINITY, |acc, (_, v)| log_add(acc, log_normal_sf((votes[top] - v) / scale)));
    let cap = (1.0 - 1.0 / votes.len() as f64).ln();
    Ok(log_q.min(cap))
}

/// Data-independent RDP of one GNMax answer at order α (Prop. 8): α/σ².
pub fn rdp_data_independent(sigma: f64, alpha: f64) -> f64 {
    alpha / (sigma * sigma)
}

/// Data-dependent RDP of one GNMax answer at order α > 1 given `log_q` from [`log_q`]
/// (Thm. 6 with the higher orders of Prop. 10); never above the data-independent value.
/// Internal diagnostic only: see the module documentation.
pub fn rdp_data_dependent(log_q: f64, sigma: f64, alpha: f64) -> Result<f64, PrivacyError> {
    if log_q > 0.0 || !(sigma > 0.0) || !(alpha > 1.0) {
        return Err(PrivacyError::InvalidParameter(format!(
            "GNMax data-dependent bound needs log_q ≤ 0, sigma > 0, order > 1 (got {log_q}, {sigma}, {alpha})"
        )));
    }
    if log_q == f64::NEG_INFINITY {
        return Ok(0.0);
    }
    let var = sigma * sigma;
    let independent = alpha / var;
    let mu2 = (var * -log_q).sqrt();
    let mu1 = mu2 + 1.0;
    let applies = mu1 > alpha && mu2 > 1.0;
    let (rdp1, rdp2) = (mu1 / var, mu2 / var);
    let log_a2 = (mu2 - 1.0) * rdp2;
    let in_range =
        log_q <= log_a2 - mu2 * ((1.0 + 1.0 / (mu1 - 1.0)).ln() + (1.0 + 1.0 / (mu2 - 1.0)).ln()) && -log_q > rdp2;
    if !(applies && in_range) {
        return Ok(independent);
    }
    let log_1mq = log1mexp(log_q);
    let log_a = (alpha - 1.0) * (log_1mq - log1mexp((log_q + rdp2) * (1.0 - 1.0 / mu2)));
    let log_b = (alpha - 1.0) * (rdp1 - log_q / (mu1 - 1.0));
    let log_s = log_add(log_1mq + log_a, log_q + log_b);
    Ok(independent.min(log_s / (alpha - 1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tie_gives_half() {
        assert!((log_q(&[50.0, 50.0], 20.0).unwrap() - 0.5_f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn data_dependent_never_exceeds_independent() {
        let lq = log_q(&[240.0, 10.0], 40.0).unwrap();
        for a in [2.0, 10.0, 100.0] {
            assert!(rdp_data_dependent(lq, 40.0, a).unwrap() <= rdp_data_independent(40.0, a));
        }
    }
}
