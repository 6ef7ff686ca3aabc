"""The package as a user meets it: the installed wheel's binary, real jobs on this machine."""

import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rhosynth as rs


def patients(n=300, seed=0):
    """A small table of every column type: a unit id, a datetime, an integer, a float, a
    categorical (pandas category dtype) and text categories (object dtype)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "patient_id": [f"p{i // 2}" for i in range(n)],
            "admitted": pd.Timestamp("2025-01-01") + pd.to_timedelta(rng.integers(0, 300, n), unit="D"),
            "age": rng.integers(18, 90, n),
            "temperature": rng.normal(37.0, 0.6, n).round(1),
            "ward": pd.Categorical(rng.choice(["icu", "cardio", "neuro"], n), categories=["icu", "cardio", "neuro"]),
            "outcome": rng.choice(["home", "transfer"], n),
        }
    )


def spec(dataset, epsilon=1.0, rows=200, **generator):
    """A marginals job over `patients()` whose domains are declared (public)."""
    return {
        "job": {"dataset_id": dataset, "partitions": 2},
        "schema": {
            "unit_column": "patient_id",
            "columns": [
                {"name": "patient_id", "kind": "identifier"},
                {"name": "admitted", "kind": "datetime", "min": "2025-01-01", "max": "2025-12-31", "bins": 12},
                {"name": "age", "kind": "integer", "min": 18, "max": 90, "bins": 8},
                {"name": "temperature", "kind": "continuous", "min": 34.0, "max": 41.0, "bins": 14},
                {"name": "ward", "kind": "categorical", "categories": ["icu", "cardio", "neuro"]},
                {"name": "outcome", "kind": "categorical", "categories": ["home", "transfer"]},
            ],
        },
        "privacy": {"epsilon": epsilon, "delta": 1e-6},
        "generator": {"name": "marginals", **generator},
        "output": {"rows": rows},
    }


@pytest.fixture
def ledger(tmp_path):
    return str(tmp_path / "ledger")


def test_a_release_comes_back_with_the_inputs_column_types(tmp_path, ledger):
    df = patients()
    result = rs.synthesize(df, spec("types"), ledger=ledger, budget=(5.0, 1e-5), output=str(tmp_path / "out"))
    out = result.data
    assert list(out.columns) == list(df.columns)
    assert len(out) == 200
    # Missing is a value of its own unless a column rejects it: a release may draw it.
    for column in ["admitted", "temperature", "ward", "outcome"]:
        assert out[column].dtype == df[column].dtype, column
    assert out["age"].dtype == ("Int64" if out["age"].isna().any() else df["age"].dtype)
    assert list(out["ward"].cat.categories) == ["icu", "cardio", "neuro"]
    assert out["age"].dropna().between(18, 90).all()
    assert out["admitted"].dropna().between(pd.Timestamp("2025-01-01"), pd.Timestamp("2025-12-31 23:59:59")).all()
    assert set(out["outcome"].dropna()) <= {"home", "transfer"}
    assert result.manifest["privacy"]["epsilon"] == pytest.approx(1.0)
    shown = rs.ledger(ledger, "types")
    # The ledger composes its charges at the budget's δ (1e-5, the job's is 1e-6): below 1.
    assert [(c["epsilon"], c["status"]) for c in shown.charges] == [(pytest.approx(1.0), "released")]
    assert 0 < shown.spent["epsilon"] <= 1.0
    # The same rows as Arrow, and a spec given as TOML text reads the same.
    assert result.to_arrow().num_rows == 200
    # Read as any Parquet reader would, without the package: datetimes are timestamps.
    part = pq.read_table(tmp_path / "out" / result.manifest["parts"][0]["path"])
    assert pa.types.is_timestamp(part.schema.field("admitted").type), part.schema
    assert rs.spec.load(rs.spec.dumps(result.spec)) == result.spec


def test_a_charge_the_budget_does_not_cover_is_refused_and_changes_nothing(tmp_path, ledger):
    rs.init_ledger(ledger, "small", 0.5, 1e-5)
    before = rs.ledger(ledger, "small")
    out = tmp_path / "refused"
    with pytest.raises(rs.LedgerRefused) as refused:
        rs.synthesize(patients(), spec("small", epsilon=1.0), ledger=ledger, output=str(out))
    assert "budget" in str(refused.value) or "exceed" in str(refused.value)
    after = rs.ledger(ledger, "small")
    assert after.spent == before.spent and after.charges == before.charges
    assert not out.exists() or not any(out.iterdir())


def test_a_bad_spec_raises_spec_error_before_anything_runs(ledger):
    bad = spec("bad")
    bad["schema"]["columns"][2]["min"] = 100  # min above max
    with pytest.raises(rs.SpecError):
        rs.synthesize(patients(), bad, ledger=ledger, budget=(5.0, 1e-5))


def test_an_interrupt_stops_the_job_and_releases_nothing(tmp_path, ledger):
    """Ctrl-C (SIGINT to this process) while a long DP-SGD job runs: the package passes it
    on, the job stops, KeyboardInterrupt is raised, and the output prefix holds nothing."""
    df = patients(4000)
    job = spec("interrupted", rows=200)
    job["generator"] = {"name": "findiff", "findiff": {"run": {"batch_size": 64, "epochs": 2000}}}
    out = tmp_path / "interrupted"
    timer = threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            rs.synthesize(df, job, ledger=ledger, budget=(50.0, 1e-5), output=str(out), progress=False)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 120
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    charges = rs.ledger(ledger, "interrupted").charges
    assert all(c["status"] != "released" for c in charges), charges


def test_an_audit_reports_the_epsilon_its_release_proves(tmp_path):
    """`rs.audit` as `rhosynth audit`: the job run once with canaries in its input; the
    report's lower bound on ε, and whether it is consistent with the claim (exit 4 is a
    report, not an error)."""
    job = spec("audited", epsilon=1.0)
    report = rs.audit(job, data=patients(300), canaries=100, out=str(tmp_path / "audit"))
    assert report["canaries"] == 100 and report["claimed_epsilon"] == pytest.approx(1.0)
    assert report["passed"] is True
    assert 0 <= report["epsilon_lower_bound"] <= 1.0
