"""Run configuration: YAML validated by pydantic. Unknown keys are rejected so a typo fails
before anything starts, naming the key; every default carries the reason it was chosen."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# Run ids and dataset names become folder names under runs/ and data/: one plain name each.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_name(value: str, what: str = "name") -> str:
    """`value` if it is a plain name (letters, digits, . _ + -, not starting with a dot or a
    separator); else ValueError naming it."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or len(value) > 200:
        raise ValueError(f"invalid {what} {value!r}: a plain name is needed (letters, digits and "
                         "'._+-', starting with a letter or digit; no '/', no leading dot)")
    return value


class DatasetConfig(Strict):
    name: str = "synth-small"  # a generated preset (see `rudder data list`) or an imported name
    root: str = "data"  # datasets live in <root>/<name>/, partitions in <root>/<name>/parts/
    partition_method: Literal["metis", "random"] = "metis"  # metis: few remote nodes, as DistDGL
    balance_train: bool = True  # equal training seeds per partition keeps DDP ranks in step
    balance_edges: bool = True
    # dtype the partitions store and the servers serve features in (the buffer holds the same;
    # the model gets float32): float16/bfloat16 halve the bytes of every pulled row
    feature_dtype: Literal["float32", "float16", "bfloat16"] = "float32"

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_name(v, "dataset name")


def refuse_check_of_free(features_free: bool, check: bool) -> None:
    """train.features_free with check_features (or `rudder run --check`, which sets it): one rule,
    one message, for the config and the runner."""
    if features_free and check:
        raise ValueError("train.features_free replaces remote rows with local ones: check_features "
                         "(--check) compares every row with a direct pull and would flag every one; "
                         "use one or the other")


class TrainConfig(Strict):
    # Neighbours sampled per node, one entry per layer in DGL's order: the LAST entry is hop 1
    # (neighbours of each seed), the first is the farthest hop. [10, 25] = 25 per seed, then 10
    # per hop-1 node (the reference and DGL example defaults). "15,10" is accepted as [15, 10].
    fanouts: list[int] = [10, 25]
    batch_size: int = Field(1000, gt=0)  # reference default (2000 in their Slurm runs)
    hidden: int = Field(16, gt=0)  # reference default: the model is small, communication dominates
    epochs: int = Field(3, gt=0)
    lr: float = Field(0.003, gt=0)  # reference default
    seed: int = 0
    eval_every: int = Field(1, ge=0)  # epochs between validation passes; 0 = only at the end
    check_features: bool = False  # --check: compare every assembled row with a direct pull
    max_steps_per_epoch: int | None = Field(None, gt=0)  # cap for quick runs and tests
    # auto: cuda:0 when torch sees a GPU, else the CPU; cuda: fail (naming why) without one
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # the seeds' order per epoch (rudder/seed_order.py): shuffle (DGL's), proximity (BFS over the
    # partition) or cluster (BFS regions of cluster_size seeds, both orders reshuffled per epoch)
    order: Literal["shuffle", "proximity", "cluster"] = "shuffle"
    cluster_size: int = Field(4000, gt=0)  # seeds per cluster for order=cluster
    # DistDGL sampler processes per trainer (DGL_NUM_SAMPLER): they sample the next minibatches
    # while the trainer's loader pulls features; 0 = sampling in the loader thread, before the pull
    samplers: int = Field(0, ge=0)
    # Feature pulls on the wire at once: 2 sends the next minibatch's pull before this one's rows
    # are received, so the link does not idle while the loader plans and assembles
    # (rudder.prefetch.pulls; BENCHMARKS §13). >1 needs samplers >= 1: sampling in the loader
    # thread is DGL RPC, which would take a pending pull's response.
    pulls_in_flight: int = Field(1, ge=1, le=8)
    # The features-free bound, measured: no remote row is pulled or buffered (each is a copy of a
    # local row), while sampling (the policy's sample-ahead schedule, the samplers), compute and the
    # host's contention stay the run's own. Its epoch time is what the run would take if remote
    # features were free; accuracy means nothing. Stored as policy `free` (stored_policy below).
    features_free: bool = False

    @model_validator(mode="after")
    def _free_is_unchecked(self):
        refuse_check_of_free(self.features_free, self.check_features)
        return self

    @model_validator(mode="after")
    def _pulls_beside_sampling(self):
        if self.pulls_in_flight > 1 and self.samplers < 1:
            raise ValueError(f"train.pulls_in_flight {self.pulls_in_flight} needs train.samplers >= 1 "
                             "(sampling in the loader thread is DGL RPC: it would take a pending "
                             "pull's response); set train.samplers: 1 or pulls_in_flight: 1")
        return self

    @field_validator("fanouts", mode="before")
    @classmethod
    def _fanouts_text(cls, v):
        """`15,10` (a --set value or a YAML scalar) -> [15, 10]; each must be >= 1 or -1 (all)."""
        if isinstance(v, (int, str)):
            try:
                v = [int(x) for x in str(v).replace(" ", "").split(",") if x]
            except ValueError:
                raise ValueError(f"fanouts: expected integers like 15,10, got {v!r}") from None
        if isinstance(v, list) and (not v or any(isinstance(x, int) and (x == 0 or x < -1)
                                                 for x in v)):
            raise ValueError(f"fanouts: need one entry >= 1 (or -1 = all) per layer, got {v!r}")
        return v


# Policy names, known here without importing the registry (rudder.prefetch.policies has one
# entry per name; a test checks the two agree).
POLICY_NAMES = ("none", "static", "fixed", "lookahead", "agent", "classifier", "collect", "rule")
# the policies whose name takes an argument after ':' (make_policy hands it to them)
ARG_POLICIES = {"classifier": "classifier:<name>", "collect": "collect:<every N windows>"}
# Policies whose runs sample minibatches ahead (prefetch.lookahead deep) for the lookahead round.
LOOKAHEAD_POLICIES = ("lookahead", "agent", "classifier", "collect", "rule")


def stored_policy(config: dict) -> str | None:
    """The policy a run is stored and summarised under: `free` for a train.features_free run (it
    measures the bound of its policy's sampling; it is neither that policy nor `none`), else
    prefetch.policy. `config`: a RunConfig as a dict (run.json's)."""
    if ((config.get("train") or {}).get("features_free")):
        return "free"
    return (config.get("prefetch") or {}).get("policy")


def check_policy_name(name: str) -> None:
    base = name.split(":", 1)[0]
    if base not in POLICY_NAMES:
        raise ValueError(
            f"unknown policy {name!r}; valid: {', '.join(sorted(POLICY_NAMES))} "
            "(classifier takes a model name: classifier:<name>)"
        )
    if base == "classifier" and ":" not in name:
        raise ValueError("policy 'classifier' needs a model name: classifier:<name>")
    if ":" in name and base not in ARG_POLICIES:  # make_policy would drop the argument unread
        raise ValueError(f"policy {name!r}: only {' and '.join(ARG_POLICIES.values())} take a ':' "
                         f"argument; {base}'s knobs are prefetch settings (e.g. prefetch.period for fixed)")


# sample_ahead with prefetch.schedule_ahead: more than any epoch's minibatches. The loader and the
# replays show what is sampled: the rest of the epoch, then the next epoch's so far
# (rudder.pipeline.known_ahead).
WHOLE_EPOCH = 1 << 40


def sample_ahead(pc: "PrefetchConfig") -> int:
    """Minibatches the run samples ahead of training: prefetch.lookahead (or, with
    schedule_ahead, the whole epoch) for the policies that use the known future, else 0
    (training and every replay read this one rule)."""
    if not pc.policy.startswith(LOOKAHEAD_POLICIES):
        return 0
    return WHOLE_EPOCH if pc.schedule_ahead else pc.lookahead


def schedules_ahead(pc: "PrefetchConfig") -> bool:
    """Whether the run samples each epoch's minibatches whole at its start (schedule_ahead on a
    policy that uses the known future; what RunContext.schedule_ahead tells the agent)."""
    return sample_ahead(pc) == WHOLE_EPOCH


class PrefetchConfig(Strict):
    policy: str = "none"  # none | static | fixed | lookahead | agent | classifier:<name>
    prefetch_fraction: float = Field(0.25, ge=0, le=1)  # buffer capacity / halo nodes
    init: Literal["degree", "random", "empty"] = "degree"  # initial fill (MassiveGNN's choices)
    alpha: float = Field(0.05, gt=0, lt=1)  # score decay per minibatch (reference default)
    period: int = Field(25, gt=0)  # fixed policy replaces every `period` minibatches
    lookahead: int = Field(8, ge=0)  # minibatches sampled ahead: 8 got 0.95-0.99 of Belady's hits
    # Know each epoch's minibatches ahead and keep them (blocks included: memory
    # grows with the epoch), so the lookahead round plans over the rest of the epoch and what of the
    # next one is sampled so far (RapidGNN's
    # schedule; issue 17). Epoch e+1 is sampled while e trains (only the first epoch waits, for
    # its first 1 + `lookahead` minibatches; its rest is sampled during it; the loader holds
    # about one epoch's minibatches), with train.samplers 0 in the loader thread, with samplers
    # > 0 in the sampler processes beside the pulls; the shuffle is SeedOrder's by (seed, rank,
    # epoch). BENCHMARKS §13.
    schedule_ahead: bool = False
    budget: float = Field(0.1, gt=0, le=1)  # max share of capacity replaced per round
    # lookahead admits only the current misses (no extra rows), or `any` node of the window
    # (pulls rows ahead of use: more hits, never fewer rows)
    admit: Literal["misses", "any"] = "misses"
    # which slots a MassiveGNN round counts stale: `stale` = not hit for `period` minibatches
    # (the mechanism's own), `half` = for period/2 (rudder.prefetch.policy.EVICT_PERIODS); the
    # agent's judge-history answer may choose it per round
    evict: Literal["stale", "half"] = "stale"
    window: int = Field(10, gt=0)  # minibatches per metrics window (agent, classifier)
    # windows the past counterfactual spans (rudder.prefetch.past): a round at the start of the
    # window past_windows - 1 before the one just closed, replayed over all of them (never from
    # the run's first minibatch: nothing was missed before it, so a round there swaps nothing);
    # where a round pays back over more than a window (synth-bench: 20-40 minibatches, BENCHMARKS 7o)
    past_windows: int = Field(1, ge=1, le=16)
    # the past counterfactual's replays at a window's close on a thread of their own, not the
    # loader's: the next minibatch's pull is not held behind them (the loader keeps the index
    # copy at the window's start; BENCHMARKS 7r)
    past_thread: bool = True
    record_trace: bool = True  # remote-access trace for `rudder oracle` and `rudder sim`
    # What the buffer may hold: the 1-hop `halo`, or any `remote` id the trainer samples (2+ hops
    # too), found through a bounded RemoteIndex of universe_max_nodes ids (None: 2 x the halo).
    universe: Literal["halo", "remote"] = "halo"
    universe_max_nodes: int | None = Field(None, gt=0)
    capacity_rows: int | None = Field(None, ge=0)  # buffer rows; None: prefetch_fraction x halo


def buffer_capacity(pc: PrefetchConfig, num_halo: int) -> int:
    """Buffer rows: prefetch.capacity_rows, else prefetch_fraction of the halo (memory stays
    the same whichever universe the rows come from)."""
    return int(pc.capacity_rows) if pc.capacity_rows is not None else int(pc.prefetch_fraction * num_halo)


def universe_max_nodes(pc: PrefetchConfig, num_halo: int, capacity: int) -> int:
    """Ids the remote universe's index may hold: universe_max_nodes, else 2 x the halo; at
    least the capacity."""
    m = pc.universe_max_nodes if pc.universe_max_nodes is not None else 2 * num_halo
    return max(int(m), capacity, 1)


class RuleConfig(Strict):
    """Knobs of policy `rule` (rudder.agent.rule, whose docstring says what each does); the
    replays (`rudder sim`, bench_baselines) pass the same as the policy's extras."""
    drop: float = Field(0.02, gt=0, le=1)  # hit-rate fall (fraction) below the best: buy it back
    probe: bool = False  # history only: one first round without a fall (a cold buffer shows none)
    evict: Literal["stale", "half", "catchup"] | None = None  # None: prefetch.evict at every round
    go_on: Literal["lift", "payback"] = "lift"  # after a round: a lift of drop/2, or one that pays its rows


class ModelConfig(Strict):
    name: str = "smollm2-135m"  # a name from rudder.agent.models, or any label with `path`
    path: str | None = None  # GGUF file; None = resolve the named shipped model
    chat_format: str | None = None  # None = the template stored in the GGUF


class AgentConfig(Strict):
    model: ModelConfig = ModelConfig()
    # last-example: no model, every prompt answered with its last example's answer (a control:
    # what the small models do, BENCHMARKS 7t; rudder.agent.last_example)
    backend: Literal["inproc", "http", "script", "last-example"] = "inproc"
    url: str | None = None  # OpenAI-compatible endpoint for backend=http
    # backend=script: a directory holding decisions-r<R>.jsonl (a run's, or a replay's from
    # `rudder sim`): each window gets the answer recorded for that window, no model runs
    # (rudder.agent.script: the recorded decider's answers live, without its CPU)
    script: str | None = None
    # A later answer is dropped and the fallback applies. Reading the prompt dominates latency on
    # CPUs (~15-40 tokens/s on a busy 2-core host): 20 s made most answers fall back there.
    timeout_s: float = Field(60.0, gt=0)
    # Steers before the first answer and after a bad/late one. auto = lookahead when the run
    # samples ahead (prefetch.lookahead > 0), else static.
    fallback: Literal["auto", "static", "fixed", "lookahead"] = "auto"
    history: int = Field(4, ge=0)  # past decisions (with outcomes) shown to the model
    max_tokens: int = Field(160, gt=0)
    prompt: str = "default"  # prompt variant, scored by `rudder agent eval`
    threads: int = Field(1, gt=0)  # llama.cpp threads; a trainer owns the other cores
    # Before the first minibatch a trainer waits up to this long for its model to load and warm
    # (start-up, not training: no minibatch ever waits on the agent). 0 = start at once; windows
    # closed before the model is up then get no decision.
    ready_timeout_s: float = Field(120.0, ge=0)
    # Runs that sample ahead: one decision before the first minibatch, on the initial buffer and
    # what the first sampled-ahead minibatches lack, so the model, not the fallback, steers from
    # the start (the fallback still applies until that answer arrives).
    start_decision: bool = True

    @model_validator(mode="after")
    def _script_has_answers(self) -> "AgentConfig":
        if self.backend == "script" and not self.script:
            raise ValueError("agent.backend=script needs agent.script: a directory holding the recorded "
                             "decisions-r<R>.jsonl (a run's, or `rudder sim`'s replay of one)")
        return self


class ClusterConfig(Strict):
    machines: int = Field(2, gt=0)
    trainers_per_machine: int = Field(1, gt=0)
    bandwidth: str | None = None  # tbf rate per machine link, e.g. "1gbit"; None = unshaped
    # [[t_s, rate], ...]: every machine link changes to `rate` t_s seconds after the run's
    # machines are launched (tc; recorded in run.json's link_changes); before the first entry
    # the link runs at `bandwidth`. The replay's time model reads the same schedule.
    bandwidth_schedule: list[tuple[float, str]] | None = None
    netns: bool | None = None  # None = network namespaces when usable (root), else loopback
    start_timeout_s: float = Field(120, gt=0)
    run_timeout_s: float = Field(1800, gt=0)  # the whole run is torn down past this
    # A trainer silent (no minibatch record) this long ends the run, naming the silent and stopped
    # processes (rudder.cluster.watchdog). None = derived: max(60 s, 10 x the measured median
    # minibatch time), 180 s before the first minibatch (+ agent.ready_timeout_s for the agent);
    # a number fixes the bound between records (start-up keeps max(it, 180 s)); 0 = off (then only
    # run_timeout_s ends a hung run).
    progress_timeout_s: float | None = Field(None, ge=0)


    @field_validator("bandwidth")
    @classmethod
    def _rate(cls, v):
        from rudder.bandwidth import parse_rate  # the tc syntax, in one place

        if v is not None:
            parse_rate(v)
        return v

    @field_validator("bandwidth_schedule", mode="before")
    @classmethod
    def _schedule(cls, v):
        from rudder.bandwidth import check_schedule

        return None if v is None else [list(e) for e in check_schedule(v)]


class RunConfig(Strict):
    dataset: DatasetConfig = DatasetConfig()
    train: TrainConfig = TrainConfig()
    prefetch: PrefetchConfig = PrefetchConfig()
    agent: AgentConfig = AgentConfig()
    rule: RuleConfig = RuleConfig()
    cluster: ClusterConfig = ClusterConfig()
    runs_dir: str = "runs"

    @field_validator("prefetch")
    @classmethod
    def _known_policy(cls, v: PrefetchConfig) -> PrefetchConfig:
        check_policy_name(v.policy)
        return v

    @model_validator(mode="after")
    def _prompt_fits_the_rounds(self) -> "RunConfig":
        """The judge prompts that show the past counterfactual describe one kind of round:
        judge-history* a MassiveGNN round (no lookahead), judge-past lookahead rounds."""
        if self.prefetch.policy != "agent":
            return self
        ahead, prompt = sample_ahead(self.prefetch) > 0, self.agent.prompt
        if prompt == "judge-past" and not ahead:
            raise ValueError("agent.prompt judge-past shows lookahead rounds: it needs prefetch.lookahead > 0 "
                             "(for a run without lookahead: judge-history-2b)")
        if prompt.startswith("judge-history") and ahead:
            raise ValueError(f"agent.prompt {prompt} is for runs without lookahead (prefetch.lookahead: 0, "
                             f"got {self.prefetch.lookahead}); with lookahead: judge or judge-past")
        return self


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def _section(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The config class that holds the key at `loc` (None when loc leaves the models)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        section = _section(model, tuple(e["loc"])) if model is not None else None
        if e["type"] == "extra_forbidden" and section is not None:
            msg += f"; valid keys here: {', '.join(section.model_fields)}"
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg += " (a section: set its keys, e.g. " + key + ".<key>=...)"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"{path} is not a file (a YAML config is expected)")
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a text file (not UTF-8 at byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML in {path}{_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, on one line (PyYAML's own text spans lines and names '<unicode string>')."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f": {exc}"
    context = getattr(exc, "context", None)
    return (f", line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
            + (f" ({context})" if context else ""))


def parse_config(model: type[BaseModel], data: dict, source: str = "<dict>"):
    try:
        return model.model_validate(data)
    except ValidationError as err:
        msg = format_validation_error(err, source, model)
        head, *rest = msg.splitlines()
        raise ConfigError(f"{head} {rest[0].strip()}" if len(rest) == 1 else msg) from None


def load_run_config(path: str | Path, overrides: dict | None = None) -> RunConfig:
    data = load_yaml(path)
    data.pop("execution", None)  # the workflow's section; not part of one run
    data.pop("study", None)
    apply_overrides(data, overrides or {})
    sets = " ".join(f"{k}={v}" for k, v in (overrides or {}).items())
    return parse_config(RunConfig, data, f"{path} with --set {sets}" if sets else str(path))


def apply_overrides(data: dict, overrides: dict) -> dict:
    """Sets each dotted key (`train.fanouts`) in the nested dict `data`; a key that would pass
    through a value that is not a section fails naming both."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        if not leaf or not all(parents):
            raise ConfigError(f"--set {dotted}: empty key part")
        for i, p in enumerate(parents):
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(f"--set {dotted}: {where} is a value "
                                  f"({type(node).__name__}), not a section with keys")
        node[leaf] = value
    return data
