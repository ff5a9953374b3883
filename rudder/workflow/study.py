"""A scaling study: which runs to make. YAML validated by pydantic; unknown keys fail naming
the key before anything starts.

    name: local-default                # runs go to <runs_dir>/<name>/<run id>/
    datasets: [synth-tiny]             # -> dataset.name
    machines: [1, 2, 4]                # -> cluster.machines (= partitions)
    trainers: [1]                      # -> cluster.trainers_per_machine
    policies: [none, static, fixed]    # -> prefetch.policy
    repeats: 1                         # repeat r runs with train.seed + r
    run:                               # RunConfig overrides applied to every run
      train: {epochs: 1}
    sweep:                             # extra axes: dotted RunConfig key -> values
      prefetch.prefetch_fraction: [0.25, 0.5]
    exclude:                           # drop points matching every key of an entry
      - {dataset: synth-small, machines: 4}

A run's config is, in order: RunConfig defaults <- the execution file's run defaults <- `run`
<- the point on the axes. Its id is `<dataset>-m<M>-t<T>-<policy>[-<sweep>]-r<R>-<hash>`, the
hash being `rudder.runner.config_hash` of the resolved config: change anything that defines a
run and it gets a new directory; rerun the study and completed runs are found and skipped.
"""
from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rudder.config import ConfigError, RunConfig, format_validation_error, load_yaml, parse_config

# Study axis -> the RunConfig key it sets. `run:` may not set these (the axis would win silently).
AXES = {
    "dataset": "dataset.name",
    "machines": "cluster.machines",
    "trainers": "cluster.trainers_per_machine",
    "policy": "prefetch.policy",
}
LIST_KEY = {"dataset": "datasets", "machines": "machines", "trainers": "trainers",
            "policy": "policies"}  # the study list of each axis
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class StudyConfig(BaseModel):
    """The grid of a study. Every list is an axis; runs are their Cartesian product."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_RE, description="study name: runs go to <runs_dir>/<name>/")
    description: str = ""
    datasets: list[str] = Field(min_length=1, description="dataset names (rudder data list)")
    machines: list[int] = Field(min_length=1, description="machines (= graph partitions) per run")
    trainers: list[int] = Field([1], min_length=1, description="trainers per machine")
    policies: list[str] = Field(min_length=1, description="prefetch policies (rudder.prefetch)")
    repeats: int = Field(1, ge=1, description="runs per grid point; repeat r uses train.seed + r")
    run: dict[str, Any] = Field(default_factory=dict, description="RunConfig overrides for all runs")
    sweep: dict[str, list[Any]] = Field(default_factory=dict,
                                        description="extra axes: dotted RunConfig key -> values")
    exclude: list[dict[str, Any]] = Field(default_factory=list,
                                          description="grid points to drop (axis or dotted key -> value)")

    @field_validator("machines", "trainers")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if x < 1]
        if bad:
            raise ValueError(f"must be >= 1, got {bad}")
        return v

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, v: list[str]) -> list[str]:
        from rudder.prefetch.policies import check_policy_name

        for name in v:
            check_policy_name(name)
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if key in AXES.values():
                axis = next(a for a, k in AXES.items() if k == key)
                raise ValueError(f"{key} is an axis of its own: use the study's `{LIST_KEY[axis]}`")
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return v


@dataclass
class PlannedRun:
    """One run of the study, fully resolved."""

    study: str
    run_id: str
    config: RunConfig
    config_hash: str
    point: dict[str, Any]  # dataset, machines, trainers, policy, repeat, plus sweep keys

    @property
    def dataset(self) -> str:
        return self.config.dataset.name

    @property
    def part_key(self) -> tuple:
        """Runs sharing this key share one partitioning (partitioned once per study)."""
        d = self.config.dataset
        return (d.name, d.root, self.config.cluster.machines, d.partition_method,
                d.balance_train, d.balance_edges, d.feature_dtype)

    @property
    def stage_key(self) -> tuple:
        return (self.config.dataset.name, self.config.dataset.root)

    def run_dir(self, runs_dir: str | Path) -> Path:
        return Path(runs_dir) / self.study / self.run_id

    def label(self) -> str:
        p = self.point
        extra = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in p.items() if "." in k)
        return (f"{p['dataset']} m={p['machines']} t={p['trainers']} {p['policy']}"
                f"{' ' + extra if extra else ''} r{p['repeat']}")


@dataclass
class Study:
    config: StudyConfig
    runs: list[PlannedRun] = field(default_factory=list)
    source: str = "<dict>"

    @property
    def name(self) -> str:
        return self.config.name


# -- dotted keys --------------------------------------------------------------------------------

def set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
        node = nxt
    node[leaf] = value


def get_dotted(data: dict, dotted: str) -> Any:
    node: Any = data
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            raise KeyError(dotted)
        node = node[p]
    return node


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _flat_keys(data: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out += _flat_keys(v, key + ".") if isinstance(v, dict) else [key]
    return out


# -- validation ---------------------------------------------------------------------------------

def _validate_run(data: dict, where: str, source: str) -> RunConfig:
    """RunConfig from a dict; errors name the key under `where` (e.g. "run.train.epochs")."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        lines = [f"invalid study {source}:"]
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "<root>"
            lines.append(f"  {where}{key}: {e['msg']}")
        raise ConfigError("\n".join(lines)) from None


def _check_exclude(cfg: StudyConfig, source: str) -> None:
    allowed = set(AXES) | {"repeat"} | set(cfg.sweep)
    for i, entry in enumerate(cfg.exclude):
        for key in entry:
            if key not in allowed:
                raise ConfigError(f"invalid study {source}:\n  exclude.{i}.{key}: unknown key; "
                                  f"allowed: {', '.join(sorted(allowed))}")


def _axis_values(cfg: StudyConfig, key: str) -> list:
    """The values a grid axis (or sweep key, or `repeat`) takes."""
    if key in LIST_KEY:
        return getattr(cfg, LIST_KEY[key])
    return list(range(cfg.repeats)) if key == "repeat" else cfg.sweep[key]


def run_id_for(point: dict[str, Any], chash: str) -> str:
    parts = [point["dataset"], f"m{point['machines']}", f"t{point['trainers']}", point["policy"]]
    for k, v in point.items():
        if "." in k:
            parts.append(f"{k.rsplit('.', 1)[-1]}{v}")
    parts += [f"r{point['repeat']}", chash[:10]]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(str(p) for p in parts))


def config_hash(cfg: RunConfig) -> str:
    """The runner's hash when it exists (one definition of "the same run")."""
    try:
        from rudder.runner import config_hash as runner_hash
    except ImportError:  # pragma: no cover - the runner is part of the package
        import hashlib

        data = cfg.model_dump(mode="json")
        data.pop("runs_dir", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return runner_hash(cfg)


def expand(cfg: StudyConfig, base: dict | None = None, source: str = "<dict>",
           runs_dir: str | None = None) -> Study:
    """The runs of a study, in a stable order (dataset, machines, trainers, policy, sweep, repeat).

    base: run defaults (RunConfig keys) from the execution file, applied under `cfg.run`.
    runs_dir: where the runs go (sets RunConfig.runs_dir to <runs_dir>/<study name>).
    """
    for key in _flat_keys(cfg.run):
        for axis, target in AXES.items():
            if key == target:
                raise ConfigError(f"invalid study {source}:\n  run.{key}: set by the study's "
                                  f"`{LIST_KEY[axis]}` list, not under run:")
    _check_exclude(cfg, source)
    common = deep_merge(base or {}, cfg.run)
    _validate_run(common, "run.", source)  # a typo in run: names its key even if no run is left

    sweep_keys = list(cfg.sweep)
    for key in sweep_keys:  # the key must exist in RunConfig
        try:
            get_dotted(RunConfig().model_dump(), key)
        except KeyError:
            raise ConfigError(f"invalid study {source}:\n  sweep.{key}: not a RunConfig key") from None

    runs: list[PlannedRun] = []
    seen: dict[str, str] = {}
    excluded: set[int] = set()  # the exclude entries that matched a point (a typo matches none)
    grid = itertools.product(cfg.datasets, cfg.machines, cfg.trainers, cfg.policies,
                             itertools.product(*(cfg.sweep[k] for k in sweep_keys)),
                             range(cfg.repeats))
    for dataset, machines, trainers, policy, sweep_values, repeat in grid:
        point: dict[str, Any] = {"dataset": dataset, "machines": machines,
                                 "trainers": trainers, "policy": policy}
        point.update(zip(sweep_keys, sweep_values))
        point["repeat"] = repeat
        hits = {i for i, entry in enumerate(cfg.exclude)
                if all(point.get(k) == v for k, v in entry.items())}
        if hits:
            excluded |= hits
            continue
        data = copy.deepcopy(common)
        for axis, target in AXES.items():
            set_dotted(data, target, point[axis])
        for key, value in zip(sweep_keys, sweep_values):
            set_dotted(data, key, value)
        seed = get_dotted(data, "train.seed") if _has(data, "train.seed") else RunConfig().train.seed
        set_dotted(data, "train.seed", seed + repeat)
        if runs_dir is not None:
            data["runs_dir"] = str(Path(runs_dir) / cfg.name)
        desc = f"point {json.dumps(point)}"
        run_cfg = _validate_run(data, f"{desc}: ", source)
        chash = config_hash(run_cfg)
        rid = run_id_for(point, chash)
        if rid in seen:  # identical configs (e.g. a sweep value equal to the default twice)
            raise ConfigError(f"invalid study {source}: points {seen[rid]} and {desc} give the "
                              "same run config")
        seen[rid] = desc
        runs.append(PlannedRun(cfg.name, rid, run_cfg, chash, point))
    for i, entry in enumerate(cfg.exclude):
        if i not in excluded:
            axes = {k: _axis_values(cfg, k) for k in entry}
            raise ConfigError(f"invalid study {source}:\n  exclude.{i}: {json.dumps(entry)} matches "
                              "no run of the grid; its axes have " + ", ".join(
                                  f"{k}: {json.dumps(v)}" for k, v in axes.items()))
    if not runs:
        raise ConfigError(f"invalid study {source}: exclude removes every run")
    return Study(cfg, runs, source)


def _has(data: dict, dotted: str) -> bool:
    try:
        get_dotted(data, dotted)
        return True
    except KeyError:
        return False


def parse_study(data: dict, source: str = "<dict>") -> StudyConfig:
    if "study" in data and isinstance(data["study"], dict) and "name" not in data:
        data = data["study"]  # a file may wrap the study in a `study:` section
    try:
        return StudyConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source).replace(
            "invalid config", "invalid study", 1)) from None


def load_study(path: str | Path, base: dict | None = None, runs_dir: str | None = None) -> Study:
    """Reads, validates and expands a study file; raises ConfigError naming the bad key."""
    data = load_yaml(path)
    cfg = parse_study(data, str(path))
    return expand(cfg, base, str(path), runs_dir)


__all__ = ["StudyConfig", "PlannedRun", "Study", "load_study", "parse_study", "expand",
           "deep_merge", "set_dotted", "get_dotted", "config_hash", "parse_config"]
