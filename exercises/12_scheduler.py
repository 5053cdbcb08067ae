"""Exercise 12: the scheduler's preemption victim (continuous batching with preemption by recompute).

Each step the serving engine's scheduler gives the running sequences their tokens, oldest first. When the KV pool
has no free block for the next one, a running sequence is *preempted*: its blocks are freed, its cache is dropped and
it goes back to the front of the waiting queue, to be recomputed later (vLLM v1 preempts by recompute, never by
swapping). Which one? The one whose loss costs least and that deserves its seat least:

- policy "continuous" (first come, first served): the NEWEST running sequence, the last of `running` (which is in
  admission order). The oldest have the most work done and waited longest; throwing them out would starve them.
- policy "priority": the LEAST urgent one, by the same aged priority that admitted it: the largest
  (priority - waited_steps // aging_steps, arrival_index). Lower priority numbers are more urgent (vLLM's
  convention), every aging_steps steps a request waited improves it by one, and among equals the later arrival goes.

Shapes: running a list of sequences (here 8 requests at most), each with .priority (int), .waited_steps (int),
.arrival_index (int, the order of add_request) and .request_id; policy "continuous" | "priority"; aging_steps an
int. Returns one element of `running` (the object itself).

Pitfalls: preempting the oldest; under "priority", the most urgent instead of the least; forgetting the aging (a
request that aging just let in would be the first thrown out); ties broken toward the older arrival.

Check it: `minitransformer learn check scheduler`. Stuck: `minitransformer learn hint scheduler`.
"""


def choose_victim(running, policy, aging_steps):
    raise NotImplementedError("write choose_victim")
