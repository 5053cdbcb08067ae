"""The build-it-yourself track's request-loop exercises (06 generate, 07 sampling, 08 stop_strings, 09
detokenizer): the untouched file says what is missing, the engine's own function passes, and a planted classic
mistake, written as a learner would write it, fails with a message that names it."""

from __future__ import annotations

import textwrap

import pytest

from minitransformer.learn import track


def load(tmp_path, name: str, source: str):
    """A learner's file with `source` in it, loaded as `learn check` loads it."""
    exercise = track.find(name)
    path = tmp_path / exercise.file_name
    path.write_text(textwrap.dedent(source))
    return exercise, track.load_function(exercise, path)


def fails_naming(exercise, fn, *words: str) -> str:
    with pytest.raises(track.CheckFailed) as failed:
        track.run_check(exercise, fn)
    message = str(failed.value)
    for word in words:
        assert word in message, message
    return message


def untouched_says_not_written(name: str) -> None:
    exercise = track.find(name)
    fn = track.load_function(exercise, track.REPO_EXERCISES / exercise.file_name)
    fails_naming(exercise, fn, "not written yet", exercise.function)


# ---------------------------------------------------------------------------------------------- 06 generate

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
