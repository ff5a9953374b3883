"""Real DistDGL runs on emulated machines (network namespaces): the model learns, remote rows
are counted right (checked against the partition book), every assembled feature row matches a
direct pull, and a trainer that dies ends the run cleanly."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch

from rudder.config import RunConfig
from rudder.pipeline import known_ahead
from rudder.records import read_jsonl
from rudder.runner import execute_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)"),
]


def make_cfg(tmp_path, data_root, machines, policy="none", epochs=2, samplers=0, **prefetch):
    return RunConfig.model_validate({
        "dataset": {"name": "synth-small", "root": str(data_root)},
        "train": {"epochs": epochs, "batch_size": 500, "lr": 0.01, "hidden": 32, "samplers": samplers},
        "prefetch": {"policy": policy, **prefetch},
        "cluster": {"machines": machines, "start_timeout_s": 120, "run_timeout_s": 400},
        "runs_dir": str(tmp_path / "runs"),
    })


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def owner_from_part_config(part_config: str, ids: torch.Tensor) -> torch.Tensor:
    """Independent of DGL's partition book: the node_map ranges in the partition config."""
    meta = json.loads(open(part_config).read())
    ranges = meta["node_map"]["_N"]  # [[start, end) per partition]
    ends = torch.tensor([r[1] for r in ranges])
    return torch.searchsorted(ends, ids, right=True)


def leftovers(run_dir):
    """Namespaces and links of this run's own cluster still on the host (other clusters may run
    beside the suite: only this run's tag counts)."""
    tag = json.loads((run_dir / "cluster" / "result.json").read_text())["cluster"]
    assert tag, "the run used no namespaces"
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (ns + links).splitlines() if tag in line]


def run_processes(run_dir) -> list[int]:
    """Processes still alive that this run started (the cluster's environment names its run
    directory; DistDGL's sampler processes inherit it), after a grace of a few seconds."""
    needle = f"RUDDER_RUN_DIR={os.path.realpath(run_dir)}".encode()
    for _ in range(40):
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                if needle in env:
                    pids.append(int(d))
        if not pids:
            return []
        time.sleep(0.25)
    return pids


@pytest.mark.parametrize("machines", [2, 4])
def test_cluster_learns_and_counts_remote_rows(tmp_path, data_root, machines):
    res = execute_run(make_cfg(tmp_path, data_root, machines, epochs=3), check=True)
    assert res.ok, res.reason
    run = json.loads((res.run_dir / "run.json").read_text())
    classes = run["num_classes"]
    for r in range(machines):
        epochs = read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")
        assert len(epochs) == 3
        assert epochs[-1]["val_acc"] > max(0.5, 3.0 / classes)  # chance is 1/classes
        # the trainer's own CPU in each epoch: some was spent, and its threads cannot have run
        # on more cores than the host has for longer than the epoch
        assert all(0 < e["cpu_s"] <= e["t_epoch"] * (os.cpu_count() or 1) for e in epochs)
        done = json.loads((res.run_dir / f"done-r{r}.json").read_text())
        assert done["checked"] and done["mismatched_rows"] == 0
        saved = torch.load(res.run_dir / f"inputs-r{r}.pt")
        assert saved
        for input_nodes, remote_rows in saved:
            owner = owner_from_part_config(run["part_config"], input_nodes)
            assert int((owner != done["part_id"]).sum()) == remote_rows
        mbs = read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")
        assert all(m["local_rows"] + m["remote_rows"] == m["input_rows"] for m in mbs)
        assert sum(m["remote_rows"] for m in mbs) > 0
    assert not leftovers(res.run_dir)


def test_machines_on_loopback_without_namespaces(tmp_path, data_root):
    """cluster.netns=false (what a host without iproute2 falls back to, e.g. a GPU container):
    two machines on their own 127.A.B.m addresses, each with a private /dev/shm. Each trainer and
    its sampler process must take itself for its own machine (DGL finds it by interface address,
    which none has): else partition 0's rows are read from the wrong shared memory. Every row
    matches a direct pull, and remote rows are counted against the partition config."""
    cfg = make_cfg(tmp_path, data_root, 2, "lookahead", epochs=1, samplers=1, prefetch_fraction=0.5)
    cfg.cluster.netns = False
    res = execute_run(cfg, check=True)
    assert res.ok, res.reason
    ips = [line.split()[0] for line in (res.run_dir / "ip_config.txt").read_text().splitlines()]
    assert len(set(ips)) == 2 and all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips), ips
    run = json.loads((res.run_dir / "run.json").read_text())
    for r in range(2):
        done = json.loads((res.run_dir / f"done-r{r}.json").read_text())
        assert done["part_id"] == r and done["checked"] and done["mismatched_rows"] == 0
        for input_nodes, remote_rows in torch.load(res.run_dir / f"inputs-r{r}.pt"):
            assert int((owner_from_part_config(run["part_config"], input_nodes) != r).sum()) == remote_rows
    assert not run_processes(res.run_dir)


def assert_honest_timing(run_dir, ranks: int, sampled_before: bool = False) -> None:
    """Every minibatch record has the loader's stage times, the slower rank's wait (the max
    of the ranks' own t_stall at that step) and the step's backward share; every epoch record the epoch's bounds over all
    ranks, the same on each rank and the same as rudder.bounds computes from the files.
    sampled_before (schedule_ahead, or a lookahead window, which slides on into the next epoch's
    first minibatches): some of an epoch's minibatches were sampled during the one before, but
    the bound charges their sampling to the epoch they train in, so the pipeline bound stays
    below the epoch time only over the run, not in each epoch."""
    from rudder.bounds import run_bounds

    mbs = {r: read_jsonl(run_dir / f"minibatches-r{r}.jsonl") for r in range(ranks)}
    eps = {r: read_jsonl(run_dir / f"epochs-r{r}.jsonl") for r in range(ranks)}
    stall = {}
    for recs in mbs.values():
        for m in recs:
            stall[m["global_step"]] = max(stall.get(m["global_step"], 0.0), m["t_stall"])
    for recs in mbs.values():
        for m in recs:
            stages = [m[k] for k in ("t_sample", "t_sample_wait", "t_plan", "t_fetch", "t_assemble", "t_load")]
            assert all(v is not None and v >= 0 for v in stages), m
            assert m["t_sample"] > 0 and m["t_fetch"] > 0
            assert m["t_load"] >= m["t_plan"] + m["t_fetch"] + m["t_assemble"], m
            assert m["t_stall_max"] == stall[m["global_step"]], m
            assert 0 < m["t_backward"] < m["t_compute"], m  # of the step: backward, all-reduce, opt
    b = run_bounds(mbs, eps)
    for r, recs in eps.items():
        for e, per in zip(recs, b.per_epoch):
            assert e["bound_compute_s"] == pytest.approx(per["compute_s"])
            assert e["bound_pipeline_s"] == pytest.approx(per["pipeline_s"])
            assert e["t_epoch_max"] == pytest.approx(per["epoch_s"])
            assert 0 < e["bound_compute_s"] <= e["bound_pipeline_s"]
            assert sampled_before or e["bound_pipeline_s"] <= e["t_epoch_max"]
            assert e["epoch_over_pipeline"] == pytest.approx(e["t_epoch_max"] / e["bound_pipeline_s"])
            assert e["epoch_over_compute"] >= e["epoch_over_pipeline"] >= (0 if sampled_before else 1)
            assert e["t_load"] == pytest.approx(sum(m["t_load"] for m in mbs[r] if m["epoch"] == e["epoch"]))
        assert sum(e["bound_pipeline_s"] for e in recs) <= sum(e["t_epoch_max"] for e in recs)


def test_policies_same_accuracy_and_feature_check(tmp_path, data_root):
    """Also: the records' timing is honest (assert_honest_timing), and lookahead's run samples
    in DistDGL sampler processes (train.samplers=1) beside the pull, with the same rows."""
    accs, fetched = {}, {}
    for policy in ("none", "static", "fixed", "lookahead"):
        samplers = 1 if policy == "lookahead" else 0
        res = execute_run(make_cfg(tmp_path, data_root, 2, policy, epochs=3, samplers=samplers,
                                   prefetch_fraction=0.5, period=5), check=True)
        assert res.ok, (policy, res.reason)
        assert_honest_timing(res.run_dir, 2, sampled_before=policy == "lookahead")
        ep = [read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")[-1] for r in range(2)]
        accs[policy] = ep[0]["val_acc"]
        fetched[policy] = sum(e["fetched_rows"] for e in ep)
        for r in range(2):
            assert json.loads((res.run_dir / f"done-r{r}.json").read_text())["mismatched_rows"] == 0
    assert max(accs.values()) - min(accs.values()) < 0.1, accs
    # with a buffer of half the halo, every buffered policy pulls fewer rows than none
    for policy in ("static", "fixed", "lookahead"):
        assert fetched[policy] < fetched["none"], fetched


def test_schedule_ahead_with_sampler_processes(tmp_path, data_root):
    """prefetch.schedule_ahead with a DistDGL sampler process per trainer: the next epoch is
    collected from the pool during this one (rudder/pipeline.py), with an evaluation after every
    epoch sharing that pool. Every epoch trains its own minibatches once, in order (nothing of
    one epoch left in the pool for the next), and every row matches a direct pull."""
    res = execute_run(make_cfg(tmp_path, data_root, 2, "lookahead", epochs=3, samplers=1,
                               prefetch_fraction=0.5, schedule_ahead=True, lookahead=2), check=True)
    assert res.ok, res.reason
    assert_honest_timing(res.run_dir, 2, sampled_before=True)
    for r in range(2):
        assert json.loads((res.run_dir / f"done-r{r}.json").read_text())["mismatched_rows"] == 0
        mbs = read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")
        eps = read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")
        steps = len(mbs) // 3
        assert steps > 3 and [(m["epoch"], m["step"]) for m in mbs] == [
            (e, s) for e in range(3) for s in range(steps)]
        assert all(e["val_acc"] is not None for e in eps)
        # each window says how many minibatches were sampled ahead when it closed: exactly the
        # schedule the replays use (the rest of its epoch, then the next one's so far)
        known = known_ahead([steps] * 3, 2)
        wins = read_jsonl(res.run_dir / f"windows-r{r}.jsonl")
        assert wins
        for w in wins:
            g = w["last_step"]
            n = w.get("lookahead_minibatches", 0)  # absent when nothing is left to sample ahead
            assert n == known[g] - g - 1, (g, n)
        assert any(w.get("lookahead_minibatches", 0) > steps - 1 - w["last_step"] % steps for w in wins)


def test_two_pulls_in_flight_on_a_real_cluster(tmp_path, data_root):
    """train.pulls_in_flight 2 (rudder.prefetch.pulls.DGLPulls) on 3 machines, so each pull has
    responses from two servers to match: a lookahead round admitting any node of the window at
    every chance, the check's pulls among the minibatches' own; validation after the last epoch
    only, so a pull stays in flight over the first epoch's end. Every row matches a direct pull,
    two pulls were on the wire at once, each epoch trained its own minibatches in order, and the
    timing records stay honest."""
    cfg = make_cfg(tmp_path, data_root, 3, "lookahead", epochs=2, samplers=1, prefetch_fraction=0.3,
                   admit="any", lookahead=3)
    cfg.train.pulls_in_flight = 2
    cfg.train.eval_every = 0
    res = execute_run(cfg, check=True)
    assert res.ok, res.reason
    assert_honest_timing(res.run_dir, 3, sampled_before=True)
    for r in range(3):
        done = json.loads((res.run_dir / f"done-r{r}.json").read_text())
        assert done["checked"] and done["mismatched_rows"] == 0
        assert done["most_pulls_in_flight"] == 2
        assert done["epoch_ends_in_flight"] == 1  # the first epoch's end; the last receives all
        mbs = read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")
        assert sum(m["admitted_rows"] for m in mbs) > 0  # rows written on arrival, still right
        steps = len(mbs) // 2
        assert [(m["epoch"], m["step"]) for m in mbs] == [(e, s) for e in range(2) for s in range(steps)]
    assert not run_processes(res.run_dir)


def test_features_free_run_pulls_no_remote_row(tmp_path, data_root):
    """train.features_free (the measured features-free bound) under lookahead's schedule with a
    sampler process: it trains, samples what a real run samples (remote rows counted, traced),
    pulls none of them, and is summarised and bounded as policy `free`."""
    from rudder.run_summary import summarize_run

    cfg = make_cfg(tmp_path, data_root, 2, "lookahead", epochs=2, samplers=1, schedule_ahead=True,
                   lookahead=2)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"features_free": True})})
    res = execute_run(cfg)
    assert res.ok, res.reason
    assert_honest_timing(res.run_dir, 2, sampled_before=True)
    for r in range(2):
        mbs = read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")
        assert mbs and sum(m["remote_rows"] for m in mbs) > 0
        assert all(m["fetched_rows"] == 0 and m["hits"] == 0 for m in mbs)
        assert (res.run_dir / f"trace-r{r}.npz").exists()
    s = summarize_run(res.run_dir)
    assert s["policy"] == "free" and s["fetched_rows"] == 0 and s["bounds"]["pipeline_s"] > 0


def test_trainer_death_ends_run_cleanly(tmp_path, data_root, monkeypatch):
    """Also with DistDGL sampler processes: an os._exit of the trainer skips DGL's pool close
    (its samplers would poll on), and the teardown's kill of each machine's process group must
    end them too."""
    monkeypatch.setenv("RUDDER_FAULT", "1:3")  # rank 1 exits at its 4th minibatch
    t0 = time.monotonic()
    res = execute_run(make_cfg(tmp_path, data_root, 2, epochs=3, samplers=1))
    assert not res.ok
    assert time.monotonic() - t0 < 200
    run = json.loads((res.run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["reason"]
    # the killed trainer's own code, whichever process the supervisor reported first
    procs = json.loads((res.run_dir / "cluster" / "result.json").read_text())["processes"]
    dead = [p for p in procs if p["role"] == "trainer" and p["rank"] == 1]
    assert [(p["returncode"], p["stopped"]) for p in dead] == [(17, False)]
    assert not leftovers(res.run_dir)
    assert not run_processes(res.run_dir)
    # records are flushed per line: the dying rank's steps before its exit are all kept
    mbs = read_jsonl(res.run_dir / "minibatches-r1.jsonl")
    assert [m["global_step"] for m in mbs] == [0, 1, 2]


def test_agent_policy_end_to_end(tmp_path, data_root):
    """The LLM agent (real SmolLM2 through llama.cpp, one per trainer in-process) steering the
    lookahead replacement on 2 emulated machines: decisions, staleness and outcomes recorded."""
    # The trainer waits for the model to load and warm before its first minibatch (agent.
    # ready_timeout_s); then 625 small minibatches (~25 s here) outlast a few answers of ~9 s
    # each on a 2-core host shared by 2 trainers, 2 servers and 2 models (the first is applied
    # near minibatch 240).
    cfg = make_cfg(tmp_path, data_root, 2, "agent", epochs=25, prefetch_fraction=0.25, window=4)
    cfg.train.batch_size = 200
    cfg.train.eval_every = 0
    cfg.agent.prompt = "zero-shot"  # the shortest prompt: quickest to warm up on 1 thread
    cfg.agent.timeout_s = 60  # 2 trainers + 2 servers + 2 models share 2 cores: answers are slow
    cfg.agent.model.name = "smollm2-135m"
    cfg.agent.backend = "inproc"
    res = execute_run(cfg)
    assert res.ok, res.reason
    ctx = json.loads((res.run_dir / "context-r0.json").read_text())
    assert ctx["extra"]["t_policy_ready"] > 0  # waited for the model before training, not during
    decisions = [d for r in range(2) for d in read_jsonl(res.run_dir / f"decisions-r{r}.jsonl")]
    assert decisions, "the agent made no decision"
    # each trainer asked once before its first minibatch (the run samples ahead): the start decision
    assert sorted(d["window"] for d in decisions if d["window"] == -1) == [-1, -1]
    asked = [d for d in decisions if not (d.get("reason") or "").startswith("dropped:")]
    assert asked
    for d in asked:  # (a window dropped while the model was busy is recorded, never asked)
        assert d["model"] == "smollm2-135m" and d["latency_s"] is not None
        assert isinstance(d["replace"], bool)
    # the loader's time in the policy (plan + observe) per minibatch: queue polls, never a wait
    # for an answer, which takes seconds here (the bound is loose: 2 cores shared by 6 processes)
    t_policy = [m["t_policy"] for r in range(2) for m in read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")]
    applied = [d for d in decisions if d.get("applied_step") is not None]
    assert applied and all(d["staleness"] >= 1 for d in applied)  # judged window -> applied later
    assert t_policy and max(t_policy) < min(d["latency_s"] for d in applied) / 2
    judged = [d for d in decisions if d.get("correct") is not None]
    assert judged  # self-reflection: predictions checked against the next window
    windows = read_jsonl(res.run_dir / "windows-r0.jsonl")
    assert windows and all(0 <= w["hit_rate"] <= 1 for w in windows)


def test_one_class_labels_report_no_accuracy(tmp_path, data_root):
    """An imported graph whose labels are all one class: the run completes and reports no
    accuracy (1.000 would mean nothing)."""
    import numpy as np

    from rudder.data.importers import import_edge_list

    rng = np.random.default_rng(0)
    n = 3000
    np.savez(tmp_path / "e.npz", src=rng.integers(0, n, 20000), dst=rng.integers(0, n, 20000),
             num_nodes=n)
    np.save(tmp_path / "y.npy", np.zeros(n, dtype=np.int64))
    import_edge_list(tmp_path / "e.npz", "one-class", data_root, labels=tmp_path / "y.npy")
    cfg = make_cfg(tmp_path, data_root, 2, epochs=1).model_copy(deep=True)
    cfg.dataset.name = "one-class"
    res = execute_run(cfg)
    assert res.ok, res.reason
    for r in range(2):
        (epoch,) = read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")
        assert epoch["train_acc"] is None and epoch["val_acc"] is None
        assert epoch["minibatches"] > 0


def test_remote_universe_serves_true_rows(tmp_path, data_root):
    """prefetch.universe=remote on a live cluster: the buffer keeps any remote id (2-hop ones
    too) through an index smaller than the remote ids sampled, so it evicts ids as it goes;
    every assembled row still matches a direct pull (--check: 0 mismatched rows)."""
    res = execute_run(make_cfg(tmp_path, data_root, 2, "lookahead", epochs=2, prefetch_fraction=0.25,
                               universe="remote", capacity_rows=300, universe_max_nodes=900), check=True)
    assert res.ok, res.reason
    for r in range(2):
        done = json.loads((res.run_dir / f"done-r{r}.json").read_text())
        assert done["checked"] and done["mismatched_rows"] == 0
        assert done["universe_held"] == 900  # the index filled: ids were evicted on the way
        assert done["capacity_frac_remote"] == pytest.approx(300 / 900)
        ctx = json.loads((res.run_dir / f"context-r{r}.json").read_text())
        assert ctx["capacity"] == 300 and ctx["extra"]["universe"] == "remote"
        ep = read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")
        assert sum(e["hits"] for e in ep) > 0
