"""Where a study runs: the `execution:` section of an execution file, validated by pydantic and
turned into a `parsl.config.Config`. Our names are translated to Parsl's at this edge only
(`max_workers` -> `max_workers_per_node` or `max_workers_per_block`, `constraint` -> `#SBATCH
--constraint`, ...), so the YAML reads the same for every executor.

An execution file holds run defaults (RunConfig keys: the same file works with `rudder run
--config`, which ignores `execution:`) and one `execution:` section:

    execution:
      retries: 1                    # Parsl retries of a failed app (a failed run is rerun)
      executors:
        local:                      # label -> executor
          type: HighThroughputExecutor
          address: 127.0.0.1
          max_workers: 1
          provider: {type: LocalProvider, init_blocks: 1, max_blocks: 1}
      apps: {stage: local, partition: local, train: local}   # app -> executor label
      launch: {type: local}         # how a run starts its machines (local | slurm)

Errors name the key: `execution.executors.local.HighThroughputExecutor.max_worker: Extra
inputs not permitted`.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Union
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rudder.child_env import with_this_rudder
from rudder.config import ConfigError, format_validation_error, load_yaml

HEAVY_APPS = ("stage", "partition", "train")  # run where the data and the machines are
LIGHT_APPS = ("collect", "report")  # the single DuckDB writer
COLLECTOR = "collector"  # built-in: one thread in the study process (single writer)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- addresses and launchers ----------------------------------------------------------------------

class AddressByInterface(Strict):
    type: Literal["address_by_interface"]
    ifname: str = Field(description="interface whose IPv4 address workers connect to (hsn0)")


class AddressByHostname(Strict):
    type: Literal["address_by_hostname"]


Address = Union[str, Annotated[Union[AddressByInterface, AddressByHostname],
                               Field(discriminator="type")]]


class SrunLauncherModel(Strict):
    type: Literal["SrunLauncher"]
    overrides: str = ""  # extra srun options, e.g. "-c 128"


class SingleNodeLauncherModel(Strict):
    type: Literal["SingleNodeLauncher"]


class SimpleLauncherModel(Strict):
    type: Literal["SimpleLauncher"]  # runs the worker pool once per block (MPIExecutor)


Launcher = Annotated[Union[SrunLauncherModel, SingleNodeLauncherModel, SimpleLauncherModel],
                     Field(discriminator="type")]


# -- providers ------------------------------------------------------------------------------------

class LocalProviderModel(Strict):
    type: Literal["LocalProvider"]
    init_blocks: int = Field(1, ge=0)
    min_blocks: int = Field(0, ge=0)
    max_blocks: int = Field(1, ge=1)
    worker_init: str = ""  # shell lines run before the workers start


class SlurmProviderModel(Strict):
    type: Literal["SlurmProvider"]
    account: str | None = None  # Perlmutter: your project (GPU allocations end in _g)
    qos: str | None = None  # debug (<= 30 min) | regular | premium
    partition: str | None = None  # not used on Perlmutter (qos + constraint select nodes)
    constraint: str | None = None  # cpu | gpu
    nodes_per_block: int = Field(1, ge=1)
    cores_per_node: int | None = None
    mem_per_node: int | None = None  # GB; must fit the node's RealMemory
    gpus_per_node: int | None = None
    exclusive: bool = True  # whole nodes: a run owns its machines
    walltime: str = Field("00:30:00", pattern=r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$")
    init_blocks: int = Field(0, ge=0)
    min_blocks: int = Field(0, ge=0)
    max_blocks: int = Field(1, ge=1)
    scheduler_options: str = ""  # extra "#SBATCH ..." lines
    worker_init: str = ""  # e.g. "module load python; source /path/to/venv/bin/activate"
    cmd_timeout: int = Field(30, gt=0)  # seconds for sbatch/squeue calls
    launcher: Launcher = SingleNodeLauncherModel(type="SingleNodeLauncher")


Provider = Annotated[Union[LocalProviderModel, SlurmProviderModel], Field(discriminator="type")]


# -- executors ------------------------------------------------------------------------------------

class HtexModel(Strict):
    type: Literal["HighThroughputExecutor"]
    address: Address = "127.0.0.1"
    max_workers: int = Field(1, ge=1, description="tasks at once per node; a run uses all cores")
    cores_per_worker: float = Field(1.0, gt=0)
    heartbeat_period: int = Field(30, gt=0)
    heartbeat_threshold: int = Field(120, gt=0)
    worker_debug: bool = False
    drain_period: int | None = Field(None, gt=0, description="s after a block starts when its "
                                     "workers take no more tasks (None on Slurm: walltime minus "
                                     "the longest run, set by fit_study)")
    provider: Provider


class MpiModel(Strict):
    """Parsl's MPIExecutor: one worker pool per block; each task gets `num_nodes` of the block's
    nodes (PARSL_MPI_NODELIST) — a run with M machines gets M whole nodes."""

    type: Literal["MPIExecutor"]
    address: Address = "127.0.0.1"
    max_workers: int = Field(1, ge=1, description="runs at once per block")
    mpi_launcher: Literal["srun", "mpiexec", "aprun"] = "srun"
    heartbeat_period: int = Field(30, gt=0)
    heartbeat_threshold: int = Field(120, gt=0)
    worker_debug: bool = False
    drain_period: int | None = Field(None, gt=0, description="as HighThroughputExecutor's")
    provider: Provider


class ThreadsModel(Strict):
    type: Literal["ThreadPoolExecutor"]
    max_threads: int = Field(1, ge=1)


class GlobusComputeModel(Strict):
    """A Globus Compute endpoint (e.g. on a Perlmutter login node, configs/perlmutter/config.yaml
    + user_config_template.yaml.j2). `mpi: true` when the endpoint runs GlobusMPIEngine: tasks
    then ask for `num_nodes` (a run: its machines). `user_configs`: the template variables sent
    with each app's tasks (app name, or "*" for any), e.g. {account, qos, walltime, nodes,
    worker_init}; the endpoint starts one engine per distinct set."""

    type: Literal["GlobusComputeExecutor"]
    endpoint_id: UUID
    mpi: bool = False
    user_configs: dict[str, dict[str, Any]] = {}


Executor = Annotated[Union[HtexModel, MpiModel, ThreadsModel, GlobusComputeModel],
                     Field(discriminator="type")]


class LaunchModel(Strict):
    """How one run starts its machines (the DGL server + agent service + trainers per machine)."""

    type: Literal["local", "slurm"] = "local"  # local: LocalCluster; slurm: srun one per node
    ifname: str | None = None  # slurm: the interface in DGL's ip_config (hsn0 on Perlmutter)
    srun_args: str = ""  # slurm: extra srun options for the supervisors, e.g. "-c 128"


class ExecutionConfig(Strict):
    retries: int = Field(0, ge=0, description="Parsl retries of a failed app")
    strategy_period: float = Field(1.0, gt=0, description="s between scaling decisions (5 adds s)")
    parsl_run_dir: str | None = None  # Parsl's own logs; None: <runs_dir>/<study>/runinfo
    executors: dict[str, Executor] = Field(min_length=1)
    apps: dict[Literal["stage", "partition", "train", "collect", "report"], str] = {}
    launch: LaunchModel = LaunchModel()
    run_timeout_margin_s: float = Field(300.0, gt=0, description="a run's subprocess is killed "
                                        "this long after cluster.run_timeout_s")

    @model_validator(mode="after")
    def _routes(self) -> "ExecutionConfig":
        labels = set(self.executors)
        if COLLECTOR in labels:
            raise ValueError(f"executor label {COLLECTOR!r} is reserved (the in-process collector)")
        for app, label in self.apps.items():
            if label not in labels and label != COLLECTOR:
                raise ValueError(f"apps.{app}: no executor labelled {label!r}; "
                                 f"defined: {', '.join(sorted(labels))}")
        return self

    def route(self, app: str) -> str:
        """The executor label an app runs on."""
        if app in self.apps:
            return self.apps[app]
        if app in LIGHT_APPS:
            return COLLECTOR
        return next(iter(self.executors))

    def is_mpi(self, label: str) -> bool:
        ex = self.executors.get(label)
        return isinstance(ex, MpiModel) or (isinstance(ex, GlobusComputeModel) and ex.mpi)

    def user_endpoint_config(self, app: str) -> dict | None:
        """The template variables an app's tasks carry to its Globus Compute endpoint."""
        ex = self.executors.get(self.route(app))
        if not isinstance(ex, GlobusComputeModel):
            return None
        return ex.user_configs.get(app) or ex.user_configs.get("*")

    def is_remote(self) -> bool:
        """True when runs execute on another filesystem (Globus Compute)."""
        return any(isinstance(self.executors.get(self.route(a)), GlobusComputeModel)
                   for a in HEAVY_APPS)


# -- variables ------------------------------------------------------------------------------------
# Site values (account, QOS, walltime, data and runs roots, model path) are `${NAME}` or
# `${NAME:-default}` in an execution file, filled when it is loaded from the environment or
# `--var NAME=VALUE`; a missing one is an error naming it and the keys that use it, before
# anything is submitted. Shell variables in worker_init are written without braces ($PATH).

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def builtin_variables(repo_root: str | Path | None = None) -> dict[str, str]:
    """Defaults every execution file may use: this checkout and this interpreter's venv (the
    workers of a shared filesystem run the same ones)."""
    root = Path(repo_root or Path(__file__).resolve().parents[2])
    return {"RUDDER_REPO": str(root), "RUDDER_VENV": sys.prefix, "RUDDER_PYTHON": sys.executable}


def expand_vars(text: str, env: dict[str, str], missing: list[str]) -> str:
    """`${NAME}` and `${NAME:-default}` (the default may hold `${...}` itself) from env; names
    that are unset (or empty) and have no default go to `missing` and stay as written."""
    out, i = [], 0
    while True:
        j = text.find("${", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        m = _NAME_RE.match(text, j + 2)
        if m is None:
            out.append("${")
            i = j + 2
            continue
        name, k, default = m.group(0), m.end(), None
        if text.startswith(":-", k):
            depth, p = 1, k + 2
            while p < len(text) and depth:
                if text.startswith("${", p):
                    depth, p = depth + 1, p + 2
                    continue
                depth -= text[p] == "}"
                p += 1
            if depth:
                raise ConfigError(f"unbalanced braces in {text!r}")
            default, end = text[k + 2:p - 1], p
        elif text.startswith("}", k):
            end = k + 1
        else:  # not ours (e.g. ${NAME[0]}): left as written
            out.append(text[j:k])
            i = k
            continue
        if env.get(name):
            out.append(env[name])
        elif default is not None:
            out.append(expand_vars(default, env, missing))
        else:
            missing.append(name)
            out.append(text[j:end])
        i = end


def expand_tree(data: Any, env: dict[str, str], path: str = "") -> tuple[Any, dict[str, list[str]]]:
    """Every string of a YAML tree expanded; returns (tree, {missing name: [dotted keys]})."""
    missing: dict[str, list[str]] = {}

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{where}.{i}") for i, v in enumerate(node)]
        if isinstance(node, str):
            names: list[str] = []
            value = expand_vars(node, env, names)
            for n in names:
                missing.setdefault(n, []).append(where)
            return value
        return node

    return walk(data, path), missing


# -- loading --------------------------------------------------------------------------------------

def split_execution_file(path: str | Path, variables: dict[str, str] | None = None,
                         provided: set[str] | frozenset = frozenset(),
                         env: dict[str, str] | None = None) -> tuple[ExecutionConfig, dict]:
    """(execution config, run defaults) from one file; run defaults are the RunConfig keys.

    `${NAME}` values come from `variables` (--var), else the environment (`env`, default
    os.environ), else builtin_variables(). A name that none of them sets raises ConfigError naming
    it and its keys, unless every key using it is in `provided` (set on the command line, e.g.
    runs_dir by --runs-dir)."""
    data = load_yaml(path)
    env = {**builtin_variables(), **(os.environ if env is None else env), **(variables or {})}
    data, missing = expand_tree(data, env)
    unmet = {n: keys for n, keys in missing.items() if not set(keys) <= set(provided)}
    if unmet:
        lines = [f"{path}: needs {len(unmet)} variable(s) not set:"]
        lines += [f"  {n}  (used by {', '.join(keys)})" for n, keys in sorted(unmet.items())]
        lines.append("set them in the environment (export NAME=VALUE) or pass --var NAME=VALUE")
        raise ConfigError("\n".join(lines))
    section = data.pop("execution", None)
    data.pop("study", None)
    if section is None:
        raise ConfigError(f"{path}: no `execution:` section (see configs/local.yaml)")
    return parse_execution(section, str(path)), data


def parse_execution(section: dict, source: str = "<dict>") -> ExecutionConfig:
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: execution must be a mapping")
    try:
        return ExecutionConfig.model_validate(section)
    except ValidationError as err:
        msg = format_validation_error(err, source)
        lines = msg.splitlines()
        return_msg = "\n".join([lines[0]] + [f"  execution.{ln.strip()}" for ln in lines[1:]])
        raise ConfigError(return_msg) from None


# -- building Parsl objects -----------------------------------------------------------------------

def prepare_environment(repo_root: str | Path | None = None) -> None:
    """What Parsl's helper processes need from this process's environment (they inherit it;
    Slurm jobs too, sbatch exports it): the venv's bin first on PATH (interchange.py,
    process_worker_pool.py) and the repo root on PYTHONPATH (workers import `apps`)."""
    os.environ.update(with_this_rudder(os.environ, repo_root))


def _address(addr: Any) -> str:
    from parsl.addresses import address_by_hostname, address_by_interface

    if isinstance(addr, str):
        return addr
    if isinstance(addr, AddressByInterface):
        return address_by_interface(addr.ifname)
    return address_by_hostname()


def _launcher(m: Any):
    from parsl.launchers import SimpleLauncher, SingleNodeLauncher, SrunLauncher

    if isinstance(m, SrunLauncherModel):
        return SrunLauncher(overrides=m.overrides)
    if isinstance(m, SimpleLauncherModel):
        return SimpleLauncher()
    return SingleNodeLauncher()


def _provider(m: Any):
    if isinstance(m, LocalProviderModel):
        from parsl.providers import LocalProvider

        return LocalProvider(init_blocks=m.init_blocks, min_blocks=m.min_blocks,
                             max_blocks=m.max_blocks, worker_init=m.worker_init)
    from parsl.providers import SlurmProvider

    return SlurmProvider(
        account=m.account, qos=m.qos, partition=m.partition, constraint=m.constraint,
        nodes_per_block=m.nodes_per_block, cores_per_node=m.cores_per_node,
        mem_per_node=m.mem_per_node, gpus_per_node=m.gpus_per_node, exclusive=m.exclusive,
        walltime=m.walltime, init_blocks=m.init_blocks, min_blocks=m.min_blocks,
        max_blocks=m.max_blocks, scheduler_options=m.scheduler_options,
        worker_init=m.worker_init, cmd_timeout=m.cmd_timeout, launcher=_launcher(m.launcher))


def _executor(label: str, m: Any, globus_executor_factory=None):
    interchange = str(Path(sys.executable).parent / "interchange.py")
    if isinstance(m, HtexModel):
        from parsl.executors import HighThroughputExecutor

        return HighThroughputExecutor(
            label=label, address=_address(m.address), max_workers_per_node=m.max_workers,
            cores_per_worker=m.cores_per_worker, heartbeat_period=m.heartbeat_period,
            heartbeat_threshold=m.heartbeat_threshold, worker_debug=m.worker_debug,
            drain_period=m.drain_period,
            interchange_launch_cmd=[interchange] if Path(interchange).exists() else None,
            provider=_provider(m.provider))
    if isinstance(m, MpiModel):
        from parsl.executors import MPIExecutor

        return MPIExecutor(
            label=label, address=_address(m.address), max_workers_per_block=m.max_workers,
            mpi_launcher=m.mpi_launcher, heartbeat_period=m.heartbeat_period,
            heartbeat_threshold=m.heartbeat_threshold, worker_debug=m.worker_debug,
            drain_period=m.drain_period,
            interchange_launch_cmd=interchange if Path(interchange).exists() else None,
            provider=_provider(m.provider))
    if isinstance(m, ThreadsModel):
        from parsl.executors.threads import ThreadPoolExecutor

        return ThreadPoolExecutor(label=label, max_threads=m.max_threads)
    from parsl.executors import GlobusComputeExecutor

    factory = globus_executor_factory
    if factory is None:
        from rudder.workflow.globus import sdk_executor as factory
    return GlobusComputeExecutor(executor=factory(str(m.endpoint_id)), label=label)


def build_parsl_config(ex: ExecutionConfig, run_dir: str | Path | None = None,
                       globus_executor_factory=None):
    """The Parsl Config for this execution: the configured executors plus the in-process
    single-threaded collector (the only DuckDB writer) when an app routes to it."""
    from parsl.config import Config
    from parsl.executors.threads import ThreadPoolExecutor

    executors = [_executor(label, m, globus_executor_factory) for label, m in ex.executors.items()]
    routes = {ex.route(a) for a in HEAVY_APPS + LIGHT_APPS}
    if COLLECTOR in routes:
        executors.append(ThreadPoolExecutor(label=COLLECTOR, max_threads=1))
    return Config(executors=executors, retries=ex.retries, strategy_period=ex.strategy_period,
                  run_dir=str(run_dir or ex.parsl_run_dir or "runinfo"),
                  initialize_logging=True)


def with_endpoint(ex: ExecutionConfig, endpoint_id: str, mpi: bool | None = None) -> ExecutionConfig:
    """The same execution with every app routed to a Globus Compute endpoint (runs, data and the
    DuckDB file then live on the endpoint's filesystem; collect stays one at a time). Each app
    carries the template variables of the executor it was routed to here (its Slurm account,
    QOS, walltime, nodes, worker_init: rudder.workflow.globus.user_endpoint_config), so the
    endpoint runs the runs on GPU blocks and stage/partition on a CPU one; collect and report,
    which ran in the study process, go with the stage app's."""
    try:
        uid = UUID(str(endpoint_id))
    except ValueError:
        raise ConfigError(f"--endpoint: not a UUID: {endpoint_id!r}") from None
    if mpi is None:  # runs that take whole nodes here take them there too (GlobusMPIEngine)
        mpi = ex.is_mpi(ex.route("train"))
    from rudder.workflow.globus import user_endpoint_config

    configs: dict[str, dict] = {}
    for app in HEAVY_APPS:
        uec = user_endpoint_config(ex.executors.get(ex.route(app)))
        if uec:
            configs[app] = uec
    for app in LIGHT_APPS:  # the study process's collector is not on the endpoint
        uec = user_endpoint_config(ex.executors.get(ex.route(app))) or configs.get("stage")
        if uec:
            configs[app] = uec
    gce = GlobusComputeModel(type="GlobusComputeExecutor", endpoint_id=uid, mpi=mpi,
                             user_configs=configs)
    return ex.model_copy(update={
        "executors": {"globus": gce},
        "apps": {a: "globus" for a in HEAVY_APPS + LIGHT_APPS},
    })
