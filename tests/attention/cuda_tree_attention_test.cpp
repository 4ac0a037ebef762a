// tree_attention (attention/cuda/kernels/tree_attention.h), launched directly and through
// CudaAttentionBackend::forward_draft_tree, against a float64 attention over exactly the keys each
// row may see: its sequence's paged prefix plus its own list of KV slots, with one uniform length
// (the EAGLE draft loop: distinct slots per row) or per-row lengths (a verify tree: rows of a
// sequence pick subsets of the sequence's tree slots). Random inputs; the seed is printed and can
// be fixed with SPECULA_TEST_SEED. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/core/dtype.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula::testing {
namespace {

namespace ck = cuda_kernels;

// Entries the kernel must never read (page-table and slot-list padding): far outside any cache.
constexpr int32_t kPoison = 1 << 30;

enum class Lengths {
  kUniform,  // branch_len for every row, distinct slots per row (the draft loop)
  kPerRow,   // branch_lens: random in [0, branch_stride] ([1, ..] where the prefix is empty),
             // a random subset of the sequence's branch_stride tree slots (a verify tree)
};

struct TreeCase {
  int num_seqs, rows_per_seq, num_kv_heads, group, head_dim, page_size;
  int branch_stride;
  int branch_len;  // kUniform only; <= branch_stride
  Lengths lengths;
  float scale_mul;  // scale = scale_mul / sqrt(head_dim); larger is peakier
};

// Random bf16 inputs of one case, on the host; branch_lens holds every row's length (also for
// kUniform, for the reference).
TreeAttentionInputs make_inputs(const TreeCase& c, std::mt19937_64& rng) {
  TreeAttentionInputs in;
  const int rows = c.num_seqs * c.rows_per_seq, D = c.head_dim;
  // Prefix lengths: one long (~3000), one empty where there are several, the rest short.
  in.prefix_lens.resize(static_cast<size_t>(c.num_seqs));
  for (int b = 0; b < c.num_seqs; ++b) {
    in.prefix_lens[b] = b == 0 ? 2900 + static_cast<int>(rng() % 200) : (b == 1 ? 0 : 1 + static_cast<int>(rng() % 300));
  }
  const int max_prefix = *std::max_element(in.prefix_lens.begin(), in.prefix_lens.end());
  const int page_stride = std::max(1, (max_prefix + c.page_size - 1) / c.page_size);
  const int total_pages = c.num_seqs * page_stride + 8;
  // Pages of all sequences are a random permutation of the pool; branch slots come after it.
  std::vector<int32_t> pool(static_cast<size_t>(total_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  in.pages.assign(static_cast<size_t>(c.num_seqs) * page_stride, kPoison);
  for (int b = 0; b < c.num_seqs; ++b) {
    const int used = (in.prefix_lens[b] + c.page_size - 1) / c.page_size;
    for (int i = 0; i < used; ++i) in.pages[static_cast<size_t>(b) * page_stride + i] = pool[b * page_stride + i];
  }
  const int branch_base = total_pages * c.page_size;
  const int S = c.branch_stride;
  in.branch_slots.assign(static_cast<size_t>(rows) * S, kPoison);
  in.branch_lens.resize(static_cast<size_t>(rows));
  int num_branch_slots = 0;
  if (c.lengths == Lengths::kUniform) {
    // Distinct slots for every (row, depth), in random places.
    std::vector<int32_t> branch_pool(static_cast<size_t>(rows) * c.branch_len);
    std::iota(branch_pool.begin(), branch_pool.end(), branch_base);
    std::shuffle(branch_pool.begin(), branch_pool.end(), rng);
    for (int r = 0; r < rows; ++r) {
      in.branch_lens[r] = c.branch_len;
      for (int i = 0; i < c.branch_len; ++i) {
        in.branch_slots[static_cast<size_t>(r) * S + i] = branch_pool[static_cast<size_t>(r) * c.branch_len + i];
      }
    }
    num_branch_slots = static_cast<int>(branch_pool.size());
  } else {
    // Each sequence owns S tree slots; a row sees a random subset of them in random order, of
    // random length (at least one key where the prefix is empty). A sequence's first row gets
    // the shortest length and its last the full stride, so both ends are always covered.
    std::vector<int32_t> tree_pool(static_cast<size_t>(c.num_seqs) * S);
    std::iota(tree_pool.begin(), tree_pool.end(), branch_base);
    std::shuffle(tree_pool.begin(), tree_pool.end(), rng);
    for (int r = 0; r < rows; ++r) {
      const int b = r / c.rows_per_seq, j = r % c.rows_per_seq;
      const int lo = in.prefix_lens[b] > 0 ? 0 : 1;
      int len = lo + static_cast<int>(rng() % static_cast<uint64_t>(S - lo + 1));
      if (c.rows_per_seq >= 2 && j == 0) len = lo;
      if (c.rows_per_seq >= 2 && j == c.rows_per_seq - 1) len = S;
      std::vector<int32_t> seen(tree_pool.begin() + static_cast<ptrdiff_t>(b) * S,
                                tree_pool.begin() + static_cast<ptrdiff_t>(b + 1) * S);
      std::shuffle(seen.begin(), seen.end(), rng);
      in.branch_lens[r] = len;
      std::copy_n(seen.begin(), len, in.branch_slots.begin() + static_cast<ptrdiff_t>(r) * S);
    }
    num_branch_slots = static_cast<int>(tree_pool.size());
  }
  const TreeAttentionShape shape{.rows = rows,
                                 .rows_per_seq = c.rows_per_seq,
                                 .num_kv_heads = c.num_kv_heads,
                                 .group = c.group,
                                 .head_dim = D,
                                 .scale = c.scale_mul / std::sqrt(static_cast<float>(D)),
                                 .page_stride = page_stride,
                                 .page_size = c.page_size,
                                 .branch_stride = S,
                                 .branch_len = c.lengths == Lengths::kUniform ? c.branch_len : -1};
  set_shape_and_random_qkv(in, shape, static_cast<size_t>(branch_base + num_branch_slots), rng);
  return in;
}

// float64 attention over the prefix and branch keys of every (row, q head); zeros for a row
// without any key.
std::vector<double> reference_attention(const TreeAttentionInputs& in) {
  const ck::TreeAttentionParams& p = in.p;
  const int D = p.head_dim, group = p.num_q_heads / p.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(p.rows) * p.num_q_heads * D, 0.0);
  for (int r = 0; r < p.rows; ++r) {
    const int b = r / p.rows_per_seq;
    std::vector<int64_t> slots;
    for (int t = 0; t < in.prefix_lens[b]; ++t) {
      slots.push_back(static_cast<int64_t>(in.pages[static_cast<size_t>(b) * p.page_stride + t / p.page_size]) *
                          p.page_size + t % p.page_size);
    }
    for (int i = 0; i < in.branch_lens[r]; ++i) {
      slots.push_back(in.branch_slots[static_cast<size_t>(r) * p.branch_stride + i]);
    }
    for (int h = 0; h < p.num_q_heads; ++h) {
      const int kvh = h / group;
      const uint16_t* q = in.q.data() + (static_cast<size_t>(r) * p.num_q_heads + h) * D;
      std::vector<double> s(slots.size());
      double mx = -INFINITY;
      for (size_t t = 0; t < slots.size(); ++t) {
        const uint16_t* kr = in.k_cache.data() + (static_cast<size_t>(slots[t]) * p.num_kv_heads + kvh) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(from_bf16(q[d])) * from_bf16(kr[d]);
        s[t] = dot * p.scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (double& x : s) sum += x = std::exp(x - mx);
      double* o = out.data() + (static_cast<size_t>(r) * p.num_q_heads + h) * D;
      for (size_t t = 0; t < slots.size(); ++t) {
        const uint16_t* vr = in.v_cache.data() + (static_cast<size_t>(slots[t]) * p.num_kv_heads + kvh) * D;
        for (int d = 0; d < D; ++d) o[d] += s[t] / sum * from_bf16(vr[d]);
      }
    }
  }
  return out;
}

// The kernel's output against the float64 reference; the largest absolute error.
double check_against_reference(const TreeAttentionInputs& in, DeviceTreeAttention& dev) {
  const ck::TreeAttentionParams& p = in.p;
  const std::vector<uint16_t> got = dev.out.download();
  const std::vector<double> ref = reference_attention(in);
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = from_bf16(got[i]);
    // bf16 output rounding is 2^-9 relative; f32 accumulation adds far less.
    EXPECT_NEAR(g, ref[i], 2e-3 + 1e-2 * std::fabs(ref[i]))
        << "row " << i / (static_cast<size_t>(p.num_q_heads) * p.head_dim) << " element " << i;
    if (std::fabs(g - ref[i]) > 2e-3 + 1e-2 * std::fabs(ref[i])) break;  // one report, not thousands
    max_err = std::max(max_err, std::fabs(g - ref[i]));
  }
  return max_err;
}

enum class Path {
  kKernel,   // ck::tree_attention with the Params filled by hand
  kBackend,  // CudaAttentionBackend::forward_draft_tree over an MHAKVPool
};

// The case through the backend: the K/V go to layer 1 of a two-layer pool whose layer 0 is NaN,
// so reading the wrong layer shows; the scale is the layer's.
void run_on_backend(const TreeAttentionInputs& in, DeviceTreeAttention& dev) {
  const ck::TreeAttentionParams& p = dev.p;
  AttentionBackendOptions o;
  o.device = Device::cuda(0);
  o.page_size = p.page_size;
  CudaAttentionBackend backend(o);
  AttentionLayer layer;
  layer.layer_id = 1;
  layer.num_q_heads = p.num_q_heads;
  layer.num_kv_heads = p.num_kv_heads;
  layer.head_dim = p.head_dim;
  layer.scaling = p.scale;
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t num_slots = static_cast<int64_t>(in.k_cache.size()) / row_elems;
  MHAKVPool pool(KVPoolConfig{num_slots, 2, p.num_kv_heads, p.head_dim, p.head_dim, DType::bf16, o.device});
  const size_t bytes = in.k_cache.size() * sizeof(uint16_t);
  CUDA_CHECK(cudaMemset(pool.k_buffer(0).data(), 0xff, bytes));
  CUDA_CHECK(cudaMemset(pool.v_buffer(0).data(), 0xff, bytes));
  CUDA_CHECK(cudaMemcpy(pool.k_buffer(1).data(), in.k_cache.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pool.v_buffer(1).data(), in.v_cache.data(), bytes, cudaMemcpyHostToDevice));
  DraftTreeView tree;
  tree.rows_per_seq = p.rows_per_seq;
  tree.prefix_pages = p.prefix_pages;
  tree.page_stride = p.page_stride;
  tree.prefix_lens = p.prefix_lens;
  tree.branch_slots = p.branch_slots;
  tree.branch_stride = p.branch_stride;
  tree.branch_len = std::max(p.branch_len, 0);
  tree.branch_lens = p.branch_lens;
  const TensorView q(dev.q.get(), DType::bf16, {p.rows, p.num_q_heads, p.head_dim}, o.device);
  const TensorView out(dev.out.get(), DType::bf16, {p.rows, p.num_q_heads, p.head_dim}, o.device);
  backend.forward_draft_tree(q, out, layer, pool, tree);
  CUDA_CHECK(cudaDeviceSynchronize());
}

void run_case(const TreeCase& c, std::mt19937_64& rng, Path path = Path::kKernel) {
  SCOPED_TRACE(::testing::Message() << (path == Path::kBackend ? "forward_draft_tree: " : "tree_attention: ")
                                    << "seqs " << c.num_seqs << " rows_per_seq " << c.rows_per_seq << " kv heads "
                                    << c.num_kv_heads << " group " << c.group << " head_dim " << c.head_dim
                                    << " page_size " << c.page_size << " branch_stride " << c.branch_stride
                                    << (c.lengths == Lengths::kUniform ? " branch_len " : " per-row lengths")
                                    << (c.lengths == Lengths::kUniform ? std::to_string(c.branch_len) : "")
                                    << " scale x" << c.scale_mul);
  const TreeAttentionInputs in = make_inputs(c, rng);
  DeviceTreeAttention dev(in);  // binds branch_lens for kPerRow only (branch_len -1)
  dev.out.fill_bytes(0xff);     // NaN bf16 wherever the kernel does not write
  const ck::TreeAttentionParams& p = dev.p;
  if (path == Path::kBackend) {
    run_on_backend(in, dev);
  } else {
    ck::tree_attention(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  const double max_err = check_against_reference(in, dev);
  std::printf("%s head_dim %d group %d rows_per_seq %d%s: max abs error %.2e\n",
              path == Path::kBackend ? "forward_draft_tree" : "tree_attention", c.head_dim, c.group, c.rows_per_seq,
              c.lengths == Lengths::kPerRow ? " per-row" : "", max_err);
}

// The draft loop's shape: rows_per_seq = topk, one uniform branch length (the step), distinct
// slots per row, a stride wider than the length (a [rows, num_steps] array).
TEST(CudaTreeAttention, UniformBranchMatchesFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_tree_attention_test"));
  const std::vector<TreeCase> cases = {
      {2, 4, 2, 1, 64, 16, 5, 3, Lengths::kUniform, 1.0f},   {3, 1, 1, 4, 64, 1, 3, 1, Lengths::kUniform, 1.0f},
      {2, 4, 2, 2, 128, 1, 8, 6, Lengths::kUniform, 1.0f},   {1, 4, 1, 7, 64, 16, 7, 5, Lengths::kUniform, 4.0f},
      {2, 1, 2, 4, 128, 16, 4, 2, Lengths::kUniform, 4.0f},  {1, 4, 1, 16, 64, 16, 6, 4, Lengths::kUniform, 1.0f},
      {2, 2, 1, 2, 256, 16, 4, 2, Lengths::kUniform, 1.0f},  {3, 4, 2, 4, 64, 1, 8, 6, Lengths::kUniform, 8.0f},
      {2, 4, 4, 8, 128, 16, 3, 1, Lengths::kUniform, 1.0f},
      // branch_len 0: the prefix alone; sequence 1 has no key at all and gets zeros.
      {3, 4, 2, 2, 64, 16, 4, 0, Lengths::kUniform, 1.0f},
  };
  for (const TreeCase& c : cases) run_case(c, rng);
}

// The verify shape: rows_per_seq = the tree's tokens, per-row lengths in [0, branch_stride]
// (never 0 for sequence 1, whose prefix is empty), rows of a sequence sharing its tree slots.
TEST(CudaTreeAttention, PerRowBranchLengthsMatchFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_tree_attention_test") + 1);
  std::vector<TreeCase> cases;
  for (int rows_per_seq : {8, 32}) {
    for (int head_dim : {64, 128}) {
      for (int group : {1, 2, 4}) {
        const int kv_heads = group == 4 ? 2 : 4 / group;
        const int page_size = group == 2 ? 1 : 16;
        cases.push_back({3, rows_per_seq, kv_heads, group, head_dim, page_size, rows_per_seq, 0, Lengths::kPerRow,
                         head_dim == 64 ? 4.0f : 1.0f});
      }
    }
  }
  // Odd shapes: a stride other than rows_per_seq, a single-row sequence, head_dim 256, a group
  // spread over several blocks.
  cases.push_back({4, 8, 2, 2, 128, 16, 11, 0, Lengths::kPerRow, 1.0f});
  cases.push_back({3, 1, 1, 4, 64, 16, 6, 0, Lengths::kPerRow, 1.0f});
  cases.push_back({2, 8, 1, 4, 256, 16, 8, 0, Lengths::kPerRow, 1.0f});
  cases.push_back({2, 8, 1, 12, 64, 1, 8, 0, Lengths::kPerRow, 8.0f});
  for (const TreeCase& c : cases) run_case(c, rng);
}

// The same kernel through the backend interface EAGLE's draft head uses: both length kinds, every
// head_dim it serves, MHA and GQA (a group over several blocks), page sizes 1 and 16, an empty
// prefix and an empty branch.
TEST(CudaTreeAttention, ForwardDraftTreeMatchesFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_tree_attention_test") + 2);
  const std::vector<TreeCase> cases = {
      {2, 4, 2, 1, 64, 16, 5, 3, Lengths::kUniform, 1.0f},  {3, 4, 2, 4, 128, 1, 8, 6, Lengths::kUniform, 4.0f},
      {2, 2, 1, 2, 256, 16, 4, 2, Lengths::kUniform, 1.0f}, {3, 4, 2, 2, 64, 16, 4, 0, Lengths::kUniform, 1.0f},
      {3, 8, 2, 2, 128, 16, 8, 0, Lengths::kPerRow, 1.0f},  {2, 8, 1, 12, 64, 1, 8, 0, Lengths::kPerRow, 8.0f},
      {4, 8, 2, 2, 128, 16, 11, 0, Lengths::kPerRow, 1.0f},
  };
  for (const TreeCase& c : cases) run_case(c, rng, Path::kBackend);
}

// An e4m3 cache (the fp8 KV cache's TARGET_VERIFY rows): the same inputs with K and V stored as
// e4m3 bytes under scales of different powers of two (so the dequantised values are exact in
// bf16 and the float64 reference reads them unchanged; K's and V's scales swapped would be off
// by a factor of 2).
TEST(CudaTreeAttention, Fp8CacheMatchesFloat64Reference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_tree_attention_test") + 3);
  const std::vector<TreeCase> cases = {
      {3, 8, 2, 2, 128, 16, 8, 0, Lengths::kPerRow, 1.0f},  {2, 8, 1, 4, 64, 1, 8, 0, Lengths::kPerRow, 4.0f},
      {2, 4, 2, 1, 64, 16, 5, 3, Lengths::kUniform, 1.0f},  {2, 8, 1, 4, 256, 16, 8, 0, Lengths::kPerRow, 1.0f},
      {2, 8, 1, 12, 128, 1, 8, 0, Lengths::kPerRow, 8.0f},
  };
  const float k_descale = 1.0f / 64, v_descale = 1.0f / 32;
  for (const TreeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "fp8: head_dim " << c.head_dim << " group " << c.group << " rows_per_seq "
                                      << c.rows_per_seq);
    TreeAttentionInputs in = make_inputs(c, rng);
    std::vector<uint8_t> k8(in.k_cache.size()), v8(in.v_cache.size());
    auto quantise = [](std::vector<uint16_t>& cache, std::vector<uint8_t>& bytes, float descale) {
      for (size_t i = 0; i < cache.size(); ++i) {
        const float x = std::clamp(from_bf16(cache[i]) / descale, -kFp8E4m3Max, kFp8E4m3Max);
        bytes[i] = float_to_fp8_e4m3_bits(x);
        cache[i] = to_bf16(fp8_e4m3_bits_to_float(bytes[i]) * descale);  // exact: a power-of-two scale
      }
    };
    // The random caches are in [-1, 1): scaled up they use e4m3's range.
    quantise(in.k_cache, k8, k_descale);
    quantise(in.v_cache, v8, v_descale);
    DeviceTreeAttention dev(in);
    DeviceArray<uint8_t> dk(k8), dv(v8);
    dev.out.fill_bytes(0xff);
    ck::TreeAttentionParams p = dev.p;
    p.k_cache = dk.get();
    p.v_cache = dv.get();
    p.kv_fp8 = true;
    p.k_descale = k_descale;
    p.v_descale = v_descale;
    ck::tree_attention(p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double max_err = check_against_reference(in, dev);
    std::printf("tree_attention fp8 head_dim %d group %d: max abs error %.2e\n", c.head_dim, c.group, max_err);
  }
}

std::string draft_tree_error(const AttentionLayer& layer, DType q_dtype, bool strided) {
  AttentionBackendOptions o;
  o.device = Device::cuda(0);
  o.page_size = 16;
  CudaAttentionBackend backend(o);
  MHAKVPool pool(KVPoolConfig{64, 1, layer.num_kv_heads, layer.head_dim, layer.head_dim, DType::bf16, o.device});
  const int64_t rows = 4, width = static_cast<int64_t>(layer.num_q_heads) * layer.head_dim;
  Buffer q(q_dtype, {rows, 2 * width}, o.device), out(q_dtype, {rows, 2 * width}, o.device);
  // strided: every row's heads are followed by a gap as wide, as a slice of a wider projection is.
  const Shape shape{rows, layer.num_q_heads, layer.head_dim};
  const Shape strides = strided ? Shape{2 * width, layer.head_dim, 1} : Shape{width, layer.head_dim, 1};
  const TensorView qv(q.data(), q_dtype, shape, strides, o.device), ov(out.data(), q_dtype, shape, strides, o.device);
  DeviceArray<int32_t> ints(std::vector<int32_t>(16, 0));
  DraftTreeView tree;
  tree.rows_per_seq = 2;
  tree.prefix_pages = ints.get();
  tree.page_stride = 1;
  tree.prefix_lens = ints.get();
  tree.branch_slots = ints.get();
  tree.branch_stride = 1;
  tree.branch_len = 1;
  try {
    backend.forward_draft_tree(qv, ov, layer, pool, tree);
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Layers and inputs the tree kernel is not built for are refused with the value and what is allowed.
TEST(CudaTreeAttention, ForwardDraftTreeRefusesWhatTheTreeKernelCannotServe) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  AttentionLayer layer;
  layer.num_q_heads = 8;
  layer.num_kv_heads = 2;
  layer.head_dim = 80;
  EXPECT_NE(draft_tree_error(layer, DType::bf16, false).find("head_dim 80"), std::string::npos);
  layer.head_dim = 64;
  EXPECT_NE(draft_tree_error(layer, DType::f16, false).find("bf16 queries and a bf16 or fp8_e4m3 KV cache; got f16"), std::string::npos);
  EXPECT_NE(draft_tree_error(layer, DType::bf16, true).find("dense [rows, num_q_heads, head_dim]"), std::string::npos);
  layer.logit_cap = 30.0f;
  EXPECT_NE(draft_tree_error(layer, DType::bf16, false).find("logit_cap 30"), std::string::npos);
  layer.logit_cap = 0.0f;
  EXPECT_EQ(draft_tree_error(layer, DType::bf16, false), "(no error)");
}

}  // namespace
}  // namespace specula::testing
