// paged_decode_merge.cuh: what both paged decode kernels share (lesson 11): the group limit and the merge kernel.
//
// paged_decode.cu (built for bandwidth) and paged_decode_simple.cu (the teaching baseline) each write, per partition
// of a sequence, part_out (B, H, P, D) already divided by the partition's own softmax sum, and part_max, part_sum
// (B, H, P). paged_decode_merge combines them by log-sum-exp:
//   grid = (H, B), block = D threads: with M = max_p part_max and w_p = part_sum_p * exp(part_max_p - M),
//   out = sum_p w_p part_out_p / sum_p w_p and lse = M + log(sum_p w_p).
#pragma once
#include "common.cuh"

constexpr int DECODE_MAX_GROUP = 8;      // query heads per KV head handled by one block (registers hold G outputs)

template <typename T, int D>
__global__ void
paged_decode_merge(const float* __restrict__ part_out,  // (B, H, P, D)
                   const float* __restrict__ part_max,  // (B, H, P)
                   const float* __restrict__ part_sum,  // (B, H, P)
                   const int* __restrict__ seq_lens,    // (B,)
                   T* __restrict__ out,                 // (B, H, D)
                   float* __restrict__ lse,             // (B, H)
                   int num_heads, int partition_size, int num_partitions) {
    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int c = threadIdx.x;                                   // blockDim.x == D
    const size_t bh = (size_t)b * num_heads + h;

    // Only the partitions that hold tokens of this sequence were written.
    const int used = min(num_partitions, (seq_lens[b] + partition_size - 1) / partition_size);
    if (used <= 0) {                                             // an empty sequence attends to nothing
        out[bh * D + c] = from_float<T>(0.0f);
        if (c == 0) lse[bh] = neg_inf();
        return;
    }
    const float* maxes = part_max + bh * num_partitions;
    const float* sums = part_sum + bh * num_partitions;

    float global_max = neg_inf();
    for (int p = 0; p < used; ++p) global_max = fmaxf(global_max, maxes[p]);

    float total = 0.0f, acc = 0.0f;
    for (int p = 0; p < used; ++p) {
        const float w = sums[p] * expf(maxes[p] - global_max);   // partition p's share of the full softmax sum
        total += w;
        acc += w * part_out[(bh * num_partitions + p) * D + c];
    }
    out[bh * D + c] = from_float<T>(acc / total);
    if (c == 0) lse[bh] = global_max + logf(total);
}
