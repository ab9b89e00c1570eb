#pragma once
// Lets plain structs be shared by host code (g++) and kernels (nvcc).
#if defined(__CUDACC__)
#define EPCOMM_HOST_DEVICE __host__ __device__
#else
#define EPCOMM_HOST_DEVICE
#endif
