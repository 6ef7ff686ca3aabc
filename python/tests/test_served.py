"""A served coordinator as a submitter meets it through `rs.Client`: `rhosynth serve` with
TLS (certificates made with `openssl`), a declared dataset and a submitter's token, one
`rhosynth-worker` with its client certificate (mTLS), all real processes over sockets."""

import hashlib
import os
import socket
import subprocess
import time

import pytest

import rhosynth as rs
from test_rhosynth import patients, spec

WORKER = os.environ.get("RHOSYNTH_TEST_WORKER")


def openssl(folder, *args):
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def certificates(folder):
    """A CA, the coordinator's certificate (127.0.0.1) and a worker's client certificate."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    openssl(folder, "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=ca", *ec, "-addext",
            "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", "ca.key", "-out", "ca.pem")
    for name, extensions in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("worker", "extendedKeyUsage=clientAuth"),
    ]:
        (folder / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\n{extensions}\n")
        openssl(folder, "req", "-new", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", *ec)
        openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(proc, log, text, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {log}:\n{log.read_text()}")


@pytest.fixture
def served(tmp_path):
    if WORKER is None:
        pytest.skip("RHOSYNTH_TEST_WORKER (a rhosynth-worker binary) is not set")
    certificates(tmp_path)
    data = tmp_path / "ward.csv"
    patients(400).to_csv(data, index=False)
    token = "analyst-token-0123456789abcdef"
    (tmp_path / "datasets.toml").write_text(
        f'[[dataset]]\nid = "ward"\nunit_column = "patient_id"\nledger = "{tmp_path / "ledger"}"\n'
        f'budget = {{ epsilon = 3.0, delta = 1e-5 }}\n[dataset.input]\nurls = ["{data}"]\n'
    )
    (tmp_path / "submitters.toml").write_text(
        f'[[submitter]]\nname = "analyst"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        f'datasets = ["ward"]\noutput_root = "{tmp_path / "out"}"\n'
    )
    port = free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("coordinator", "worker")}
    coordinator = subprocess.Popen(
        [rs.cli.binary(), "serve", "--listen", f"127.0.0.1:{port}", "--release-quantum", "0.2",
         "--scratch", str(tmp_path / "scratch"), "--ledger", str(tmp_path / "default-ledger"),
         "--datasets", str(tmp_path / "datasets.toml"), "--submitters", str(tmp_path / "submitters.toml"),
         "--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"),
         "--worker-ca", str(tmp_path / "ca.pem")],
        stdout=subprocess.DEVNULL, stderr=logs["coordinator"].open("w"),
    )
    url = f"https://127.0.0.1:{port}"
    worker = None
    try:
        wait_for(coordinator, logs["coordinator"], "coordinator listening")
        worker = subprocess.Popen(
            [WORKER, "--coordinator", url, "--name", "w1", "--tls-ca", str(tmp_path / "ca.pem"),
             "--tls-cert", str(tmp_path / "worker.pem"), "--tls-key", str(tmp_path / "worker.key")],
            stdout=subprocess.DEVNULL, stderr=logs["worker"].open("w"),
        )
        wait_for(worker, logs["worker"], "registered")
        yield {"url": url, "token": token, "ca": tmp_path / "ca.pem", "out": tmp_path / "out", "dir": tmp_path}
    finally:
        for proc in (worker, coordinator):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def submitted_spec():
    """The declared dataset's job: its input, unit and ledger are the operator's."""
    job = spec("ward")
    job["schema"].pop("unit_column")
    return job


def test_a_served_job_runs_through_the_client_over_tls_with_a_token(served):
    client = rs.Client(served["url"], token=served["token"], ca=served["ca"])
    result = client.submit(submitted_spec(), progress=False)
    assert result.manifest["privacy"]["dataset_id"] == "ward"
    assert result.manifest["privacy"]["epsilon"] == pytest.approx(1.0)
    assert os.path.dirname(result.output) == str(served["out"])
    out = result.read()
    assert len(out) == 200 and list(out.columns) == list(patients().columns)
    assert str(out["admitted"].dtype).startswith("datetime64")
    # A declared dataset keeps a category for values outside the declared ones.
    assert list(out["ward"].cat.categories)[:3] == ["icu", "cardio", "neuro"]
    assert set(out["ward"].cat.categories[3:]) <= {"__other__"}
    # The dataset's ledger (the operator's) holds the one charge.
    owner = rs.ledger(served["dir"] / "ledger", "ward")
    assert [(c["epsilon"], c["status"]) for c in owner.charges] == [(pytest.approx(1.0), "released")]
    # The submitter sees it through the coordinator: the same cost and totals, its own job
    # by name, and not the operator's files.
    seen = client.ledger("ward")
    assert (seen.dataset, seen.budget, seen.spent, seen.input) == ("ward", owner.budget, owner.spent, None)
    assert seen.remaining_epsilon == pytest.approx(owner.remaining_epsilon)
    assert [(c["job_id"], c["epsilon"], c["status"]) for c in seen.charges] == [
        (result.manifest["job_id"], owner.charges[0]["epsilon"], "released")
    ]
    with pytest.raises(rs.RhosynthError, match="no dataset 'claims' is granted"):
        client.ledger("claims")


def test_a_token_the_coordinator_does_not_know_is_refused(served):
    client = rs.Client(served["url"], token="not-a-token-0123456789", ca=served["ca"])
    with pytest.raises(rs.RhosynthError, match="rejected"):
        client.submit(submitted_spec(), progress=False)
    with pytest.raises(rs.RhosynthError, match="unknown bearer token"):
        client.ledger("ward")
    assert not (served["dir"] / "ledger").exists() or rs.ledger(served["dir"] / "ledger", "ward").charges == []


def test_a_client_refuses_urls_that_would_send_its_token_in_the_clear():
    for url, ca in [
        ("http://coordinator.example:50051", None),
        ("http://127.0.0.1:@evil.example:50051", None),
        ("https://user@coordinator.example:50051", "ca.pem"),
        ("http://127.0.0.1:50051", "ca.pem"),
    ]:
        with pytest.raises(ValueError):
            rs.Client(url, token="t", ca=ca)
    assert "t0k" not in repr(rs.Client("https://c.example:1", token="t0k", ca="ca.pem"))
    rs.Client("http://127.0.0.1:50051", token="t")  # loopback, as the CLI allows
