"""Reference for tests/eval.rs: scikit-learn's logistic regression on the design matrices
rhosynth's evaluation builds (CSV: features..., label). Prints {"roc_auc": ...}."""
import json
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

train = np.loadtxt(sys.argv[1], delimiter=",")
test = np.loadtxt(sys.argv[2], delimiter=",")
model = LogisticRegression(C=1.0, max_iter=5000).fit(train[:, :-1], train[:, -1])
print(json.dumps({"roc_auc": roc_auc_score(test[:, -1], model.predict_proba(test[:, :-1])[:, 1])}))
