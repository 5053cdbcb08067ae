"""The tokenizer's exercise (01 bpe): the committed learner file fails as "not written yet", the engine's own bpe
passes both stages, and a learner's classic mistakes, written as a learner would write them, are named."""

from __future__ import annotations

from learner_files import check_fails, learner_file
from minitransformer.learn import track


def test_bpe_untouched_is_not_written_yet(real_model_path):
    exercise = track.find("bpe")
    path = track.REPO_EXERCISES / exercise.file_name
    check_fails(exercise, track.load_function(exercise, path), path, "not written yet", "bpe")


def test_bpe_the_engines_own_passes_inside_the_real_tokenizer_and_model(real_model_path):
    lines = track.run_check(track.find("bpe"), track.find("bpe").reference)
    assert "your bpe ran inside the real tokenizer" in lines[0] and "the reference's 12 tokens" in lines[0]


def test_bpe_a_learners_own_loop_passes(tmp_path, real_model_path):
    """Written the textbook way (rescan the word after every merge): slower than the engine's heap, same pieces."""
    exercise, fn, path = learner_file(tmp_path, "bpe", """
        def bpe(symbols, ranks):
            symbols = list(symbols)
            while True:
                pairs = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
                if not pairs:
                    return symbols
                _, i = min(pairs)
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    """)
    assert track.run_check(exercise, fn, path)[0].startswith("your bpe ran inside the real tokenizer")


def test_bpe_merging_the_largest_rank_first_is_named(tmp_path, real_model_path):
    exercise, fn, path = learner_file(tmp_path, "bpe", """
        def bpe(symbols, ranks):
            symbols = list(symbols)
            while True:
                pairs = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
                if not pairs:
                    return symbols
                best = max(rank for rank, _ in pairs)
                i = next(i for rank, i in pairs if rank == best)
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    """)
    check_fails(exercise, fn, path, "bpe of 'lower'", "expected ['lower']", "Likely mistake: the pair with the "
                "largest rank is merged first")


def test_bpe_one_pass_is_named(tmp_path, real_model_path):
    exercise, fn, path = learner_file(tmp_path, "bpe", """
        def bpe(symbols, ranks):
            pieces = []
            for symbol in symbols:
                if pieces and (pieces[-1], symbol) in ranks:
                    pieces[-1] = pieces[-1] + symbol
                else:
                    pieces.append(symbol)
            return pieces
    """)
    check_fails(exercise, fn, path, "Likely mistake: one left-to-right pass")
