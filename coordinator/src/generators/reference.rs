//! Where a generator's public reference set stands with this dataset's ledger (HARMONIC's
//! prompts, DP-2Stage's and the sequence model's stage 1): public data as declared,
//! another dataset's release, or a release of this dataset exactly as this ledger charged
//! and recorded it (the spec's check refuses its input, held-out files and ledger before
//! anything is read, `generators::reference::check_location`).

use rhosynth_privacy::ledger::Ledger;
use rhosynth_shared::generators::{GeneratorName, PlanError};
use rhosynth_shared::output::Manifest;
use rhosynth_shared::storage;

use crate::context::JobError;

/// What guarantee the reference set at `url` carries, for the manifest. Anything at,
/// in or around one of this dataset's releases must be that release as this ledger
/// holds it, whatever its manifest says: charged and released *there* (else its cost
/// could be missing from the data's total, or the files be another's), with the
/// manifest whose SHA-256 the ledger recorded (so neither a part nor the manifest was
/// changed since); the output's guarantee then composes this job's charges with that
/// release's and whatever it was built from, all in this ledger. Elsewhere, a
/// release of another dataset carries that dataset's guarantee, and a table without a
/// manifest is the operator's public data.
pub(crate) fn guarantee(
    generator: GeneratorName,
    url: &str,
    read: &str,
    manifest: Option<(Manifest, String)>,
    ledger: &Ledger,
) -> Result<String, JobError> {
    let plan_error = |message: String| JobError::Plan(PlanError::new(generator.as_str(), message));
    if storage::nested(url, ledger.url()) {
        return Err(plan_error("reference overlaps the job's ledger".into()));
    }
    let released_here = ledger.release_locations().find(|(_, location)| storage::nested(url, location));
    let (m, manifest_sha256) = match (manifest, released_here) {
        (None, None) => return Ok(format!("{read}: public data, as declared")),
        (None, Some((charge, _))) => {
            return Err(plan_error(format!(
                "reference: {url} holds files of this dataset's release (ledger entry {charge}) without its \
                 manifest; a release is read with the manifest it was released with"
            )));
        }
        (Some(manifest), _) => manifest,
    };
    let p = &m.privacy;
    let release = format!(
        "{read}: a rhosynth release of dataset {} by job {} (ε = {}, δ = {}, ledger entry {})",
        p.dataset_id, m.job_id, p.epsilon, p.delta, p.ledger_entry
    );
    if p.dataset_id != ledger.dataset_id() && released_here.is_none() {
        return Ok(format!("{release}; another dataset's release carries that dataset's guarantee"));
    }
    let charged = p.dataset_id == ledger.dataset_id()
        && ledger.charged(p.ledger_entry).is_some_and(|(request, _)| request.job_id == m.job_id);
    let here = ledger
        .release_location(p.ledger_entry)
        .is_some_and(|location| storage::canonical_url(location) == storage::canonical_url(url));
    if !(charged && here) {
        return Err(plan_error(format!(
            "reference: a release of this dataset (job {}, ledger entry {}) that this ledger did not charge and \
             release at {url}: its cost could be missing from the data's total",
            m.job_id, p.ledger_entry
        )));
    }
    if ledger.published(p.ledger_entry) != Some(manifest_sha256.as_str()) {
        return Err(plan_error(format!(
            "reference: the manifest at {url} is not the one this ledger recorded when entry {} was released \
             (changed since, or released before manifests were recorded)",
            p.ledger_entry
        )));
    }
    Ok(format!(
        "{release}; this output's guarantee composes this job's charges with that release's and whatever it was \
         built from, all in this ledger: at most the dataset's composed total (`rhosynth ledger show`)"
    ))
}

#[cfg(test)]
mod tests {
    use rhosynth_privacy::ledger::{Budget, ChargeRequest};
    use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions};
    use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};

    use super::*;

    fn manifest(job_id: &str, ledger_entry: u64) -> Manifest {
        serde_json::from_value(serde_json::json!({
            "format": "rhosynth.manifest.v1", "rhosynth_version": "test", "job_id": job_id,
            "generator": "marginals", "created_at": "2026-11-26T00:00:00Z", "rows": 0, "columns": [],
            "parts": [], "privacy": {"epsilon": 1.0, "delta": 1e-6, "accountant": "rdp", "mechanisms": [],
            "dataset_id": "d", "ledger_url": "l", "ledger_entry": ledger_entry, "public_inputs": []}
        }))
        .unwrap()
    }

    /// A release of this dataset is a reference only as released: charged and released
    /// there, with the manifest whose SHA-256 the ledger recorded (a release rewritten
    /// whole, manifest and parts, is refused), and files of a release without its
    /// manifest are not public data.
    #[tokio::test]
    async fn a_reference_is_the_release_the_ledger_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let location = storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap();
        let budget = Budget { epsilon: 10.0, delta: 1e-6 };
        let mut ledger =
            Ledger::init(&location, "d", budget, Adjacency::AddRemove, AccountingOptions::default()).await.unwrap();
        let mechanisms = vec![Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: 10.0,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }];
        let request = ChargeRequest { job_id: "j".into(), mechanisms, accountant: Accountant::Rdp, delta: 1e-6 };
        let receipt = ledger.charge(&request).await.unwrap();
        let release = dir.path().join("releases/one").display().to_string();
        ledger.record_release(receipt.seq, &release).await.unwrap();
        ledger.record_published(receipt.seq, "aa").await.unwrap();
        let guarantee = |url: &str, m: Option<(Manifest, String)>| {
            guarantee(GeneratorName::Harmonic, url, "read", m, &ledger).map_err(|e| e.submitter_message())
        };

        let ok = guarantee(&release, Some((manifest("j", receipt.seq), "aa".into()))).unwrap();
        assert!(ok.contains("composes this job's charges with that release's"), "{ok}");
        let rewritten = guarantee(&release, Some((manifest("j", receipt.seq), "bb".into()))).unwrap_err();
        assert!(rewritten.contains("not the one this ledger recorded"), "{rewritten}");
        for url in [release.clone(), format!("{release}/part-00000.parquet")] {
            let bare = guarantee(&url, None).unwrap_err();
            assert!(bare.contains("without its manifest"), "{bare}");
        }
        // A manifest claiming another dataset, at or around this dataset's release: still
        // this dataset's release, and not the one recorded.
        let mut forged = manifest("j", receipt.seq);
        forged.privacy.dataset_id = "other".into();
        let parent = dir.path().join("releases").display().to_string();
        for url in [&release, &parent] {
            let err = guarantee(url, Some((forged.clone(), "cc".into()))).unwrap_err();
            assert!(err.contains("this ledger did not charge and release"), "{err}");
        }
        let elsewhere = dir.path().join("elsewhere").display().to_string();
        let other = guarantee(&elsewhere, Some((forged, "cc".into()))).unwrap();
        assert!(other.contains("another dataset's release"), "{other}");
        let public = guarantee(&dir.path().join("public.csv").display().to_string(), None).unwrap();
        assert!(public.contains("public data"), "{public}");
    }
}
