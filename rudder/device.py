"""The training device: `train.device` (auto | cpu | cuda) resolved, described and checked.

A run that asks for cuda and cannot have it fails with the reason (never a silent CPU run on a
GPU allocation): `preflight` before the cluster starts (trainers on this host), `resolve` again
in every trainer (the device the trainer really gets, e.g. on a Slurm node).
Which GPU: trainers on a Slurm node each see one GPU through CUDA_VISIBLE_DEVICES
(rudder.cluster.slurm), so each uses its own. Emulated machines on one host (LocalCluster) see all
its GPUs and spread over them by rank (RANK % GPUs): on a single-GPU host they share that GPU.
"""
from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import torch

log = logging.getLogger("rudder.device")

DEVICES = ("auto", "cpu", "cuda")


class DeviceError(RuntimeError):
    """The requested device cannot be had here; the message says why."""


def _driver_gpus() -> int:
    """GPUs the NVIDIA driver lists, whatever torch was built for (0 without a driver)."""
    d = Path("/proc/driver/nvidia/gpus")
    return len(list(d.iterdir())) if d.is_dir() else 0


def why_no_cuda() -> str:
    """Why torch sees no CUDA device here (call when torch.cuda.is_available() is False)."""
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build; `make setup CUDA=1` installs "
                "the CUDA build of the pinned torch")
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and vis.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={vis!r} hides every GPU"
    gpus = _driver_gpus()
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device "
            f"({gpus} GPU(s) listed by the NVIDIA driver"
            + ("; is the driver older than this CUDA build?)" if gpus else "; no driver or no GPU)"))


def resolve(requested: str, bind: bool = False) -> torch.device:
    """train.device -> the torch device; DeviceError for cuda without a CUDA device.
    bind: make it this process's current CUDA device (the trainer; creates its CUDA context)."""
    if requested not in DEVICES:
        raise DeviceError(f"unknown train.device {requested!r}; valid: {', '.join(DEVICES)}")
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ.get("RANK", "0")) % torch.cuda.device_count())
        if bind:
            torch.cuda.set_device(dev)
        return dev
    if requested == "cuda":
        raise DeviceError(f"train.device=cuda, but {why_no_cuda()}")
    if _driver_gpus():  # auto on a GPU node with a CPU torch: allowed, but say so
        log.warning("train.device=auto falls back to the CPU: %s", why_no_cuda())
    return torch.device("cpu")


def preflight(requested: str, launcher: str = "local") -> str | None:
    """Before a cluster starts: the reason a run cannot have its device, or None. Checked only
    when the trainers run on this host (the local launcher); Slurm trainers check on their node."""
    if launcher != "local":
        return None
    try:
        resolve(requested)
    except DeviceError as exc:
        return str(exc)
    return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device) -> dict:
    """What run.json records about a trainer's device (JSON-ready)."""
    info = {"device": str(device), "type": device.type, "torch": torch.__version__,
            "cuda": torch.version.cuda, "threads": torch.get_num_threads(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, memory_bytes=int(p.total_memory),
                    capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version())
    else:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
        info.update(name=_cpu_name(), memory_bytes=mem)
    return info


def summary() -> str:
    """One line for `rudder doctor`: the CUDA devices torch sees, or "cpu only" and why."""
    if not torch.cuda.is_available():
        return f"cpu only ({torch.get_num_threads()} threads): {why_no_cuda()}"
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(f"cuda:{i} {p.name} ({p.total_memory / 2**30:.1f} GiB)")
    return f"torch {torch.__version__} CUDA {torch.version.cuda}: " + ", ".join(gpus)


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (CUDA is asynchronous): timings end here."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
