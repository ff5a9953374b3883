"""Issue 18, must-have 5: how far the window's own signals carry a replace/keep decision when a
learner is *trained* on labelled windows -- the ceiling of any decider, an LLM of any size
included, that reads what the judge-history prompts show and nothing else.

  python benchmarks/bench_signal_ceiling.py --test benchmarks/results/cf_suite_past/heldout-synth-medium.jsonl
         --train pool benchmarks/results/cf_suite_past/heldout-synth-small-21c0eea90b39.jsonl [--json OUT]

Every --train set (a labelled-window file as bench_cf_suite_past writes, or `pool`: the
judge-history-3 example pool, rudder/agent/history_pool.jsonl, its too-close windows left out)
trains each learner (scikit-learn; the seeded ones over --seeds), which then answers every --test window; beside them
the no-model deciders of bench_cf_suite_past (follow the past counterfactual; the pool's nearest
window's answer, which a model that copies its last example is). Also per file, leave-one-out
within it (train and test on one graph: an optimistic figure, not held out). Accuracy against the
counterfactual label, and counterfactual Pass@1 of the answer with the round the past
counterfactual found best (as follow-the-past answers). Features: rudder.agent.signals'
SIGNAL_FEATURES, computed as the prompts compute them and as the classifiers read them
(rudder.agent.classifiers.windows_xy); no label or future field is read.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_set(name: str) -> list[dict]:
    """A labelled-window file, or `pool`: the judge-history-3 pool as labelled windows."""
    from rudder.agent.eval import load_windows
    from rudder.agent.history_examples import PAST_CONTEXT, example_pool

    if name != "pool":
        return load_windows(name)
    return [{**e, "context": PAST_CONTEXT, "label_replace": e["label"] == "replace"}
            for e in example_pool().entries]


def learners(seed: int = 0) -> dict:
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return {"logistic regression": make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
            "3-nearest neighbours": make_pipeline(StandardScaler(), KNeighborsClassifier(3)),
            "random forest": RandomForestClassifier(200, random_state=seed),
            "gradient boosting": GradientBoostingClassifier(random_state=seed)}


def best_round(rec: dict) -> tuple[str, str]:
    """(budget, evict) of the round the window's past counterfactual found best."""
    from rudder.agent.signals import past_counterfactual

    pc = past_counterfactual(rec["window"]) or {"small/stale": 0.0}
    b, e = min(pc, key=pc.get).split("/")
    return b, e


def score(name: str, train: str, test: list[dict], answers) -> dict:
    from bench_cf_suite_past import cf_right

    ok = [bool(a) == bool(r["label_replace"]) for a, r in zip(answers, test)]
    cf = [cf_right(r, bool(a), *best_round(r)) for a, r in zip(answers, test)]
    cf = [c for c in cf if c is not None]
    return {"decider": name, "trained on": train, "n": len(test), "accuracy": round(sum(ok) / len(ok), 3),
            "replace share": round(float(np.mean([bool(a) for a in answers])), 2),
            "pass_at_1_cf": f"{sum(cf)}/{len(cf)}"}


def over_seeds(rows: list[dict]) -> dict:
    """One learner's rows over seeds: the mean accuracy, its range, the seeds' Pass@1."""
    acc = [r["accuracy"] for r in rows]
    out = {**rows[0], "accuracy": round(float(np.mean(acc)), 3)}
    out["accuracy min-max"] = f"{min(acc):.3f}-{max(acc):.3f}" if len(rows) > 1 else "-"
    out["pass_at_1_cf"] = " ".join(sorted({r["pass_at_1_cf"] for r in rows}))
    return out


def held_out(train_sets: dict[str, list[dict]], test: list[dict], seeds=(0,)) -> list[dict]:
    from bench_cf_suite_past import follow_past, nearest_example

    from rudder.agent.classifiers import windows_xy

    X = windows_xy(test)[0]
    fixed = [score("follow the past counterfactual", "-", test, [follow_past(r)[0] for r in test]),
             score("the pool's nearest window (1-NN, judge-history-3's last example)", "pool", test,
                   [nearest_example(r)[0] for r in test])]
    rows = [over_seeds([r]) for r in fixed]
    for tname, recs in train_sets.items():
        Xt, yt = windows_xy(recs)
        for lname in learners():
            rows.append(over_seeds([score(lname, tname, test, learners(s)[lname].fit(Xt, yt).predict(X))
                                    for s in seeds]))
    return rows


def leave_one_out(name: str, recs: list[dict], seeds=(0,)) -> list[dict]:
    from sklearn.model_selection import LeaveOneOut, cross_val_predict

    from rudder.agent.classifiers import windows_xy

    X, y = windows_xy(recs)
    return [over_seeds([score(lname, f"{name} (leave one out)", recs,
                              cross_val_predict(learners(s)[lname], X, y, cv=LeaveOneOut())) for s in seeds])
            for lname in learners()]


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return "\n".join(out + ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--test", required=True, help="the held-out labelled-window file")
    p.add_argument("--train", nargs="+", required=True, help="labelled-window files, or `pool`")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                   help="the seeded learners' seeds (random forest, gradient boosting); mean and range")
    p.add_argument("--no-loo", action="store_true", help="skip the within-file leave-one-out (slow: minutes)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    from rudder.agent.eval import load_windows
    from rudder.agent.signals import SIGNAL_FEATURES

    test = load_windows(a.test)
    trains = {t if t == "pool" else Path(t).name: load_set(t) for t in a.train}
    rows = held_out(trains, test, a.seeds)
    print(f"held out: {a.test} ({len(test)} windows)\n" + table(rows), flush=True)
    loo = [] if a.no_loo else [r for name, recs in {Path(a.test).name: test, **trains}.items()
                               for r in leave_one_out(name, recs, a.seeds)]
    if loo:
        print("\nwithin one file (not held out):\n" + table(loo))
    if a.json:
        a.json.write_text(json.dumps({"test": a.test, "train": a.train, "features": SIGNAL_FEATURES,
                                      "held_out": rows, "leave_one_out": loo}, indent=1))


if __name__ == "__main__":
    main()
