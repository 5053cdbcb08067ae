"""The serving-and-beyond exercises of the build-it-yourself track (11-15): the untouched learner file fails with
"not written yet", the engine's own function passes both stages, and a planted classic mistake is named."""

from __future__ import annotations

import pytest

from learner_files import check_fails as _fails_with, learner_file as _learner
from minitransformer.learn import track


@pytest.mark.parametrize("name", ["paged_slots", "scheduler", "speculative", "int8", "sse"])
def test_untouched_file_is_not_written_yet(name):
    exercise = track.find(name)
    path = track.REPO_EXERCISES / exercise.file_name
    fn = track.load_function(exercise, path)
    _fails_with(exercise, fn, path, "not written yet")


# ------------------------------------------------------------------------------------------------ 11 paged_slots

def test_paged_slots_reference_passes(real_model_path):
    lines = track.run_check(track.find("paged_slots"), track.find("paged_slots").reference)
    assert any("token for token" in line for line in lines)


def test_paged_slots_logical_block_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "paged_slots", """
        def slot_mapping(block_table, start, end, block_size):
            slots = []
            for p in range(start, end):
                block = p // block_size
                slots.append(block * block_size + p % block_size)
            return slots
        """)
    _fails_with(exercise, fn, path, "differs at", "must go through the table")


def test_paged_slots_off_by_one_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "paged_slots", """
        def slot_mapping(block_table, start, end, block_size):
            out = []
            for p in range(start, end):
                n = p + 1                      # the learner counts positions from 1
                out.append(block_table[n // block_size] * block_size + n % block_size)
            return out
        """)
    _fails_with(exercise, fn, path, "off by one at a block boundary")


# -------------------------------------------------------------------------------------------------- 12 scheduler

def test_scheduler_reference_passes(real_model_path):
    lines = track.run_check(track.find("scheduler"), track.find("scheduler").reference)
    assert any("preemption" in line for line in lines)


def test_scheduler_oldest_victim_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "scheduler", """
        def choose_victim(running, policy, aging_steps):
            if policy == "priority":
                return max(running, key=lambda s: (s.priority - s.waited_steps // aging_steps, s.arrival_index))
            return running[0]
        """)
    _fails_with(exercise, fn, path, "the oldest running request is preempted")


def test_scheduler_no_aging_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "scheduler", """
        def choose_victim(running, policy, aging_steps):
            if policy == "continuous":
                return running[-1]
            worst = running[0]
            for seq in running:
                if (seq.priority, seq.arrival_index) > (worst.priority, worst.arrival_index):
                    worst = seq
            return worst
        """)
    _fails_with(exercise, fn, path, "the aging is left out")


# ------------------------------------------------------------------------------------------------ 13 speculative

def test_speculative_reference_passes(real_model_path):
    lines = track.run_check(track.find("speculative"), track.find("speculative").reference)
    assert any("drafts accepted" in line for line in lines)


def test_speculative_reversed_test_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "speculative", """
        import numpy as np
        from minitransformer.core.sampling import draw_from

        def accept_or_resample(p, q, draft, generator):
            q_d = 1.0 if q is None else float(q[draft])
            if generator.random() * float(p[draft]) < q_d:     # q over p: the wrong way round
                return draft
            if q is None:
                residual = p.copy()
                residual[draft] = 0.0
            else:
                residual = np.maximum(p - q, 0.0)
            return draw_from(residual if residual.sum() > 0 else p, generator)
        """)
    _fails_with(exercise, fn, path, "p and q are swapped")


def test_speculative_resample_from_p_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "speculative", """
        from minitransformer.core.sampling import draw_from

        def accept_or_resample(p, q, draft, generator):
            q_d = 1.0 if q is None else q[draft]
            if generator.random() * q_d < p[draft]:
                return draft
            return draw_from(p, generator)
        """)
    _fails_with(exercise, fn, path, "drawn from p")


# ------------------------------------------------------------------------------------------------------ 14 int8

def test_int8_reference_passes(real_model_path):
    lines = track.run_check(track.find("int8"), track.find("int8").reference)
    assert any("token for token" in line for line in lines)


def test_int8_scale_without_127_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "int8", """
        import numpy as np

        def quantize_int8(w):
            scale = np.abs(w).max(axis=1)
            scale[scale == 0] = 1.0
            q = np.round(w / scale[:, None]).astype(np.int8)
            return q, scale.astype(np.float32)
        """)
    _fails_with(exercise, fn, path, "it must be max|w| / 127")


def test_int8_truncation_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "int8", """
        import numpy as np

        def quantize_int8(w):
            scale = (np.abs(w).max(axis=1) / 127).astype(np.float32)
            scale = np.where(scale == 0, np.float32(1), scale)
            return (w / scale[:, None]).astype(np.int8), scale
        """)
    _fails_with(exercise, fn, path, "truncated toward zero")


def test_int8_one_scale_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "int8", """
        import numpy as np

        def quantize_int8(w):
            scale = np.float32(np.abs(w).max() / 127)
            return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale
        """)
    _fails_with(exercise, fn, path, "one scale for the whole matrix")


# ------------------------------------------------------------------------------------------------------- 15 sse

def test_sse_reference_passes(real_model_path):
    lines = track.run_check(track.find("sse"), track.find("sse").reference)
    assert any("[DONE]" in line for line in lines)


def test_sse_missing_blank_line_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "sse", """
        import json

        def sse(data):
            text = data if isinstance(data, str) else json.dumps(data)
            return f"data: {text}\\n"
        """)
    _fails_with(exercise, fn, path, "the blank line is missing")


def test_sse_pretty_json_is_named(tmp_path):
    exercise, fn, path = _learner(tmp_path, "sse", """
        import json

        def sse(data):
            if isinstance(data, str):
                return "data: " + data + "\\n\\n"
            return "data: " + json.dumps(data, indent=2, ensure_ascii=False) + "\\n\\n"
        """)
    _fails_with(exercise, fn, path, "pretty-printed")
