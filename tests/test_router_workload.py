"""The router comparison's pure parts (bench/router_workload.py): the tenants' prompts, the counters read from
/metrics, the hit-rate arithmetic and the startup line's replica URLs. The measurement itself is lesson 16's."""

from __future__ import annotations

import pytest

from minitransformer.bench.router_workload import (
    TenantWorkload,
    hit_rates,
    prefix_counters,
    replica_urls,
    tenant_prompts,
)


def test_tenants_take_turns_and_each_keeps_its_own_long_system_prompt(real_tokenizer):
    w = TenantWorkload(tenants=3, rounds=4)
    requests = tenant_prompts(w)
    assert [tenant for tenant, _ in requests] == [0, 1, 2] * 4
    prompts = {t: [p for tenant, p in requests if tenant == t] for t in range(3)}
    for own in prompts.values():
        system = own[0].partition("\n\nQuestion:")[0]
        assert all(p.startswith(system + "\n\nQuestion:") for p in own)        # the same prefix every time
        assert len(set(own)) == 4                                      # but its own questions
        assert 300 <= len(real_tokenizer.encode(system)) <= 500
    firsts = [real_tokenizer.encode(prompts[t][0])[:16] for t in range(3)]     # the first KV block of each
    assert len({tuple(ids) for ids in firsts}) == 3
    assert len({prompts[t][0][:1] for t in range(3)}) == 3                     # and the first character (smg)
    assert tenant_prompts(w) == requests                                        # the same for every policy


def test_the_number_of_tenants_is_checked():
    with pytest.raises(ValueError, match="tenants"):
        tenant_prompts(TenantWorkload(tenants=0))


def test_prefix_counters_sum_the_samples_of_both_counters():
    page = ('# HELP vllm:prefix_cache_hits_total Prompt tokens found in the prefix cache.\n'
            '# TYPE vllm:prefix_cache_hits_total counter\n'
            'vllm:prefix_cache_hits_total{model_name="m"} 352\n'
            'vllm:prefix_cache_queries_total{model_name="m"} 737\n'
            'vllm:prefix_cache_queries_total_other{model_name="m"} 5\n'
            'vllm:prompt_tokens_total{model_name="m"} 900\n')
    assert prefix_counters(page) == {"vllm:prefix_cache_hits_total": 352.0,
                                     "vllm:prefix_cache_queries_total": 737.0}
    assert prefix_counters("") == {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}


def test_hit_rates_are_the_runs_deltas_per_replica_and_overall():
    counters = lambda hits, queries: {"vllm:prefix_cache_hits_total": hits, "vllm:prefix_cache_queries_total": queries}
    before = {"a": counters(10, 20), "b": counters(0, 0), "c": counters(5, 5)}
    after = {"a": counters(310, 420), "b": counters(100, 500), "c": counters(5, 5)}
    rates = hit_rates(before, after)
    assert rates["replicas"]["a"] == {"hits": 300, "queries": 400, "hit_rate": 0.75}
    assert rates["replicas"]["b"] == {"hits": 100, "queries": 500, "hit_rate": 0.2}
    assert rates["replicas"]["c"]["hit_rate"] is None                           # it was sent nothing
    assert rates["hit_rate"] == pytest.approx(400 / 900)                       # not the mean of 0.75 and 0.2
    assert hit_rates(before, before)["hit_rate"] is None


def test_replica_urls_come_from_the_startup_line():
    log = ("some earlier line http://127.0.0.1:1\n"
           "minitransformer serve --replicas 2: router http://127.0.0.1:8000 (smg, policy cache_aware) -> replicas "
           "http://127.0.0.1:41001 http://127.0.0.1:41002  (Ctrl-C stops)\n")
    assert replica_urls(log) == ["http://127.0.0.1:41001", "http://127.0.0.1:41002"]
    assert replica_urls("nothing yet") == []
