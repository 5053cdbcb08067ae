// math_constants.h for the CPU runner: the CUDART_* float constants kernels use.
#pragma once
#include <math.h>
#define CUDART_INF_F INFINITY
#define CUDART_NAN_F NAN
#define CUDART_PI_F 3.141592654f
#define CUDART_SQRT_HALF_F 0.707106781f
#define CUDART_L2E_F 1.442695041f   // log2(e)
#define CUDART_LN2_F 0.693147181f
#define CUDART_INF INFINITY
