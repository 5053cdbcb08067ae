"""`minitransformer bench`: end to end on the tiny model, the JSON's figures and ratios recomputed from its raw runs,
the markdown agreeing with the JSON, best runs, medians, noise marks and run order checked with a fake peer whose
numbers we choose, missing peers and bad flags. Timings themselves are never asserted: these machines are noisy."""

from __future__ import annotations

import json
import re
import statistics
import sys

import pytest

from minitransformer import cli
from minitransformer.bench import report
from minitransformer.bench.run import QUICK, TARGETS, load_systems, run_bench
from minitransformer.bench.workloads import Ours

TINY = ["--quick", "--repeats", "3", "--prefill-lengths", "8,16", "--batches", "1,2"]
PEAKS = {"read_bandwidth_bytes_s": 12e9, "copy_bandwidth_bytes_s": 10e9, "gemm_flops": 50e9}
SETTINGS = QUICK.__class__(prefill_lengths=(8, 16), batches=(1, 2), decode_prompt_tokens=8, decode_tokens=4,
                           cache_prompt_tokens=8, cache_new_tokens=4, continuous_requests=3, continuous_tokens=4,
                           repeats=3, settle_s=0.0)


def _cli(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def bench_run(tiny_model_path, tmp_path_factory):
    """One CLI run on the tiny model, peers none: (exit code, stdout, the JSON, the output folder)."""
    out = tmp_path_factory.mktemp("bench")
    import io
    from contextlib import redirect_stderr, redirect_stdout
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = cli.main(["bench", "--model", str(tiny_model_path), "--peers", "none", "--out", str(out)] + TINY)
    return code, stdout.getvalue(), json.loads((out / "bench.json").read_text()), out


def test_cli_writes_json_markdown_and_png(bench_run):
    code, stdout, data, out = bench_run
    assert code == 0
    assert (out / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "bench.md").read_text() == report.markdown(data)
    assert "### minitransformer bench" in stdout and "decode batch 1 (tok/s)" in stdout
    assert set(data) >= {"schema", "model", "weight_bytes", "machine", "peers", "systems", "settings", "rows",
                         "ratios", "quietness"}
    assert data["quietness"]["line"].startswith("quietness: load average") and data["quietness"]["line"] in stdout
    assert data["quietness"]["quiet"] == data["quietness"]["line"].endswith(": quiet")
    assert data["systems"] == ["ours"] and data["peers"] == {}
    assert set(data["machine"]) >= {"cores", "numpy", "read_bandwidth_bytes_s", "copy_bandwidth_bytes_s", "gemm_flops",
                                  "label", "profile", "profile_line"}
    expected_rows = {"prefill_8", "prefill_16", "decode_b1", "decode_b2", "generate_cache", "generate_no_cache",
                     "continuous"}
    assert set(data["rows"]) == expected_rows
    for row in data["rows"].values():
        assert set(row) >= {"workload", "size", "unit", "runs_unit", "runs", "values"}
        assert len(row["runs"]["ours"]) == 3                        # --repeats 3 kept, the warm-up dropped
        assert all(v > 0 for v in row["runs"]["ours"])
    assert data["rows"]["generate_cache"]["tokens_equal"] == {"ours": True}


def test_every_value_and_ratio_recomputes_from_raw_runs(bench_run):
    _, _, data, _ = bench_run
    m = data["machine"]
    bw, peak = m["read_bandwidth_bytes_s"], m["gemm_flops"]
    for key, row in data["rows"].items():
        for system, runs in row["runs"].items():
            # the figure is the best run (least seconds, most tok/s); the median stands next to it
            if row["workload"] == "prefill":
                best, median = row["size"] / min(runs), row["size"] / statistics.median(runs)
            elif row["runs_unit"] == "s":
                best, median = min(runs), statistics.median(runs)
            else:
                best, median = max(runs), 1 / statistics.median([1 / r for r in runs])
            assert row["values"][system] == pytest.approx(best, rel=1e-12), key
            assert row["medians"][system] == pytest.approx(median, rel=1e-12), key
        if row["workload"] == "prefill":                             # P / max(compute time, memory time)
            assert row["values"]["roofline"] == pytest.approx(
                row["size"] / max(row["flops"] / peak, row["bytes"] / bw), rel=1e-12)
    values = {key: row["values"] for key, row in data["rows"].items()}
    ids = set()
    for r in data["ratios"]:
        (nr, ns), (dr, ds) = r["num"], r["den"]
        assert r["value"] == pytest.approx(values[nr][ns] / values[dr][ds], rel=1e-12), r["id"]
        assert isinstance(r["beyond_noise"], bool)
        if r["id"] in TARGETS:
            assert r["target"] == TARGETS[r["id"]] and r["meets"] == (r["value"] >= r["target"])
        ids.add(r["id"])
    for row in data["rows"].values():
        for system, runs in row["runs"].items():
            assert row["spread"][system] == pytest.approx(max(runs) / min(runs), rel=1e-12)
    assert {"prefill_8/roofline", "decode_b1/roofline", "cache_speedup/ours", "continuous/ours_decode_b1"} <= ids
    assert not any("llama-cpp-python" in i or "/hf" in i for i in ids)       # no peer, no peer ratio


def test_decode_roofline_at_batch_1_is_bandwidth_over_weights_and_cache(bench_run, tiny_model):
    from minitransformer.core.kv_cache import estimate_kv_bytes
    _, _, data, _ = bench_run
    s, m = data["settings"], data["machine"]
    context = s["decode_prompt_tokens"] + s["decode_tokens"] // 2
    memory_bound = m["read_bandwidth_bytes_s"] / (data["weight_bytes"] + estimate_kv_bytes(tiny_model.config, context))
    row = data["rows"]["decode_b1"]
    compute_bound = m["gemm_flops"] / row["flops"]
    assert row["values"]["roofline"] == pytest.approx(min(memory_bound, compute_bound), rel=1e-12)


def test_markdown_numbers_equal_the_json(bench_run):
    _, _, data, out = bench_run
    text = (out / "bench.md").read_text()
    results, runs_table = text.split("The runs behind each figure")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in results.splitlines() if line.startswith("| ")}
    runs_lines = [line for line in runs_table.splitlines() if line.startswith("| ") and "median" in line]
    assert len(runs_lines) == len(data["rows"])
    for line, row in zip(runs_lines, data["rows"].values()):
        digits = 1 if row["unit"] == "tok/s" else 3
        assert f"median {row['medians']['ours']:.{digits}f}, spread {(row['spread']['ours'] - 1) * 100:.0f}%" in line
    ratio = {r["id"]: r["value"] for r in data["ratios"]}
    for key, row in data["rows"].items():
        line = next(text for label, text in lines.items() if label.startswith(
            {"prefill": f"prefill {row['size']} tokens", "decode": f"decode batch {row['size']} ",
             "generate_cache": "generate with cache", "generate_no_cache": "generate without cache",
             "continuous": "continuous,"}[row["workload"]]))
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        digits = 1 if row["unit"] == "tok/s" else 3
        assert cells[1] == f"{row['values']['ours']:.{digits}f}"
        if "roofline" in row["values"]:
            assert cells[2] == f"{row['values']['roofline']:.{digits}f}"
            assert cells[3].startswith(f"{ratio[key + '/roofline']:.2f}x")
    target = next(text for label, text in lines.items() if label.startswith("decode batch 1: ours / float32 roofline"))
    assert f"{ratio['decode_b1/roofline']:.2f}x" in target
    assert data["quietness"]["line"] in text
    assert re.search(r"read bandwidth ([\d.]+) GB/s", text).group(1) == \
        f"{data['machine']['read_bandwidth_bytes_s'] / 1e9:.1f}"
    assert re.search(r"copy ([\d.]+) GB/s \(read \+ write\)", text).group(1) == \
        f"{data['machine']['copy_bandwidth_bytes_s'] / 1e9:.1f}"


class FakePeer:
    """A peer whose measurements we choose: prefill seconds, decode and continuous tok/s from lists, calls logged.

    Named like llama.cpp's batched-bench, so the target ratio that divides by llama.cpp's batched decode is computed
    too."""
    name = "llama-batched-bench"

    def __init__(self, log, values):
        self.log, self.values, self.reason = log, values, None

    def available(self):
        return True

    def supports(self, workload, batch=1):
        return workload in ("prefill", "decode", "continuous") and batch == 1

    def _next(self, what):
        self.log.append(("fake", what))
        return self.values[what].pop(0)

    def prefill_seconds(self, ids):
        return self._next("prefill")

    def decode_tok_s(self, batch, ids, new_tokens):
        return self._next("decode")

    def continuous_tok_s(self, prompts, new_tokens):
        return self._next("continuous")


class LoggedOurs(Ours):
    def __init__(self, model, log):
        super().__init__(model)
        self.log = log

    def prefill_seconds(self, ids):
        self.log.append(("ours", "prefill"))
        return super().prefill_seconds(ids)

    def decode_tok_s(self, batch, ids, new_tokens):
        self.log.append(("ours", "decode"))
        return super().decode_tok_s(batch, ids, new_tokens)

    def continuous_tok_s(self, prompts, new_tokens):
        self.log.append(("ours", "continuous"))
        return super().continuous_tok_s(prompts, new_tokens)


def test_alternation_warmup_dropped_and_medians(tiny_model):
    log = []
    # warm-up values are absurd (1000 s, 1e6 tok/s): if they were kept, the medians below would move
    values = {"prefill": [1000.0, 0.5, 0.1, 0.2] + [1000.0, 0.8, 0.4, 0.1],
              "decode": [1e6, 30.0, 10.0, 20.0], "continuous": [1e6, 7.0, 5.0, 6.0]}
    settings = SETTINGS.__class__(**{**SETTINGS.__dict__, "batches": (1,)})
    data = run_bench(tiny_model, [LoggedOurs(tiny_model, log), FakePeer(log, values)], settings, peaks=PEAKS)
    prefill = [who for who, what in log if what == "prefill"]
    decode = [who for who, what in log if what == "decode"]
    assert prefill == ["ours", "fake"] * 8                          # (warm-up + 3 repeats) x 2 lengths, alternating
    assert decode == ["ours", "fake"] * 4
    assert [who for who, what in log if what == "continuous"] == ["ours", "fake"] * 4
    rows = data["rows"]
    assert rows["prefill_8"]["runs"]["llama-batched-bench"] == [0.5, 0.1, 0.2]
    assert rows["prefill_8"]["values"]["llama-batched-bench"] == pytest.approx(8 / 0.1)     # P / fastest seconds
    assert rows["prefill_8"]["medians"]["llama-batched-bench"] == pytest.approx(8 / 0.2)    # P / median seconds
    assert rows["prefill_16"]["values"]["llama-batched-bench"] == pytest.approx(16 / 0.1)
    assert rows["decode_b1"]["values"]["llama-batched-bench"] == pytest.approx(30.0)         # the fastest run
    assert rows["decode_b1"]["medians"]["llama-batched-bench"] == pytest.approx(20.0)
    assert rows["continuous"]["runs"]["llama-batched-bench"] == [7.0, 5.0, 6.0]
    r = {x["id"]: x for x in data["ratios"]}
    assert r["decode_b1/llama-batched-bench"]["value"] == pytest.approx(rows["decode_b1"]["values"]["ours"] / 30.0)
    # the continuous-batching target divides by the batched-decode figure measured in the same rounds (best: 7.0)
    target = r["continuous/llama-batched-bench"]
    assert target["den"] == ["continuous", "llama-batched-bench"] and target["target"] == 1.25
    assert target["value"] == pytest.approx(rows["continuous"]["values"]["ours"] / 7.0)
    cells = report.table_rows(data)
    assert data["systems"] == ["ours", "llama-batched-bench"] and cells[0][2] == f"{8 / 0.1:.1f}"
    assert report.runs_rows(data)[0][2] == f"median {8 / 0.2:.1f}, spread 400%"     # 0.5 s / 0.1 s - 1


def _row(runs, runs_unit="s", unit="tok/s", size=8):
    from minitransformer.bench.run import summarize
    return summarize(dict(workload="prefill" if unit == "tok/s" and runs_unit == "s" else "decode", size=size,
                          unit=unit, runs_unit=runs_unit, runs=runs))


def test_a_ratio_is_beyond_noise_only_when_the_runs_do_not_overlap():
    from minitransformer.bench.run import ratios
    rows = {"prefill_8": _row({"ours": [0.10, 0.11, 0.12], "llama-cpp-python": [0.20, 0.25, 0.30]}),
            "prefill_16": _row({"ours": [0.10, 0.20, 0.30], "llama-cpp-python": [0.15, 0.16, 0.17]}, size=16),
            "decode_b1": _row({"ours": [30.0, 31.0], "llama-cpp-python": [29.0, 30.5]}, runs_unit="tok/s")}
    got = {r["id"]: r for r in ratios(rows, ["ours", "llama-cpp-python"])}
    prefill_8 = got["prefill_8/llama-cpp-python"]
    assert prefill_8["beyond_noise"] and prefill_8["value"] == pytest.approx(2.0)
    assert not got["prefill_16/llama-cpp-python"]["beyond_noise"]             # ours' runs straddle the peer's
    assert not got["decode_b1/llama-cpp-python"]["beyond_noise"]              # best 31 vs 30.5, but 30.0 < 30.5
    cell = report.ratio_cell(got["decode_b1/llama-cpp-python"])
    assert cell == f"{31 / 30.5:.2f}x (within noise)" and report.ratio_cell(prefill_8) == "2.00x"


def test_a_busy_run_says_its_figures_are_not_a_quiet_machines():
    data = {"quietness": {"line": "quietness: ... busy", "quiet": False, "why_busy": "other programs used 80%"}}
    note = report.quietness_note(data)
    assert note.startswith("quietness: ... busy") and "other programs used 80%" in note and "rerun" in note
    assert report.quietness_note({"quietness": {"line": "quietness: ... quiet", "quiet": True,
                                                "why_busy": ""}}) == "quietness: ... quiet"


def test_a_missing_peer_is_reported_with_its_reason(tiny_model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)              # `import llama_cpp` raises ImportError
    code, out, err = _cli(["bench", "--model", str(tiny_model_path), "--peers", "llama-cpp-python", "--out",
                           str(tmp_path)] + TINY, capsys)
    assert code == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["peers"]["llama-cpp-python"]["available"] is False
    assert "llama_cpp not importable" in data["peers"]["llama-cpp-python"]["reason"]
    assert data["systems"] == ["ours"]
    assert "llama-cpp-python not measured: llama_cpp not importable" in out.replace("\n", " ")
    assert "n/a (peer missing)" in (tmp_path / "bench.md").read_text()


def test_a_peer_that_cannot_load_its_file_has_a_reason(tiny_model, tmp_path):
    pytest.importorskip("llama_cpp")
    from minitransformer.bench.peers import LlamaCpp
    peer = LlamaCpp(tmp_path / "missing.gguf")
    assert not peer.available() and "missing.gguf" in peer.reason


@pytest.mark.parametrize("argv, words", [
    (["--repeats", "0"], "--repeats"),
    (["--peers", "vllm"], "--peers"),
    (["--peers", "llama.cpp"], "--peers"),                            # the old name of llama-cpp-python
    (["--prefill-lengths", "8,x"], "--prefill-lengths"),
    (["--batches", "0"], "--batches"),
    (["--prefill-lengths", "4096"], "prefill length 4096"),
    (["--repeats", "three"], "--repeats"),
])
def test_bad_flags_exit_2_with_one_line(tiny_model_path, tmp_path, capsys, argv, words):
    code = None
    try:
        code, out, err = _cli(["bench", "--model", str(tiny_model_path), "--peers", "none", "--out",
                               str(tmp_path)] + argv, capsys)
    except SystemExit as exc:                                         # argparse's own errors exit from parse_args
        code = exc.code
        out, err = capsys.readouterr()
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("minitransformer: error")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err
    assert not (tmp_path / "bench.json").exists()


def test_llama_cpp_python_peer_prefill_and_batch_1_decode(real_model):
    """Optional: llama-cpp-python's in-process prefill and batch-1 decode (skipped without llama-cpp-python). Its
    Python API decodes one sequence at a time, so continuous batching is llama-batched-bench's row, not its."""
    pytest.importorskip("llama_cpp")
    systems, status = load_systems(real_model, ["llama-cpp-python"])
    if not status["llama-cpp-python"]["available"]:
        pytest.skip(status["llama-cpp-python"]["reason"])
    peer = systems[1]
    ids = real_model.tokenizer.encode("The capital of France is")
    assert peer.prefill_seconds(ids) > 0
    assert peer.decode_tok_s(1, ids, 4) > 0
    assert not peer.supports("continuous") and not peer.supports("decode", 4)


def test_hf_peer_on_32_tokens(real_model):
    """Optional: the HF peer measures prefill and decode on the real model (skipped without torch/transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    systems, status = load_systems(real_model, ["hf"])
    if not status["hf"]["available"]:
        pytest.skip(status["hf"]["reason"])
    hf = systems[1]
    ids = real_model.tokenizer.encode("The history of the printing press " * 8)[:32]
    assert hf.prefill_seconds(ids) > 0
    assert hf.decode_tok_s(1, ids, 4) > 0
    _, cached = hf.generate_seconds(ids, 8, True)
    ours = Ours(real_model).generate_seconds(ids, 8, True)[1]
    assert cached == ours                                              # same greedy tokens as ours (float32 both)


def test_each_timed_call_waits_settle_seconds_first(monkeypatch):
    """The idle pause before every timed call (not before warm-ups): other runtimes' threads go quiet first."""
    import minitransformer.bench.run as run
    events = []
    monkeypatch.setattr(run.time, "sleep", lambda s: events.append(("sleep", s)))

    class Stub:
        def __init__(self, name):
            self.name = name

    runs = run.alternate([Stub("ours"), Stub("peer")], lambda x: events.append(("call", x.name)) or 1.0,
                         repeats=2, tick=lambda: None, settle_s=0.25)
    assert runs == {"ours": [1.0, 1.0], "peer": [1.0, 1.0]}
    assert events == [("call", "ours"), ("call", "peer")] + [("sleep", 0.25), ("call", "ours"),
                                                             ("sleep", 0.25), ("call", "peer")] * 2
