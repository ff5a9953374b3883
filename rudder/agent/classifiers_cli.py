"""`rudder classifiers ...`: train, evaluate and list the offline classifier baselines.

  rudder classifiers train --runs runs/A runs/B --out models/classifiers/
  rudder classifiers eval  --model xgboost --runs runs/C          (accuracy under shift)
  rudder classifiers list
"""
from __future__ import annotations

import argparse
import json

from rudder.arg_types import at_least


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "classifiers", help="offline ML baselines: train/eval/list (policy classifier:<name>)",
        description="Classifier baselines trained on trajectories from policy 'collect'.")
    sub = p.add_subparsers(dest="classifiers_command", metavar="ACTION")

    t = sub.add_parser("train", help="fit the classifiers on collected trajectories")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--runs", nargs="+", metavar="DIR",
                     help="run directories (searched for trajectories-r*.jsonl) or files")
    src.add_argument("--windows", nargs="+", metavar="FILE",
                     help="labelled-window files (the counterfactual decision suite, "
                          "benchmarks/bench_cf_suite_past.py): learn the counterfactual label from "
                          "the signals the judge-history prompts show (history-only runs)")
    t.add_argument("--out", default=None, metavar="DIR",
                   help="where the models go (default: $RUDDER_CLASSIFIERS_DIR or "
                        "models/classifiers)")
    t.add_argument("--models", default=None,
                   help="comma-separated kinds (default: mlp,xgboost,linear_svm,logreg,"
                        "random_forest)")
    t.add_argument("--folds", type=at_least(int, 2), default=5, help="cross-validation folds (2 or more)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--margin", type=float, default=None,
                   help="relabel: hit-rate margin of the label rule (default: labels as "
                        "collected)")
    t.add_argument("--cost", choices=["time", "rows"], default=None,
                   help="relabel: fetch cost measured as time or rows")
    t.add_argument("--actions", choices=["all", "replace", "skip"], default="all",
                   help="train on all decisions, or only the replace (or skip) ones")
    t.add_argument("--json", action="store_true", help="print the results as JSON")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="accuracy of a saved model on other trajectories")
    e.add_argument("--model", required=True, help="a saved model's name (xgboost, rf, ...: `rudder classifiers list`)")
    e.add_argument("--models-dir", default=None)
    e.add_argument("--runs", nargs="+", required=True, metavar="DIR")
    e.add_argument("--margin", type=float, default=None)
    e.add_argument("--cost", choices=["time", "rows"], default=None)
    e.set_defaults(func=_eval)

    ls = sub.add_parser("list", help="saved models and how they were trained")
    ls.add_argument("--models-dir", default=None)
    ls.set_defaults(func=_list)

    def _no_action(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_no_action)


def _rule(args: argparse.Namespace):
    from rudder.agent.trajectories import LabelRule

    if args.margin is None and args.cost is None:
        return None
    default = LabelRule()
    return LabelRule(margin=default.margin if args.margin is None else args.margin,
                     cost=args.cost or default.cost)


def _train(args: argparse.Namespace) -> int:
    from rudder.agent.classifiers import models_dir, train_models, windows_dataset
    from rudder.agent.trajectories import load_trajectories

    rule = _rule(args)
    if args.windows:
        if rule is not None or args.actions != "all":
            raise SystemExit("rudder classifiers train: --margin, --cost and --actions apply to "
                             "--runs; labelled windows carry their counterfactual label")
        data = windows_dataset(args.windows)
    else:
        data = load_trajectories(args.runs, rule=rule, actions=args.actions)
    kinds = [k.strip() for k in args.models.split(",") if k.strip()] if args.models else None
    out = models_dir(args.out)
    results = train_models(data, out, kinds, folds=args.folds, seed=args.seed,
                           rule=rule, runs=list(args.runs or args.windows), actions=args.actions,
                           labels="counterfactual (label_replace)" if args.windows else "as collected")
    if args.json:
        print(json.dumps({k: {f: m[f] for f in ("cv_accuracy", "samples", "path")}
                          for k, m in results.items()}, indent=2))
        return 0
    pos = int(data.y.sum())
    what = "labelled windows" if args.windows else "trajectories"
    print(f"{len(data)} {what} ({pos} replace / {len(data) - pos} keep) "
          f"from {len(data.sources)} file(s); models in {out}/")
    print("TabNet: skipped (pytorch-tabnet is not in the stack)")
    print(f"{'model':<14} {'cv accuracy':>12} {'folds':>6} {'majority':>9} {'train acc':>10}")
    for kind, m in results.items():
        cv = "n/a" if m["cv_accuracy"] is None else f"{m['cv_accuracy']:.3f}"
        print(f"{kind:<14} {cv:>12} {m['cv_folds']:>6} {m['majority_baseline']:>9.3f} "
              f"{m['train_accuracy']:>10.3f}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rudder.agent.classifiers import SavedClassifier, evaluate
    from rudder.agent.trajectories import load_trajectories

    model = SavedClassifier.load(args.model, args.models_dir)
    data = load_trajectories(args.runs, rule=_rule(args))
    print(json.dumps(evaluate(model, data), indent=2))
    return 0


def _list(args: argparse.Namespace) -> int:
    from rudder.agent.classifiers import models_dir

    d = models_dir(args.models_dir)
    metas = sorted(d.glob("*.json")) if d.is_dir() else []
    if not metas:
        print(f"no classifiers in {d}/; train with: rudder classifiers train --runs DIR... "
              f"--out {d}/")
        return 0
    for f in metas:
        m = json.loads(f.read_text())
        cv = m.get("cv_accuracy")
        print(f"{f.stem:<14} cv={'n/a' if cv is None else f'{cv:.3f}'} samples={m.get('samples')} "
              f"datasets={','.join(m.get('datasets', []))} trained={m.get('trained_at')}")
    return 0
