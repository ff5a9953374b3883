"""`rudder doctor`: what works here, one line per capability, ok or the reason it is not."""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess


STUDY_MODEL = "qwen2.5-coder-0.5b"


def _check(name: str, fn) -> tuple[str, bool, str]:
    try:
        detail = fn()
        return name, True, detail or ""
    except Exception as exc:  # the reason is the point of this command
        return name, False, f"{type(exc).__name__}: {exc}".strip()


def _version(mod: str) -> str:
    m = importlib.import_module(mod)
    return getattr(m, "__version__", "")


def _device() -> str:
    from rudder.device import summary

    return summary()


def _dgl_distributed() -> str:
    import dgl.distributed  # noqa: F401  (imports graphbolt: needs the shim)

    return "import ok"


def _llama() -> str:
    import llama_cpp

    from rudder.agent.models import resolve_model
    from rudder.config import ModelConfig

    path = resolve_model(ModelConfig(name="smollm2-135m"))
    return f"llama_cpp {llama_cpp.__version__}, smollm2-135m at {path}"


def _study_model() -> str:
    """The study's agent model (configs/studies/local_default.yaml); `make models` assembles it."""
    from rudder.agent.models import resolve

    return str(resolve(STUDY_MODEL))


def _netns() -> str:
    from rudder.cluster import netns_available

    ok, why = netns_available()
    if not ok:
        if os.geteuid() == 0 and shutil.which("unshare"):
            why += "; several machines still run, on loopback without link shaping (cluster.bandwidth: null)"
        raise RuntimeError(why)
    return why


def _slurm() -> str:
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "srun", "squeue") if not shutil.which(b)]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)} (scripts/install_slurm.sh installs slurm-wlm)")
    # slurmd -V needs no slurm.conf (sbatch --version looks one up and prints "fatal" lines)
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError(f"slurmd -V exited {out.returncode}: {(out.stderr or out.stdout).strip()}")
    return out.stdout.strip()


def _root() -> str:
    if os.geteuid() != 0:
        raise RuntimeError("not root: clusters run as one machine on loopback")
    return "root"


CHECKS = [
    ("torch", lambda: _version("torch")),
    ("device", _device),
    ("dgl", lambda: _version("dgl")),
    ("dgl.distributed", _dgl_distributed),
    ("llama_cpp + shipped model", _llama),
    (f"study model {STUDY_MODEL}", _study_model),
    ("parsl", lambda: _version("parsl")),
    ("duckdb", lambda: _version("duckdb")),
    ("globus_compute_sdk", lambda: _version("globus_compute_sdk")),
    ("root", _root),
    ("network namespaces", _netns),
    ("slurm binaries", _slurm),
]


def run_checks() -> list[tuple[str, bool, str]]:
    return [_check(name, fn) for name, fn in CHECKS]


def register(sub) -> None:
    p = sub.add_parser("doctor", help="report versions and what works on this machine")
    p.set_defaults(func=_doctor)


def _doctor(args) -> int:
    results = run_checks()
    width = max(len(n) for n, _, _ in results)
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<{width}}  {detail}")
    core = {"torch", "dgl", "dgl.distributed", "duckdb"}
    return 0 if all(ok for n, ok, _ in results if n in core) else 1
