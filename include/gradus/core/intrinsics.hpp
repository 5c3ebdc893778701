#pragma once
// The target's intrinsics (<immintrin.h>), included first from here.
// g++ 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized
// or uninitialized once inlined (e.g. in xsimd's exp/pow of doubles); the warning's
// location is the compiler's header, so silencing it before that header is first
// included keeps user code under -Werror clean: a gradus header that uses the intrinsics
// includes this one, not <immintrin.h>.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#elif defined(__AVX__)
#include <immintrin.h>
#endif
