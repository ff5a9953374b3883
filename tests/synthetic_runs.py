"""Synthetic run directories: schema-true (rudder.records field lists), made-up numbers.

For tests and demos of the results pipeline (collect -> query -> report) without a cluster.
The numbers follow a toy model only so that plots look like something: more machines mean more
remote rows; a buffer policy turns a share of them into hits; fetching costs time. They say
nothing about real performance. Every run is marked `"synthetic": true` in its run.json.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

from rudder.records import (
    DECISION_FIELDS,
    EPOCH_FIELDS,
    MINIBATCH_FIELDS,
    WINDOW_FIELDS,
    JsonlWriter,
    outcome_fields,
    write_json_atomic,
)

# toy %-hits per policy (fraction of remote input rows served by the buffer)
HIT_RATE = {"none": 0.0, "static": 0.40, "fixed": 0.42, "lookahead": 0.55, "agent": 0.48}
BUFFER_FREE = {"none"}  # policies without a buffer
DECIDING = ("agent", "classifier")  # policies that write decisions-r<R>.jsonl


def write_synthetic_run(root: str | Path, run_id: str, *, dataset: str = "synth-small",
                        machines: int = 2, trainers_per_machine: int = 1, policy: str = "none",
                        model: str = "smollm2-135m", epochs: int = 3, steps: int = 20,
                        window: int = 5, batch_size: int = 1000, prefetch_fraction: float = 0.25,
                        study: str | None = None, status: str = "complete",
                        reason: str | None = None, simulated: bool = True, seed: int = 0,
                        epochs_done: int | None = None) -> Path:
    """Writes runs/<run_id>/ (run.json + per-rank JSONL files) and returns its path.

    epochs_done: epochs actually written (default all; fewer for a failed run).
    """
    rng = random.Random(f"{run_id}/{seed}")
    run_dir = Path(root) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "dataset": {"name": dataset},
        "train": {"batch_size": batch_size, "epochs": epochs, "fanouts": [10, 25], "seed": seed},
        "prefetch": {"policy": policy, "prefetch_fraction": prefetch_fraction, "window": window},
        "agent": {"model": {"name": model}},
        "cluster": {"machines": machines, "trainers_per_machine": trainers_per_machine,
                    "bandwidth": None},
        "runs_dir": str(root),
    }
    started = time.time() - 3600.0
    base_hr = HIT_RATE.get(policy.split(":")[0], 0.45)
    ranks = machines * trainers_per_machine
    done = epochs if epochs_done is None else epochs_done
    wall = 0.0
    for rank in range(ranks):
        mb_w = JsonlWriter(run_dir / f"minibatches-r{rank}.jsonl")
        ep_w = JsonlWriter(run_dir / f"epochs-r{rank}.jsonl")
        win_w = JsonlWriter(run_dir / f"windows-r{rank}.jsonl")
        dec_w = (JsonlWriter(run_dir / f"decisions-r{rank}.jsonl")
                 if policy.startswith(DECIDING) else None)
        window_recs: list[dict] = []
        n_window = n_decision = 0
        t_run = 0.0
        for epoch in range(done):
            mbs = []
            for step in range(steps):
                g = epoch * steps + step
                input_rows = 20000 + rng.randrange(2000)
                remote = int(input_rows * (1 - 1 / machines) * (0.25 + 0.05 * rng.random()))
                hr = 0.0 if policy in BUFFER_FREE else min(
                    0.95, max(0.0, base_hr + 0.05 * rng.uniform(-1, 1) + 0.002 * step))
                hits = int(remote * hr)
                misses = remote - hits
                replaced = 0 if policy in ("none", "static") else rng.choice((0, 0, 0, 50))
                fetched = misses + replaced
                t_fetch = 2e-5 * fetched + 0.01
                rec = {
                    "epoch": epoch, "step": step, "global_step": g, "input_rows": input_rows,
                    "local_rows": input_rows - remote, "remote_rows": remote, "hits": hits,
                    "misses": misses, "replaced_rows": replaced, "fetched_rows": fetched,
                    "fetched_bytes": fetched * 400, "hit_rate": hits / remote if remote else 0.0,
                    "t_sample": 0.02, "t_fetch": t_fetch, "t_buffer": 0.002,
                    "t_compute": 0.05, "t_stall": max(0.0, t_fetch - 0.05),
                    "loss": 2.0 / (1 + g / 10),
                    # the loader's stages (sampling in the loader thread: waited = worked)
                    "t_sample_wait": 0.02, "t_plan": 0.0005, "t_assemble": 0.003,
                    "t_load": 0.0235 + t_fetch, "t_stall_max": max(0.0, t_fetch - 0.05),
                }
                assert list(rec) == MINIBATCH_FIELDS
                mb_w.write(rec)
                mbs.append(rec)
                window_recs.append(rec)
                if len(window_recs) == window:
                    wrec = _window(n_window, window_recs)
                    win_w.write(wrec)
                    if dec_w is not None:
                        dec_w.write(_decision(n_decision, n_window, wrec, policy, model, rng))
                        n_decision += 1
                    n_window += 1
                    window_recs = []
            t_epoch = sum(m["t_sample"] + m["t_compute"] + m["t_stall"] for m in mbs)
            t_run += t_epoch
            erec = {
                "epoch": epoch, "t_epoch": t_epoch,
                **{k: sum(m[k] for m in mbs) for k in
                   ("t_sample", "t_fetch", "t_buffer", "t_compute", "t_stall")},
                "loss": mbs[-1]["loss"], "train_acc": 0.5 + 0.1 * epoch, "val_acc": 0.45,
                "minibatches": len(mbs),
                **{k: sum(m[k] for m in mbs) for k in
                   ("input_rows", "remote_rows", "hits", "fetched_rows", "fetched_bytes",
                    "replaced_rows")},
                "initial_fill_rows": 0 if policy in BUFFER_FREE or epoch else 5000,
                **{k: sum(m[k] for m in mbs) for k in
                   ("t_sample_wait", "t_plan", "t_assemble", "t_load", "t_stall_max")},
                # one rank's view of the bounds (the store derives its own from the minibatches)
                "t_epoch_max": t_epoch, "bound_compute_s": 0.05 * len(mbs),
                "bound_pipeline_s": 0.05 * len(mbs), "epoch_over_compute": t_epoch / (0.05 * len(mbs)),
                "epoch_over_pipeline": t_epoch / (0.05 * len(mbs)),
                "cpu_s": 0.8 * t_epoch,
            }
            erec = {k: erec[k] for k in EPOCH_FIELDS}
            ep_w.write(erec)
        wall = max(wall, t_run)
        for w in (mb_w, ep_w, win_w) + ((dec_w,) if dec_w else ()):
            w.close()
    config_text = json.dumps(config, sort_keys=True)
    write_json_atomic(run_dir / "run.json", {
        "run_id": run_id, "study": study, "config": config,
        "config_hash": hashlib.sha256(config_text.encode()).hexdigest()[:16],
        "status": status, "reason": reason, "started_at": started,
        "ended_at": started + wall + 5.0, "wall_s": wall + 5.0, "simulated": simulated,
        "versions": {"python": "3.11"}, "host": {"hostname": "synthetic"},
        "seeds": {"train": seed}, "timings": {"start_s": 2.0, "train_s": wall},
        "synthetic": True,
    })
    return run_dir


def _window(n: int, recs: list[dict]) -> dict:
    remote = sum(r["remote_rows"] for r in recs)
    out = {
        "window": n, "first_step": recs[0]["global_step"], "last_step": recs[-1]["global_step"],
        "minibatches": len(recs),
        "hit_rate": sum(r["hits"] for r in recs) / remote if remote else 0.0,
        "remote_rows": remote, "fetched_rows": sum(r["fetched_rows"] for r in recs),
        "replaced_rows": sum(r["replaced_rows"] for r in recs),
        "t_fetch": sum(r["t_fetch"] for r in recs), "t_stall": sum(r["t_stall"] for r in recs),
        "t_minibatch": sum(r["t_sample"] + r["t_compute"] + r["t_stall"] for r in recs)
        / len(recs),
        "buffer_fill": 5000, "stale_slots": 100, "lookahead_missing": 0, "lookahead_rows": 0,
        "missed_nodes": 0, "missed_again": 0, "missed_union": 0,
    }
    assert list(out) == WINDOW_FIELDS
    return out


def _outcome_deltas(n: int, window: int) -> tuple[float, float]:
    """(hit-rate delta, relative rows delta) of a synthetic decision: an RNG of its own, so
    the run's other synthetic numbers stay what they were before these fields existed."""
    r = random.Random(n * 7919 + window)
    return round(r.uniform(-0.03, 0.05), 4), round(r.uniform(-0.2, 0.1), 4)


def _counterfactual(n: int, window: int, replace: bool, fallback: bool) -> dict:
    """cf_rows_saved, cf_replace_share, correct_cf (rudder agent judge's fields), from an RNG of
    their own like _outcome_deltas."""
    from rudder.agent.judge import counterfactual

    r = random.Random(n * 104729 + window)
    share = round(r.uniform(-0.05, 0.1), 4)
    saved = int(share * 1000) * (1 if replace else -1)
    return {"cf_rows_saved": saved, "cf_replace_share": share,
            "correct_cf": counterfactual(replace, fallback, share)}


def _decision(n: int, window: int, wrec: dict, policy: str, model: str,
              rng: random.Random) -> dict:
    replace = rng.random() < 0.5
    fallback = rng.random() < 0.1
    staleness = rng.choice((0, 1, 1, 2, 3))
    decided = wrec["last_step"] + 1
    out = {
        "decision": n, "window": window, "decided_step": decided,
        "applied_step": decided + staleness, "staleness": staleness,
        "policy": policy.split(":")[0], "model": model if policy == "agent" else policy,
        "backend": "inproc", "prompt_hash": "synthetic",
        "raw": json.dumps({"replace": replace, "hit_rate": "up" if replace else "flat"}),
        "replace": replace, "budget": 0.05 if replace else 0.0,
        "expected_hit_rate": "up" if replace else "flat", "expected_remote_rows": "down",
        "reason": "synthetic", "latency_s": 0.2 + rng.random(), "fallback": fallback,
        **outcome_fields(*_outcome_deltas(n, window)),
        "correct": None if fallback else rng.random() < 0.75,
        **_counterfactual(n, window, replace, fallback),
    }
    assert list(out) == DECISION_FIELDS
    return out
