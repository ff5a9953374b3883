"""Offline-trained classifier baselines (the paper's comparison for the LLM agent).

Trained on trajectories collected with policy `collect` (rudder.agent.trajectories), each model
answers the agent's question at every window close: replace now or not?

  kinds        mlp, xgboost, linear_svm (LinearSVC), logreg, random_forest  (TabNet: not built;
               its package is not in our stack)
  training     `train_models(...)` / `rudder classifiers train`: a scaling + model sklearn
               Pipeline per kind, stratified k-fold accuracy, then a fit on all the data; saved
               with joblib as <out>/<kind>.joblib (pipeline, feature names, training metadata)
               plus a readable <kind>.json beside it
  or windows   `windows_dataset` / `rudder classifiers train --windows`: labelled windows of the
               counterfactual decision suite instead of trajectories; the model learns the
               counterfactual label from the signals the judge-history prompts show
               (SIGNAL_FEATURES) and is a history-only model (prefetch.lookahead 0)
  policy       `ClassifierPolicy` (policy name `classifier:<name>`): loads <models_dir>/<name>
               .joblib (or a path), decides at each window close, applies at the next plan()
               as the agent does: with lookahead (ctx.depth > 0) a positive prediction
               holds Replace("lookahead", budget x capacity) on every minibatch until the
               next window's prediction; without lookahead it is one MassiveGNN round;
               writes DECISION_FIELDS records whose outcome/correct fields are filled one window
               later (the same LabelRule as the training labels: online accuracy under shift)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rudder.agent.signals import SIGNAL_FEATURES, TREND_WINDOWS, signal_features
from rudder.agent.steering import Steering
from rudder.agent.trajectories import (
    FEATURE_NAMES,
    FeatureDecider,
    LabelRule,
    TrajectorySet,
    WindowStats,
)
from rudder.agent.windows import DecisionPoint
from rudder.config import PrefetchConfig
from rudder.prefetch.past import settle

log = logging.getLogger(__name__)

DEFAULT_MODELS_DIR = "models/classifiers"  # relative to the working directory
MODELS_DIR_ENV = "RUDDER_CLASSIFIERS_DIR"  # overrides the default directory
MODEL_KINDS = ["mlp", "xgboost", "linear_svm", "logreg", "random_forest"]
ALIASES = {
    "svm": "linear_svm", "linearsvc": "linear_svm", "lr": "logreg", "logistic": "logreg",
    "rf": "random_forest", "forest": "random_forest", "xgb": "xgboost",
}
TRAIN_COMMAND = "rudder classifiers train --runs RUN_DIR... --out {out}"


def canonical_kind(kind: str) -> str:
    k = ALIASES.get(kind.lower(), kind.lower())
    if k == "tabnet":
        raise ValueError("tabnet is not available (pytorch-tabnet is not in the stack); "
                         f"choose from {', '.join(MODEL_KINDS)}")
    if k not in MODEL_KINDS:
        raise ValueError(f"unknown classifier kind {kind!r}; valid: {', '.join(MODEL_KINDS)}")
    return k


def make_estimator(kind: str, seed: int = 0, n_jobs: int = 1):
    """A scaling + classifier Pipeline. Sizes are small on purpose: a few thousand rows of
    ~30 features, and the model runs beside a trainer at every window close."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    kind = canonical_kind(kind)
    if kind == "mlp":
        from sklearn.neural_network import MLPClassifier

        clf = MLPClassifier(hidden_layer_sizes=(32, 16), alpha=1e-3, max_iter=300,
                            early_stopping=True, n_iter_no_change=10, random_state=seed)
    elif kind == "xgboost":
        from xgboost import XGBClassifier

        clf = XGBClassifier(n_estimators=200, max_depth=4, learning_rate=0.1, subsample=0.9,
                            colsample_bytree=0.9, n_jobs=n_jobs, random_state=seed,
                            eval_metric="logloss", verbosity=0)
    elif kind == "linear_svm":
        from sklearn.svm import LinearSVC

        clf = LinearSVC(C=1.0, max_iter=5000, random_state=seed)
    elif kind == "logreg":
        from sklearn.linear_model import LogisticRegression

        clf = LogisticRegression(C=1.0, max_iter=2000)
    else:
        from sklearn.ensemble import RandomForestClassifier

        clf = RandomForestClassifier(n_estimators=100, min_samples_leaf=2, n_jobs=n_jobs,
                                     random_state=seed)
    return Pipeline([("scale", StandardScaler()), ("clf", clf)])


# ---- training -------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    out = {}
    for mod in ("sklearn", "xgboost", "numpy", "joblib"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return out


def cross_validate(kind: str, data: TrajectorySet, folds: int = 5, seed: int = 0) -> list[float]:
    """Stratified k-fold accuracy (shuffled; folds capped by the smaller class)."""
    import numpy as np
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    counts = np.bincount(data.y, minlength=2)
    k = int(min(folds, counts.min()))
    if k < 2:
        return []
    cv = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [float(s) for s in cross_val_score(make_estimator(kind, seed), data.X, data.y, cv=cv)]


def windows_dataset(paths: list[str | Path]) -> TrajectorySet:
    """Labelled windows (`rudder agent eval --windows` files; the counterfactual decision suite,
    benchmarks/bench_cf_suite_past.py) as a training set over SIGNAL_FEATURES, labelled by the
    counterfactual (`label_replace`)."""
    import numpy as np

    from rudder.agent.eval import load_windows

    recs = load_windows([str(p) for p in paths])
    if not recs:
        raise ValueError(f"no labelled windows in {', '.join(map(str, paths))}")
    X, y = windows_xy(recs)
    records = [{"features": {**dict(zip(SIGNAL_FEATURES, x)),
                             "batch_size": float(r["context"].get("batch_size") or 0)},
                "dataset": r.get("graph")} for x, r in zip(X.tolist(), recs)]
    return TrajectorySet(X, y, list(SIGNAL_FEATURES), records, [str(p) for p in paths])


def windows_xy(recs: list[dict]):
    """(X over SIGNAL_FEATURES, y: 1 = replace) of labelled windows (their context, window,
    the windows before it, and the counterfactual label)."""
    import numpy as np

    X = np.array([[f[n] for n in SIGNAL_FEATURES] for f in
                  (signal_features(r["window"], r.get("recent") or [], int(r["context"].get("capacity") or 0))
                   for r in recs)])
    return X, np.array([int(bool(r["label_replace"])) for r in recs])


def train_models(
    data: TrajectorySet,
    out_dir: str | Path,
    kinds: list[str] | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    rule: LabelRule | None = None,
    runs: list[str] | None = None,
    actions: str = "all",
    labels: str = "as collected",
) -> dict[str, dict]:
    """Fits each kind on all of `data` and saves it; returns {kind: metadata} (with cv scores).
    Raises ValueError when the labels hold one class only (nothing to learn)."""
    import joblib
    import numpy as np

    kinds = [canonical_kind(k) for k in (kinds or MODEL_KINDS)]
    counts = np.bincount(data.y, minlength=2)
    if (counts == 0).any():
        only = int(np.argmax(counts))
        raise ValueError(
            f"all {len(data)} trajectories have label {only}; collect with both actions "
            "(policy 'collect', p_replace between 0 and 1) or change --margin/--cost")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    recs = data.records
    for kind in kinds:
        t0 = time.perf_counter()
        scores = cross_validate(kind, data, folds, seed)
        model = make_estimator(kind, seed).fit(data.X, data.y)
        meta = {
            "kind": kind,
            "feature_names": list(data.feature_names),
            "cv_folds": len(scores),
            "cv_accuracy": float(np.mean(scores)) if scores else None,
            "cv_scores": scores,
            "train_accuracy": float((model.predict(data.X) == data.y).mean()),
            "samples": int(len(data)),
            "positives": int(counts[1]),
            "majority_baseline": float(counts.max() / counts.sum()),
            "label_rule": asdict(rule) if rule else labels,
            "actions": actions,
            "datasets": sorted({str(r.get("dataset")) for r in recs}),
            "batch_sizes": sorted({float(r["features"].get("batch_size", 0)) for r in recs}),
            "runs": list(runs or []),
            "sources": list(data.sources),
            "seed": seed,
            "params": {k: repr(v) for k, v in model.named_steps["clf"].get_params().items()},
            "versions": _versions(),
            "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "fit_seconds": round(time.perf_counter() - t0, 3),
        }
        path = out / f"{kind}.joblib"
        joblib.dump({"pipeline": model, "meta": meta}, path)
        # The digest a run checks before it unpickles the file (resolve_checked).
        meta["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (out / f"{kind}.json").write_text(json.dumps(meta, indent=2) + "\n")
        meta["path"] = str(path)
        results[kind] = meta
        log.info("%s: cv accuracy %s (%d samples) -> %s", kind, meta["cv_accuracy"],
                 len(data), path)
    return results


# ---- loading and applying -------------------------------------------------------------------
def models_dir(explicit: str | Path | None = None) -> Path:
    return Path(explicit or os.environ.get(MODELS_DIR_ENV) or DEFAULT_MODELS_DIR)


def resolve_model_path(name: str, directory: str | Path | None = None) -> Path:
    """A name ("xgboost", "rf") resolves to <dir>/<kind>.joblib; a path is taken as is."""
    if name.endswith(".joblib") or os.sep in name or "/" in name:
        return Path(name)
    base = models_dir(directory)
    direct = base / f"{name}.joblib"
    if direct.exists():
        return direct
    try:
        return base / f"{canonical_kind(name)}.joblib"
    except ValueError:
        return direct


def resolve_checked(name: str, directory: str | Path | None = None, lookahead: int | None = None) -> Path:
    """The model file for a configured name (`classifier:<name>`): a plain name, found in the
    models folder (models_dir), whose sha256 matches the digest its training recorded in
    <name>.json. A joblib file is a pickle: loading one runs code, so a run loads only these.
    `lookahead` (a run's prefetch.lookahead): also `check_lookahead` on the feature names that
    <name>.json records, before anything is unpickled (preflight)."""
    from rudder.config import check_name

    stem = name[:-len(".joblib")] if name.endswith(".joblib") else name
    try:
        check_name(stem, "classifier model name")
    except ValueError as exc:
        raise ValueError(f"{exc}; classifier models load only from {models_dir(directory)}/ "
                         "(set $RUDDER_CLASSIFIERS_DIR to use another folder)") from None
    base = models_dir(directory).resolve()
    path = resolve_model_path(stem, base)
    if not path.exists():
        raise FileNotFoundError(
            f"classifier model {name!r} not found: {path} does not exist. Collect "
            "trajectories with prefetch policy 'collect', then train it with: "
            + TRAIN_COMMAND.format(out=base))
    if not path.resolve().is_relative_to(base):  # a symlink out of the folder
        raise ValueError(f"classifier model {path} points outside {base}")
    sidecar = path.with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        meta = {}
    want = meta.get("sha256")
    if not want:
        raise ValueError(f"classifier model {path} has no recorded sha256 in {sidecar}: retrain "
                         "it (" + TRAIN_COMMAND.format(out=base) + ") so its digest is recorded")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise ValueError(f"classifier model {path} has sha256 {got[:12]}..., its {sidecar.name} "
                         f"records {want[:12]}...: altered since training; not loaded")
    if lookahead is not None:
        check_lookahead(name, path, meta.get("feature_names") or [], lookahead)
    return path


def check_lookahead(name: str, path: Path, feature_names: list[str], lookahead: int) -> None:
    """A model that learnt from labelled windows (`--windows`) reads a history-only window's
    signals, which a run that samples ahead does not have: refused, naming why."""
    if set(feature_names) & set(SIGNAL_FEATURES) and lookahead > 0:
        raise ValueError(f"classifier:{name} ({path}) learnt from history-only labelled windows "
                         f"(--windows): it needs prefetch.lookahead: 0, got {lookahead}")


class SavedClassifier:
    """A trained pipeline with its feature names; predicts replace (1) / keep (0)."""

    def __init__(self, pipeline: Any, meta: dict, path: Path):
        self.pipeline = pipeline
        self.meta = meta
        self.path = path
        self.kind = meta.get("kind", path.stem)
        self.feature_names: list[str] = list(meta.get("feature_names") or FEATURE_NAMES)
        self.digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    @classmethod
    def load(cls, name: str, directory: str | Path | None = None) -> "SavedClassifier":
        import joblib

        path = resolve_checked(name, directory)
        return cls.load_file(path)

    @classmethod
    def load_file(cls, path: str | Path) -> "SavedClassifier":
        """Unpickles `path` as given, unchecked: for a caller that trusts the file."""
        import joblib

        path = Path(path)
        obj = joblib.load(path)
        if not isinstance(obj, dict) or "pipeline" not in obj:
            raise ValueError(f"{path} is not a Rudder classifier file (no 'pipeline' entry)")
        return cls(obj["pipeline"], obj.get("meta", {}), path)

    def vector(self, features: dict[str, float]):
        import numpy as np

        return np.array([[float(features.get(n, 0.0)) for n in self.feature_names]])

    def decide(self, features: dict[str, float]) -> tuple[bool, float]:
        """(replace?, score) in one model call: score = P(replace) where the model has
        probabilities (the decision is their argmax, as the model's own predict), else the
        decision-function margin (replace iff > 0, as LinearSVC.predict)."""
        x = self.vector(features)
        classes = list(self.pipeline.classes_)
        if hasattr(self.pipeline, "predict_proba"):
            proba = self.pipeline.predict_proba(x)[0]
            return bool(int(classes[int(proba.argmax())])), float(proba[classes.index(1)])
        margin = float(self.pipeline.decision_function(x)[0])
        return bool(int(classes[1] if margin > 0 else classes[0])), margin

    def predict(self, features: dict[str, float]) -> bool:
        return bool(int(self.pipeline.predict(self.vector(features))[0]))

    def predict_many(self, X):
        return self.pipeline.predict(X)


def evaluate(model: SavedClassifier, data: TrajectorySet) -> dict:
    """Accuracy of a saved model on other trajectories (e.g. another batch size or graph)."""
    import numpy as np

    idx = [data.feature_names.index(n) if n in data.feature_names else None
           for n in model.feature_names]
    X = np.zeros((len(data), len(idx)))
    for j, i in enumerate(idx):
        if i is not None:
            X[:, j] = data.X[:, i]
    pred = np.asarray(model.predict_many(X)).astype(int)
    counts = np.bincount(data.y, minlength=2)
    return {
        "model": model.kind,
        "path": str(model.path),
        "samples": int(len(data)),
        "accuracy": float((pred == data.y).mean()),
        "majority_baseline": float(counts.max() / max(1, counts.sum())),
        "predicted_replace": float(pred.mean()),
    }


class ClassifierDecider(FeatureDecider):
    """An offline-trained model answers from the window's feature vector. A model trained on
    labelled windows (`--windows`) reads the prompts' signals (SIGNAL_FEATURES): its windows then
    carry the past counterfactual, and the windows before each one give the trends."""

    backend = "sklearn"

    def __init__(self, model: SavedClassifier, label: str, *, rule: LabelRule | None = None,
                 dataset: str | None = None):
        super().__init__(rule=rule, dataset=dataset)
        self.model = model
        self.label = label
        self.model_label = f"{model.kind}@{model.digest}"
        if model.kind == "xgboost":
            self.backend = "xgboost"
        self.wants_past = bool(set(model.feature_names) & set(SIGNAL_FEATURES))

    def features(self, point: DecisionPoint) -> dict[str, float]:
        feats = super().features(point)
        if self.wants_past and point.raw.get("window", -1) >= 0:  # not the start decision
            # Live, the past counterfactual may still be measured off the loader
            # (prefetch.past_thread): this decider answers on the loader thread, so it waits for
            # it -- without it every past signal reads 0 and the model answers another window.
            recent = [settle(w) for w in point.recent[-(TREND_WINDOWS - 1):]]
            feats.update(signal_features(settle(point.raw), recent, self.steer.ctx.capacity))
        return feats

    def choose(self, features: dict[str, float], stats: WindowStats) -> tuple[bool, dict]:
        t0 = time.perf_counter()
        replace, score = self.model.decide(features)
        latency = time.perf_counter() - t0
        return replace, {"raw": json.dumps({"replace": replace, "score": score}),
                         "latency_s": latency, "reason": f"score={score:.3f}"}


class ClassifierPolicy(Steering):
    """`classifier:<name>`: the steering skeleton with a ClassifierDecider.

    extra: model_name (from the policy name), model_path (a file, overrides the name),
    models_dir (default $RUDDER_CLASSIFIERS_DIR or models/classifiers), dataset, margin and
    cost (the LabelRule that fills `correct`); agent= and other keys are ignored.
    The model loads here, so a missing file fails before the run starts.
    """

    name = "classifier"
    named = True  # classifier:<model name>

    def __init__(self, cfg: PrefetchConfig, model_name: str | None = None, *,
                 model_path: str | None = None, models_dir: str | None = None,
                 dataset: str | None = None, margin: float = 0.01, cost: str = "time",
                 **_ignored: Any):
        if not (model_name or model_path):
            raise ValueError("policy 'classifier' needs a model name: classifier:<name>")
        self.model_name = model_name or Path(model_path).stem  # type: ignore[arg-type]
        model = (SavedClassifier.load_file(model_path) if model_path  # a caller's own file
                 else SavedClassifier.load(self.model_name, models_dir))
        check_lookahead(self.model_name, model.path, model.feature_names, cfg.lookahead)
        super().__init__(cfg, ClassifierDecider(model, f"classifier:{self.model_name}",
                                                rule=LabelRule(margin=margin, cost=cost), dataset=dataset))

    @property
    def model(self) -> SavedClassifier:
        return self.decider.model
