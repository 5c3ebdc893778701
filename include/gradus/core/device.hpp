#pragma once
// GRADUS_HD marks what a GPU kernel calls as well as the CPU: elementwise functors, plan
// evaluation (exec/plan.hpp), optimizer and RNN-cell rules, the counter hash. Under nvcc it
// is __host__ __device__; everywhere else it is nothing, so the CPU backend and every
// compiler but nvcc see plain C++.
//
// A GRADUS_HD template declares no named local of its value type (write `V d = ...; use(d,
// d)` as a call of a second function taking `const V& d`). nvcc compiles each instantiation
// of a __host__ __device__ template for the device too, and refuses a local of a vector type
// there ("contains a vector, which is not supported in device code"), even in a discarded
// `if constexpr` branch. cpu_simd instantiates these templates with xsimd batches (vector
// types), so a .cu that includes both backends, as the GPU test suite does (it checks the
// device against cpu_simd in one program), would not compile. Temporaries and references of
// those types are accepted: the host code nvcc then calls from them only warns (20011,
// 20014), and nothing of it runs on a device.
#if defined(__CUDACC__)
#define GRADUS_HD __host__ __device__
#else
#define GRADUS_HD
#endif

// GRADUS_UNROLL before a loop of constant trip count in GRADUS_HD code: unrolled in device
// code, so that the arrays it indexes stay in registers (exec/plan.hpp's row arithmetic);
// nothing on the host, where g++ would warn about an unknown pragma.
#if defined(__CUDA_ARCH__)
#define GRADUS_UNROLL _Pragma("unroll")
#else
#define GRADUS_UNROLL
#endif
