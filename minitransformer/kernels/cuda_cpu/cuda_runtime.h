// cuda_runtime.h for the CPU runner: everything a kernel needs is in cuda_cpu.h, already included.
#pragma once
#include "cuda_cpu.h"
