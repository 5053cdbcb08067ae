"""The concept diagrams (viz_concepts) show the run's own numbers: block tables as the engine holds them after the
same steps replayed independently, a prefix block held by two tables, and the draft-and-verify passes that add up to
the speculative run's counts and tokens.
"""

from __future__ import annotations

from minitransformer import SamplingParams, generate
from minitransformer import viz_concepts as vc
from minitransformer.serving import Engine

from test_figures import png_size


def test_paged_attention_diagram_shows_the_engines_tables(real_model, tmp_path):
    path = tmp_path / "paged_attention.png"
    data = vc.draw_paged_attention(real_model, path)
    assert min(png_size(path)) > 300

    # Replay the same steps on a fresh engine, written out here rather than through run_paged_engine.
    engine = Engine(real_model, max_num_seqs=4, num_blocks=vc.NUM_BLOCKS, block_size=vc.BLOCK_SIZE)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    engine.add_request(vc.PAGED_PROMPTS["A"], params, request_id="A")
    engine.step()
    engine.add_request(vc.PAGED_PROMPTS["B"], params, request_id="B")
    engine.add_request(vc.PAGED_PROMPTS["C"], params, request_id="C")
    for _ in range(vc.PAGED_STEPS - 1):
        engine.step()
    bm = engine.block_manager
    bm.check()
    assert data["steps"] == engine.num_steps == vc.PAGED_STEPS
    assert {s["request_id"]: s["block_table"] for s in data["sequences"]} == bm.block_tables
    assert {s["request_id"]: s["num_computed_tokens"] for s in data["sequences"]} == {
        rid: seq.num_computed_tokens for rid, seq in engine.sequences.items()}
    assert data["ref_counts"] == bm.ref_counts and len(data["ref_counts"]) == vc.NUM_BLOCKS

    # A and B share their prompt's first full blocks: each such block is in both tables, with ref count 2.
    tables = bm.block_tables
    assert data["shared_blocks"] and data["prefix_cache_hits"] == len(data["shared_blocks"]) * vc.BLOCK_SIZE
    for block in data["shared_blocks"]:
        assert bm.ref_counts[block] == 2
        assert [rid for rid, table in tables.items() if block in table] == ["A", "B"]
    assert tables["A"][:len(data["shared_blocks"])] == tables["B"][:len(data["shared_blocks"])] == data["shared_blocks"]
    assert not set(tables["C"]) & set(tables["A"] + tables["B"])


def test_draft_and_verify_diagram_adds_up_to_the_run(real_model, tmp_path):
    path = tmp_path / "draft_and_verify.png"
    data = vc.draw_draft_and_verify(real_model, path)
    assert min(png_size(path)) > 300
    run = generate(real_model, vc.SPEC_PROMPT, SamplingParams(max_tokens=24, temperature=0),
                   speculative="ngram", num_speculative_tokens=4)
    plain = generate(real_model, vc.SPEC_PROMPT, SamplingParams(max_tokens=24, temperature=0))
    passes, spec = data["passes"], run.speculative
    assert data["token_ids"] == run.token_ids == plain.token_ids             # speculative greedy == plain greedy
    assert sum(p["accepted"] for p in passes) == spec["accepted_tokens"] == data["speculative"]["accepted_tokens"]
    assert len(passes) == spec["target_passes"]
    assert sum(len(p["drafted"][:p["accepted"] + 1]) for p in passes) == spec["draft_tokens"]   # checked drafts
    # each pass contributes its kept drafts, then the target's own token: together, the run's tokens
    rebuilt = [t for p in passes for t in p["drafted"][:p["accepted"]] + [p["target_token"]] if t is not None]
    assert rebuilt == run.token_ids
    assert any(p["accepted"] == len(p["drafted"]) == vc.SPEC_K for p in passes)   # a pass that kept all k drafts
    assert any(p["accepted"] < len(p["drafted"]) for p in passes)                 # and one that rejected a draft
