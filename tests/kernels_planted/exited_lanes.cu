// Planted bug: lanes past n return, then the warp reduces over the full mask. CUDA waits only for the lanes of the
// mask that have not exited, but a shuffle that reads an exited lane gets an undefined value (CUDA C++ Programming
// Guide, "Warp Shuffle Functions": a thread may only read from a thread that takes part in the shuffle). The CPU
// runner raises KernelError naming the file and line.
extern "C" __global__ void sum_after_return(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);  // BUG: the butterfly reads lanes that have returned
    out[i] = v;
}

// Legal: the mask names lanes that have returned, but nobody reads them (lane 0 is the source), and the ballot
// counts only the lanes that take part.
extern "C" __global__ void broadcast_after_return(const float* x, float* out, unsigned* ballot, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __shfl_sync(0xffffffffu, x[i], 0);
    const unsigned b = __ballot_sync(0xffffffffu, true);
    if (threadIdx.x == 0) ballot[blockIdx.x] = b;
}
