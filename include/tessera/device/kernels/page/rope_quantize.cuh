// Fused decode-step cache write for fp8 caches (FlashInfer's
// rope_quantize_fp8 / rope_quantize_fp8_append_paged_kv_cache): one launch
// rotates q_rope / k_rope with a float32 cos/sin cache (primitives/rope.cuh,
// rope_turn_rn: one rounding per operation), multiplies every q value by
// quant_scale_q and every k / v value by quant_scale_kv (FlashInfer's
// convention: a multiply, unlike append_paged_kv_cache's divide), rounds to
// fp8 (arch/fp8.cuh: nearest even, saturating) and writes q to its outputs
// and k / v to their outputs or, paged, straight into the cache slots of the
// same page-table addressing as append_kv.cuh. See
// abi/rope_quantize_params.cuh for the exact contract.
//
// Thread mapping: one thread per 8-feature chunk of one (token, head) row, in
// a grid-stride loop over every token's chunks in the order q_rope, k_rope,
// k_nope, v, q_nope. Half-split pairs live in different chunks: the thread of
// chunk c < rope_dim / 16 also rotates its partner chunk c + rope_dim / 16
// and the partner's own thread does nothing (as page/rope.cuh). A chunk reads
// 16 bytes and writes 8.
#pragma once
#include "tessera/abi/rope_quantize_params.cuh"
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/primitives/rope.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kRopeQuantizeThreads = 256;

// Eight floats times `scale` (one rounding each) as eight fp8 bytes at dst.
template <typename TQ>
__device__ __forceinline__ void store_quantized8(TQ* dst, const float (&x)[8], float scale) {
  u32 w[2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
    w[j] = float_to_fp8x2<TQ>(__fmul_rn(x[4 * j], scale), __fmul_rn(x[4 * j + 1], scale)) |
           (float_to_fp8x2<TQ>(__fmul_rn(x[4 * j + 2], scale), __fmul_rn(x[4 * j + 3], scale)) << 16);
  *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

// Chunk c (8 features) of a row: copied (quantized) as is.
template <typename T, typename TQ>
__device__ __forceinline__ void quantize_chunk(const T* src, TQ* dst, int c, float scale) {
  float a[8];
  load_vec<8>(src + c * 8, a);
  store_quantized8<TQ>(dst + c * 8, a, scale);
}

// Chunk c of the first rope_dim features of a row at position pos, rotated
// and quantized (with its partner chunk when pairs are half-split).
template <typename T, typename TQ, bool INTERLEAVE>
__device__ __forceinline__ void rope_quantize_chunk(const RopeQuantizeParams& p, const T* src, TQ* dst, int c,
                                                    int pos, float scale) {
  const int half_ch = p.rope_dim / 16, half = p.rope_dim / 2;
  if (!INTERLEAVE && c >= half_ch) return;  // rotated with its partner chunk
  const bool cached = pos >= 0 && pos < p.cache_rows;
  const float* row = p.cos_sin_cache + static_cast<i64>(cached ? pos : 0) * p.cache_stride;
  auto angle = [&](int j, float& cs, float& sn) {
    if (cached) {
      cs = __ldg(row + j);
      sn = __ldg(row + half + j);
    } else {
      cs = sn = __int_as_float(0x7fffffff);  // NaN: a position outside the cache
    }
  };
  float a[8], b[8], ra[8], rb[8];
  load_vec<8>(src + c * 8, a);
  if constexpr (!INTERLEAVE) load_vec<8>(src + (c + half_ch) * 8, b);
  rope_rotate_chunk<INTERLEAVE, true>(c, a, b, angle, ra, rb);
  if constexpr (!INTERLEAVE) store_quantized8<TQ>(dst + (c + half_ch) * 8, rb, scale);
  store_quantized8<TQ>(dst + c * 8, ra, scale);
}

// Row (i, h) of a K / V destination; page < 0: unpaged (row i).
__device__ __forceinline__ i64 rope_quantize_row(const RopeQuantizeDst& d, i64 i, int h, int page, int slot) {
  const i64 row = page < 0 ? i * d.stride_n : page * d.page_stride + slot * d.token_stride;
  return row + h * d.stride_h;
}

// T: q / k / v rows (half_t or bf16_t); TQ: the fp8 type of every output.
template <typename T, typename TQ, bool INTERLEAVE>
__device__ __forceinline__ void rope_quantize_fp8(const RopeQuantizeParams& p) {
  static_assert(sizeof(T) == 2 && is_fp8<TQ>, "16-bit rows into fp8");
  const int rch = p.rope_dim / 8, nch = p.no_rope_dim / 8;
  const i64 q_rope_n = static_cast<i64>(p.num_qo_heads) * rch, k_rope_n = static_cast<i64>(p.num_kv_heads) * rch;
  const i64 k_nope_n = static_cast<i64>(p.num_kv_heads) * nch;
  const i64 v_n = p.v != nullptr ? static_cast<i64>(p.num_kv_heads) * (rch + nch) : 0;
  const i64 q_nope_n = static_cast<i64>(p.num_qo_heads) * nch;
  const i64 per_token = q_rope_n + k_rope_n + k_nope_n + v_n + q_nope_n, total = p.nnz * per_token;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const i64 i = t / per_token;
    i64 u = t - i * per_token;
    // Token i's cache slot: page < 0 unpaged; kv_ok false when not covered.
    int page = -1, slot = 0;
    bool kv_ok = true;
    if (p.kv_indptr != nullptr) {
      const int b = p.batch_indices[i];
      if (b < 0) continue;  // padding: nothing written
      const int pos = p.positions[i];
      kv_ok = b < p.batch && pos >= 0;
      if (kv_ok) {
        // Tables read up to p.batch / p.num_indices, the buffers' capacity
        // (so a graph replayed after larger tables were written follows
        // them); 64-bit sums, so corrupt entries cannot overflow.
        const int page_in_req = pos / p.page_size;
        const i64 first = p.kv_indptr[b], j = first + page_in_req;
        kv_ok = first >= 0 && j < p.kv_indptr[b + 1] && j < p.num_indices;
        if (kv_ok) {
          page = p.kv_indices[j];
          slot = pos - page_in_req * p.page_size;
          kv_ok = page >= 0 && page < p.num_pages;
        }
      }
    }
    const int pos_id = p.pos_ids[i];
    if (u < q_rope_n) {
      const int h = static_cast<int>(u / rch), c = static_cast<int>(u % rch);
      const T* src = static_cast<const T*>(p.q_rope) + i * p.q_rope_stride_n + h * p.q_rope_stride_h;
      TQ* dst = static_cast<TQ*>(p.q_rope_out) + i * p.q_rope_out_stride_n + h * p.q_rope_out_stride_h;
      rope_quantize_chunk<T, TQ, INTERLEAVE>(p, src, dst, c, pos_id, p.quant_scale_q);
      continue;
    }
    u -= q_rope_n;
    if (u < k_rope_n) {
      if (!kv_ok) continue;
      const int h = static_cast<int>(u / rch), c = static_cast<int>(u % rch);
      const T* src = static_cast<const T*>(p.k_rope) + i * p.k_rope_stride_n + h * p.k_rope_stride_h;
      TQ* dst = static_cast<TQ*>(p.k_rope_dst.ptr) + rope_quantize_row(p.k_rope_dst, i, h, page, slot);
      rope_quantize_chunk<T, TQ, INTERLEAVE>(p, src, dst, c, pos_id, p.quant_scale_kv);
      continue;
    }
    u -= k_rope_n;
    if (u < k_nope_n) {
      if (!kv_ok) continue;
      const int h = static_cast<int>(u / nch), c = static_cast<int>(u % nch);
      const T* src = static_cast<const T*>(p.k_nope) + i * p.k_nope_stride_n + h * p.k_nope_stride_h;
      TQ* dst = static_cast<TQ*>(p.k_nope_dst.ptr) + rope_quantize_row(p.k_nope_dst, i, h, page, slot);
      quantize_chunk<T, TQ>(src, dst, c, p.quant_scale_kv);
      continue;
    }
    u -= k_nope_n;
    if (u < v_n) {
      if (!kv_ok) continue;
      const int h = static_cast<int>(u / (rch + nch)), c = static_cast<int>(u % (rch + nch));
      const T* src = static_cast<const T*>(p.v) + i * p.v_stride_n + h * p.v_stride_h;
      TQ* dst = static_cast<TQ*>(p.v_dst.ptr) + rope_quantize_row(p.v_dst, i, h, page, slot);
      quantize_chunk<T, TQ>(src, dst, c, p.quant_scale_kv);
      continue;
    }
    u -= v_n;
    {
      const int h = static_cast<int>(u / nch), c = static_cast<int>(u % nch);
      const T* src = static_cast<const T*>(p.q_nope) + i * p.q_nope_stride_n + h * p.q_nope_stride_h;
      TQ* dst = static_cast<TQ*>(p.q_nope_out) + i * p.q_nope_out_stride_n + h * p.q_nope_out_stride_h;
      quantize_chunk<T, TQ>(src, dst, c, p.quant_scale_q);
    }
  }
}

#endif

}  // namespace tessera
