"""execute_run: one training run end to end, usable without Parsl.

stage dataset -> partition (reused when valid) -> runs/<id>/run.json (status running) ->
LocalCluster (servers + per-node agent service + trainers) -> run.json status complete|failed.
A run that fails leaves its records and the reason; it never raises past this function for a
failure inside the cluster (the caller decides on retries).
"""
from __future__ import annotations

import hashlib
import json
import os
import logging
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rudder.config import RunConfig
from rudder.records import host_info, read_jsonl, update_run_json, versions

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
                     balance_train=d.balance_train, balance_edges=d.balance_edges, root=d.root)


def execute_run(cfg: RunConfig, run_id: str | None = None, study: str | None = None,
                check: bool = False) -> RunResult:
    from rudder.cluster import ClusterSpec
    from rudder.cluster.slurm import make_cluster  # LocalCluster, or Slurm when RUDDER_LAUNCHER=slurm

    import rudder

    run_id = run_id or new_run_id(cfg)
    run_dir = Path(cfg.runs_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    update_run_json(run_dir, run_id=run_id, study=study, status="preparing", reason=None,
                    config=cfg.model_dump(mode="json"), config_hash=config_hash(cfg),
                    seeds={"train": cfg.train.seed}, started_at=started, simulated=False,
                    host=host_info(), versions={"rudder": rudder.__version__, **versions()})
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
    node_service = node_agent_service(cfg)
    service = None if node_service else agent_service_argv(cfg)
    if node_service:
        update_run_json(run_dir, agent_node_service={k: node_service.get(k) for k in
                                                     ("pid", "port", "reused", "started_at")})
    spec = ClusterSpec(machines=c.machines, trainers_per_machine=c.trainers_per_machine,
                       bandwidth=c.bandwidth, netns=c.netns, start_timeout_s=c.start_timeout_s,
                       run_timeout_s=c.run_timeout_s,
                       wait_services=service is not None)  # trainers start once the agent answers
    trainer = [sys.executable, "-m", "rudder.train", "--run-dir", str(run_dir.resolve())]
    if check or cfg.train.check_features:
        trainer.append("--check")
    log.info("run %s: %s on %d machine(s) x %d trainer(s), policy %s", run_id, cfg.dataset.name,
             c.machines, c.trainers_per_machine, cfg.prefetch.policy)
    try:
        with make_cluster(spec, run_dir) as cluster:
            env = None
            if node_service:  # the host, as each emulated machine reaches it: its bridge
                cluster.start()
                net = getattr(cluster, "net", None)
                host = net.bridge_address if net is not None else "127.0.0.1"
                env = {"RUDDER_AGENT_URL": f"http://{host}:{node_service['port']}"}
            res = cluster.run(Path(info.part_config).resolve(), trainer, service_argv=service,
                              env=env)
        ok, reason = res.ok, res.reason
    except Exception as exc:  # cluster setup failure: recorded, never a hang
        ok, reason = False, f"cluster: {exc}"
    except BaseException:  # SIGTERM (SystemExit) / Ctrl-C: the cluster tore down; say so
        update_run_json(run_dir, status="failed", reason="interrupted", ended_at=time.time())
        raise
    if ok:
        ok, reason = _check_outputs(run_dir, c.machines * c.trainers_per_machine)
    contexts = {p.stem.split("-r")[-1]: json.loads(p.read_text()) for p in run_dir.glob("context-r*.json")}
    ended = time.time()
    update_run_json(run_dir, status="complete" if ok else "failed", reason=reason or None,
                    ended_at=ended, wall_s=ended - started, contexts=contexts)
    (log.info if ok else log.error)("run %s %s%s", run_id, "complete" if ok else "failed",
                                    f": {reason}" if reason else "")
    return RunResult(run_id, run_dir, ok, reason or "")


def node_agent_service(cfg: RunConfig) -> dict | None:
    """The study's per-node agent service (started here by the first agent run on this node),
    when the run uses the agent over HTTP inside a study that set RUDDER_AGENT_NODE_DIR and its
    machines are emulated on this host; else None (single runs keep their own service)."""
    from rudder.agent.service import NODE_DIR_ENV, ensure_node_service

    node_dir = os.environ.get(NODE_DIR_ENV)
    if (not node_dir or cfg.prefetch.policy != "agent" or cfg.agent.backend != "http"
            or cfg.agent.url or os.environ.get("RUDDER_LAUNCHER", "local") != "local"):
        return None
    c, a = cfg.cluster, cfg.agent
    return ensure_node_service(node_dir, a.model.name, a.model.path, a.threads, a.prompt,
                               trainers=c.machines * c.trainers_per_machine)


def agent_service_argv(cfg: RunConfig) -> list[str] | None:
    """One agent service per machine when the agent runs over HTTP (one model per node)."""
    if cfg.prefetch.policy != "agent" or cfg.agent.backend != "http" or cfg.agent.url:
        return None
    return [sys.executable, "-m", "rudder.agent.service", "--model", cfg.agent.model.name,
            *(["--path", cfg.agent.model.path] if cfg.agent.model.path else []),
            "--threads", str(cfg.agent.threads)]


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
