// Planted bug: each thread writes its value to shared memory and reads its neighbour's with no __syncthreads in
// between. On a GPU this often works by luck (the warp runs in lockstep); the CPU runner runs thread 0 to its end
// before thread 1 starts, so thread 0 reads the poison (NaN) left in shared memory before the block.
extern "C" __global__ void rotate_left(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float tile[128];
    const int t = threadIdx.x;
    tile[t] = x[blockIdx.x * blockDim.x + t];
    // BUG: a __syncthreads() is missing here
    out[blockIdx.x * blockDim.x + t] = tile[(t + 1) % blockDim.x];
}

// The fixed kernel, for comparison.
extern "C" __global__ void rotate_left_fixed(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float tile[128];
    const int t = threadIdx.x;
    tile[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = tile[(t + 1) % blockDim.x];
}
