// The launchers: for each kernel cpu_compile.py asked for, a table entry `entry(&kernel)` built from the kernel's
// function pointer. The parameter types come from the C++ compiler (template argument deduction on `void (*)(A...)`),
// never from parsing the source: `args` holds one pointer per parameter, to the value to pass (the layout of CUDA's
// kernelParams). cpu_compile.py writes the table and the four extern "C" functions Python calls after this header.
#pragma once
#include "cuda_cpu.h"

namespace cudacpu {

struct ParamInfo {              // ctypes mirror in cpu_runner.py
    int32_t is_pointer, is_const, kind, size;   // of the value, or of the pointee for a pointer
};                              // kind: 1 int, 2 unsigned, 3 float, 4 __half, 5 bfloat16, 6 bytes, 7 bool, 0 other

template <class T> constexpr int kind_of() {
    using U = std::remove_cv_t<T>;
    if (half_kind<U>::value) return half_kind<U>::value;
    if (std::is_same<U, bool>::value) return 7;
    if (std::is_void<U>::value || std::is_same<U, char>::value || std::is_same<U, unsigned char>::value) return 6;
    if (std::is_floating_point<U>::value) return 3;
    if (std::is_integral<U>::value) return std::is_signed<U>::value ? 1 : 2;
    return 0;
}
template <class T> constexpr int size_of() {
    if constexpr (std::is_void<std::remove_cv_t<T>>::value) return 1; else return int(sizeof(T));
}

template <class A> ParamInfo param_info() {
    if constexpr (std::is_pointer<A>::value) {
        using P = std::remove_pointer_t<A>;
        return {1, std::is_const<P>::value, kind_of<P>(), size_of<P>()};
    } else {
        return {0, 0, kind_of<A>(), int(sizeof(A))};
    }
}

template <class... A, size_t... I> void call_kernel(void* kernel, void** args, std::index_sequence<I...>) {
    reinterpret_cast<void (*)(A...)>(kernel)(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}
template <class... A> void thunk(void* kernel, void** args) {
    call_kernel<A...>(kernel, args, std::index_sequence_for<A...>{});
}
template <class... A> int describe(ParamInfo* out, int max) {
    const ParamInfo all[] = {param_info<A>()..., ParamInfo{}};
    for (int i = 0; i < int(sizeof...(A)) && i < max; ++i) out[i] = all[i];
    return int(sizeof...(A));
}

struct Entry {
    void* kernel;
    void (*thunk)(void*, void**);
    int (*describe)(ParamInfo*, int);
};
template <class... A> Entry entry(void (*kernel)(A...)) {
    return {reinterpret_cast<void*>(kernel), &thunk<A...>, &describe<A...>};
}

}  // namespace cudacpu
