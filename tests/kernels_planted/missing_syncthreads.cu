// Planted bugs: a __syncthreads missing between a write to shared memory and another thread's access to it.

// Read-after-write: each thread writes its value to shared memory and reads its neighbour's with no barrier in
// between. On a GPU this often works by luck (the warp runs in lockstep); the CPU runner runs each thread to its end
// before the next one starts, so whichever thread runs first reads the poison (NaN) left in shared memory before the
// block, in every resume order.
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

// Write-after-read: shift left twice through one buffer. Each thread reads its right neighbour's slot, then
// overwrites its own with no barrier in between, so a thread that runs before its left neighbour has read destroys
// the value that neighbour needs. Nothing here is ever poison: the result is merely wrong. Resumed forward (thread
// t before t + 1) every read comes first and the bug stays hidden; reverse and shuffled orders expose it.
extern "C" __global__ void shift_left_twice(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float tile[128];
    const int t = threadIdx.x, last = blockDim.x - 1;
    tile[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    const float right = t < last ? tile[t + 1] : 0.0f;
    // BUG: a __syncthreads() is missing here
    tile[t] = right;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = t < last ? tile[t + 1] : 0.0f;
}
