"""The package as a user meets it: the installed wheel's binary, real jobs on this machine."""

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
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


def _alive(pid):
    """Whether `pid` runs (a zombie no one reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_job_whose_python_is_killed_stops_and_releases_nothing(tmp_path, ledger):
    """A kernel killed (SIGKILL: no interrupt to pass on) mid-job: the CLI sees its parent
    gone, cancels the job, and the output prefix holds nothing."""
    out = tmp_path / "orphaned"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import rhosynth as rs
        from test_rhosynth import patients, spec
        job = spec("orphaned", rows=200)
        job["generator"] = {{"name": "findiff", "findiff": {{"run": {{"batch_size": 64, "epochs": 2000}}}}}}
        rs.synthesize(patients(4000), job, ledger={ledger!r}, budget=(50.0, 1e-5), output={str(out)!r}, progress=False)
    """))
    kernel = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 120
    while not (out / "_claim.json").exists():
        assert kernel.poll() is None and time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    with open(f"/proc/{kernel.pid}/task/{kernel.pid}/children") as f:
        (cli,) = map(int, f.read().split())
    time.sleep(3)
    kernel.kill()
    kernel.wait()
    deadline = time.monotonic() + 60
    while _alive(cli):
        assert time.monotonic() < deadline, "the job ran on without its kernel"
        time.sleep(0.2)
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    charges = rs.ledger(ledger, "orphaned").charges
    assert all(c["status"] != "released" for c in charges), charges


def test_input_files_a_killed_call_left_are_deleted_by_the_next(tmp_path, monkeypatch):
    """A call deletes its table's file as it ends; a killed one cannot, so the next call
    deletes every file no live call holds (private rows do not linger)."""
    monkeypatch.setenv("RHOSYNTH_HOME", str(tmp_path / "home"))
    folder = rs.frames.private_dir("inputs")
    left, held = (os.path.join(folder, c * 64 + ".csv") for c in "01")
    for path in (left, held):
        with open(path, "w") as f:
            f.write("patient_id\np0\n")
    with open(held + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # another call reading it
        with rs.frames.csv_input(patients()) as path:
            assert os.path.exists(path) and os.path.exists(held)
            assert not os.path.exists(left)
    assert not os.path.exists(path)
    # A CLI the call ran holds the call's lock (the package passes it): its file outlives
    # the call while that CLI runs, and goes with the next call after it ends.
    with rs.frames.csv_input(patients()) as path:
        reader = subprocess.Popen(["sleep", "30"], pass_fds=rs.frames.held_locks())
    with rs.frames.csv_input(patients(10)):
        assert os.path.exists(path)
    reader.kill()
    reader.wait()
    with rs.frames.csv_input(patients(10)):
        assert not os.path.exists(path)


def test_a_database_release_comes_back_as_its_tables(tmp_path, ledger):
    """A database job (patients → admissions → vitals): the result is a dict of its tables,
    the root first, each with its spec's types, and every key resolving to its parent."""
    data = tmp_path / "db"
    subprocess.run([rs.cli.binary(), "simulate", "--relational", "--patients", "200", str(data)], check=True)
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mimic-database.toml")
    job = rs.spec.load(example)
    for table in job["tables"]:
        table["input"]["urls"] = [str(data / f"{table['name']}.csv")]
    # Placeholders in the spec's output are the engine's to fill: the result is where it wrote.
    job["output"]["url"] = str(tmp_path / "out" / "{dataset_id}" / "{job_id}")
    job["job"]["id"] = "db-job"
    result = rs.synthesize(str(data / "patients.csv"), job, ledger=ledger, budget=(10.0, 1e-5), progress=False)
    assert result.output == str(tmp_path / "out" / job["job"]["dataset_id"] / "db-job")
    tables = result.data
    assert list(tables) == ["patients", "admissions", "vitals"]
    patients_, admissions, vitals = tables.values()
    assert len(patients_) > 0 and len(admissions) > 0 and len(vitals) > 0
    assert list(patients_["sex"].cat.categories) == ["F", "M"]
    assert str(admissions["admittime"].dtype).startswith("datetime64")
    assert set(admissions["subject_id"]) <= set(patients_["subject_id"])
    assert set(vitals["hadm_id"]) <= set(admissions["hadm_id"])
    assert set(result.to_arrow()) == set(tables)


def test_an_audit_reports_the_epsilon_its_release_proves(tmp_path):
    """`rs.audit` as `rhosynth audit`: the job run once with canaries in its input; the
    report's lower bound on ε, and whether it is consistent with the claim (exit 4 is a
    report, not an error)."""
    job = spec("audited", epsilon=1.0)
    report = rs.audit(job, data=patients(300), canaries=100, out=str(tmp_path / "audit"))
    assert report["canaries"] == 100 and report["claimed_epsilon"] == pytest.approx(1.0)
    assert report["passed"] is True
    assert 0 <= report["epsilon_lower_bound"] <= 1.0
