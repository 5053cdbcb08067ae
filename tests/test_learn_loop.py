"""The build-it-yourself track's request-loop exercises (07 generate, 08 sampling, 09 stop_strings, 10
detokenizer): the untouched file says what is missing, the engine's own function passes, and a planted classic
mistake, written as a learner would write it, fails with a message that names it."""

from __future__ import annotations

from learner_files import check_fails, learner_file
from minitransformer.learn import track


def load(tmp_path, name: str, source: str):
    """(exercise, function) of a learner's file holding `source`."""
    return learner_file(tmp_path, name, source)[:2]


def fails_naming(exercise, fn, *words: str) -> str:
    return check_fails(exercise, fn, "your file", *words)


def untouched_says_not_written(name: str) -> None:
    exercise = track.find(name)
    fn = track.load_function(exercise, track.REPO_EXERCISES / exercise.file_name)
    fails_naming(exercise, fn, "not written yet", exercise.function)


# ---------------------------------------------------------------------------------------------- 07 generate

GENERATE = """
    import numpy as np
    from minitransformer.core.decode import decode_step
    from minitransformer.core.kv_cache import KVCache
    from minitransformer.core.prefill import prefill


    def greedy_generate(model, prompt_ids, max_tokens, eos_id):
        cache = KVCache(model.config, {cache_len})
        logits = prefill(model, prompt_ids, cache)
        out = []
        while len(out) < max_tokens:
            token = int(np.argmax(logits[0]))
            out.append(token)
            {stop}
            logits = decode_step(model, [token], cache)
        return out
"""


def test_generate_untouched(real_model_path):
    untouched_says_not_written("generate")


def test_generate_reference_passes(real_model_path):
    exercise = track.find("generate")
    lines = track.run_check(exercise, exercise.reference)
    assert any("Paris" in line for line in lines), lines


def test_generate_cache_too_small(tmp_path, real_model_path):
    exercise, fn = load(tmp_path, "generate", GENERATE.format(cache_len="len(prompt_ids)",
                                                              stop="if token == eos_id: break"))
    fails_naming(exercise, fn, "KV cache is full", "holds the prompt only")


def test_generate_no_eos_stop(tmp_path, real_model_path):
    exercise, fn = load(tmp_path, "generate", GENERATE.format(cache_len="len(prompt_ids) + max_tokens", stop="pass"))
    fails_naming(exercise, fn, "does not stop at eos_id")


# ---------------------------------------------------------------------------------------------- 08 sampling

SAMPLING = """
    import numpy as np


    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()


    def top_k_filter(logits, keep, k):
        if k > 0:
            kth = np.sort(np.where(keep, logits, -np.inf))[::-1][k - 1]
            keep = keep & (logits >= kth)
        return keep


    def top_p_filter(logits, keep, p):
        if p < 1:
            probs = softmax(np.where(keep, logits, -np.inf))
            order = np.argsort(-probs)
            cumulative = np.cumsum(probs[order])
            kept = order[{top_p_rule}]
            keep = keep & np.isin(np.arange(len(logits)), kept)
        return keep


    def filtered_probs(logits, temperature, top_k, top_p, min_p):
        if temperature < 1e-5:
            out = np.zeros_like(logits)
            out[np.argmax(logits)] = 1.0
            return out
        logits = logits / temperature
        keep = np.ones(len(logits), dtype=bool)
        if min_p > 0:
            probs = softmax(logits)
            keep = probs >= min_p * probs.max()
        {filters}
        return softmax(np.where(keep, logits, -np.inf))
"""
RIGHT_ORDER = "keep = top_p_filter(logits, top_k_filter(logits, keep, top_k), top_p)"


def test_sampling_untouched():
    untouched_says_not_written("sampling")


def test_sampling_reference_passes(real_model_path):
    exercise = track.find("sampling")
    lines = track.run_check(exercise, exercise.reference)
    assert any("total variation distance" in line for line in lines), lines


def test_sampling_right_solution_as_written_passes(real_model_path, tmp_path):
    exercise, fn = load(tmp_path, "sampling", SAMPLING.format(top_p_rule="cumulative - probs[order] < p",
                                                              filters=RIGHT_ORDER))
    assert track.run_check(exercise, fn)


def test_sampling_top_p_drops_crossing_token(tmp_path):
    exercise, fn = load(tmp_path, "sampling", SAMPLING.format(top_p_rule="cumulative < p", filters=RIGHT_ORDER))
    fails_naming(exercise, fn, "top_p 0.9", "drops the token that crosses top_p")


def test_sampling_top_k_after_top_p(tmp_path):
    exercise, fn = load(tmp_path, "sampling", SAMPLING.format(
        top_p_rule="cumulative - probs[order] < p",
        filters="keep = top_k_filter(logits, top_p_filter(logits, keep, top_p), top_k)"))
    fails_naming(exercise, fn, "top_k 5 and top_p 0.8", "top_k is applied after top_p")


# ---------------------------------------------------------------------------------------------- 09 stop_strings

STOP_STRINGS = """
    def find_stop_string(text, new_chars, stops):
        best = None
        for stop in stops:
            {search}
            if start != -1 and (best is None or (start, len(stop)) < (best[0], len(best[1]))):
                best = ({start}, stop)
        return best


    def held_back(text, pending, stops):
        {hold}
"""
SEARCH_WINDOW = "start = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))"
HOLD_LONGEST = """best = 0
        for stop in stops:
            for k in range(min(len(stop) - 1, pending), 0, -1):
                if text.endswith(stop[:k]):
                    best = max(best, k)
                    break
        return best"""


def test_stop_strings_untouched():
    untouched_says_not_written("stop_strings")


def test_stop_strings_reference_passes(real_model_path):
    exercise = track.find("stop_strings")
    lines = track.run_check(exercise, exercise.reference)
    assert any("math problem" in line for line in lines), lines


def test_stop_strings_only_new_characters(tmp_path):
    exercise, fn = load(tmp_path, "stop_strings", STOP_STRINGS.format(
        search="start = text[len(text) - new_chars:].find(stop)\n            "
               "start = start if start == -1 else start + len(text) - new_chars",
        start="start", hold=HOLD_LONGEST))
    fails_naming(exercise, fn, "straddles two tokens", "only the new characters are searched")


def test_stop_strings_index_after_the_stop(tmp_path):
    exercise, fn = load(tmp_path, "stop_strings", STOP_STRINGS.format(search=SEARCH_WINDOW,
                                                                      start="start + len(stop)", hold=HOLD_LONGEST))
    fails_naming(exercise, fn, "where the stop string ends")


def test_stop_strings_holds_nothing(tmp_path):
    exercise, fn = load(tmp_path, "stop_strings", STOP_STRINGS.format(search=SEARCH_WINDOW, start="start",
                                                                      hold="return 0"))
    fails_naming(exercise, fn, "held_back(", "nothing is held back")


# ---------------------------------------------------------------------------------------------- 10 detokenizer

def test_detokenizer_untouched():
    untouched_says_not_written("detokenizer")


def test_detokenizer_reference_passes(real_model_path):
    exercise = track.find("detokenizer")
    lines = track.run_check(exercise, exercise.reference)
    assert any("no U+FFFD" in line for line in lines), lines


def test_detokenizer_decodes_everything(tmp_path):
    exercise, fn = load(tmp_path, "detokenizer", """
        def complete_prefix(data):
            data.decode("utf-8", errors="replace")      # never fails, so everything can go
            return len(data)
    """)
    fails_naming(exercise, fn, "b'caf\\xc3'", "comes out as U+FFFD")


def test_detokenizer_holds_one_byte(tmp_path):
    exercise, fn = load(tmp_path, "detokenizer", """
        def complete_prefix(data):
            try:
                data.decode("utf-8")
                return len(data)
            except UnicodeDecodeError:
                return len(data) - 1                    # the last byte waits for the rest
    """)
    fails_naming(exercise, fn, "only the last byte is held back")
