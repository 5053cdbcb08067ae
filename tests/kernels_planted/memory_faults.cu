// Planted bugs that crash a process: on a GPU "an illegal memory access was encountered"; in the CPU runner's
// fibers mode a KernelError naming the thread, and the Python process lives on.

// Each level of recursion keeps 1 KiB of locals: deep enough, it runs off the end of the thread's stack.
__device__ int deep(int n) {
    volatile char pad[1024];
    pad[n % 1024] = char(n);
    return n == 0 ? 0 : deep(n - 1) + pad[n % 1024];
}

extern "C" __global__ void recurse(int* out, int depth) {
    out[threadIdx.x] = deep(depth);
}

// A write far outside the array (a wrong stride, an index never checked against the length).
extern "C" __global__ void write_far(float* out, long long index) {
    if (threadIdx.x == 3) out[index] = 1.0f;
}

// A kernel that checks its own input and calls __trap() when it is wrong: a GPU aborts the launch.
extern "C" __global__ void checked(const int* lengths, int max_length) {
    if (lengths[threadIdx.x] > max_length) __trap();  // the trap
}
