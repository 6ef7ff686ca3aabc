"""The one-run audit bound of a public implementation, on the counts rhosynth's test checks.

Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run", as
jax-privacy 2.0.0 implements it (`jax_privacy.auditing._epsilon_one_run` and
`_one_run_p_value`). Writes `shared/src/audit/one_run_vectors.json`, which
`rhosynth_shared::audit::bound`'s test compares with, number for number.

    python3 -m venv .venv && .venv/bin/pip install --require-hashes -r requirements.txt \
      && .venv/bin/pip install --no-deps --require-hashes -r jax_privacy.txt \
      && .venv/bin/python one_run.py

Only `auditing.py` is loaded (its package's `__init__` imports JAX, which the bound does
not need).
"""

import importlib.util
import json
import os
import sys
import sysconfig

path = os.path.join(sysconfig.get_paths()["purelib"], "jax_privacy", "auditing.py")
spec = importlib.util.spec_from_file_location("jax_privacy_auditing", path)
auditing = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = auditing
spec.loader.exec_module(auditing)

# (canaries, guesses, correct, delta, significance): chance, near chance, strong, perfect,
# small and large audits, with and without delta.
COUNTS = [
    (1000, 200, 100, 1e-5, 0.05),
    (1000, 200, 120, 1e-5, 0.05),
    (1000, 200, 140, 0.0, 0.05),
    (1000, 200, 140, 1e-5, 0.05),
    (1000, 200, 160, 1e-5, 0.05),
    (1000, 200, 180, 1e-5, 0.05),
    (1000, 200, 195, 1e-5, 0.05),
    (1000, 200, 200, 0.0, 0.05),
    (1000, 200, 200, 1e-5, 0.05),
    (1000, 100, 80, 1e-6, 0.05),
    (1000, 100, 90, 1e-5, 0.01),
    (1000, 1000, 600, 1e-5, 0.05),
    (1000, 1000, 750, 1e-5, 0.05),
    (200, 40, 30, 1e-5, 0.05),
    (200, 40, 36, 1e-5, 0.05),
    (200, 40, 40, 0.0, 0.05),
    (200, 40, 40, 1e-5, 0.05),
    (100, 20, 19, 0.0, 0.05),
    (5000, 500, 400, 1e-5, 0.05),
    (5000, 1000, 990, 1e-6, 0.05),
    (10000, 2000, 1300, 1e-5, 0.05),
    (50, 10, 10, 1e-3, 0.05),
]

cases = []
for m, r, v, delta, significance in COUNTS:
    cases.append(
        {
            "canaries": m,
            "guesses": r,
            "correct": v,
            "delta": delta,
            "significance": significance,
            "epsilon_lower_bound": auditing._epsilon_one_run(0.0, m, r, v, significance, delta),
            "p_value_at_1": float(auditing._one_run_p_value(m, r, v, 1.0, delta)),
        }
    )

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/src/audit/one_run_vectors.json")
with open(out, "w") as f:
    json.dump({"about": "jax-privacy 2.0.0 auditing._epsilon_one_run(0, m, r, v, significance, delta) and "
               "_one_run_p_value(m, r, v, 1.0, delta); written by bench/audit_reference/one_run.py",
               "cases": cases}, f, indent=1)
    f.write("\n")
for c in cases:
    print(c)
