#pragma once
// GRADUS_HD marks what a GPU kernel calls as well as the CPU: elementwise functors, plan
// evaluation (exec/plan.hpp), optimizer and RNN-cell rules, the counter hash. Under nvcc it
// is __host__ __device__; everywhere else it is nothing, so the CPU backend and every
// compiler but nvcc see plain C++.
#if defined(__CUDACC__)
#define GRADUS_HD __host__ __device__
#else
#define GRADUS_HD
#endif
