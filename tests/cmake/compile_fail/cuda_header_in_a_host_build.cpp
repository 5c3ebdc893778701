// Must not compile: the CUDA backend's header in a plain g++/clang++ translation unit (no
// nvcc, no cuda-omp flag). gradus' #error must come first, not a missing Thrust header.
#include <gradus/backends/cuda.hpp>

int main() {}
