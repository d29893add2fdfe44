// Storage types for 16-bit floats and their conversions, written against PTX
// directly so the device layer needs no toolkit header: the same source
// compiles under nvcc and under NVRTC with only Tessera's embedded headers.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// IEEE fp16 and bfloat16 as raw bits; arithmetic happens in float.
struct half_t { u16 bits; };
struct bf16_t { u16 bits; };
template <typename T> constexpr bool is_fp16 = false;
template <> constexpr bool is_fp16<half_t> = true;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(half_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t x) { return __uint_as_float(static_cast<u32>(x.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
  bf16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

// Two floats -> one register of two 16-bit values (low half = first).
__device__ __forceinline__ u32 pack2(float lo, float hi, half_t) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 pack2(float lo, float hi, bf16_t) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// The inverse: one register of two 16-bit values -> two floats (exact).
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi, half_t) {
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(w));
}
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi, bf16_t) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// log2(e): softmax runs in base 2 (exp2 is one MUFU op); see attention_state.cuh.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x as the bare MUFU op: exp2f() adds denormal handling around it (extra
// FMULs and a compare per element), which softmax weights in [0, 1] do not
// need. ex2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) and 1 / x as bare MUFU ops, for arguments in a tame range (a sum of
// softmax weights, >= 1): log2f() and IEEE division add range handling and a
// slow-path call that such arguments never need.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#endif

}  // namespace tessera
