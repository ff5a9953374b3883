"""execute_run: one training run end to end, usable without Parsl.

check inputs (preflight: dataset, model and classifier files, agent URL) -> stage dataset ->
partition (reused when valid) -> runs/<id>/run.json (status running) -> LocalCluster (servers +
per-node agent service + trainers, a progress watchdog) -> run.json status complete|failed.
A run that fails leaves its records and the reason; it never raises past this function for a
failure inside the cluster (the caller decides on retries); bad input raises ConfigError before
any cluster starts.

Each attempt starts clean: what an earlier attempt left in runs/<id>/ moves to
runs/<id>/attempts/<n>/ (its records are never appended to). run.json names the process that
owns the run (pid, start time, host): a run left `running` by a killed owner is marked
`failed: interrupted` by the next command that meets it (`reconcile_run`).
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rudder.cluster.attempts import live_owner, owner_info, reconcile_run, set_aside_attempt  # noqa: F401 (re-exported)
from rudder.config import ConfigError, RunConfig, check_name, refuse_check_of_free
from rudder.records import host_info, read_jsonl, read_run, unwritable_folder, update_run_json, versions

log = logging.getLogger("rudder.run")


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    ok: bool
    reason: str


def config_hash(cfg: RunConfig) -> str:
    """Stable hash of everything that defines a run (not where its files go)."""
    data = cfg.model_dump(mode="json")
    data.pop("runs_dir", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def new_run_id(cfg: RunConfig) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.prefetch.policy.replace(':', '_')}-{uuid.uuid4().hex[:6]}"


def prepare_data(cfg: RunConfig):
    """Stages the dataset and partitions it for cfg.cluster.machines (each reused if valid)."""
    from rudder.data.partition import partition
    from rudder.data.store import stage

    d = cfg.dataset
    stage(d.name, root=d.root)
    return partition(d.name, cfg.cluster.machines, method=d.partition_method,
                     balance_train=d.balance_train, balance_edges=d.balance_edges, root=d.root,
                     feature_dtype=d.feature_dtype)


def execute_run(cfg: RunConfig, run_id: str | None = None, study: str | None = None,
                check: bool = False, launch=None) -> RunResult:
    """launch: how the machines start (rudder.cluster.launch.Launch or its dict; None: local)."""
    from rudder.cluster import ClusterSpec
    from rudder.cluster.launch import Launch, make_cluster  # LocalCluster, or SlurmCluster by `launch`
    from rudder.cluster.slurm import SlurmCluster
    from rudder.cluster.watchdog import FIRST_S, ProgressWatchdog

    import rudder

    refuse_check_of_free(cfg.train.features_free, check)  # model_copy below would not validate
    if check and not cfg.train.check_features:  # run.json then records what the run did
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"check_features": True})})
    run_id = check_name(run_id, "run id") if run_id is not None else new_run_id(cfg)
    run_dir = Path(cfg.runs_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    reconcile_run(run_dir)
    live = live_owner(run_dir)
    if live:
        raise ValueError(f"run {run_id} is in progress in {run_dir} (owner pid {live}); "
                         "choose another --run-id")
    earlier = set_aside_attempt(run_dir)
    started = time.time()
    update_run_json(run_dir, run_id=run_id, study=study, status="preparing", reason=None,
                    config=cfg.model_dump(mode="json"), config_hash=config_hash(cfg),
                    seeds={"train": cfg.train.seed}, started_at=started, simulated=False,
                    host=host_info(), versions={"rudder": rudder.__version__, **versions()},
                    owner=owner_info(), attempt=len(earlier) + 1, earlier_attempts=earlier)
    from rudder.device import preflight as device_preflight

    # train.device=cuda without a GPU here: fail before anything starts (Slurm trainers check on their node)
    why = device_preflight(cfg.train.device, launcher=Launch.of(launch).type)
    if why:
        update_run_json(run_dir, status="failed", reason=f"device: {why}", ended_at=time.time())
        log.error("run %s failed: device: %s", run_id, why)
        return RunResult(run_id, run_dir, False, f"device: {why}")
    problems = preflight(cfg)
    if problems:  # bad input: recorded, then raised before anything starts
        update_run_json(run_dir, status="failed", reason="input: " + "; ".join(problems),
                        ended_at=time.time())
        raise ConfigError("; ".join(problems))
    try:
        info = prepare_data(cfg)
    except Exception as exc:  # bad dataset etc.: recorded, then raised for a clear CLI error
        update_run_json(run_dir, status="failed", reason=f"data: {exc}", ended_at=time.time())
        raise
    meta = json.loads((Path(cfg.dataset.root) / cfg.dataset.name / "meta.json").read_text())
    update_run_json(run_dir, status="running", part_config=str(Path(info.part_config).resolve()),
                    num_classes=meta.get("classes") or meta.get("num_classes"),
                    classes_present=meta.get("classes_present"),  # distinct labels, if known
                    partition=info.manifest)

    c = cfg.cluster
    node_service = node_agent_service(cfg, launch)
    service = None if node_service else agent_service_argv(cfg)
    run_cpus = trainer_cpus(node_service)
    if node_service:
        update_run_json(run_dir, agent_node_service={k: node_service.get(k) for k in
                                                     ("pid", "port", "reused", "started_at", "cpus")},
                        run_cpus=run_cpus)
    spec = ClusterSpec(machines=c.machines, trainers_per_machine=c.trainers_per_machine,
                       bandwidth=c.bandwidth, bandwidth_schedule=c.bandwidth_schedule,
                       netns=c.netns, start_timeout_s=c.start_timeout_s,
                       run_timeout_s=c.run_timeout_s, samplers_per_trainer=cfg.train.samplers,
                       wait_services=service is not None,  # trainers start once the agent answers
                       cpus=run_cpus)
    trainer = [sys.executable, "-m", "rudder.train", "--run-dir", str(run_dir.resolve())]
    if check or cfg.train.check_features:
        trainer.append("--check")
    log.info("run %s: %s on %d machine(s) x %d trainer(s), policy %s", run_id, cfg.dataset.name,
             c.machines, c.trainers_per_machine, cfg.prefetch.policy)
    first_s = FIRST_S + (cfg.agent.ready_timeout_s if cfg.prefetch.policy == "agent" else 0.0)
    try:
        with make_cluster(spec, run_dir, launch) as cluster:
            unreachable = probe_agent_url(cfg, cluster)
            if unreachable:  # no trainer would ever get an answer: fail before the first minibatch
                raise ConfigError(unreachable)
            net = getattr(cluster, "net", None)
            links = {f"link of machine {m}": net.host_veth(m) for m in range(c.machines)} if net else None
            cluster.watchdog = ProgressWatchdog(run_dir, c.progress_timeout_s, first_s=first_s,
                                                local=not isinstance(cluster, SlurmCluster),
                                                links=links)
            env = None
            if node_service:  # the host, as each emulated machine reaches it: its bridge
                host = net.bridge_address if net is not None else "127.0.0.1"
                env = {"RUDDER_AGENT_URL": f"http://{host}:{node_service['port']}"}
                if node_service.get("turn_file"):  # its trainers ask in turn (NodeTurn)
                    env["RUDDER_AGENT_TURN"] = node_service["turn_file"]
            res = cluster.run(Path(info.part_config).resolve(), trainer, service_argv=service,
                              env=env)
        ok, reason = res.ok, res.reason
        if res.link_changes:  # when the links' rate changed (cluster.bandwidth_schedule)
            update_run_json(run_dir, link_changes=res.link_changes, startup_s=res.startup_s)
    except ConfigError as exc:
        update_run_json(run_dir, status="failed", reason=f"input: {exc}", ended_at=time.time())
        raise
    except Exception as exc:  # cluster setup failure: recorded, never a hang
        ok, reason = False, f"cluster: {exc}"
    except BaseException:  # SIGTERM (SystemExit) / Ctrl-C: the cluster tore down; say so
        update_run_json(run_dir, status="failed", reason="interrupted", ended_at=time.time())
        raise
    if ok:
        ok, reason = _check_outputs(run_dir, c.machines * c.trainers_per_machine)
    if cfg.train.check_features:
        done = [json.loads(p.read_text()) for p in sorted(run_dir.glob("done-r*.json"))]
        update_run_json(run_dir, feature_check={
            "ranks_checked": sum(1 for d in done if d.get("checked")),
            "mismatched_rows": sum(d.get("mismatched_rows") or 0 for d in done)})
    contexts = {p.stem.split("-r")[-1]: json.loads(p.read_text()) for p in run_dir.glob("context-r*.json")}
    ended = time.time()
    threads = {rank: (ctx.get("extra") or {}).get("threads") for rank, ctx in contexts.items()}
    update_run_json(run_dir, status="complete" if ok else "failed", reason=reason or None,
                    ended_at=ended, wall_s=ended - started, contexts=contexts,
                    threads_per_trainer=threads,
                    devices={r: c.get("extra", {}).get("device") for r, c in contexts.items()})
    (log.info if ok else log.error)("run %s %s%s", run_id, "complete" if ok else "failed",
                                    f": {reason}" if reason else "")
    if ok:
        judge_decisions(run_dir)
    return RunResult(run_id, run_dir, ok, reason or "")


def judge_decisions(run_dir: Path) -> dict | None:
    """A complete run's decisions (agent, classifier, rule, collector) judged against their
    counterfactual on its own traces (`rudder agent judge`, default horizon), so its records,
    the store and the report carry correct_cf, not only the noisy before/after `correct`.
    Recorded in run.json as `judge`; a failure is recorded there too and never fails the run."""
    from rudder.agent.hindsight import HORIZON, judge_run

    if not any(p.stat().st_size for p in run_dir.glob("decisions-r*.jsonl")):
        return None  # a policy that decides nothing
    try:  # e.g. prefetch.record_trace off: the judge names the missing trace
        judge_run(run_dir, horizon=HORIZON)  # records run.json's `judge`
        out = read_run(run_dir)["judge"]
        log.info("run %s: %d of %d decisions judged against their counterfactual in %.1f s",
                 run_dir.name, out["judged"], out["decisions"], out["s"])
    except Exception as exc:  # noqa: BLE001 - the run's own records stand without the judge
        log.warning("run %s: its decisions were not judged: %s", run_dir.name, exc)
        out = {"horizon": HORIZON, "error": str(exc)}
        update_run_json(run_dir, judge=out)
    return out


def trainer_cpus(node_service: dict | None) -> list[int] | None:
    """The cores left to the run's servers and trainers when the node's agent service is pinned
    to cores of its own (`spare_cpus`): the trainers keep off the model's cores as it keeps off
    theirs. None (no pinning) without a pinned service."""
    model = set((node_service or {}).get("cpus") or ())
    rest = sorted(set(os.sched_getaffinity(0)) - model)
    return rest if model and rest else None


def node_agent_service(cfg: RunConfig, launch=None) -> dict | None:
    """The study's per-node agent service (started here by the first agent run on this node),
    when the run uses the agent over HTTP inside a study whose launch names the folder of its
    node services (launch.agent_node_dir) and its machines are emulated on this host; else None
    (single runs keep their own service)."""
    from rudder.agent.service import ensure_node_service
    from rudder.cluster.launch import Launch

    launch = Launch.of(launch)
    node_dir = launch.agent_node_dir
    if (not node_dir or cfg.prefetch.policy != "agent" or cfg.agent.backend != "http"
            or cfg.agent.url or launch.type != "local"):
        return None
    c, a = cfg.cluster, cfg.agent
    return ensure_node_service(node_dir, a.model.name, a.model.path, a.threads, a.prompt,
                               trainers=c.machines * c.trainers_per_machine)


def agent_service_argv(cfg: RunConfig) -> list[str] | None:
    """One agent service per machine when the agent runs over HTTP (one model per node)."""
    if cfg.prefetch.policy != "agent" or cfg.agent.backend != "http" or cfg.agent.url:
        return None
    # bound to the node's loopback (reachable by that node's trainers only) on a free port;
    # the supervisor hands the URL from its ready file to the trainers (RUDDER_AGENT_URL)
    return [sys.executable, "-m", "rudder.agent.service", "--model", cfg.agent.model.name,
            "--host", "127.0.0.1", "--port", "0",
            *(["--path", cfg.agent.model.path] if cfg.agent.model.path else []),
            "--threads", str(cfg.agent.threads),
            "--prompt", cfg.agent.prompt]  # the prefix it warms: the one the trainers' prompts share


def _check_outputs(run_dir: Path, trainers: int) -> tuple[bool, str]:
    for r in range(trainers):
        done = run_dir / f"done-r{r}.json"
        if not done.exists():
            return False, f"trainer rank {r} left no done-r{r}.json"
        d = json.loads(done.read_text())
        if d.get("mismatched_rows"):
            return False, f"feature check failed on rank {r}: {d['mismatched_rows']} rows differ"
        if not read_jsonl(run_dir / f"epochs-r{r}.jsonl"):
            return False, f"trainer rank {r} recorded no epoch"
    return True, ""


# -- inputs checked before a cluster starts ------------------------------------------------------

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def _uses_namespaces(cfg: RunConfig) -> bool:
    """Whether the trainers will run in network namespaces (LocalCluster's choice, as root)."""
    if os.environ.get("RUDDER_LAUNCHER", "local") == "slurm":
        return False  # Slurm nodes: loopback is each node's own
    if cfg.cluster.netns is None:  # LocalCluster's choice: namespaces where usable (root, iproute2)
        from rudder.cluster import netns_available

        return netns_available()[0]
    return cfg.cluster.netns


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def agent_url(cfg: RunConfig) -> str | None:
    """The OpenAI-compatible URL the trainers will call (agent.url, or $RUDDER_AGENT_URL)."""
    if cfg.prefetch.policy != "agent" or cfg.agent.backend == "script":
        return None
    return os.environ.get("RUDDER_AGENT_URL") or (cfg.agent.url if cfg.agent.backend == "http" else None)


def _url_host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"agent url {url!r} is not an http(s)://host[:port] address")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def tcp_reachable(host: str, port: int, timeout_s: float = 3.0) -> str:
    """'' when a TCP connection to host:port opens within timeout_s, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def preflight(cfg: RunConfig, probe: bool = True) -> list[str]:
    """Everything about a run's inputs that can be known before a cluster starts; each problem
    one line naming the value and the fix. `probe`: also try the agent URL from this host."""
    problems: list[str] = []
    why = unwritable_folder(cfg.runs_dir)
    if why:
        problems.append(f"runs_dir: {cfg.runs_dir}: {why}")
    d = cfg.dataset
    try:
        from rudder.data.store import dataset_known

        dataset_known(d.name, d.root)
    except ValueError as exc:
        problems.append(f"dataset.name: {exc}")
    pol = cfg.prefetch.policy
    if pol == "agent":
        from rudder.agent.context import get_variant

        try:  # every trainer builds its prompts from it (a bad name would fail them all, later)
            get_variant(cfg.agent.prompt)
        except ValueError as exc:
            problems.append(f"agent.prompt: {exc}")
    if pol == "agent" and (cfg.agent.backend == "inproc" or agent_service_argv(cfg)):
        from rudder.agent.models import ModelError, resolve_model

        try:  # the trainers (inproc) or the node services (http) load this file
            resolve_model(cfg.agent.model)
        except ModelError as exc:
            problems.append(f"agent.model: {exc}")
    if pol == "agent" and cfg.agent.backend == "script":
        from rudder.agent.script import load_answers

        try:  # every trainer's recorded answers, read as the trainers will
            for r in range(cfg.cluster.machines * cfg.cluster.trainers_per_machine):
                load_answers(cfg.agent.script, r)
        except (FileNotFoundError, ValueError) as exc:
            problems.append(str(exc))
    if pol.startswith("classifier:"):
        from rudder.agent.classifiers import resolve_checked

        try:
            resolve_checked(pol.split(":", 1)[1], lookahead=cfg.prefetch.lookahead)
        except (ValueError, FileNotFoundError) as exc:
            problems.append(f"prefetch.policy: {exc}")
    url = agent_url(cfg)
    if url:
        try:
            host, port = _url_host_port(url)
        except ValueError as exc:
            problems.append(f"agent.url: {exc}")
        else:
            if _is_loopback(host) and _uses_namespaces(cfg):
                problems.append(
                    f"agent.url: {url} is loopback, which inside each emulated machine's network "
                    "namespace is that machine's own: the trainers can never reach it. Leave "
                    "agent.url unset (one agent service per machine), or give an address of "
                    "this host that the machines reach (the cluster bridge), or cluster.netns=false")
            elif probe:
                why = tcp_reachable(host, port)
                if why:
                    problems.append(f"agent.url: {url} unreachable from this host ({why})")
    return problems


def probe_agent_url(cfg: RunConfig, cluster) -> str:
    """'' when agent.url answers a TCP connect from each machine's network; else why not. Runs
    in each namespace (LocalCluster with namespaces) before any trainer starts."""
    url = agent_url(cfg)
    net = getattr(cluster, "net", None)
    if not url or net is None:
        return ""
    host, port = _url_host_port(url)
    code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
            "timeout=3).close()\nexcept OSError as e:\n print(type(e).__name__, e); sys.exit(1)")
    for m in range(cluster.spec.machines):
        ns = net.namespace(m)
        try:
            r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-I", "-c", code, host,
                                str(port)], capture_output=True, text=True, timeout=15)
        except subprocess.TimeoutExpired:
            return f"agent.url {url}: the reachability probe from machine {m} ({ns}) hung"
        if r.returncode != 0:
            return (f"agent.url {url} unreachable from machine {m} (namespace {ns}, address "
                    f"{cluster.addresses[m]}): {(r.stdout or r.stderr).strip()[-300:]}")
    return ""
