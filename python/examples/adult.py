# %% [markdown]
# # UCI Adult with rhosynth: draft → AIM → evaluate → ledger
#
# A notebook as a script (Jupytext's percent format: `jupytext --to ipynb adult.py`).
# Needs Adult's files (`adult.data`, `adult.test`); `ADULT_DIR` names their folder.
# Every row is a different person (`row_level=True`).

# %%
import os
import sys
import tempfile

import pandas as pd

import rhosynth as rs

ADULT_DIR = os.environ.get("ADULT_DIR", "../shared/data/adult")
WORK = os.environ.get("RHOSYNTH_EXAMPLE_DIR") or tempfile.mkdtemp(prefix="adult-")
COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income",
]


def read(name, **options):
    frame = pd.read_csv(
        os.path.join(ADULT_DIR, name), names=COLUMNS, na_values="?", skipinitialspace=True, **options
    )
    # adult.test ends its labels with "." (">50K." for ">50K").
    frame["income"] = frame["income"].str.rstrip(".")
    return frame


train, test = read("adult.data"), read("adult.test", skiprows=1)
print(f"train {train.shape}, test {test.shape}")

# %% [markdown]
# ## 1. A spec drafted with DP (ε = 0.2), charged to the dataset's new ledger

# %%
ledger = os.path.join(WORK, "ledger")
spec = rs.draft(
    train, row_level=True, epsilon=0.2, dataset="uci-adult", ledger=ledger, budget=(3.0, 1e-5),
    generator="aim", epsilon_job=1.0,
)
spec["schema"]["target"] = "income"
print([(c["name"], c["kind"]) for c in spec["schema"]["columns"]])

# %% [markdown]
# ## 2. AIM at ε = 1

# %%
result = rs.synthesize(train, spec, output=os.path.join(WORK, "release"))
synthetic = result.data
print(synthetic.head())
print(result.manifest["privacy"]["epsilon"], result.manifest["privacy"]["ledger_entry"])

# %% [markdown]
# ## 3. Evaluate against the held-out rows (not differentially private: the owner's)

# %%
report = rs.evaluate(test, result, out=os.path.join(WORK, "report"))
print({k: report["summary"][k] for k in ("hist", "pair", "cor_acc", "membership_auc")})
print("TSTR:", report["utility"])
print("report:", report["html"])

# %% [markdown]
# ## 4. What the dataset has spent

# %%
spent = rs.ledger(ledger, "uci-adult")
print(f"spent ε = {spent.spent['epsilon']:.3f} of {spent.budget['epsilon']}; {len(spent.charges)} charges")
sys.stdout.flush()
